//! A store your tests steer: lost locks, failing renewals, a store that goes away, answers
//! held back, and time that a test controls (feature `testing`).
//!
//! [`TestStore`] is a [`LockBackend`]: give it to [`LockClient::new`](crate::LockClient::new) and hand that client
//! to the code under test, exactly as production code gets its client. The test then
//! makes things happen to the locks that code holds:
//!
//! | to test what happens when… | call |
//! |---|---|
//! | one hold is lost (another process took the key, an operator broke the lock) | [`lose`](TestStore::lose) |
//! | a key's leases run out now | [`expire`](TestStore::expire) |
//! | renewals fail, or come back late | [`fail_renewals`](TestStore::fail_renewals), [`delay_renewals`](TestStore::delay_renewals) |
//! | the store goes away, then comes back | [`stop`](TestStore::stop), [`start`](TestStore::start) |
//! | the store applies requests but its answers are late | [`pause`](TestStore::pause), [`answers_held`](TestStore::answers_held), [`resume`](TestStore::resume) |
//! | how many requests the code sent | [`ops`](TestStore::ops) |
//!
//! # Time
//!
//! [`TestStore::new`] keeps its leases on tokio's clock, and lockcore times everything
//! about them on that clock too: lease expiry, TTLs, renewals, the watchdog's
//! [`lost`](crate::LockHandle::lost) deadline, `wait` deadlines, retry pauses and
//! [`valid_until`](crate::LockHandle::valid_until). Under
//! `#[tokio::test(start_paused = true)]` (tokio's `test-util` feature, on a current-thread
//! runtime) a test therefore goes through a 30-second lease in microseconds: the runtime
//! jumps to the next timer whenever every task waits.
//!
//! What does not follow tokio's clock: `std::time::Instant::now()` and
//! `std::thread::sleep` (compare [`valid_until`](crate::LockHandle::valid_until) with
//! `tokio::time::Instant::now().into_std()`), the stores of the other drivers, whose
//! leases expire on the store's own clock, and a plain [`MemoryBackend`], which keeps the
//! monotonic clock. Everything lockcore times for those follows the monotonic clock too,
//! so pausing tokio's clock neither expires nor renews their leases. A
//! [`TestStore::wrap`]ped backend keeps its own clock; its faults work all the same.
//!
//! # Examples
//!
//! A job that must stop when its lock is lost:
//!
//! ```
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), distlock_core::LockError> {
//! use std::time::Duration;
//! use distlock_core::{testing::TestStore, LockClient};
//!
//! let store = TestStore::new();
//! let locks = LockClient::new(store.clone());
//! let guard = locks.lock("report").ttl(Duration::from_secs(30)).acquire().await?;
//!
//! store.lose(&guard).await?;
//! // The watchdog learns it at its next renewal (ttl/3 later on tokio's clock; at once
//! // in wall time, since the clock is paused).
//! guard.lost().await;
//! assert!(guard.is_lost());
//! assert_eq!(store.ops().renewals, 1);
//! # Ok(()) }
//! ```

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::memory::MemoryBackend;
use crate::notify::ReleaseNotifier;
use crate::{
    AcquireOutcome, Capabilities, ClaimRequest, ExtendOutcome, LockBackend, LockError, LockHandle,
    LockInfo, LockKey, Owner, ReleaseOutcome, Renewal, SetOutcome, WaitHint,
};

/// A [`LockBackend`] that a test steers; see the [module](self) documentation.
///
/// Every operation first counts in [`ops`](Self::ops); then, in this order, a
/// [`stop`](Self::stop)ped store refuses it, renewal faults apply, the operation reaches
/// the wrapped store, and a [`pause`](Self::pause)d store holds its answer.
pub struct TestStore {
    inner: Arc<dyn LockBackend>,
    caps: Capabilities,
    stopped: AtomicBool,
    paused: tokio::sync::watch::Sender<bool>,
    /// Answers held back by the pause right now.
    held: tokio::sync::watch::Sender<usize>,
    renewal_faults: Mutex<RenewalFaults>,
    counts: Counts,
}

/// What happens to the next renewals.
#[derive(Debug, Default)]
struct RenewalFaults {
    /// Renewals still to fail.
    fail: usize,
    /// Renewal requests still to delay, and by how much.
    delay: usize,
    delay_by: Duration,
}

#[derive(Debug, Default)]
struct Counts {
    claims: AtomicU64,
    set_claims: AtomicU64,
    releases: AtomicU64,
    renewals: AtomicU64,
    renew_requests: AtomicU64,
    holders: AtomicU64,
    waits: AtomicU64,
    abandons: AtomicU64,
    force_releases: AtomicU64,
}

/// How many operations of each kind a [`TestStore`] has received, whatever became of them
/// (failed by a fault, refused while stopped, or answered).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Ops {
    /// Claims: every acquisition attempt, exclusive, shared or permits.
    pub claims: u64,
    /// Claims of a whole set of keys in one request (see
    /// [`LockBackend::claim_all`]).
    pub set_claims: u64,
    /// Owner-checked releases.
    pub releases: u64,
    /// Lease renewals (a renewal request can carry several).
    pub renewals: u64,
    /// Renewal requests.
    pub renew_requests: u64,
    /// Reads of a key's holders (`inspect`, `holders`).
    pub holders: u64,
    /// Waits for a release.
    pub waits: u64,
    /// Waiters that gave up.
    pub abandons: u64,
    /// Forced releases (including [`TestStore::expire`]).
    pub force_releases: u64,
}

