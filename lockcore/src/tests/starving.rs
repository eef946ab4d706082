//! Bounded unfairness ([`Fairness::Bounded`]): the reference store's marks for long waits,
//! and a client that releases and asks again at once no longer starving another's waiter.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::driver::*;
use crate::memory::MemoryBackend;
use crate::*;

const BOUND: Duration = Duration::from_secs(10);
const TTL: Duration = Duration::from_secs(5);

fn owner(label: &str) -> Owner {
    Owner::new(label)
}

fn acquired(outcome: &AcquireOutcome) -> bool {
    matches!(outcome, AcquireOutcome::Acquired(_))
}

/// An attempt that says it has waited `waited` (as a client's would).
async fn attempt(
    store: &MemoryBackend,
    key: &LockKey,
    who: &Owner,
    waited: Option<Duration>,
) -> AcquireOutcome {
    let request = ClaimRequest::exclusive(key, who, TTL);
    let request = match waited {
        Some(waited) => request.waited(waited),
        None => request,
    };
    store
        .claim(&request)
        .await
        .expect("the memory store answers")
}

#[tokio::test]
async fn a_young_refusal_marks_nothing() {
    let store = MemoryBackend::new();
    let key = LockKey::new("young").unwrap();
    let (holder, young, next) = (owner("holder"), owner("young"), owner("next"));
    assert!(acquired(&attempt(&store, &key, &holder, None).await));
    assert!(!acquired(&attempt(&store, &key, &young, None).await));
    store.release(&key, &holder).await.unwrap();
    // Nobody asked to be next: whoever asks first gets it.
    assert!(acquired(&attempt(&store, &key, &next, None).await));
}

#[tokio::test]
async fn the_earliest_long_wait_goes_first() {
    let store = MemoryBackend::new();
    let key = LockKey::new("earliest").unwrap();
    let (holder, later, earlier, barging) = (
        owner("holder"),
        owner("later"),
        owner("earlier"),
        owner("barging"),
    );
    let ms = Duration::from_millis;
    assert!(acquired(&attempt(&store, &key, &holder, None).await));
    // `later` marks the key; `earlier`, which arrived before it, takes the mark over.
    assert!(!acquired(
        &attempt(&store, &key, &later, Some(ms(30))).await
    ));
    assert!(!acquired(
        &attempt(&store, &key, &earlier, Some(ms(500))).await
    ));
    store.release(&key, &holder).await.unwrap();
    // Neither a fresh request nor the later arrival gets the key while the mark lives...
    let refused = attempt(&store, &key, &barging, None).await;
    let AcquireOutcome::Held(contention) = refused else {
        panic!("a fresh request took a key marked for a long waiter");
    };
    assert!(contention.hint.is_behind_reservation());
    assert!(!acquired(
        &attempt(&store, &key, &later, Some(ms(40))).await
    ));
    // ...the earlier arrival does, and its mark goes with the grant.
    assert!(acquired(
        &attempt(&store, &key, &earlier, Some(ms(510))).await
    ));
    store.release(&key, &earlier).await.unwrap();
    // `later` was refused by a mark, not by a holder, so it left none: the key is free.
    assert!(acquired(&attempt(&store, &key, &barging, None).await));
}

#[tokio::test]
async fn an_earlier_arrival_goes_before_a_mark_without_taking_it() {
    let store = MemoryBackend::new();
    let key = LockKey::new("before-mark").unwrap();
    let (holder, marked, earlier, barging) = (
        owner("holder"),
        owner("marked"),
        owner("earlier"),
        owner("barging"),
    );
    let ms = Duration::from_millis;
    assert!(acquired(&attempt(&store, &key, &holder, None).await));
    assert!(!acquired(
        &attempt(&store, &key, &marked, Some(ms(30))).await
    ));
    store.release(&key, &holder).await.unwrap();
    assert!(acquired(
        &attempt(&store, &key, &earlier, Some(ms(900))).await
    ));
    store.release(&key, &earlier).await.unwrap();
    // The mark still stands for its owner.
    assert!(!acquired(&attempt(&store, &key, &barging, None).await));
    assert!(acquired(
        &attempt(&store, &key, &marked, Some(ms(40))).await
    ));
}

#[tokio::test]
async fn an_abandoned_mark_lets_the_next_request_in() {
    let store = MemoryBackend::new();
    let key = LockKey::new("abandoned").unwrap();
    let (holder, marked, next) = (owner("holder"), owner("marked"), owner("next"));
    assert!(acquired(&attempt(&store, &key, &holder, None).await));
    let long = Some(Duration::from_millis(30));
    assert!(!acquired(&attempt(&store, &key, &marked, long).await));
    store.release(&key, &holder).await.unwrap();
    store.abandon(&key, &marked).await.unwrap();
    assert!(acquired(&attempt(&store, &key, &next, None).await));
}

