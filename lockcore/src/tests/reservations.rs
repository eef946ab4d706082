//! Refusals behind another waiter's reservation: what the reference store answers, and how
//! the client passes a wake-up on that may have been meant for the reservation's owner.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::driver::*;
use crate::memory::MemoryBackend;
use crate::*;

const BOUND: Duration = Duration::from_secs(10);

/// A client's view of the shared memory store with scripted answers: while `held_back` is
/// set, every attempt is refused as if another waiter's reservation kept the room; while
/// `late` is set, the answers of exclusive attempts (applied in the store already) wait for
/// the test to let them through. Counts attempts, applied exclusive attempts and waits.
#[derive(Debug)]
struct Scripted {
    inner: Arc<MemoryBackend>,
    held_back: AtomicBool,
    late: AtomicBool,
    gate: tokio::sync::Semaphore,
    attempts: Arc<AtomicUsize>,
    applied: AtomicUsize,
    waits: AtomicUsize,
    /// Declare FIFO fairness (a store that queues its waiters).
    fifo: AtomicBool,
    abandons: AtomicUsize,
    /// Every claim's answer and every wait, in order: "acquired", "held", "wait".
    log: std::sync::Mutex<Vec<&'static str>>,
}

impl Scripted {
    fn new(inner: &Arc<MemoryBackend>, attempts: &Arc<AtomicUsize>) -> Self {
        Scripted {
            inner: inner.clone(),
            held_back: AtomicBool::new(false),
            late: AtomicBool::new(false),
            gate: tokio::sync::Semaphore::new(0),
            attempts: attempts.clone(),
            applied: AtomicUsize::new(0),
            waits: AtomicUsize::new(0),
            fifo: AtomicBool::new(false),
            abandons: AtomicUsize::new(0),
            log: std::sync::Mutex::default(),
        }
    }

    /// Every attempt refused behind a reservation.
    fn held_back(inner: &Arc<MemoryBackend>, attempts: &Arc<AtomicUsize>) -> Arc<Self> {
        let s = Scripted::new(inner, attempts);
        s.held_back.store(true, Ordering::SeqCst);
        Arc::new(s)
    }

    /// Exclusive attempts answered only once [`let_through`](Self::let_through) is called.
    fn late_answers(inner: &Arc<MemoryBackend>) -> Arc<Self> {
        let s = Scripted::new(inner, &Arc::default());
        s.late.store(true, Ordering::SeqCst);
        Arc::new(s)
    }

    fn let_through(&self) {
        self.gate.add_permits(1_000);
    }

    fn refusal(&self) -> Option<AcquireOutcome> {
        self.attempts.fetch_add(1, Ordering::SeqCst);
        self.held_back.load(Ordering::SeqCst).then(|| {
            AcquireOutcome::Held(
                Contention::new(Some(Duration::from_secs(60)))
                    .with_hint(WaitHint::none().behind_reservation()),
            )
        })
    }

    async fn exclusive(
        &self,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<AcquireOutcome, LockError> {
        let outcome = self.inner.try_acquire(key, owner, ttl).await;
        self.applied.fetch_add(1, Ordering::SeqCst);
        if self.late.load(Ordering::SeqCst) {
            let _let_through = self.gate.acquire().await;
        }
        outcome
    }

    /// Waits until this client's request waits for a release (it has its place in line).
    async fn waiting(&self) {
        until("the request's wait", || {
            self.waits.load(Ordering::SeqCst) > 0
        })
        .await;
    }
}

#[async_trait::async_trait]
impl LockBackend for Scripted {
    fn name(&self) -> &'static str {
        "scripted"
    }
    fn capabilities(&self) -> Capabilities {
        let caps = self.inner.capabilities();
        if self.fifo.load(Ordering::SeqCst) {
            return caps.with_fairness(Fairness::Fifo);
        }
        // A store that keeps no places (the reference store marks long waits).
        caps.with_fairness(Fairness::None)
    }
    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<AcquireOutcome, LockError> {
        let outcome = match self.refusal() {
            Some(refused) => Ok(refused),
            None if request.claim.is_exclusive() => {
                self.exclusive(request.key, request.owner, request.ttl)
                    .await
            }
            None => self.inner.claim(request).await,
        };
        let said = match &outcome {
            Ok(AcquireOutcome::Acquired(_)) => "acquired",
            _ => "held",
        };
        self.log.lock().unwrap().push(said);
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
        self.waits.fetch_add(1, Ordering::SeqCst);
        self.log.lock().unwrap().push("wait");
        self.inner.wait_released(key, hint, place, max_wait).await
    }
    async fn force_release(&self, key: &LockKey) -> Result<ReleaseOutcome, LockError> {
        self.inner.force_release(key).await
    }
    async fn abandon(&self, key: &LockKey, owner: &Owner) -> Result<(), LockError> {
        self.abandons.fetch_add(1, Ordering::SeqCst);
        self.inner.abandon(key, owner).await
    }
    fn notifier(&self) -> Option<&ReleaseNotifier> {
        self.inner.notifier()
    }
}

