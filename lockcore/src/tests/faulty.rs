//! A memory store with switchable faults, for lockcore's own tests: the public
//! [`TestStore`]'s faults and counts, and the few faults only lockcore's tests need.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::memory::MemoryBackend;
use crate::testing::TestStore;
use crate::{
    AcquireOutcome, Capabilities, ClaimRequest, Contention, ExtendOutcome, LockBackend, LockError,
    LockInfo, LockKey, Owner, ReleaseOutcome, Renewal, WaitHint,
};

/// Fails operations on demand, like a store that restarts or goes away; counts what
/// reached it.
#[derive(Debug)]
pub(crate) struct Faulty {
    pub(crate) inner: Arc<MemoryBackend>,
    /// `inner` behind the public test store: every operation goes through it.
    pub(crate) test: Arc<TestStore>,
    /// How many of the next acquisitions fail.
    pub(crate) acquire_failures: AtomicUsize,
    /// Whether renewals fail.
    pub(crate) extend_fails: AtomicBool,
    /// Whether releases fail.
    pub(crate) release_fails: AtomicBool,
    /// How long each release takes, in milliseconds.
    pub(crate) release_millis: AtomicUsize,
    /// How many of the next acquisitions answer a split vote: held by nobody, retry after
    /// [`SPLIT_VOTE_PAUSE`].
    pub(crate) split_votes: AtomicUsize,
    /// How many of the next acquisitions are applied but answered only once the lease they
    /// grant has run out (a store too slow for the TTL).
    pub(crate) late_grants: AtomicUsize,
    /// Declares no fencing tokens (set before a client is built: clients read the
    /// capabilities once).
    pub(crate) unfenced: AtomicBool,
    /// The size of every renewal batch that reached the store.
    pub(crate) batches: std::sync::Mutex<Vec<usize>>,
    /// Renewal batches answer one outcome fewer than they were sent renewals.
    pub(crate) short_batches: AtomicBool,
    /// How long each renewal batch takes, in milliseconds.
    pub(crate) batch_millis: AtomicUsize,
    /// Renewal batches in flight now, and the most there ever were at once.
    pub(crate) batches_in_flight: AtomicUsize,
    pub(crate) most_batches_in_flight: AtomicUsize,
    /// Claims are applied, then answered only when [`gate`](Self::gate) lets them (one
    /// `notify_one` each): an answer the test delays as long as it likes.
    pub(crate) gated: AtomicBool,
    pub(crate) gate: tokio::sync::Notify,
    /// Claims that reached the gate.
    pub(crate) at_gate: AtomicUsize,
}

/// The pause a split vote asks for.
pub(crate) const SPLIT_VOTE_PAUSE: Duration = Duration::from_millis(40);

impl Faulty {
    pub(crate) fn new() -> Arc<Self> {
        let inner = MemoryBackend::new();
        Arc::new(Faulty {
            test: TestStore::wrap(inner.clone()),
            inner,
            acquire_failures: AtomicUsize::new(0),
            extend_fails: AtomicBool::new(false),
            release_fails: AtomicBool::new(false),
            release_millis: AtomicUsize::new(0),
            split_votes: AtomicUsize::new(0),
            late_grants: AtomicUsize::new(0),
            unfenced: AtomicBool::new(false),
            batches: std::sync::Mutex::new(Vec::new()),
            short_batches: AtomicBool::new(false),
            batch_millis: AtomicUsize::new(0),
            batches_in_flight: AtomicUsize::new(0),
            most_batches_in_flight: AtomicUsize::new(0),
            gated: AtomicBool::new(false),
            gate: tokio::sync::Notify::new(),
            at_gate: AtomicUsize::new(0),
        })
    }

    /// Releases that reached the store (failed or not).
    pub(crate) fn releases(&self) -> u64 {
        self.test.ops().releases
    }

    /// Calls to `wait_released`.
    pub(crate) fn waits(&self) -> u64 {
        self.test.ops().waits
    }

    /// Waiters that gave up.
    pub(crate) fn abandoned(&self) -> u64 {
        self.test.ops().abandons
    }

    /// A failure whose outcome is unknown: the answer was lost.
    fn failure(&self) -> LockError {
        LockError::unavailable("faulty", "timed out waiting for the answer")
    }
}

#[async_trait::async_trait]
impl LockBackend for Faulty {
    fn name(&self) -> &'static str {
        "faulty"
    }
    fn capabilities(&self) -> Capabilities {
        // Exclusive locks only: it stands for a backend without shared claims.
        let caps = self.inner.capabilities().with_claims(false, false);
        if self.unfenced.load(Ordering::SeqCst) {
            caps.with_fencing(crate::FencingGuarantee::None)
        } else {
            caps
        }
    }
    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<AcquireOutcome, LockError> {
        let take = self
            .acquire_failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        if take.is_ok() {
            return Err(self.failure());
        }
        let split = self
            .split_votes
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        if split.is_ok() {
            let hint = WaitHint::retry_after(SPLIT_VOTE_PAUSE);
            return Ok(AcquireOutcome::Held(Contention::new(None).with_hint(hint)));
        }
        let late = self
            .late_grants
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        let outcome = self.test.claim(request).await;
        if self.gated.load(Ordering::SeqCst) {
            self.at_gate.fetch_add(1, Ordering::SeqCst);
            self.gate.notified().await;
        }
        if late.is_ok() {
            tokio::time::sleep(request.ttl + Duration::from_millis(5)).await;
        }
        outcome
    }
    async fn release(&self, key: &LockKey, owner: &Owner) -> Result<ReleaseOutcome, LockError> {
        let millis = self.release_millis.load(Ordering::SeqCst);
        if millis > 0 {
            tokio::time::sleep(Duration::from_millis(millis as u64)).await;
        }
        if self.release_fails.load(Ordering::SeqCst) {
            return Err(self.failure());
        }
        self.test.release(key, owner).await
    }
    async fn renew(
        &self,
        renewals: &[Renewal<'_>],
    ) -> Result<Vec<Result<ExtendOutcome, LockError>>, LockError> {
        self.batches
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(renewals.len());
        let now = self.batches_in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_batches_in_flight.fetch_max(now, Ordering::SeqCst);
        let millis = self.batch_millis.load(Ordering::SeqCst);
        if millis > 0 {
            tokio::time::sleep(Duration::from_millis(millis as u64)).await;
        }
        self.batches_in_flight.fetch_sub(1, Ordering::SeqCst);
        if self.extend_fails.load(Ordering::SeqCst) {
            return Err(self.failure());
        }
        let mut answers = self.test.renew(renewals).await?;
        if self.short_batches.load(Ordering::SeqCst) {
            answers.pop();
        }
        Ok(answers)
    }
    async fn holders(&self, key: &LockKey) -> Result<Vec<LockInfo>, LockError> {
        self.test.holders(key).await
    }
    async fn wait_released(
        &self,
        key: &LockKey,
        hint: &WaitHint,
        place: u64,
        max: Duration,
    ) -> Result<(), LockError> {
        self.test.wait_released(key, hint, place, max).await
    }
    fn notifier(&self) -> Option<&crate::notify::ReleaseNotifier> {
        self.test.notifier()
    }
    async fn force_release(&self, key: &LockKey) -> Result<ReleaseOutcome, LockError> {
        self.test.force_release(key).await
    }
    async fn abandon(&self, key: &LockKey, owner: &Owner) -> Result<(), LockError> {
        self.test.abandon(key, owner).await
    }
}