impl std::fmt::Debug for TestStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestStore")
            .field("inner", &self.inner.name())
            .field("stopped", &self.stopped.load(Ordering::SeqCst))
            .field("paused", &*self.paused.borrow())
            .finish_non_exhaustive()
    }
}

impl TestStore {
    /// A fresh in-memory store (a [`MemoryBackend`]) whose leases follow tokio's clock,
    /// as lockcore's timing of them does (see [Time](self#time)).
    pub fn new() -> Arc<TestStore> {
        let inner = MemoryBackend::on_tokio_clock();
        let caps = inner.capabilities();
        Self::with_caps(inner, caps)
    }

    /// Puts the faults of a test store in front of `backend`: any backend, a real store's
    /// included. Its leases keep the backend's own clock.
    pub fn wrap(backend: Arc<dyn LockBackend>) -> Arc<TestStore> {
        let caps = backend.capabilities();
        Self::with_caps(backend, caps)
    }

    fn with_caps(inner: Arc<dyn LockBackend>, caps: Capabilities) -> Arc<TestStore> {
        Arc::new(TestStore {
            inner,
            caps,
            stopped: AtomicBool::new(false),
            paused: tokio::sync::watch::Sender::new(false),
            held: tokio::sync::watch::Sender::new(0),
            renewal_faults: Mutex::new(RenewalFaults::default()),
            counts: Counts::default(),
        })
    }

    /// The store behind the faults.
    pub fn inner(&self) -> &Arc<dyn LockBackend> {
        &self.inner
    }

    /// Makes `hold` lost now: the store drops that one lease (other holders of a shared
    /// key keep theirs), as when an operator breaks it or another process takes the key
    /// over. The holder is not told; its watchdog learns it at the next renewal and fires
    /// [`lost`](LockHandle::lost), as it would with a real store.
    ///
    /// Returns whether the lease was still held.
    ///
    /// # Errors
    ///
    /// The wrapped store's, if it fails to drop the lease.
    pub async fn lose(&self, hold: &LockHandle) -> Result<bool, LockError> {
        let outcome = self.inner.release(hold.key(), hold.owner()).await?;
        Ok(outcome == ReleaseOutcome::Released)
    }

