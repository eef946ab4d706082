//! The extension point: what a backend module implements to get its rows.
//!
//! See `README.md` beside this file for how to add a backend and how its raw baseline
//! must be written.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lockcore::driver::BoxError;
use lockcore::driver::{
    async_trait, AcquireOutcome, Capabilities, ClaimRequest, ExtendOutcome, Renewal, SetOutcome,
    WaitHint, RENEWAL_BATCH,
};
use lockcore::{LockBackend, LockError, LockInfo, LockKey, Owner, ReleaseOutcome};

/// A store lockbench measures: one implementation per backend (or per configuration, e.g.
/// redlock with 3 and with 5 instances), in its backend's module file.
///
/// The bench builds every [`LockClient`](lockcore::LockClient) it needs with
/// [`backend`](Self::backend) (two of them for the hand-off case, as two processes would
/// open), and the baselines with [`raw`](Self::raw).
pub trait Target: Sized + Send + Sync + 'static {
    /// The backend's name: matched by the command-line filter, shown in the table and in
    /// `results.json` (`"memory"`, `"redis"`, `"postgres"`, `"redlock5"`, …).
    const NAME: &'static str;

    /// The hand-written baselines (an enum when a target has several kinds).
    type Raw: RawLock;

    /// Connects to the store once per run (e.g. reading `DISTLOCK_TEST_REDIS_URL`). A
    /// missing server or variable is an error that says how to start it
    /// (`scripts/servers.sh start`), never a silent skip.
    fn setup() -> impl Future<Output = Result<Self, BoxError>> + Send;

    /// A new backend instance with the driver's default connection/pool settings, as an
    /// independent process would open it. Instances from one target share one store.
    fn backend(&self) -> impl Future<Output = Result<Arc<dyn LockBackend>, BoxError>> + Send;

    /// The raw baselines, each on a new connection/pool with the same settings as
    /// [`backend`](Self::backend), as `(name, baseline)`. The first is the primary one: the
    /// `ratio` of the uncontended and concurrent rows is taken against it; the others get
    /// ratios in the `vs` field. A baseline named `raw` gives the rows `uncontended_raw` and
    /// `concurrent64_raw`; one named `raw_scripts` gives `uncontended_raw_scripts`, and so
    /// on. Called once per client of the hand-off case too, so it must return the same
    /// names in the same order every time.
    fn raw(&self) -> impl Future<Output = Result<Vec<(&'static str, Self::Raw)>, BoxError>> + Send;

    /// The URL another process opens the same store with (`distlock::connect_backend`), for
    /// the case between processes; `None` for a store that lives in this process.
    fn url(&self) -> Option<String> {
        None
    }
}

/// `url` with the query parameter `pair` (`name=value`) added.
pub fn with_param(url: &str, pair: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{pair}")
}

/// A lock written by hand against the store's own client, without lockcore: what a user of
/// the store would write instead of distlock. One acquire attempt and one owner-checked
/// release, each the round trips a hand-written lock makes (redis: `SET key owner NX PX
/// ttl`, then `EVALSHA` of a compare-and-delete script).
///
/// `key` and `owner` are lockcore types only to hand over a validated name and a fresh
/// 128-bit owner value (`owner.token().as_bytes()` / `to_hex()`); how they are stored is up
/// to the implementation.
pub trait RawLock: Send + Sync + 'static {
    /// One attempt to take `key` for `owner` with `ttl`: `true` if taken, `false` if held.
    fn try_acquire(
        &self,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
    ) -> impl Future<Output = Result<bool, BoxError>> + Send;

    /// Owner-checked release: `true` if this owner held `key` and it is free now.
    fn release(
        &self,
        key: &LockKey,
        owner: &Owner,
    ) -> impl Future<Output = Result<bool, BoxError>> + Send;

    /// Whether this baseline also runs in the hand-off case, waiting with
    /// [`wait_released`](Self::wait_released) between failed tries, or with its own
    /// [`acquire_waiting`](Self::acquire_waiting) where it [`waits_itself`](Self::waits_itself)
    /// (row `handoff_NAME`; its name must then not be `raw`, which names the hand-off
    /// case's loop over the backend trait object). Default: no.
    fn handoff(&self) -> bool {
        false
    }

    /// Whether the hand-off case takes the lock with [`acquire_waiting`](Self::acquire_waiting)
    /// — a peer crate's own waiting acquire, or the waiting loop its user has to write —
    /// instead of `try_acquire` + `wait_released`. Default: no.
    fn waits_itself(&self) -> bool {
        false
    }

    /// Hand-off case, where the baseline [`waits_itself`](Self::waits_itself): takes `key`
    /// for `owner`, waiting at most `max_wait`. `Some(failed tries)` once taken (the
    /// attempts answered "held" on the way, 0 where the store itself waits, e.g. a blocking
    /// `pg_advisory_lock`), `None` if `max_wait` passed first.
    fn acquire_waiting(
        &self,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
        max_wait: Duration,
    ) -> impl Future<Output = Result<Option<u64>, BoxError>> + Send {
        let _ = (key, owner, ttl, max_wait);
        std::future::ready(Err("this baseline does not wait by itself".into()))
    }

    /// Hand-off case: resolves when `key` is probably free, or after `max_wait` — the
    /// store's own signal written by hand (pub/sub, LISTEN/NOTIFY, a watch) or one poll
    /// interval. Like `LockBackend::wait_released` it must not sleep through a release
    /// that happened since the failed try (subscribe, then re-check).
    fn wait_released(
        &self,
        key: &LockKey,
        max_wait: Duration,
    ) -> impl Future<Output = Result<(), BoxError>> + Send {
        let _ = (key, max_wait);
        std::future::ready(Err("this baseline does not implement wait_released".into()))
    }
}