async fn until(what: &str, done: impl Fn() -> bool) {
    tokio::time::timeout(BOUND, async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{what} never happened"));
}

/// A release wakes the first waiter of the process; when a reservation refuses it, the
/// wake-up goes on to the waiter behind it, which the room was kept for, at once.
#[tokio::test]
async fn a_wake_up_a_reservation_refused_reaches_the_waiter_behind() {
    let store = MemoryBackend::new();
    let attempts = Arc::new(AtomicUsize::new(0));
    let first = Scripted::held_back(&store, &attempts);
    let holder = LockClient::new(store.clone());
    let owner = LockClient::new(store.clone());
    let ttl = Duration::from_secs(30);
    let held = holder.lock("k").ttl(ttl).acquire().await.unwrap();
    let waiting_first = {
        let c = LockClient::new(first.clone());
        tokio::spawn(async move { c.lock("k").ttl(ttl).wait(BOUND).acquire().await })
    };
    first.waiting().await;
    // Second in line: the room will be kept for it.
    let waiting_owner = {
        let owner = owner.clone();
        tokio::spawn(async move { owner.lock("k").ttl(ttl).wait(BOUND).acquire().await })
    };
    tokio::time::timeout(BOUND, async {
        while owner.in_line("k") == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .unwrap();
    let released = Instant::now();
    held.release().await.unwrap();
    let g = waiting_owner.await.unwrap().unwrap();
    // Without the pass, it sleeps half its TTL (15 s), past the request's wait.
    assert!(
        released.elapsed() < Duration::from_secs(5),
        "{:?}",
        released.elapsed()
    );
    g.release().await.unwrap();
    waiting_first.abort();
}

/// Waiters that are all held back pass one wake-up down the line once: each tries once,
/// none wakes a waiter ahead of it, so they never wake each other round in a circle.
#[tokio::test]
async fn waiters_held_back_pass_a_wake_up_down_the_line_once() {
    let store = MemoryBackend::new();
    let attempts = Arc::new(AtomicUsize::new(0));
    let (holder, other) = (
        LockClient::new(store.clone()),
        LockClient::new(store.clone()),
    );
    let ttl = Duration::from_secs(30);
    // Both permits out; a release of one leaves the key held, so the waits block.
    let kept = holder.semaphore("k", 2).ttl(ttl).acquire().await.unwrap();
    let freed = other.semaphore("k", 2).ttl(ttl).acquire().await.unwrap();
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let b = Scripted::held_back(&store, &attempts);
        let c = LockClient::new(b.clone());
        tasks.push(tokio::spawn(async move {
            c.semaphore("k", 2).ttl(ttl).wait(BOUND).acquire().await
        }));
        b.waiting().await;
    }
    let before = attempts.load(Ordering::SeqCst);
    freed.release().await.unwrap();
    // Each of the three tries once; let any further wake-up show.
    tokio::time::timeout(BOUND, async {
        while attempts.load(Ordering::SeqCst) < before + 3 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("the wake-up was not passed down the line");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let tried = attempts.load(Ordering::SeqCst) - before;
    assert_eq!(
        tried, 3,
        "one release made the held-back waiters try {tried} times"
    );
    for t in tasks {
        t.abort();
    }
    kept.release().await.unwrap();
}

/// The reference store marks a refusal by a reservation alone, with the reservation's
/// remaining TTL, and waits on a key that is free but reserved instead of returning.
#[tokio::test]
async fn the_memory_store_marks_refusals_by_a_reservation_alone() {
    let store = MemoryBackend::new();
    let key = LockKey::new("k").unwrap();
    let (reader, writer, late) = (Owner::new("r"), Owner::new("w"), Owner::new("late"));
    let ttl = Duration::from_secs(30);
    let held = |o: AcquireOutcome| match o {
        AcquireOutcome::Held(c) => c,
        other => panic!("expected a refusal, got {other:?}"),
    };
    let shared = Claim::shared();
    store.try_claim(&key, &reader, ttl, shared).await.unwrap();
    // The writer waits for the reader: not behind a reservation (it records its own).
    let w = held(
        store
            .try_claim(&key, &writer, Duration::from_secs(4), Claim::exclusive())
            .await
            .unwrap(),
    );
    assert!(!w.hint.is_behind_reservation());
    assert!(w.remaining_ttl.unwrap() > Duration::from_secs(20), "{w:?}");
    // A later reader fits beside the reader, but the writer's reservation keeps it out.
    let r = held(store.try_claim(&key, &late, ttl, shared).await.unwrap());
    assert!(r.hint.is_behind_reservation());
    let left = r.remaining_ttl.unwrap();
    assert!(
        left <= Duration::from_secs(4) && left > Duration::from_secs(3),
        "{r:?}"
    );
    // The reader leaves: the key is free of leases, but reserved.
    store.release(&key, &reader).await.unwrap();
    let r = held(store.try_claim(&key, &late, ttl, shared).await.unwrap());
    assert!(r.hint.is_behind_reservation());
    let started = Instant::now();
    let waited = tokio::time::timeout(
        Duration::from_millis(200),
        store.wait_released(&key, &r.hint, u64::MAX, Duration::from_secs(5)),
    )
    .await;
    assert!(
        waited.is_err(),
        "returned after {:?} on a reserved key",
        started.elapsed()
    );
    // Without the mark, a free key ends the wait at once.
    let plain = WaitHint::none();
    tokio::time::timeout(
        Duration::from_secs(1),
        store.wait_released(&key, &plain, u64::MAX, Duration::from_secs(5)),
    )
    .await
    .expect("a free key did not end an unmarked wait")
    .unwrap();
}

/// Requests of one client for one key that arrive while the first is still on its first
/// attempt queue behind it instead of sending attempts of their own: a burst of waiters sends
/// one attempt (10,000 arriving together once sent 6,473 to PostgreSQL, and etcd stopped
/// answering). Once the key is free, each gets it in turn.
#[tokio::test]
async fn requests_arriving_during_the_first_attempt_queue_behind_it() {
    let store = MemoryBackend::new();
    let ttl = Duration::from_secs(30);
    let other = LockClient::new(store.clone());
    let holder = other.lock("k").ttl(ttl).acquire().await.unwrap();
    let late = Scripted::late_answers(&store);
    let client = LockClient::new(late.clone());
    let spawn = |c: LockClient| {
        tokio::spawn(async move { c.lock("k").ttl(ttl).wait(BOUND).acquire().await })
    };
    let first = spawn(client.clone());
    until("the first attempt", || {
        late.applied.load(Ordering::SeqCst) == 1
    })
    .await;
    let more: Vec<_> = (0..8).map(|_| spawn(client.clone())).collect();
    let key = LockKey::new("k").unwrap();
    until("the later requests in line", || {
        client.inner.lines.len(&key) == 9
    })
    .await;
    assert_eq!(
        late.applied.load(Ordering::SeqCst),
        1,
        "requests arriving during the first attempt sent attempts of their own"
    );
    late.let_through();
    holder.release().await.unwrap();
    first.await.unwrap().unwrap().release().await.unwrap();
    for r in more {
        r.await.unwrap().unwrap().release().await.unwrap();
    }
}

/// A store that queues its waiters gives a refused try (or a wait whose deadline passes)
/// a place: the request leaves it before answering, not in the clean-up task, which the caller's next request (or another
/// client's) could overtake and find the place still ahead. Elsewhere the clean-up stays in
/// the background, off the caller's path.
#[tokio::test]
async fn a_refused_try_leaves_a_fifo_queue_before_answering() {
    let inner = Arc::new(MemoryBackend::new());
    for fifo in [true, false] {
        let s = Scripted::held_back(&inner, &Arc::default());
        s.fifo.store(fifo, Ordering::SeqCst);
        let client = LockClient::new(s.clone());
        assert!(client.lock("k").try_acquire().await.unwrap().is_none());
        // No await since the answer: the clean-up task (current-thread runtime) has not run.
        let before = s.abandons.load(Ordering::SeqCst);
        assert_eq!(before, usize::from(fifo), "fifo: {fifo}");
        until("the clean-up", || s.abandons.load(Ordering::SeqCst) >= 1).await;
        // A wait whose deadline passes leaves the same way.
        let waited = client
            .lock("k")
            .wait(Duration::from_millis(30))
            .acquire()
            .await;
        assert!(
            matches!(waited, Err(LockError::Timeout { .. })),
            "{waited:?}"
        );
        let after = s.abandons.load(Ordering::SeqCst);
        assert_eq!(after, 1 + usize::from(fifo), "fifo: {fifo}");
        until("the clean-up", || s.abandons.load(Ordering::SeqCst) >= 2).await;
        client.shutdown().await;
    }
}

/// A backend's refusal says whether the store keeps a reservation for the owner
/// ([`WaitHint::with_reservation`]), and the client takes it at its word before a refused
/// try answers: a writer refused behind a reader takes its reservation back (else readers
/// would be held back by a request that had given up, until the background clean-up or the
/// TTL), and a reader refused behind another writer's reservation keeps none, so no round
/// trip takes one back. (No await between the answer and the count: on this one-thread
/// runtime the background clean-up has not run.)
#[tokio::test]
async fn a_refusal_says_whether_a_reservation_is_left_to_take_back() {
    let inner = Arc::new(MemoryBackend::new());
    let readers = LockClient::new(Arc::new(Scripted::new(&inner, &Arc::default())));
    let held = readers.lock("k").shared().acquire().await.unwrap();
    let s = Arc::new(Scripted::new(&inner, &Arc::default()));
    let c = LockClient::new(s.clone());
    assert!(c.lock("k").try_acquire().await.unwrap().is_none());
    assert_eq!(
        s.abandons.load(Ordering::SeqCst),
        1,
        "the refused writer's reservation was left behind"
    );
    assert!(readers
        .lock("k")
        .shared()
        .try_acquire()
        .await
        .unwrap()
        .is_some());
    // A writer that waits keeps its reservation; a reader refused behind it keeps none.
    let w = Arc::new(Scripted::new(&inner, &Arc::default()));
    let waiting = LockClient::new(w.clone());
    let writer = tokio::spawn(async move { waiting.lock("k").acquire().await });
    w.waiting().await;
    let before = s.abandons.load(Ordering::SeqCst);
    assert!(c.lock("k").shared().try_acquire().await.unwrap().is_none());
    assert_eq!(
        s.abandons.load(Ordering::SeqCst),
        before,
        "a round trip to take back a reservation the store did not keep"
    );
    held.release().await.unwrap();
    readers.shutdown().await;
    let granted = tokio::time::timeout(BOUND, writer).await.unwrap().unwrap();
    granted.unwrap().release().await.unwrap();
}

/// A backend that does not say whether it keeps a reservation for a refused claim: one that
/// is not exclusive is assumed to hold one, taken back before the refused try answers.
#[tokio::test]
async fn an_unsaid_reservation_of_a_shared_claim_is_taken_back() {
    let inner = Arc::new(MemoryBackend::new());
    let s = Scripted::held_back(&inner, &Arc::default());
    let client = LockClient::new(s.clone());
    assert!(client
        .lock("k")
        .shared()
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    assert_eq!(s.abandons.load(Ordering::SeqCst), 1);
    client.shutdown().await;
}

/// A store that queues its waiters is waited on from a place in its queue: the request
/// behind another of the same client's, once that one is granted, tries at once (which
/// queues it) instead of waiting first with no place to wait from (etcd then slept 50 ms
/// per wait: a hand-off took 200 ms).
#[tokio::test]
async fn behind_its_own_client_a_fifo_waiter_queues_before_it_waits() {
    let store = MemoryBackend::new();
    let s = Arc::new(Scripted::new(&store, &Arc::default()));
    s.fifo.store(true, Ordering::SeqCst);
    let holder = LockClient::new(store.clone());
    let held = holder.lock("k").acquire().await.unwrap();
    let client = LockClient::new(s.clone());
    let first = {
        let client = client.clone();
        tokio::spawn(async move { client.lock("k").wait(BOUND).acquire().await })
    };
    s.waiting().await;
    let second = {
        let client = client.clone();
        tokio::spawn(async move { client.lock("k").wait(BOUND).acquire().await })
    };
    // The second request waits in the client's line, behind the first.
    tokio::task::yield_now().await;
    held.release().await.unwrap();
    let first = tokio::time::timeout(BOUND, first)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    until("the second request's refusal", || {
        s.log
            .lock()
            .unwrap()
            .iter()
            .filter(|e| **e == "held")
            .count()
            >= 2
    })
    .await;
    {
        let log = s.log.lock().unwrap();
        let granted = log.iter().position(|e| *e == "acquired").unwrap();
        assert_eq!(
            log.get(granted + 1),
            Some(&"held"),
            "after the first request's grant, the second waited before it queued: {log:?}"
        );
    }
    first.release().await.unwrap();
    let second = tokio::time::timeout(BOUND, second)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    second.release().await.unwrap();
}