    /// Ends every lease on `key` now, as if their TTLs had run out: another client can
    /// take the key at once (with a higher fencing token), and the holders learn it at
    /// their next renewal. Counts as a forced release in [`ops`](Self::ops).
    ///
    /// Returns whether any lease was live.
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidKey`] for an invalid key; the wrapped store's failure.
    pub async fn expire(&self, key: &str) -> Result<bool, LockError> {
        let key = LockKey::new(key)?;
        self.counts.force_releases.fetch_add(1, Ordering::SeqCst);
        let outcome = self.inner.force_release(&key).await?;
        Ok(outcome == ReleaseOutcome::Released)
    }

    /// The next `n` lease renewals fail with [`LockError::Unavailable`] without reaching
    /// the store (replacing any count set before: `fail_renewals(0)` ends the failures,
    /// `usize::MAX` fails them all). The holder retries until the lease must be assumed
    /// lost, shortly before it ends; a renewal that gets through before then keeps it.
    pub fn fail_renewals(&self, n: usize) {
        self.faults().fail = n;
    }

    /// The next `n` renewal requests reach the store `by` late (replacing what was set
    /// before). A request the holder gives up on meanwhile (after a quarter of the TTL)
    /// never reaches it.
    pub fn delay_renewals(&self, n: usize, by: Duration) {
        let mut faults = self.faults();
        faults.delay = n;
        faults.delay_by = by;
    }

    /// Every operation from now on fails with [`LockError::Unavailable`], as with a store
    /// that refuses connections: nothing reaches the store, so nothing is applied.
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
    }

    /// Operations reach the store again, with whatever it kept meanwhile (leases that ran
    /// out while it was stopped are gone).
    pub fn start(&self) {
        self.stopped.store(false, Ordering::SeqCst);
    }

    /// From now on, operations are applied by the store but their answers are held until
    /// [`resume`](Self::resume): a slow network on the way back. A caller that gives up
    /// meanwhile (a dropped `acquire`, a deadline) has had its request applied anyway.
    pub fn pause(&self) {
        self.paused.send_replace(true);
    }

    /// Lets every held answer go, and answers at once again.
    pub fn resume(&self) {
        self.paused.send_replace(false);
    }

    /// Resolves once at least `n` answers are held by [`pause`](Self::pause): the moment
    /// to cancel, time out or inspect, knowing the store has applied those requests.
    pub async fn answers_held(&self, n: usize) {
        let mut held = self.held.subscribe();
        // The sender lives as long as `self`: the wait ends only by the count.
        let _ = held.wait_for(|held| *held >= n).await;
    }

    /// How many operations of each kind the store has received.
    pub fn ops(&self) -> Ops {
        let c = &self.counts;
        let read = |n: &AtomicU64| n.load(Ordering::SeqCst);
        Ops {
            claims: read(&c.claims),
            set_claims: read(&c.set_claims),
            releases: read(&c.releases),
            renewals: read(&c.renewals),
            renew_requests: read(&c.renew_requests),
            holders: read(&c.holders),
            waits: read(&c.waits),
            abandons: read(&c.abandons),
            force_releases: read(&c.force_releases),
        }
    }

    fn faults(&self) -> std::sync::MutexGuard<'_, RenewalFaults> {
        self.renewal_faults
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Counts one operation in `counter`, then refuses it if the store is stopped.
    fn receive(&self, counter: &AtomicU64) -> Result<(), LockError> {
        counter.fetch_add(1, Ordering::SeqCst);
        if self.stopped.load(Ordering::SeqCst) {
            return Err(LockError::unavailable_unsent(
                self.inner.name(),
                std::io::Error::new(
                    std::io::ErrorKind::ConnectionRefused,
                    "the test store is stopped",
                ),
            ));
        }
        Ok(())
    }

    /// Hands `answer` back, after the pause if there is one.
    async fn answer<T>(&self, answer: T) -> T {
        if *self.paused.borrow() {
            let mut paused = self.paused.subscribe();
            self.held.send_modify(|h| *h += 1);
            // Counted down even if the caller stops waiting for the answer.
            let _held = HeldAnswer(&self.held);
            let _ = paused.wait_for(|paused| !*paused).await;
        }
        answer
    }

    fn failed_renewal(&self) -> LockError {
        LockError::unavailable(self.inner.name(), "the test store failed the renewal")
    }
}

/// One answer held by the pause, counted down when it goes (or is dropped).
struct HeldAnswer<'a>(&'a tokio::sync::watch::Sender<usize>);

impl Drop for HeldAnswer<'_> {
    fn drop(&mut self) {
        self.0.send_modify(|h| *h -= 1);
    }
}

#[async_trait::async_trait]
impl LockBackend for TestStore {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn capabilities(&self) -> Capabilities {
        self.caps
    }

    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<AcquireOutcome, LockError> {
        self.receive(&self.counts.claims)?;
        let outcome = self.inner.claim(request).await;
        self.answer(outcome).await
    }

    async fn claim_all(
        &self,
        requests: &[ClaimRequest<'_>],
    ) -> Result<Option<SetOutcome>, LockError> {
        self.receive(&self.counts.set_claims)?;
        let outcome = self.inner.claim_all(requests).await;
        self.answer(outcome).await
    }

    async fn release(&self, key: &LockKey, owner: &Owner) -> Result<ReleaseOutcome, LockError> {
        self.receive(&self.counts.releases)?;
        let outcome = self.inner.release(key, owner).await;
        self.answer(outcome).await
    }

    async fn renew(
        &self,
        renewals: &[Renewal<'_>],
    ) -> Result<Vec<Result<ExtendOutcome, LockError>>, LockError> {
        self.counts
            .renewals
            .fetch_add(renewals.len() as u64, Ordering::SeqCst);
        self.receive(&self.counts.renew_requests)?;
        let (failing, delay) = {
            let mut faults = self.faults();
            let failing: Vec<bool> = renewals
                .iter()
                .map(|_| match faults.fail.checked_sub(1) {
                    Some(left) => {
                        faults.fail = left;
                        true
                    }
                    None => false,
                })
                .collect();
            let delay = match faults.delay.checked_sub(1) {
                Some(left) => {
                    faults.delay = left;
                    Some(faults.delay_by)
                }
                None => None,
            };
            (failing, delay)
        };
        if let Some(delay) = delay {
            tokio::time::sleep(delay).await;
        }
        let passing: Vec<Renewal<'_>> = renewals
            .iter()
            .zip(&failing)
            .filter(|(_, fails)| !**fails)
            .map(|(renewal, _)| *renewal)
            .collect();
        let outcome = if passing.is_empty() {
            Ok(Vec::new())
        } else {
            self.inner.renew(&passing).await
        };
        let outcome = outcome.map(|answers| {
            let mut answers = answers.into_iter();
            failing
                .iter()
                .map(|fails| match fails {
                    true => Err(self.failed_renewal()),
                    false => answers.next().unwrap_or_else(|| {
                        Err(LockError::backend(
                            self.inner.name(),
                            "the store answered fewer outcomes than renewals",
                        ))
                    }),
                })
                .collect()
        });
        self.answer(outcome).await
    }

    async fn holders(&self, key: &LockKey) -> Result<Vec<LockInfo>, LockError> {
        self.receive(&self.counts.holders)?;
        let outcome = self.inner.holders(key).await;
        self.answer(outcome).await
    }

    async fn wait_released(
        &self,
        key: &LockKey,
        hint: &WaitHint,
        place: u64,
        max_wait: Duration,
    ) -> Result<(), LockError> {
        self.receive(&self.counts.waits)?;
        let outcome = self.inner.wait_released(key, hint, place, max_wait).await;
        self.answer(outcome).await
    }

    async fn abandon(&self, key: &LockKey, owner: &Owner) -> Result<(), LockError> {
        self.receive(&self.counts.abandons)?;
        let outcome = self.inner.abandon(key, owner).await;
        self.answer(outcome).await
    }

    async fn force_release(&self, key: &LockKey) -> Result<ReleaseOutcome, LockError> {
        self.receive(&self.counts.force_releases)?;
        let outcome = self.inner.force_release(key).await;
        self.answer(outcome).await
    }

    fn notifier(&self) -> Option<&ReleaseNotifier> {
        self.inner.notifier()
    }

    async fn shutdown(&self) {
        self.inner.shutdown().await
    }
}