/// Counts the exclusive claims that were answered `Held` (the failed tries of the hand-off
/// case; it wraps both sides of that case alike, so the ratio is not skewed) and the store
/// requests of renewals (the scale case): per `renew`, one per batch on a backend that
/// declares [`batched_renewals`](lockcore::driver::Capabilities::batched_renewals), else one
/// per renewal.
///
/// It takes exclusive claims only (others are
/// [`claims_unsupported`](LockError::claims_unsupported)), does not pass
/// [`abandon`](LockBackend::abandon) on, and shows lockcore no
/// [`notifier`](LockBackend::notifier): the cases it measures use the exclusive lock.
#[derive(Debug)]
pub struct CountingBackend {
    inner: Arc<dyn LockBackend>,
    held: AtomicU64,
    extends: AtomicU64,
    extended: AtomicU64,
    /// Renewals answered `NotHeld`, and renewals failed (an error for the renewal or for
    /// its whole batch).
    not_held: AtomicU64,
    failed: AtomicU64,
    /// The longest renewal request (a batch), in microseconds.
    slowest_us: AtomicU64,
    /// The last renewal error.
    last_error: std::sync::Mutex<Option<String>>,
    /// `wait_released` calls in progress, and those that returned.
    waiting: AtomicU64,
    wakeups: AtomicU64,
    /// Claims in progress, and all of them.
    attempting: AtomicU64,
    attempts: AtomicU64,
}

/// What the renewals since the last [`CountingBackend::take_renewals`] came to.
#[derive(Clone, Debug, Default)]
pub struct Renewals {
    /// Store requests (one per batch of up to [`RENEWAL_BATCH`] on a batching backend).
    pub requests: u64,
    /// Renewals answered `Extended`.
    pub extended: u64,
    /// Renewals answered `NotHeld`.
    pub not_held: u64,
    /// Renewals that failed.
    pub failed: u64,
    /// The longest request.
    pub slowest: Duration,
    /// The last error, if any renewal failed.
    pub last_error: Option<String>,
}

