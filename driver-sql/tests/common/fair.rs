//! The queue of a fair backend (`distlock_fair=true`), checked the same way on each
//! database with two backends on one table, as two processes would have: a free key goes
//! to the first live place only; a place given up hands the key on at once, a granted one
//! leaves the queue, a silent one lapses after its TTL and not before; a refused waiter is
//! told to come back before its place lapses; and what the fair backend refuses.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lockcore::driver::{
    AcquireOutcome, Capabilities, ClaimRequest, Contention, ExtendOutcome, Fairness,
    LockBackendExt, ReleaseNotifier, Renewal, WaitHint,
};
use lockcore::{
    Claim, FencingToken, LockBackend, LockError, LockInfo, LockKey, Owner, ReleaseOutcome,
};
use tokio::sync::watch;

use super::key;

const LONG: Duration = Duration::from_secs(30);

async fn granted(b: &dyn LockBackend, k: &LockKey, owner: &Owner, ttl: Duration) -> FencingToken {
    match b.try_acquire(k, owner, ttl).await.unwrap() {
        AcquireOutcome::Acquired(g) => g.token,
        AcquireOutcome::Held(c) => panic!("{} was refused: {c:?}", owner.label()),
    }
}

async fn refused(b: &dyn LockBackend, k: &LockKey, owner: &Owner, ttl: Duration) -> Contention {
    match b.try_acquire(k, owner, ttl).await.unwrap() {
        AcquireOutcome::Held(c) => c,
        AcquireOutcome::Acquired(g) => panic!("{} was granted {:?}", owner.label(), g.token),
    }
}

async fn release(b: &dyn LockBackend, k: &LockKey, owner: &Owner) {
    assert_eq!(b.release(k, owner).await.unwrap(), ReleaseOutcome::Released);
}

/// Declares FIFO fairness, and refuses shared claims with a clear error.
pub async fn declares_fifo_and_refuses_claims(a: Arc<dyn LockBackend>) {
    let caps = a.capabilities();
    assert_eq!(caps.fairness, Fairness::Fifo);
    assert!(!caps.shared && !caps.semaphores, "{caps:?}");
    let err = a
        .try_claim(&key("fair-shared"), &Owner::new("r"), LONG, Claim::shared())
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Config { .. }), "{err}");
}

/// A released key goes to the waiter that queued first, not to a newcomer; once that
/// waiter gives up, the newcomer gets it at once; a granted waiter leaves the queue.
pub async fn the_first_place_gets_the_key(a: Arc<dyn LockBackend>, b: Arc<dyn LockBackend>) {
    let k = key("fair-first");
    let (holder, first, second, late) = (
        Owner::new("holder"),
        Owner::new("first"),
        Owner::new("second"),
        Owner::new("late"),
    );
    let held = granted(&*a, &k, &holder, LONG).await;
    refused(&*b, &k, &first, LONG).await;
    refused(&*a, &k, &second, LONG).await;
    release(&*a, &k, &holder).await;
    // The holder asks again at once: the waiters are ahead of it.
    let c = refused(&*a, &k, &holder, LONG).await;
    assert!(
        c.hint.is_behind_reservation(),
        "a free key kept for the queue's first place is a wait behind it: {c:?}"
    );
    refused(&*a, &k, &second, LONG).await;
    let t1 = granted(&*b, &k, &first, LONG).await;
    assert!(t1 > held);
    release(&*b, &k, &first).await;
    // `first` left the queue when granted; `second` is next, ahead of the holder.
    refused(&*b, &k, &holder, LONG).await;
    b.abandon(&k, &second).await.unwrap();
    // `second` gave up: the holder, queued behind it, is first now; `late` is not.
    refused(&*a, &k, &late, LONG).await;
    let t2 = granted(&*a, &k, &holder, LONG).await;
    assert!(t2 > t1);
    release(&*a, &k, &holder).await;
    b.abandon(&k, &late).await.unwrap();
    // Every place is gone: anyone gets the free key.
    granted(&*b, &k, &Owner::new("anyone"), LONG).await;
}