/// One client takes the key, holds it a moment, releases it and asks again at once, over
/// and over; another client's waiter is served after a bounded number of those grants.
/// (Without marks the releasing client wins every time: its next attempt reaches the
/// store before the woken waiter's.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_asking_again_at_once_does_not_starve_another() {
    let store = MemoryBackend::new();
    let (greedy, patient) = (
        LockClient::new(store.clone()),
        LockClient::new(store.clone()),
    );
    let first = greedy.lock("contended").ttl(TTL).acquire().await.unwrap();
    let grants = Arc::new(AtomicUsize::new(0));
    let waiter = tokio::spawn(async move {
        let guard = patient
            .lock("contended")
            .ttl(TTL)
            .wait(BOUND)
            .acquire()
            .await;
        guard.map(|g| g.token())
    });
    let looping = {
        let grants = grants.clone();
        tokio::spawn(async move {
            let mut guard = first;
            loop {
                tokio::time::sleep(Duration::from_millis(2)).await;
                guard.release().await.unwrap();
                guard = greedy.lock("contended").ttl(TTL).acquire().await.unwrap();
                grants.fetch_add(1, Ordering::SeqCst);
            }
        })
    };
    let served = waiter.await.unwrap();
    let bypassed = grants.load(Ordering::SeqCst);
    looping.abort();
    assert!(served.is_ok(), "the waiter was never served: {served:?}");
    // 20 ms of 2 ms holds before the waiter marks the key, then one more grant at most.
    assert!(
        bypassed <= 40,
        "the waiter was served after {bypassed} grants to a client asking again at once"
    );
}

#[tokio::test]
async fn a_mark_whose_waiter_vanished_lapses_after_a_moment() {
    let store = MemoryBackend::new();
    let key = LockKey::new("vanished").unwrap();
    let (holder, vanished, next) = (owner("holder"), owner("vanished"), owner("next"));
    assert!(acquired(&attempt(&store, &key, &holder, None).await));
    let long = Some(Duration::from_millis(30));
    assert!(!acquired(&attempt(&store, &key, &vanished, long).await));
    store.release(&key, &holder).await.unwrap();
    assert!(!acquired(&attempt(&store, &key, &next, None).await));
    // Not the waiter's 5 s TTL: the mark's own short life.
    tokio::time::sleep(STARVING_MARK_TTL + Duration::from_millis(50)).await;
    assert!(acquired(&attempt(&store, &key, &next, None).await));
}

/// The reference store as a store without release signals would declare it, counting the
/// attempts that say how long their request has waited.
#[derive(Debug)]
struct Polling {
    inner: Arc<MemoryBackend>,
    starving: AtomicUsize,
    /// How long each attempt takes to be answered.
    delay: Duration,
}

#[async_trait::async_trait]
impl LockBackend for Polling {
    fn name(&self) -> &'static str {
        "polling"
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities().with_notifications(false)
    }
    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<AcquireOutcome, LockError> {
        if request.waited.is_some() {
            self.starving.fetch_add(1, Ordering::SeqCst);
        }
        let outcome = self.inner.claim(request).await;
        tokio::time::sleep(self.delay).await;
        outcome
    }
    async fn release(&self, key: &LockKey, owner: &Owner) -> Result<ReleaseOutcome, LockError> {
        self.inner.release(key, owner).await
    }
    async fn renew(
        &self,
        renewals: &[Renewal<'_>],
    ) -> Result<Vec<Result<ExtendOutcome, LockError>>, LockError> {
        self.inner.renew(renewals).await
    }
    async fn holders(&self, key: &LockKey) -> Result<Vec<LockInfo>, LockError> {
        self.inner.holders(key).await
    }
    async fn wait_released(
        &self,
        key: &LockKey,
        hint: &WaitHint,
        place: u64,
        max_wait: Duration,
    ) -> Result<(), LockError> {
        self.inner.wait_released(key, hint, place, max_wait).await
    }
    fn notifier(&self) -> Option<&ReleaseNotifier> {
        self.inner.notifier()
    }
    async fn force_release(&self, key: &LockKey) -> Result<ReleaseOutcome, LockError> {
        self.inner.force_release(key).await
    }
    async fn abandon(&self, key: &LockKey, owner: &Owner) -> Result<(), LockError> {
        self.inner.abandon(key, owner).await
    }
}

/// A fresh [`Polling`] store whose attempts are answered after `delay`.
fn polling(delay: Duration) -> Arc<Polling> {
    Arc::new(Polling {
        inner: MemoryBackend::new(),
        starving: AtomicUsize::new(0),
        delay,
    })
}