impl CountingBackend {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn LockBackend>) -> Arc<Self> {
        Arc::new(CountingBackend {
            inner,
            held: AtomicU64::new(0),
            extends: AtomicU64::new(0),
            extended: AtomicU64::new(0),
            not_held: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            slowest_us: AtomicU64::new(0),
            last_error: std::sync::Mutex::new(None),
            waiting: AtomicU64::new(0),
            wakeups: AtomicU64::new(0),
            attempting: AtomicU64::new(0),
            attempts: AtomicU64::new(0),
        })
    }

    /// The renewals since the last call (and resets the counts).
    pub fn take_renewals(&self) -> Renewals {
        Renewals {
            requests: self.extends.swap(0, Ordering::Relaxed),
            extended: self.extended.swap(0, Ordering::Relaxed),
            not_held: self.not_held.swap(0, Ordering::Relaxed),
            failed: self.failed.swap(0, Ordering::Relaxed),
            slowest: Duration::from_micros(self.slowest_us.swap(0, Ordering::Relaxed)),
            last_error: self.last_error().take(),
        }
    }

    fn last_error(&self) -> std::sync::MutexGuard<'_, Option<String>> {
        self.last_error.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts the outcomes of one renewal request that took `took`.
    fn count(&self, outcomes: &[Result<ExtendOutcome, LockError>], took: Duration) {
        for o in outcomes {
            let counter = match o {
                Ok(ExtendOutcome::Extended(_)) => &self.extended,
                Ok(_) => &self.not_held,
                Err(e) => {
                    *self.last_error() = Some(lockcore::ErrorChain(e).to_string());
                    &self.failed
                }
            };
            counter.fetch_add(1, Ordering::Relaxed);
        }
        let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        self.slowest_us.fetch_max(us, Ordering::Relaxed);
    }

    /// `wait_released` calls in progress.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::SeqCst) as usize
    }

    /// Claims in progress, and all of them so far.
    pub fn attempts(&self) -> (usize, u64) {
        (
            self.attempting.load(Ordering::SeqCst) as usize,
            self.attempts.load(Ordering::SeqCst),
        )
    }

    /// `wait_released` calls that returned since the last call (and resets the count).
    pub fn take_wakeups(&self) -> u64 {
        self.wakeups.swap(0, Ordering::SeqCst)
    }

    /// Claims answered `Held` since the last call (and resets the count).
    pub fn take_held(&self) -> u64 {
        self.held.swap(0, Ordering::Relaxed)
    }
}

#[async_trait]
impl LockBackend for CountingBackend {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<AcquireOutcome, LockError> {
        if !request.claim.is_exclusive() {
            return Err(LockError::claims_unsupported(self.name(), &request.claim));
        }
        self.attempts.fetch_add(1, Ordering::SeqCst);
        self.attempting.fetch_add(1, Ordering::SeqCst);
        // Counted down however the attempt ends.
        struct Attempting<'a>(&'a AtomicU64);
        impl Drop for Attempting<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        let _attempting = Attempting(&self.attempting);
        let outcome = self.inner.claim(request).await?;
        if matches!(outcome, AcquireOutcome::Held(_)) {
            self.held.fetch_add(1, Ordering::Relaxed);
        }
        Ok(outcome)
    }

    /// A set in one request counts as one attempt.
    async fn claim_all(
        &self,
        requests: &[ClaimRequest<'_>],
    ) -> Result<Option<SetOutcome>, LockError> {
        if let Some(shared) = requests.iter().find(|r| !r.claim.is_exclusive()) {
            return Err(LockError::claims_unsupported(self.name(), &shared.claim));
        }
        self.attempts.fetch_add(1, Ordering::SeqCst);
        let outcome = self.inner.claim_all(requests).await?;
        if matches!(outcome, Some(SetOutcome::Held { .. })) {
            self.held.fetch_add(1, Ordering::Relaxed);
        }
        Ok(outcome)
    }

    async fn release(&self, key: &LockKey, owner: &Owner) -> Result<ReleaseOutcome, LockError> {
        self.inner.release(key, owner).await
    }

    async fn renew(
        &self,
        renewals: &[Renewal<'_>],
    ) -> Result<Vec<Result<ExtendOutcome, LockError>>, LockError> {
        // A backend that batches sends one request per batch; the others, one per renewal.
        let requests = if self.inner.capabilities().batched_renewals {
            renewals.len().div_ceil(RENEWAL_BATCH)
        } else {
            renewals.len()
        };
        self.extends.fetch_add(requests as u64, Ordering::Relaxed);
        let started = std::time::Instant::now();
        match self.inner.renew(renewals).await {
            Ok(outcomes) => {
                self.count(&outcomes, started.elapsed());
                Ok(outcomes)
            }
            Err(e) => {
                self.failed
                    .fetch_add(renewals.len() as u64, Ordering::Relaxed);
                *self.last_error() = Some(lockcore::ErrorChain(&e).to_string());
                Err(e)
            }
        }
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
        self.waiting.fetch_add(1, Ordering::SeqCst);
        // Counted down however the wait ends (a cancelled wait included).
        struct Waiting<'a>(&'a CountingBackend);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.waiting.fetch_sub(1, Ordering::SeqCst);
                self.0.wakeups.fetch_add(1, Ordering::SeqCst);
            }
        }
        let _waiting = Waiting(self);
        self.inner.wait_released(key, hint, place, max_wait).await
    }

    async fn force_release(&self, key: &LockKey) -> Result<ReleaseOutcome, LockError> {
        self.inner.force_release(key).await
    }

    async fn shutdown(&self) {
        self.inner.shutdown().await
    }
}