/// A waiter that queued and went silent blocks the key until its place lapses (its TTL
/// after its last attempt, by the database's clock), and no longer.
pub async fn a_silent_place_lapses_after_its_ttl(a: Arc<dyn LockBackend>, b: Arc<dyn LockBackend>) {
    let k = key("fair-lapse");
    let place_ttl = Duration::from_millis(600);
    let (holder, silent, next) = (
        Owner::new("holder"),
        Owner::new("silent"),
        Owner::new("next"),
    );
    granted(&*a, &k, &holder, LONG).await;
    let asked = Instant::now();
    refused(&*b, &k, &silent, place_ttl).await;
    release(&*a, &k, &holder).await;
    let got = loop {
        match a.try_acquire(&k, &next, LONG).await.unwrap() {
            AcquireOutcome::Acquired(_) => break asked.elapsed(),
            AcquireOutcome::Held(_) => {
                assert!(
                    asked.elapsed() < Duration::from_secs(5),
                    "the silent waiter's place never lapsed"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    assert!(
        got >= place_ttl - Duration::from_millis(10),
        "the key went past the queue's first place {got:?} after it queued, before its TTL of {place_ttl:?}"
    );
}

/// A refused waiter is told to come back within half its TTL, however long the holder's
/// lease, so its place does not lapse while it waits.
pub async fn a_waiter_comes_back_before_its_place_lapses(
    a: Arc<dyn LockBackend>,
    b: Arc<dyn LockBackend>,
) {
    let k = key("fair-renew");
    let ttl = Duration::from_secs(2);
    granted(&*a, &k, &Owner::new("holder"), LONG).await;
    let c = refused(&*b, &k, &Owner::new("waiter"), ttl).await;
    let back = c.remaining_ttl.expect("a refusal names when to come back");
    assert!(
        back <= ttl / 2,
        "told to come back after {back:?}, TTL {ttl:?}"
    );
}

/// A free key is granted even when the attempt's own place lapses before the attempt reads
/// the queue (a TTL shorter than the attempt, on a clock that moves within it, as SQLite's
/// and MySQL's do between statements): nobody is ahead. Once answered "unexpected row".
pub async fn a_place_lapsed_within_its_attempt_is_nobody_ahead(a: Arc<dyn LockBackend>) {
    for i in 0..200 {
        let k = key(&format!("fair-instant-{i}"));
        granted(&*a, &k, &Owner::new("brief"), Duration::from_micros(1)).await;
    }
}

/// A pass-through backend counting the attempts the store refused.
#[derive(Debug)]
struct Refusals {
    inner: Arc<dyn LockBackend>,
    refused: watch::Sender<usize>,
    /// How many waits for a release began, and how many ended.
    waits: watch::Sender<usize>,
    woke: watch::Sender<usize>,
    /// While true, a wait for a release begins but does not reach the store (a waiter whose
    /// re-check lags behind the key's hand-offs).
    stall: watch::Sender<bool>,
}

#[async_trait::async_trait]
impl LockBackend for Refusals {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<AcquireOutcome, LockError> {
        let outcome = self.inner.claim(request).await;
        if let Ok(AcquireOutcome::Held(_)) = outcome {
            self.refused.send_modify(|n| *n += 1);
        }
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
        self.waits.send_modify(|n| *n += 1);
        let _ = self.stall.subscribe().wait_for(|stalled| !*stalled).await;
        let woke = self.inner.wait_released(key, hint, place, max_wait).await;
        self.woke.send_modify(|n| *n += 1);
        woke
    }
    async fn force_release(&self, key: &LockKey) -> Result<ReleaseOutcome, LockError> {
        self.inner.force_release(key).await
    }
    async fn abandon(&self, key: &LockKey, owner: &Owner) -> Result<(), LockError> {
        self.inner.abandon(key, owner).await
    }
    fn notifier(&self) -> Option<&ReleaseNotifier> {
        self.inner.notifier()
    }
}

/// The waiters of one client take turns too: a task that releases and asks again at once
/// goes behind the client's other waiters (a store that queues waiters is asked by each of
/// them, with no line in the client to order them).
pub async fn one_clients_waiters_take_turns(a: Arc<dyn LockBackend>) {
    const TASKS: usize = 4;
    const ROUNDS: usize = 6;
    let counted = Arc::new(Refusals {
        inner: a.clone(),
        refused: watch::Sender::new(0),
        waits: watch::Sender::new(0),
        woke: watch::Sender::new(0),
        stall: watch::Sender::new(false),
    });
    let client = lockcore::LockClient::new(counted.clone());
    let k = key("fair-turns");
    // Every task queues behind a holder first, so that each has arrived before the turns
    // begin (a task still connecting has not).
    let holder = Owner::new("holder");
    granted(&*a, &k, &holder, LONG).await;
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let tasks: Vec<_> = (0..TASKS)
        .map(|me| {
            let (client, k, order) = (client.clone(), k.clone(), order.clone());
            tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    let guard = client.lock(k.as_str()).ttl(LONG).acquire().await.unwrap();
                    order.lock().unwrap().push(me);
                    guard.release().await.unwrap();
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    let mut refused = counted.refused.subscribe();
    tokio::time::timeout(LONG, refused.wait_for(|n| *n >= TASKS))
        .await
        .expect("every task queued")
        .unwrap();
    release(&*a, &k, &holder).await;
    for task in tasks {
        tokio::time::timeout(LONG, task).await.unwrap().unwrap();
    }
    let order = order.lock().unwrap().clone();
    // While every task still asks, a task granted twice in a row asked again before any
    // other task had a place: it happens (a task that released may not have asked again
    // yet when the next turn comes), but rarely: up to 3 of 19 alone, 5 once in a full
    // test run on a loaded 2-core machine. Without turns, one task took the key again at
    // once, most times (10 of 19 and more).
    let busy = &order[..TASKS * (ROUNDS - 1)];
    let again = busy.windows(2).filter(|w| w[0] == w[1]).count();
    assert!(
        again <= 6,
        "{again} of {} grants went to the task that had just released, while {TASKS} tasks asked; order {order:?}",
        busy.len() - 1
    );
    client.shutdown().await;
}

/// A place that lapsed behind the first live one and is taken again goes to the back of
/// the queue: the waiter was silent for its whole TTL, and the ones queued behind it since
/// stay ahead of it (the queue drops only the lapsed places at its front).
pub async fn a_lapsed_place_taken_again_goes_to_the_back(
    a: Arc<dyn LockBackend>,
    b: Arc<dyn LockBackend>,
) {
    let k = key("fair-back");
    let short = Duration::from_millis(300);
    let (holder, first, silent, third) = (
        Owner::new("holder"),
        Owner::new("first"),
        Owner::new("silent"),
        Owner::new("third"),
    );
    granted(&*a, &k, &holder, LONG).await;
    refused(&*a, &k, &first, LONG).await;
    refused(&*b, &k, &silent, short).await;
    refused(&*a, &k, &third, LONG).await;
    // The silent place lapses: its TTL passes on the database's clock.
    tokio::time::sleep(short + Duration::from_millis(100)).await;
    refused(&*b, &k, &silent, LONG).await;
    release(&*a, &k, &holder).await;
    granted(&*a, &k, &first, LONG).await;
    release(&*a, &k, &first).await;
    refused(&*b, &k, &silent, LONG).await;
    granted(&*a, &k, &third, LONG).await;
}

/// Makes sure `client`'s backend listens for releases: a backend's `LISTEN` session starts
/// with its first wait, and until it is up, waiters poll. A wait on a key `a` holds, ended
/// by its deadline, gives the session time to start.
async fn listening(a: &dyn LockBackend, client: &lockcore::LockClient) {
    let warm = key("fair-warm");
    let _ = a
        .try_acquire(&warm, &Owner::new("warm"), LONG)
        .await
        .unwrap();
    let err = client
        .lock(warm.as_str())
        .wait(Duration::from_millis(300))
        .acquire()
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }), "{err}");
}

/// A counting wrapper around `b` and a client over it.
fn counted(b: Arc<dyn LockBackend>) -> (Arc<Refusals>, lockcore::LockClient) {
    let counted = Arc::new(Refusals {
        inner: b,
        refused: watch::Sender::new(0),
        waits: watch::Sender::new(0),
        woke: watch::Sender::new(0),
        stall: watch::Sender::new(false),
    });
    let client = lockcore::LockClient::new(counted.clone());
    (counted, client)
}

/// A release wakes only the waiter whose place is first in the queue, whichever process
/// it is in: waiters of two backends, queued in a known order, are served in that order
/// with no attempt refused on the way (a release that woke every waiter of the key would
/// have each of them ask, and all but one be refused).
pub async fn a_release_wakes_only_the_first_places_waiter(
    a: Arc<dyn LockBackend>,
    b: Arc<dyn LockBackend>,
) {
    const WAITERS: usize = 8;
    let k = key("fair-one-wake");
    let holder = Owner::new("holder");
    granted(&*a, &k, &holder, LONG).await;
    let sides = [counted(a.clone()), counted(b)];
    for (_, client) in &sides {
        listening(&*a, client).await;
    }
    let base: usize = sides.iter().map(|(c, _)| *c.refused.borrow()).sum();
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for me in 0..WAITERS {
        let (counted, client) = &sides[me % 2];
        let mut waits = counted.waits.subscribe();
        let before = *waits.borrow();
        let (client, k, order) = (client.clone(), k.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let guard = client.lock(k.as_str()).ttl(LONG).acquire().await.unwrap();
            order.lock().unwrap().push(me);
            guard.release().await.unwrap();
        }));
        // Queued (refused, and waiting) before the next one starts: the arrival order is
        // known, and each waiter looks at the key before the holder lets it go.
        tokio::time::timeout(LONG, waits.wait_for(|n| *n > before))
            .await
            .expect("the waiter queued")
            .unwrap();
    }
    let queued: usize = sides.iter().map(|(c, _)| *c.refused.borrow()).sum();
    assert_eq!(queued - base, WAITERS);
    release(&*a, &k, &holder).await;
    for task in tasks {
        tokio::time::timeout(LONG, task).await.unwrap().unwrap();
    }
    let refused: usize = sides.iter().map(|(c, _)| *c.refused.borrow()).sum();
    assert_eq!(
        *order.lock().unwrap(),
        (0..WAITERS).collect::<Vec<_>>(),
        "not served in arrival order"
    );
    // A waiter whose re-check after queueing sees the key change hands asks once more;
    // waking every waiter at each release would refuse about WAITERS² / 2.
    assert!(
        refused - queued <= WAITERS / 2,
        "{} attempts were refused while {WAITERS} waiters took their turns: releases woke \
         waiters that were not first",
        refused - queued
    );
    for (_, client) in sides {
        client.shutdown().await;
    }
}

/// A first place given up is announced with the next place's ticket: that waiter, asleep
/// while the key was kept for the first place, takes the free key at once, not after its
/// wait's bound (half its TTL here).
pub async fn a_first_place_given_up_wakes_the_next(
    a: Arc<dyn LockBackend>,
    b: Arc<dyn LockBackend>,
) {
    let k = key("fair-given-up");
    let (holder, first) = (Owner::new("holder"), Owner::new("first"));
    granted(&*a, &k, &holder, LONG).await;
    refused(&*a, &k, &first, LONG).await;
    // Free, but kept for `first`, which does not ask.
    release(&*a, &k, &holder).await;
    let (counted, client) = counted(b);
    listening(&*a, &client).await;
    let mut waits = counted.waits.subscribe();
    let waiter = tokio::spawn({
        let (client, k) = (client.clone(), k.clone());
        async move {
            let guard = client.lock(k.as_str()).ttl(LONG).acquire().await.unwrap();
            guard.release().await.unwrap();
        }
    });
    // Refused behind `first`, the waiter waits (its ticket is registered as its wait
    // begins, before it re-checks the key).
    let warm = *waits.borrow();
    tokio::time::timeout(LONG, waits.wait_for(|n| *n > warm))
        .await
        .expect("the waiter waits")
        .unwrap();
    let gave_up = Instant::now();
    a.abandon(&k, &first).await.unwrap();
    tokio::time::timeout(LONG, waiter).await.unwrap().unwrap();
    assert!(
        gave_up.elapsed() < Duration::from_secs(5),
        "the next waiter took the key {:?} after the first place was given up",
        gave_up.elapsed()
    );
    client.shutdown().await;
}

/// A waiter that knows its place asks again for its turn only: the key changing hands
/// among the places ahead of it, seen by a re-check that lags behind, does not send it
/// to the store (waiters that did asked at every hand-off once the queue was long).
pub async fn a_waiter_asks_only_for_its_turn(a: Arc<dyn LockBackend>, b: Arc<dyn LockBackend>) {
    let k = key("fair-own-turn");
    let (holder, first) = (Owner::new("holder"), Owner::new("first"));
    granted(&*a, &k, &holder, LONG).await;
    refused(&*a, &k, &first, LONG).await;
    let (counted, client) = counted(b);
    listening(&*a, &client).await;
    let (mut waits, mut woke) = (counted.waits.subscribe(), counted.woke.subscribe());
    let (warm_waits, warm_woke) = (*waits.borrow(), *woke.borrow());
    counted.stall.send_replace(true);
    let waiter = tokio::spawn({
        let (client, k) = (client.clone(), k.clone());
        async move {
            let guard = client.lock(k.as_str()).ttl(LONG).acquire().await.unwrap();
            guard.release().await.unwrap();
        }
    });
    tokio::time::timeout(LONG, waits.wait_for(|n| *n > warm_waits))
        .await
        .expect("the waiter waits")
        .unwrap();
    // While its wait lags, the key changes hands: the holder lets it go, `first` takes it.
    release(&*a, &k, &holder).await;
    granted(&*a, &k, &first, LONG).await;
    counted.stall.send_replace(false);
    // Its wait re-checks the key: held, by the place ahead of it. Nothing to ask yet, so
    // the wait goes on (a re-check takes a round trip; half a second is plenty).
    let ended = tokio::time::timeout(
        Duration::from_millis(500),
        woke.wait_for(|n| *n > warm_woke),
    )
    .await;
    assert!(
        ended.is_err(),
        "the waiter stopped waiting while the key changed hands ahead of it"
    );
    // Its turn: named by the release.
    release(&*a, &k, &first).await;
    tokio::time::timeout(LONG, waiter).await.unwrap().unwrap();
    client.shutdown().await;
}

/// The checks above as tests of one database: `$pair` is an async expression giving two
/// fair backends on one fresh table (and whatever must live as long as they do).
#[allow(unused_macros)] // Not every test binary sharing `common` uses it.
macro_rules! fair_tests {
    ($pair:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn declares_fifo_and_refuses_claims() {
            let (_keep, a, _) = $pair.await;
            common::fair::declares_fifo_and_refuses_claims(a).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn the_first_place_gets_the_key() {
            let (_keep, a, b) = $pair.await;
            common::fair::the_first_place_gets_the_key(a, b).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn a_silent_place_lapses_after_its_ttl() {
            let (_keep, a, b) = $pair.await;
            common::fair::a_silent_place_lapses_after_its_ttl(a, b).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn a_place_lapsed_within_its_attempt_is_nobody_ahead() {
            let (_keep, a, _) = $pair.await;
            common::fair::a_place_lapsed_within_its_attempt_is_nobody_ahead(a).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn one_clients_waiters_take_turns() {
            let (_keep, a, _) = $pair.await;
            common::fair::one_clients_waiters_take_turns(a).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn a_release_wakes_only_the_first_places_waiter() {
            let (_keep, a, b) = $pair.await;
            common::fair::a_release_wakes_only_the_first_places_waiter(a, b).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn a_waiter_asks_only_for_its_turn() {
            let (_keep, a, b) = $pair.await;
            common::fair::a_waiter_asks_only_for_its_turn(a, b).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn a_first_place_given_up_wakes_the_next() {
            let (_keep, a, b) = $pair.await;
            common::fair::a_first_place_given_up_wakes_the_next(a, b).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn a_lapsed_place_taken_again_goes_to_the_back() {
            let (_keep, a, b) = $pair.await;
            common::fair::a_lapsed_place_taken_again_goes_to_the_back(a, b).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn a_waiter_comes_back_before_its_place_lapses() {
            let (_keep, a, b) = $pair.await;
            common::fair::a_waiter_comes_back_before_its_place_lapses(a, b).await;
        }
    };
}
#[allow(unused_imports)]
pub(crate) use fair_tests;