/// A fresh [`Polling`] store whose `key` one client holds and another client's waiter
/// (spawned, within [`BOUND`]) waits for.
async fn held_and_awaited(
    key: &'static str,
) -> (
    Arc<Polling>,
    LockGuard,
    tokio::task::JoinHandle<Result<(), LockError>>,
) {
    let store = polling(Duration::ZERO);
    let (holder, waiter) = (
        LockClient::new(store.clone()),
        LockClient::new(store.clone()),
    );
    let held = holder.lock(key).ttl(TTL).acquire().await.unwrap();
    let waiting = tokio::spawn(async move {
        let guard = waiter.lock(key).ttl(TTL).wait(BOUND).acquire().await;
        guard.map(drop)
    });
    (store, held, waiting)
}

/// On a store without release signals, a waiter asks again as soon as its wait is long, to
/// mark the key while it is still held: a poller looks only when the key is free, and by
/// then the releasing client has taken it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_on_a_polling_store_marks_the_key_while_it_is_held() {
    let (store, held, waiting) = held_and_awaited("polled").await;
    // Well past STARVING_AFTER, well before the holder's TTL (which a waiter that is told
    // nothing about the key would sleep until).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let marked = store.starving.load(Ordering::SeqCst);
    held.release().await.unwrap();
    waiting.await.unwrap().unwrap();
    assert!(marked >= 1, "no attempt marked the key while it was held");
}

/// A marked waiter asks again before its mark's short life ends, however long the holder
/// keeps the key, so the mark still stands when the key is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_marked_waiter_renews_its_mark_while_it_waits() {
    let (store, held, waiting) = held_and_awaited("renewed").await;
    // Three of the mark's half-lives past the first mark.
    tokio::time::sleep(STARVING_MARK_TTL * 3 / 2 + Duration::from_millis(200)).await;
    let asked = store.starving.load(Ordering::SeqCst);
    held.release().await.unwrap();
    waiting.await.unwrap().unwrap();
    assert!(
        asked >= 3,
        "the mark was renewed {} times in 1.7 s",
        asked.saturating_sub(1)
    );
}

/// A wait whose deadline passes while it is idle leaves its mark before it answers
/// `Timeout`, and sends no attempt at the deadline that would leave one behind: the next
/// request, right after the holder's release, finds the key free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_waiter_leaves_no_mark_behind() {
    let store = polling(Duration::from_millis(20));
    let clients: Vec<_> = (0..3).map(|_| LockClient::new(store.clone())).collect();
    for round in 0..5 {
        let key = format!("timed-out-{round}");
        let held = clients[0].lock(&key).ttl(TTL).acquire().await.unwrap();
        let waited = clients[1]
            .lock(&key)
            .ttl(TTL)
            .wait(Duration::from_millis(150))
            .acquire()
            .await;
        assert!(
            matches!(waited, Err(LockError::Timeout { .. })),
            "{waited:?}"
        );
        assert!(
            store.starving.load(Ordering::SeqCst) > 0,
            "the waiter never marked"
        );
        held.release().await.unwrap();
        let next = clients[2].lock(&key).ttl(TTL).try_acquire().await.unwrap();
        assert!(
            next.is_some(),
            "round {round}: the timed-out waiter's mark kept the key"
        );
    }
}

/// A client with more marked waiters than its budget of renewals allows renews their marks
/// less often, all keys together: 2,000 waiters on 2,000 held keys ask about a thousand
/// times a second in all (twice a second each would be 4,000), each at least once in any
/// two seconds, and each is served once its key is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn marked_waiters_on_many_keys_share_a_budget_of_renewals() {
    const KEYS: usize = 2_000;
    const LONG: Duration = Duration::from_secs(60);
    let store = polling(Duration::ZERO);
    let (holder, waiter) = (
        LockClient::new(store.clone()),
        LockClient::new(store.clone()),
    );
    let mut held = Vec::with_capacity(KEYS);
    for i in 0..KEYS {
        held.push(
            holder
                .lock(format!("budget-{i}"))
                .ttl(LONG)
                .acquire()
                .await
                .unwrap(),
        );
    }
    let waiting: Vec<_> = (0..KEYS)
        .map(|i| {
            let waiter = waiter.clone();
            tokio::spawn(async move {
                let key = format!("budget-{i}");
                waiter
                    .lock(key)
                    .ttl(LONG)
                    .wait(BOUND)
                    .acquire()
                    .await
                    .map(drop)
            })
        })
        .collect();
    // Every waiter has marked its key (20 ms after it began) well before the window.
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(waiter.inner.marked.load(Ordering::SeqCst), KEYS);
    let before = store.starving.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let renewed = store.starving.load(Ordering::SeqCst) - before;
    assert!(
        (1_000..=3_000).contains(&renewed),
        "{KEYS} marked waiters asked {renewed} times in 2 s (about 2,000 within the budget)"
    );
    for guard in held {
        guard.release().await.unwrap();
    }
    for waiting in waiting {
        waiting.await.unwrap().unwrap();
    }
    assert_eq!(
        waiter.inner.marked.load(Ordering::SeqCst),
        0,
        "served requests still count as marked"
    );
}
