//! The client: acquisition, waiting, cancellation safety, reentrancy.

use std::collections::hash_map::{Entry, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::runtime::Handle;
use tokio::sync::OwnedMutexGuard;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::guard::{release_with_retry, Hold, LockGuard, LockHandle, Slot, SlotState};
use crate::notify::{next_place, WAITING_SINCE};
use crate::retry::jitter;
use crate::{
    AcquireOutcome, Capabilities, Contention, ErrorChain, Fairness, LockBackend, LockError,
    LockInfo, LockKey, Operation, Owner, OwnerToken, ReleaseOutcome, RetryPolicy,
};

type Slots = HashMap<SlotId, Arc<Slot>>;

/// A slot's key: (lock key, owner token). Hashed as two plain byte writes, the token first,
/// rather than the derived tuple hash with its length prefixes and separator.
#[derive(PartialEq, Eq)]
struct SlotId(LockKey, OwnerToken);

impl std::hash::Hash for SlotId {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write(self.1.as_bytes());
        state.write(self.0.as_bytes());
    }
}

/// Shards of a client's slot map.
const SLOT_SHARDS: usize = 8;

/// The TTL used when a request sets none.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);

/// How long [`LockClient::shutdown`] waits for background work by default.
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// Consecutive wake-ups under a millisecond after which a waiter starts pausing.
const QUICK_WAKES_BEFORE_PAUSE: u32 = 16;

/// How long a waiter sleeps at most between attempts when the store told it nothing about
/// the holder (no remaining TTL): the backend's own wake-ups usually come much sooner.
const MAX_BLIND_WAIT: Duration = Duration::from_secs(1);

/// A handle to a lock store: hands out [`LockGuard`]s.
///
/// Cheap to clone (an `Arc`); clones share reentrancy state and background tasks. Create
/// one per store and process, e.g. with `distlock::connect(url)`, or from any backend with
/// [`LockClient::new`].
///
/// # Which method should I use?
///
/// * [`lock(key)`](Self::lock) then [`acquire()`](LockRequest::acquire) waits like
///   `tokio::sync::Mutex::lock` (forever, or up to [`wait`](LockRequest::wait)).
/// * [`try_acquire()`](LockRequest::try_acquire) makes one attempt: `Ok(None)` when held.
/// * [`with_lock`](Self::with_lock) runs a future under the lock and stops it if the lock
///   is lost.
///
/// # Examples
///
/// ```
/// # #[tokio::main] async fn main() -> Result<(), lockcore::LockError> {
/// use std::time::Duration;
/// use lockcore::{LockClient, memory::MemoryBackend};
///
/// let locks = LockClient::new(MemoryBackend::new());
/// let guard = locks.lock("invoice:42").ttl(Duration::from_secs(10)).acquire().await?;
/// println!("writing with fencing token {}", guard.token());
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct LockClient {
    pub(crate) inner: Arc<ClientInner>,
}

impl std::fmt::Debug for LockClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

pub(crate) struct ClientInner {
    pub(crate) backend: Arc<dyn LockBackend>,
    pub(crate) caps: Capabilities,
    label: Arc<str>,
    default_ttl: Duration,
    shutdown_timeout: Duration,
    /// Sharded by the owner token's first byte (random): requests of different owners
    /// rarely contend for one mutex.
    slots: [Mutex<Slots>; SLOT_SHARDS],
    /// The keys this client's requests are waiting for.
    lines: Lines,
    pub(crate) tasks: TaskTracker,
    closed: CancellationToken,
}

/// Each key's line of this client's requests: where the store does not order waiters,
/// one request at a time (the head) waits for the store and tries; the others wait their
/// turn here, in arrival order (see [`LockRequest::acquire`]).
#[derive(Default)]
struct Lines {
    /// Requests in all lines: while it is zero (no contention) nothing else is looked at.
    total: AtomicUsize,
    per_key: Mutex<HashMap<LockKey, Line>>,
}

/// One key's line: the turn (held by the head) and how many requests are in it.
type Line = (Arc<tokio::sync::Mutex<()>>, usize);

impl Lines {
    fn per_key(&self) -> std::sync::MutexGuard<'_, HashMap<LockKey, Line>> {
        self.per_key.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether requests of this client are in `key`'s line.
    fn any(&self, key: &LockKey) -> bool {
        self.total.load(Ordering::Acquire) > 0 && self.per_key().contains_key(key)
    }

    /// Joins `key`'s line: its turn, to wait for.
    fn join(&self, key: &LockKey) -> Arc<tokio::sync::Mutex<()>> {
        let mut per_key = self.per_key();
        let (turn, n) = per_key.entry(key.clone()).or_default();
        *n += 1;
        self.total.fetch_add(1, Ordering::AcqRel);
        turn.clone()
    }

    fn leave(&self, key: &LockKey) {
        let mut per_key = self.per_key();
        if let Entry::Occupied(mut line) = per_key.entry(key.clone()) {
            line.get_mut().1 -= 1;
            if line.get().1 == 0 {
                line.remove();
            }
            self.total.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl std::fmt::Debug for ClientInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockClient")
            .field("backend", &self.backend.name())
            .field("label", &self.label)
            .finish()
    }
}

/// Builds a [`LockClient`] with non-default settings.
#[derive(Debug)]
pub struct LockClientBuilder {
    backend: Arc<dyn LockBackend>,
    label: Option<String>,
    default_ttl: Duration,
    shutdown_timeout: Duration,
}

impl LockClientBuilder {
    /// The label of the owners this client creates (default: `hostname/pid`).
    pub fn label(mut self, label: impl Into<String>) -> Self {
        self.label = Some(label.into());
        self
    }

    /// The TTL of requests that set none (default: [`DEFAULT_TTL`], 30 s).
    pub fn default_ttl(mut self, ttl: Duration) -> Self {
        self.default_ttl = ttl;
        self
    }

    /// How long [`LockClient::shutdown`] waits for background work (releases of dropped
    /// guards, clean-up of cancelled acquisitions) before giving up on it (default
    /// [`DEFAULT_SHUTDOWN_TIMEOUT`], 5 s). Locks whose release did not finish expire after
    /// their TTL. Keep it below your orchestrator's grace period (Kubernetes: 30 s).
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.shutdown_timeout = timeout;
        self
    }

    /// Builds the client.
    pub fn build(self) -> LockClient {
        let caps = self.backend.capabilities();
        let label = self.label.unwrap_or_else(crate::owner::default_label);
        LockClient {
            inner: Arc::new(ClientInner {
                backend: self.backend,
                caps,
                label: Owner::new(label).shared_label().clone(),
                default_ttl: self.default_ttl,
                shutdown_timeout: self.shutdown_timeout,
                slots: std::array::from_fn(|_| Mutex::new(HashMap::new())),
                lines: Lines::default(),
                tasks: TaskTracker::new(),
                closed: CancellationToken::new(),
            }),
        }
    }
}

impl LockClient {
    /// A client over `backend` with default settings.
    pub fn new(backend: Arc<dyn LockBackend>) -> Self {
        Self::builder(backend).build()
    }

    /// A builder for a client over `backend`.
    pub fn builder(backend: Arc<dyn LockBackend>) -> LockClientBuilder {
        LockClientBuilder {
            backend,
            label: None,
            default_ttl: DEFAULT_TTL,
            shutdown_timeout: DEFAULT_SHUTDOWN_TIMEOUT,
        }
    }

    /// Starts a request for the lock named `key`; set options, then
    /// [`acquire`](LockRequest::acquire) or [`try_acquire`](LockRequest::try_acquire).
    /// The key is validated when the request is sent, before any store round trip.
    pub fn lock(&self, key: impl Into<String>) -> LockRequest {
        LockRequest {
            client: self.clone(),
            key: key.into(),
            options: LockOptions::default(),
        }
    }

    /// The backend this client talks to.
    pub fn backend(&self) -> &Arc<dyn LockBackend> {
        &self.inner.backend
    }

    /// What the backend can do.
    pub fn capabilities(&self) -> Capabilities {
        self.inner.caps
    }

    /// A new owner with this client's label, to pass to [`LockRequest::owner`] for
    /// reentrant locking.
    pub fn new_owner(&self) -> Owner {
        Owner::with_shared_label(&self.inner.label)
    }

    /// The holder of `key` (label, fencing token, remaining TTL), or `None` if it is free.
    /// Never shows the owner token.
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidKey`] for a bad key; store errors as the backend reports them.
    pub async fn inspect(&self, key: impl AsRef<str>) -> Result<Option<LockInfo>, LockError> {
        let key = LockKey::new(key)?;
        let info = self.inner.backend.inspect(&key).await;
        info.map_err(|e| e.during(Operation::Inspect, &key))
    }

    /// Frees `key` whoever holds it: an operator's break-lock.
    ///
    /// This is unsafe for correctness: the holder is not told and may still be working.
    /// Only fencing tokens keep its late writes out.
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidKey`] for a bad key; store errors as the backend reports them.
    pub async fn force_release(&self, key: impl AsRef<str>) -> Result<ReleaseOutcome, LockError> {
        let key = LockKey::new(key)?;
        let outcome = self.inner.backend.force_release(&key).await;
        outcome.map_err(|e| e.during(Operation::ForceRelease, &key))
    }

    /// Runs `work` under the lock `key` and releases it afterwards, waiting for the lock as
    /// [`LockRequest::acquire`] does.
    ///
    /// `work` gets a [`LockHandle`]: the fencing token to pass to the resource, the lease,
    /// [`extend`](LockHandle::extend), and the [`renewal_failing`](LockHandle::renewal_failing)
    /// early warning. If the lock is lost midway (see [`LockHandle::lost`]), `work` is dropped
    /// at its next `.await` and the call returns [`LockError::Lost`]. Stopping at an `.await`
    /// is not a rollback: whatever `work` already wrote stays written, which is why its
    /// writes must carry the fencing token.
    ///
    /// # Errors
    ///
    /// As [`LockRequest::acquire`], plus [`LockError::Lost`], plus the release's errors.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future drops `work` and releases the lock in the background.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> Result<(), lockcore::LockError> {
    /// use std::time::Duration;
    /// use lockcore::{LockClient, LockOptions, memory::MemoryBackend};
    ///
    /// let locks = LockClient::new(MemoryBackend::new());
    /// let opts = LockOptions::new().ttl(Duration::from_secs(5)).wait(Duration::from_secs(1));
    /// let n = locks.with_lock("nightly-report", opts, |lock| async move {
    ///     lock.token().get() // generate the report, fenced by this token
    /// }).await?;
    /// assert!(n > 0);
    /// # Ok(()) }
    /// ```
    pub async fn with_lock<F, Fut, T>(
        &self,
        key: impl Into<String>,
        options: LockOptions,
        work: F,
    ) -> Result<T, LockError>
    where
        F: FnOnce(LockHandle) -> Fut,
        Fut: Future<Output = T>,
    {
        let guard = self.request(key, options).acquire().await?;
        run_under(guard, work).await
    }

    /// Runs `work` under the lock `key` if it is free now, and returns `Ok(None)` at once,
    /// without running `work`, if another owner holds it: a cron job's "skip if the last
    /// run is still going". Otherwise as [`with_lock`](Self::with_lock).
    ///
    /// # Errors
    ///
    /// As [`LockRequest::try_acquire`], plus [`LockError::Lost`], plus the release's errors.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, like [`with_lock`](Self::with_lock).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> Result<(), lockcore::LockError> {
    /// use lockcore::{LockClient, LockOptions, memory::MemoryBackend};
    ///
    /// let locks = LockClient::new(MemoryBackend::new());
    /// let running = locks.lock("nightly-report").acquire().await?;
    /// let skipped = locks.try_with_lock("nightly-report", LockOptions::new(), |_| async { "ran" }).await?;
    /// assert_eq!(skipped, None);
    /// running.release().await?;
    /// let ran = locks.try_with_lock("nightly-report", LockOptions::new(), |_| async { "ran" }).await?;
    /// assert_eq!(ran, Some("ran"));
    /// # Ok(()) }
    /// ```
    pub async fn try_with_lock<F, Fut, T>(
        &self,
        key: impl Into<String>,
        options: LockOptions,
        work: F,
    ) -> Result<Option<T>, LockError>
    where
        F: FnOnce(LockHandle) -> Fut,
        Fut: Future<Output = T>,
    {
        match self.request(key, options).try_acquire().await? {
            Some(guard) => run_under(guard, work).await.map(Some),
            None => Ok(None),
        }
    }

    fn request(&self, key: impl Into<String>, options: LockOptions) -> LockRequest {
        LockRequest {
            client: self.clone(),
            key: key.into(),
            options,
        }
    }

    /// Stops accepting requests and waits for background work (releases of dropped guards,
    /// compensations of cancelled acquisitions) to finish, for at most the client's
    /// [`shutdown_timeout`](LockClientBuilder::shutdown_timeout) (5 s by default). Work still
    /// pending then is left to run while the runtime lives; the locks it did not release
    /// expire after their TTL. Guards still alive keep their locks until released or dropped.
    ///
    /// Returns whether all background work finished in time.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the client is closed at the first poll; dropping the future only stops
    /// the waiting.
    pub async fn shutdown(&self) -> bool {
        self.inner.closed.cancel();
        self.inner.tasks.close();
        let limit = self.inner.shutdown_timeout;
        match tokio::time::timeout(limit, self.inner.tasks.wait()).await {
            Ok(()) => true,
            Err(_) => {
                tracing::warn!(
                    pending = self.inner.tasks.len(),
                    timeout = ?limit,
                    "shutdown gave up waiting for background releases; their locks expire after their TTL"
                );
                false
            }
        }
    }

    /// How many of this client's requests are in `key`'s line.
    #[cfg(test)]
    pub(crate) fn in_line(&self, key: &str) -> usize {
        let key = LockKey::new(key).expect("a valid key");
        self.inner.lines.per_key().get(&key).map_or(0, |(_, n)| *n)
    }

    #[cfg(test)]
    pub(crate) fn slot_count(&self) -> usize {
        self.inner
            .slots
            .iter()
            .map(|shard| shard.lock().unwrap_or_else(|e| e.into_inner()).len())
            .sum()
    }

    /// The shard of the slot map holding `owner`'s slots, locked.
    fn slots_of(&self, owner: &Owner) -> std::sync::MutexGuard<'_, Slots> {
        let shard = usize::from(owner.token().as_bytes()[0]) % SLOT_SHARDS;
        self.inner.slots[shard]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// The slot of (key, owner), registered as used by one more request.
    pub(crate) fn slot(&self, key: &LockKey, owner: &Owner) -> Arc<Slot> {
        let mut slots = self.slots_of(owner);
        let slot = slots
            .entry(SlotId(key.clone(), *owner.token()))
            .or_insert_with(|| Arc::new(Slot::default()))
            .clone();
        slot.pending.fetch_add(1, Ordering::Relaxed);
        slot
    }

    /// A request is done with `slot`.
    pub(crate) fn done_with_slot(&self, key: &LockKey, owner: &Owner, slot: &Arc<Slot>) {
        let mut slots = self.slots_of(owner);
        slot.pending.fetch_sub(1, Ordering::Relaxed);
        // An acquisition that got the lock keeps the slot; its release forgets it.
        let unheld = slot
            .gate
            .try_lock()
            .map(|state| state.hold.is_none())
            .unwrap_or(false);
        Self::forget_locked(&mut slots, key, owner, slot, unheld);
    }

    /// The hold of `slot` was released: forget the slot unless a request is queued on it.
    pub(crate) fn released_slot(&self, key: &LockKey, owner: &Owner, slot: &Arc<Slot>) {
        let mut slots = self.slots_of(owner);
        Self::forget_locked(&mut slots, key, owner, slot, true);
    }

    fn forget_locked(
        slots: &mut Slots,
        key: &LockKey,
        owner: &Owner,
        slot: &Arc<Slot>,
        unheld: bool,
    ) {
        // `pending` only changes under the map's mutex, so no request can pick the slot up
        // between this check and the removal.
        if unheld && slot.pending.load(Ordering::Relaxed) == 0 {
            if let Entry::Occupied(current) = slots.entry(SlotId(key.clone(), *owner.token())) {
                if Arc::ptr_eq(current.get(), slot) {
                    current.remove();
                }
            }
        }
    }
}

/// Options of one lock request; see [`LockRequest`] for their meaning.
#[derive(Clone, Debug, Default)]
pub struct LockOptions {
    ttl: Option<Duration>,
    wait: Option<Duration>,
    owner: Option<Owner>,
    no_watchdog: bool,
    retry: Option<RetryPolicy>,
}

impl LockOptions {
    /// Default options: the client's TTL, wait forever, a fresh owner, watchdog on.
    pub fn new() -> Self {
        Self::default()
    }

    /// See [`LockRequest::ttl`].
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// See [`LockRequest::wait`].
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    /// See [`LockRequest::owner`].
    pub fn owner(mut self, owner: Owner) -> Self {
        self.owner = Some(owner);
        self
    }

    /// See [`LockRequest::watchdog`].
    pub fn watchdog(mut self, renew: bool) -> Self {
        self.no_watchdog = !renew;
        self
    }

    /// See [`LockRequest::retry`].
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = Some(policy);
        self
    }
}

/// A request for one lock, built by [`LockClient::lock`].
#[derive(Debug)]
#[must_use = "a lock request does nothing until `acquire()` or `try_acquire()` is awaited"]
pub struct LockRequest {
    client: LockClient,
    key: String,
    options: LockOptions,
}

pub(crate) struct Validated {
    pub(crate) key: LockKey,
    pub(crate) owner: Owner,
    pub(crate) ttl: Duration,
    pub(crate) deadline: Option<Instant>,
    pub(crate) renew: bool,
    pub(crate) started: Instant,
    /// How to retry failures retrying may fix; `None`: only inside a wait deadline.
    pub(crate) retry: Option<RetryPolicy>,
}

impl LockRequest {
    /// The lease TTL (default 30 s, or the client's default). The watchdog renews it every
    /// `ttl / 3` while the guard lives. Rounded up to the backend's minimum; the effective
    /// value is on [`Lease::ttl`](crate::Lease::ttl).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.options.ttl = Some(ttl);
        self
    }

    /// How long [`acquire`](Self::acquire) may wait before failing with
    /// [`LockError::Timeout`]. Without it, `acquire` waits until it holds the lock.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.options.wait = Some(wait);
        self
    }

    /// Acquires as `owner` instead of a fresh owner. If `owner` already holds the lock
    /// through this client, the request re-enters it at once: same token, same lease, one
    /// watchdog, and the store still sees a single hold, freed when the last guard goes.
    /// The TTL of a re-entering request is ignored (the lease is shared).
    pub fn owner(mut self, owner: Owner) -> Self {
        self.options.owner = Some(owner);
        self
    }

    /// Whether the watchdog renews the lease (default `true`). Without renewal the lock
    /// expires after its TTL and [`LockHandle::lost`] fires shortly before.
    pub fn watchdog(mut self, renew: bool) -> Self {
        self.options.no_watchdog = !renew;
        self
    }

    /// Lets [`acquire`](Self::acquire) retry failures that retrying may fix (the store
    /// unreachable, no Redlock quorum) following `policy`, also without a
    /// [`wait`](Self::wait) deadline: a leader loop that waits forever then survives a
    /// store restart instead of failing at the first refused connection. Without it, such
    /// failures are retried only inside a `wait` deadline (with [`RetryPolicy::new`]'s
    /// backoff), and returned at once otherwise. [`try_acquire`](Self::try_acquire) never
    /// retries.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> Result<(), lockcore::LockError> {
    /// use std::time::Duration;
    /// use lockcore::{LockClient, RetryPolicy, memory::MemoryBackend};
    ///
    /// let locks = LockClient::new(MemoryBackend::new());
    /// let policy = RetryPolicy::new().max_elapsed(Duration::from_secs(60));
    /// let leader = locks.lock("leader").retry(policy).acquire().await?;
    /// leader.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.options.retry = Some(policy);
        self
    }

    fn validate(&self) -> Result<Validated, LockError> {
        let started = Instant::now();
        let key = LockKey::new(&self.key)?;
        let inner = &self.client.inner;
        let requested = self.options.ttl.unwrap_or(inner.default_ttl);
        let ttl = inner.caps.effective_ttl(requested)?;
        if started.checked_add(ttl * 2).is_none() {
            return Err(LockError::InvalidTtl {
                ttl: requested,
                reason: "the TTL overflows the clock".into(),
            });
        }
        if inner.closed.is_cancelled() {
            return Err(LockError::Shutdown);
        }
        Ok(Validated {
            key,
            owner: self
                .options
                .owner
                .clone()
                .unwrap_or_else(|| Owner::with_shared_label(&inner.label)),
            ttl,
            deadline: self.options.wait.and_then(|w| started.checked_add(w)),
            renew: !self.options.no_watchdog,
            started,
            retry: self.options.retry,
        })
    }

    /// Waits until the lock is held and returns its guard.
    ///
    /// While another owner holds the lock, the request sleeps until the backend signals a
    /// release (pub/sub, NOTIFY, watch, or polling where the store has no signal) or the
    /// holder's remaining TTL runs out, plus jitter; it never busy-polls.
    ///
    /// A client's requests for one key are served in arrival order, as
    /// `tokio::sync::Mutex` serves its waiters: only the first of them waits for the store
    /// and tries, and a new request joins the back of the line instead of racing it (so a
    /// task that releases and asks again at once cannot starve the others). Requests of
    /// different clients or processes race for each release unless the backend orders
    /// them itself ([`Capabilities::fairness`] is [`Fairness::Fifo`]).
    ///
    /// # Errors
    ///
    /// * [`LockError::InvalidKey`], [`LockError::InvalidTtl`]: before any request is sent.
    /// * [`LockError::Timeout`]: the [`wait`](Self::wait) deadline passed; nothing is held.
    /// * [`LockError::Unavailable`], [`LockError::QuorumNotReached`]: the store could not be
    ///   reached (or too few Redlock instances answered). With a [`wait`](Self::wait)
    ///   deadline such failures are retried with jittered backoff until the deadline, and the
    ///   last one is returned then; without a deadline the first is returned at once, unless
    ///   a [`retry`](Self::retry) policy says to go on.
    /// * [`LockError::Backend`]: the store failed in a way retrying will not fix.
    ///
    /// Whatever an answered attempt may have applied is released.
    /// * [`LockError::Shutdown`]: the client was shut down.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe. If this future is dropped (a `select!`, a timeout) while an attempt is
    /// in flight, that attempt is handed to a background task that still sees its outcome
    /// and releases whatever it acquired; an attempt answered with an error that may have
    /// been applied is undone by a release by owner. Only an attempt the store never
    /// answered falls back to the TTL. [`LockClient::shutdown`] waits for that clean-up.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> Result<(), lockcore::LockError> {
    /// use std::time::Duration;
    /// use lockcore::{LockClient, LockError, memory::MemoryBackend};
    ///
    /// let locks = LockClient::new(MemoryBackend::new());
    /// let held = locks.lock("k").acquire().await?;
    /// let err = locks.lock("k").wait(Duration::from_millis(20)).acquire().await.unwrap_err();
    /// assert!(matches!(err, LockError::Timeout { .. }));
    /// drop(held);
    /// # Ok(()) }
    /// ```
    pub async fn acquire(self) -> Result<LockGuard, LockError> {
        let req = self.validate()?;
        let runtime = Handle::try_current().map_err(|_| no_runtime())?;
        let (deadline, started, key) = (req.deadline, req.started, req.key.clone());
        let attempt = self.client.acquire_inline(req, true, runtime);
        let answer = match deadline {
            // The loop answers at the deadline itself while idle; this bound covers an
            // attempt still in flight then: dropping the request hands that attempt to a
            // task that releases whatever it acquires.
            Some(deadline) => match tokio::time::timeout_at(deadline.into(), attempt).await {
                Ok(answer) => answer,
                Err(_) => {
                    return Err(LockError::Timeout {
                        key,
                        waited: started.elapsed(),
                    })
                }
            },
            None => attempt.await,
        };
        answer?.ok_or_else(|| LockError::Timeout {
            key,
            waited: started.elapsed(),
        })
    }

    /// Makes one attempt: `Ok(Some(guard))` if the lock was free (or already held by this
    /// owner through this client), `Ok(None)` if another owner holds it.
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire), except that contention is `Ok(None)`, never an error.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, like [`acquire`](Self::acquire).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> Result<(), lockcore::LockError> {
    /// use lockcore::{LockClient, memory::MemoryBackend};
    ///
    /// let locks = LockClient::new(MemoryBackend::new());
    /// let first = locks.lock("k").try_acquire().await?;
    /// assert!(first.is_some());
    /// assert!(locks.lock("k").try_acquire().await?.is_none());
    /// # Ok(()) }
    /// ```
    pub async fn try_acquire(self) -> Result<Option<LockGuard>, LockError> {
        let req = self.validate()?;
        let runtime = Handle::try_current().map_err(|_| no_runtime())?;
        self.client.acquire_inline(req, false, runtime).await
    }
}

type Answer = Result<Option<LockGuard>, LockError>;

/// One `try_acquire` call to the store, boxed so that it can outlive its caller.
type Attempt = Pin<Box<dyn Future<Output = Result<AcquireOutcome, LockError>> + Send>>;

fn no_runtime() -> LockError {
    LockError::config("locks must be acquired inside a tokio runtime")
}

/// An error after which the attempt may have been applied in the store with its answer lost:
/// a release by owner undoes it. A request that provably never reached the store (its
/// connection was refused) applied nothing and needs no release: with the store down, a
/// shutdown must not wait out a retried release for every failed attempt.
fn maybe_applied(e: &LockError) -> bool {
    matches!(
        e,
        LockError::Unavailable { .. }
            | LockError::Backend { .. }
            | LockError::QuorumNotReached { .. }
    ) && !e.never_sent()
}

impl LockClient {
    /// Every acquisition. It runs in the caller's task (no spawn, no channel on the hot
    /// path); whatever a caller that goes away would strand lives in a [`Request`] whose
    /// `Drop` finishes it in the background.
    async fn acquire_inline(&self, req: Validated, wait: bool, runtime: Handle) -> Answer {
        let slot = self.slot(&req.key, &req.owner);
        let mut request = Request {
            client: self.clone(),
            slot,
            req,
            runtime,
            gate: None,
            attempt: None,
            queued: false,
            maybe_applied: false,
            place: None,
            joined: false,
            turn: None,
        };
        request.run(wait).await
    }
}

/// One acquisition in progress.
///
/// Its `Drop` runs on every exit — an answer, an error, or the caller dropping the future
/// midway — and hands what must not be stranded to a background task: an attempt still in
/// flight is awaited there and whatever it acquired is released; an attempt answered with an
/// error that may have been applied is undone by a release by owner; a request the store
/// may have queued is abandoned ([`LockBackend::abandon`]). That task keeps the slot's gate
/// until it is done, so a later request of the same owner cannot be granted the hold that
/// a compensating release is about to free.
struct Request {
    client: LockClient,
    slot: Arc<Slot>,
    req: Validated,
    runtime: Handle,
    /// Requests for the same (key, owner) queue on this gate, so re-entry and release of one
    /// hold are serialised and the store only ever sees one hold per owner.
    gate: Option<OwnedMutexGuard<SlotState>>,
    /// The attempt in flight, polled in place while the caller waits.
    attempt: Option<Attempt>,
    /// Told "held": the store may keep a place for this owner in its queue.
    queued: bool,
    /// The last attempt failed in a way that may have applied it; a later answered attempt
    /// settles the question (same owner: the same hold, or someone else's).
    maybe_applied: bool,
    /// When this request first found the lock held (see [`crate::ReleaseNotifier`]).
    place: Option<u64>,
    /// In this client's line for the key ([`Lines`]).
    joined: bool,
    /// The head of that line: the one request of this client that waits for the store.
    turn: Option<OwnedMutexGuard<()>>,
}

impl Request {
    async fn run(&mut self, wait: bool) -> Answer {
        let client = self.client.clone();
        let inner = &client.inner;
        if inner.closed.is_cancelled() {
            return Err(LockError::Shutdown);
        }
        // The gate is almost always free (a fresh owner's slot is new): take it without
        // registering for the shutdown signal.
        let gate = match self.slot.gate.clone().try_lock_owned() {
            Ok(gate) => gate,
            Err(_) => tokio::select! {
                biased;
                _ = inner.closed.cancelled() => return Err(LockError::Shutdown),
                gate = self.slot.gate.clone().lock_owned() => gate,
            },
        };
        let state = self.gate.insert(gate);
        if let Some(hold) = state.hold.clone() {
            state.count += 1;
            tracing::debug!(key = %hold.key, holds = state.count, "lock re-entered");
            return Ok(Some(LockGuard::new(
                client.clone(),
                self.slot.clone(),
                hold,
            )));
        }
        // A backend whose signal says "free" while its attempt says "held" (a holder that
        // just expired on one clock but not the other) must not make us spin.
        let mut quick_wakes = 0u32;
        let retry = self.req.retry;
        let mut backoff = retry.unwrap_or_default().backoff();
        // Where the store does not order waiters, this client's requests for a key queue
        // in a line of their own: only its head waits for the store and tries; a new
        // request that finds the line non-empty joins it at the back instead of racing
        // the head (as `tokio::sync::Mutex` serves its waiters in order). Across
        // processes the heads still race.
        let in_line = wait && inner.caps.fairness == Fairness::None;
        let mut contention = None;
        if in_line && inner.lines.any(&self.req.key) {
            self.take_turn().await?;
            contention = Some(Contention::new(None));
        }
        loop {
            if let Some(contention) = contention.take() {
                if !self.wait_for_release(&contention, &mut quick_wakes).await? {
                    return Ok(None);
                }
            }
            let attempt_started = Instant::now();
            match self.attempt().await {
                Ok(AcquireOutcome::Acquired(grant)) => {
                    self.queued = false;
                    self.maybe_applied = false;
                    let req = &self.req;
                    tracing::debug!(key = %req.key, token = %grant.token, "lock acquired");
                    let hold =
                        match Hold::start(&client, req, attempt_started, grant, &self.runtime) {
                            Ok(hold) => hold,
                            Err(e) => {
                                // Unwatched, the hold could not be kept or known lost.
                                self.maybe_applied = true;
                                return Err(e.during(Operation::Acquire, &req.key));
                            }
                        };
                    if let Some(state) = self.gate.as_mut() {
                        state.hold = Some(hold.clone());
                        state.count = 1;
                    }
                    return Ok(Some(LockGuard::new(
                        client.clone(),
                        self.slot.clone(),
                        hold,
                    )));
                }
                Ok(AcquireOutcome::Held(held)) => {
                    self.queued = true;
                    self.maybe_applied = false;
                    backoff.reset();
                    if !wait {
                        return Ok(None);
                    }
                    if in_line && self.turn.is_none() && !self.take_turn().await? {
                        // Others were ahead: what this attempt saw is stale by now.
                        contention = Some(Contention::new(None));
                    } else {
                        contention = Some(held);
                    }
                }
                Err(e) => {
                    // The store answered, so the attempt is no longer in flight. If it may
                    // have been applied, the next answered attempt tells (same owner: the
                    // same hold); if none comes, `Drop` releases by owner.
                    self.maybe_applied |= maybe_applied(&e);
                    // Inside a wait deadline a transient failure (store unreachable, no
                    // quorum) is retried with jittered backoff; at the deadline the caller
                    // sees the store's error, not a Timeout that would hide it.
                    // A `retry` policy extends that to requests without a deadline.
                    let e = e.during(Operation::Acquire, &self.req.key);
                    let now = Instant::now();
                    let retrying = wait
                        && e.is_retryable()
                        && (self.req.deadline.is_some() || retry.is_some());
                    let pause = backoff
                        .next_pause(now)
                        .filter(|p| self.req.deadline.map_or(true, |d| now + *p < d));
                    match pause {
                        Some(pause) if retrying => {
                            tracing::debug!(key = %self.req.key, error = %ErrorChain(&e), "acquire attempt failed; retrying");
                            tokio::select! {
                                biased;
                                _ = inner.closed.cancelled() => return Err(LockError::Shutdown),
                                _ = tokio::time::sleep(pause) => {}
                            }
                        }
                        _ => return Err(e),
                    }
                }
            }
        }
    }

    /// Waits for a release of the key after an attempt saw `contention`, or at most until
    /// the holder's lease runs out (a blind nap when unknown), within the deadline: `false`
    /// when the deadline passed.
    async fn wait_for_release(
        &mut self,
        contention: &Contention,
        quick_wakes: &mut u32,
    ) -> Result<bool, LockError> {
        let client = self.client.clone();
        let inner = &client.inner;
        // Our place in line among this process's waiters: kept across
        // wake-ups lost to other processes.
        let place = *self.place.get_or_insert_with(next_place);
        let req = &self.req;
        let now = Instant::now();
        let left = match req.deadline {
            Some(d) if d <= now => return Ok(false),
            Some(d) => d - now,
            None => Duration::MAX,
        };
        let base = contention
            .remaining_ttl
            .unwrap_or(MAX_BLIND_WAIT.min(req.ttl));
        let nap = (base + jitter(base / 8 + Duration::from_millis(2))).min(left);
        // A woken waiter that loses the race to another client is legitimately
        // woken again within a millisecond; only a long run of instant wake-ups
        // is a spin.
        if *quick_wakes >= QUICK_WAKES_BEFORE_PAUSE {
            let shift = (*quick_wakes - QUICK_WAKES_BEFORE_PAUSE).min(4);
            let pause = Duration::from_millis(1 << shift).min(nap);
            tokio::time::sleep(pause).await;
        }
        let waiting = Instant::now();
        if let Some(pause) = contention.hint.retry_delay() {
            // Nobody to wait for (a split vote): the store asked for a pause instead.
            tokio::select! {
                biased;
                _ = inner.closed.cancelled() => return Err(LockError::Shutdown),
                _ = tokio::time::sleep(pause.min(left)) => {}
            }
            *quick_wakes = 0;
            return Ok(true);
        }
        tokio::select! {
            biased;
            _ = inner.closed.cancelled() => return Err(LockError::Shutdown),
            woke = WAITING_SINCE.scope(place, inner.backend.wait_released(&req.key, &contention.hint, nap)) => {
                if let Err(e) = woke {
                    // The next attempt reports the store's state; don't spin on it.
                    tracing::debug!(key = %req.key, error = %ErrorChain(&e), "waiting for a release failed");
                    tokio::time::sleep(nap.min(Duration::from_millis(50))).await;
                }
            }
        }
        // Only a holder about to expire can make the signal and the attempt
        // disagree; a fresh holder that won the race is ordinary contention.
        let expiring = contention
            .remaining_ttl
            .map_or(true, |left| left < Duration::from_millis(5));
        *quick_wakes = if expiring && waiting.elapsed() < Duration::from_millis(1) {
            *quick_wakes + 1
        } else {
            0
        };
        Ok(true)
    }

    /// Joins this client's line for the key and waits for its turn: whether the turn was
    /// free at once (nobody ahead).
    async fn take_turn(&mut self) -> Result<bool, LockError> {
        let line = self.client.inner.lines.join(&self.req.key);
        self.joined = true;
        if let Ok(turn) = line.clone().try_lock_owned() {
            self.turn = Some(turn);
            return Ok(true);
        }
        let closed = self.client.inner.closed.clone();
        let turn = tokio::select! {
            biased;
            _ = closed.cancelled() => return Err(LockError::Shutdown),
            turn = line.lock_owned() => turn,
        };
        self.turn = Some(turn);
        Ok(false)
    }

    /// Sends one attempt and waits for its answer in place. If the caller goes away
    /// meanwhile, the attempt stays in `self.attempt` for `Drop` to finish.
    async fn attempt(&mut self) -> Result<AcquireOutcome, LockError> {
        let backend = self.client.inner.backend.clone();
        let (key, owner, ttl) = (self.req.key.clone(), self.req.owner.clone(), self.req.ttl);
        let attempt = self.attempt.insert(Box::pin(async move {
            backend.try_acquire(&key, &owner, ttl).await
        }));
        let outcome = attempt.await;
        self.attempt = None;
        outcome
    }
}

impl Drop for Request {
    fn drop(&mut self) {
        drop(self.turn.take());
        if self.joined {
            self.client.inner.lines.leave(&self.req.key);
        }
        let attempt = self.attempt.take();
        if attempt.is_none() && !self.maybe_applied && !self.queued {
            // The common case: an answer was delivered and nothing is left to undo.
            drop(self.gate.take());
            self.client
                .done_with_slot(&self.req.key, &self.req.owner, &self.slot);
            return;
        }
        let (client, slot, gate) = (self.client.clone(), self.slot.clone(), self.gate.take());
        let (key, owner) = (self.req.key.clone(), self.req.owner.clone());
        let (mut release, mut abandon) = (self.maybe_applied, self.queued);
        let until = Instant::now() + self.req.ttl;
        let finish = async move {
            if let Some(attempt) = attempt {
                // Not raced against anything: once sent, its outcome must be seen.
                match attempt.await {
                    Ok(AcquireOutcome::Acquired(_)) => (release, abandon) = (true, false),
                    Ok(AcquireOutcome::Held(_)) => (release, abandon) = (false, true),
                    Err(e) => release |= maybe_applied(&e),
                }
            }
            let backend = &*client.inner.backend;
            if release {
                match release_with_retry(backend, &key, &owner, until).await {
                    Ok(outcome) => {
                        tracing::debug!(key = %key, ?outcome, "released what a request left behind")
                    }
                    Err(e) => {
                        tracing::warn!(key = %key, error = %ErrorChain(&e), "could not release what a request left behind; it expires after its TTL")
                    }
                }
            }
            if abandon {
                if let Err(e) = backend.abandon(&key, &owner).await {
                    tracing::debug!(key = %key, error = %ErrorChain(&e), "abandoning a wait failed");
                }
            }
            drop(gate);
            client.done_with_slot(&key, &owner, &slot);
        };
        self.client.inner.tasks.spawn_on(finish, &self.runtime);
    }
}

/// Runs `work` under `guard`: stops it if the lock is lost, releases afterwards.
async fn run_under<F, Fut, T>(guard: LockGuard, work: F) -> Result<T, LockError>
where
    F: FnOnce(LockHandle) -> Fut,
    Fut: Future<Output = T>,
{
    let lost = guard.lost();
    let out = tokio::select! {
        biased;
        _ = lost => None,
        v = work(guard.handle()) => Some(v),
    };
    match out {
        Some(v) => {
            guard.release().await?;
            Ok(v)
        }
        None => {
            let key = guard.key().clone();
            drop(guard);
            Err(LockError::Lost { key })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemoryBackend;
    use crate::testing::Faulty;
    use std::sync::atomic::Ordering;

    /// Tasks that loop taking a lock and giving it back at once must not starve the
    /// waiters: the releasing task's next request joins the line behind them. (On one
    /// thread, the releasing task runs on until its next request is sent: a request that
    /// could barge always would.)
    #[tokio::test]
    async fn a_client_serves_its_waiters_in_order_and_a_new_request_queues_behind_them() {
        let client = LockClient::new(MemoryBackend::new());
        let held = client.lock("k").acquire().await.unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut waiters = Vec::new();
        for i in 0..4 {
            let (waiter, order) = (client.clone(), order.clone());
            waiters.push(tokio::spawn(async move {
                let guard = waiter.lock("k").acquire().await.unwrap();
                order.lock().unwrap().push(i);
                guard.release().await.unwrap();
            }));
            // Each is in line before the next one starts.
            tokio::time::timeout(Duration::from_secs(5), async {
                while client.in_line("k") < i + 1 {
                    tokio::task::yield_now().await;
                }
            })
            .await
            .expect("the waiter never joined the line");
        }
        // The holder gives the lock back and asks again at once: with the store free for
        // an instant and its request first, it would win every time if it could barge.
        held.release().await.unwrap();
        let again = client.lock("k").acquire().await.unwrap();
        order.lock().unwrap().push(4);
        again.release().await.unwrap();
        for w in waiters {
            w.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3, 4]);
        assert_eq!(client.in_line("k"), 0);
    }

    /// A request that leaves the line (its deadline passed, or its future was dropped)
    /// while at its head or behind it never holds up the ones after it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn requests_that_leave_the_line_pass_the_turn_on() {
        let client = LockClient::new(MemoryBackend::new());
        let held = client.lock("k").acquire().await.unwrap();
        let in_line = |n: usize| {
            let client = client.clone();
            async move {
                tokio::time::timeout(Duration::from_secs(5), async {
                    while client.in_line("k") != n {
                        tokio::task::yield_now().await;
                    }
                })
                .await
                .unwrap_or_else(|_| panic!("the line never held {n}"));
            }
        };
        let request = |wait: Option<Duration>| {
            let client = client.clone();
            tokio::spawn(async move {
                let mut request = client.lock("k");
                if let Some(wait) = wait {
                    request = request.wait(wait);
                }
                request.acquire().await
            })
        };
        // The head gives up at its deadline; the second is dropped while behind it.
        let head = request(Some(Duration::from_millis(100)));
        in_line(1).await;
        let dropped = request(None);
        in_line(2).await;
        let last = request(Some(Duration::from_secs(5)));
        in_line(3).await;
        dropped.abort();
        assert!(matches!(
            head.await.unwrap(),
            Err(LockError::Timeout { .. })
        ));
        in_line(1).await;
        let released = Instant::now();
        held.release().await.unwrap();
        let guard = last.await.unwrap().expect("the last request gets the lock");
        assert!(released.elapsed() < Duration::from_secs(1));
        guard.release().await.unwrap();
        assert_eq!(client.in_line("k"), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_waiter_that_gives_up_is_abandoned_once() {
        let flaky = Faulty::new();
        let client = LockClient::new(flaky.clone());
        let held = client.lock("k").acquire().await.unwrap();
        assert!(client.lock("k").try_acquire().await.unwrap().is_none());
        let err = client
            .lock("k")
            .wait(Duration::from_millis(50))
            .acquire()
            .await
            .unwrap_err();
        assert!(matches!(err, LockError::Timeout { .. }));
        let cancelled =
            tokio::time::timeout(Duration::from_millis(50), client.lock("k").acquire()).await;
        assert!(cancelled.is_err());
        let waiter = tokio::spawn({
            let client = client.clone();
            async move {
                client
                    .lock("k")
                    .wait(Duration::from_secs(5))
                    .acquire()
                    .await
            }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        held.release().await.unwrap();
        waiter.await.unwrap().unwrap().release().await.unwrap();
        client.shutdown().await;
        assert_eq!(
            flaky.abandoned.load(Ordering::SeqCst),
            3,
            "try, timeout and cancel each abandon once; a grant does not"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn transient_failures_are_retried_only_inside_a_wait_deadline() {
        let flaky = Faulty::new();
        flaky.acquire_failures.store(3, Ordering::SeqCst);
        let client = LockClient::new(flaky.clone());
        let err = client.lock("k").acquire().await.unwrap_err();
        assert!(matches!(err, LockError::Unavailable { .. }), "{err}");
        let err = client.lock("k").try_acquire().await.unwrap_err();
        assert!(matches!(err, LockError::Unavailable { .. }), "{err}");
        let g = client
            .lock("k")
            .wait(Duration::from_secs(5))
            .acquire()
            .await
            .unwrap();
        g.release().await.unwrap();
        flaky.acquire_failures.store(usize::MAX, Ordering::SeqCst);
        let started = Instant::now();
        let err = client
            .lock("k")
            .wait(Duration::from_millis(300))
            .acquire()
            .await
            .unwrap_err();
        assert!(
            matches!(err, LockError::Unavailable { .. }),
            "the deadline hid the store's error: {err}"
        );
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reentrancy_state_is_forgotten_after_release() {
        let client = LockClient::new(MemoryBackend::new());
        for i in 0..100 {
            let g = client
                .lock(format!("k{i}"))
                .try_acquire()
                .await
                .unwrap()
                .unwrap();
            if i % 2 == 0 {
                g.release().await.unwrap();
            } else {
                drop(g);
            }
        }
        let contended = client.lock("k0").try_acquire().await.unwrap().unwrap();
        assert!(client.lock("k0").try_acquire().await.unwrap().is_none());
        contended.release().await.unwrap();
        client.shutdown().await;
        assert_eq!(client.slot_count(), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_reentry_by_one_owner_shares_one_hold() {
        let store = MemoryBackend::new();
        let client = LockClient::new(store.clone());
        let owner = client.new_owner();
        let tasks: Vec<_> = (0..16)
            .map(|_| {
                let (client, owner) = (client.clone(), owner.clone());
                tokio::spawn(async move { client.lock("k").owner(owner).acquire().await.unwrap() })
            })
            .collect();
        let mut guards = Vec::new();
        for t in tasks {
            guards.push(t.await.unwrap());
        }
        assert!(guards.iter().all(|g| g.token() == guards[0].token()));
        let last = guards.pop().unwrap();
        for g in guards {
            assert!(matches!(
                g.release().await.unwrap(),
                ReleaseOutcome::StillHeld { .. }
            ));
        }
        assert_eq!(store.held_count(), 1);
        assert_eq!(last.release().await.unwrap(), ReleaseOutcome::Released);
        assert_eq!(store.held_count(), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reacquire_by_same_owner_after_a_drop_is_never_lost() {
        // The drop's background release and the new request of the same owner race: the
        // request either re-enters the hold the release has not reached yet, or queues
        // behind that release and gets a new hold. It must never be granted the old hold in
        // the store and then lose it to the release.
        for _ in 0..50 {
            let store = MemoryBackend::new();
            let client = LockClient::new(store.clone());
            let owner = client.new_owner();
            let first = client
                .lock("k")
                .owner(owner.clone())
                .acquire()
                .await
                .unwrap();
            let token = first.token();
            drop(first);
            let second = client.lock("k").owner(owner).acquire().await.unwrap();
            assert!(second.token() >= token);
            client.shutdown().await;
            assert_eq!(store.held_count(), 1, "the new hold was released");
            let info = client.inspect("k").await.unwrap().unwrap();
            assert_eq!(info.token, second.token());
            assert_eq!(second.release().await.unwrap(), ReleaseOutcome::Released);
            assert_eq!(store.held_count(), 0);
        }
    }
}

#[cfg(test)]
mod first_contact_tests {
    use super::*;
    use crate::memory::MemoryBackend;
    use crate::testing::Faulty;
    use std::sync::atomic::Ordering;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_split_vote_pauses_as_asked_instead_of_waiting_for_a_release() {
        let store = Faulty::new();
        store.split_votes.store(2, Ordering::SeqCst);
        let client = LockClient::new(store.clone());
        let started = Instant::now();
        let guard = client
            .lock("split")
            .wait(Duration::from_secs(10))
            .acquire()
            .await
            .unwrap();
        let took = started.elapsed();
        assert_eq!(
            store.waits.load(Ordering::SeqCst),
            0,
            "nobody held it: no wait"
        );
        let pause = crate::testing::SPLIT_VOTE_PAUSE;
        assert!(took >= pause * 2, "two pauses: {took:?}");
        assert!(took < Duration::from_secs(5), "{took:?}");
        guard.release().await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn store_errors_name_the_operation_and_the_key() {
        let store = Faulty::new();
        store.acquire_failures.store(1, Ordering::SeqCst);
        let client = LockClient::new(store.clone());
        let err = client.lock("invoice:42").acquire().await.unwrap_err();
        assert_eq!(
            err.to_string(),
            "faulty is unavailable while acquiring \"invoice:42\""
        );
        assert_eq!(
            ErrorChain(&err).to_string(),
            "faulty is unavailable while acquiring \"invoice:42\": timed out waiting for the answer"
        );
        // A short lease: a failing release is retried until the lease ends.
        let ttl = Duration::from_millis(300);
        let guard = client.lock("invoice:42").ttl(ttl).acquire().await.unwrap();
        store.release_fails.store(true, Ordering::SeqCst);
        let err = guard.release().await.unwrap_err();
        assert!(
            err.to_string().ends_with("while releasing \"invoice:42\""),
            "{err}"
        );
    }

    /// With the store refusing connections, a failed attempt applied nothing: no
    /// compensating release is sent, and shutdown does not wait for one.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_refused_attempt_is_not_compensated() {
        let store = Faulty::new();
        store.refused.store(true, Ordering::SeqCst);
        store.release_fails.store(true, Ordering::SeqCst);
        store.acquire_failures.store(usize::MAX, Ordering::SeqCst);
        let client = LockClient::new(store.clone());
        for i in 0..10 {
            let err = client.lock(format!("k{i}")).acquire().await.unwrap_err();
            assert!(matches!(err, LockError::Unavailable { .. }));
        }
        let started = Instant::now();
        assert!(client.shutdown().await);
        assert!(started.elapsed() < Duration::from_millis(500));
        assert_eq!(store.releases.load(Ordering::SeqCst), 0);

        // An attempt whose answer was lost may have been applied: that one is released.
        let store = Faulty::new();
        store.acquire_failures.store(1, Ordering::SeqCst);
        let client = LockClient::new(store.clone());
        client.lock("k").acquire().await.unwrap_err();
        assert!(client.shutdown().await);
        assert_eq!(store.releases.load(Ordering::SeqCst), 1);
    }

    /// A release that cannot get through is retried until the lease ends (here a minute):
    /// shutdown gives up at its timeout instead.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shutdown_is_bounded_by_its_timeout() {
        let store = Faulty::new();
        let client = LockClient::builder(store.clone())
            .shutdown_timeout(Duration::from_millis(300))
            .build();
        let guard = client
            .lock("k")
            .ttl(Duration::from_secs(60))
            .acquire()
            .await
            .unwrap();
        store.release_fails.store(true, Ordering::SeqCst);
        drop(guard);
        let started = Instant::now();
        assert!(!client.shutdown().await, "the release cannot have finished");
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(300) && took < Duration::from_secs(2),
            "{took:?}"
        );
    }

    /// Without a deadline, failures are retried only when a policy says so, and only for as
    /// long as it says.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_retry_policy_rides_out_failures_without_a_deadline() {
        let store = Faulty::new();
        store.acquire_failures.store(3, Ordering::SeqCst);
        let client = LockClient::new(store.clone());
        let policy = RetryPolicy::new().first_delay(Duration::from_millis(5));
        let guard = client.lock("k").retry(policy).acquire().await.unwrap();
        assert_eq!(store.acquire_failures.load(Ordering::SeqCst), 0);
        guard.release().await.unwrap();

        store.acquire_failures.store(usize::MAX, Ordering::SeqCst);
        let started = Instant::now();
        let err = client
            .lock("k")
            .retry(policy.max_elapsed(Duration::from_millis(200)))
            .acquire()
            .await
            .unwrap_err();
        assert!(matches!(err, LockError::Unavailable { .. }), "{err}");
        let took = started.elapsed();
        assert!(took < Duration::from_secs(2), "{took:?}");
        // 5, 10, 20 and 40 ms (plus jitter) fit in the 200 ms: at least five attempts.
        let attempts = usize::MAX - store.acquire_failures.load(Ordering::SeqCst);
        assert!(attempts >= 5, "{attempts} attempts in {took:?}");
        // try_acquire makes its one attempt whatever the policy.
        let before = store.acquire_failures.load(Ordering::SeqCst);
        let err = client.lock("k").retry(policy).try_acquire().await;
        assert!(err.is_err());
        assert_eq!(store.acquire_failures.load(Ordering::SeqCst), before - 1);
    }

    /// with_lock stops the work when the lock is lost and says which lock.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn with_lock_reports_the_lost_key() {
        let store = MemoryBackend::new();
        let client = LockClient::new(store.clone());
        let breaker = client.clone();
        let opts = LockOptions::new().ttl(Duration::from_millis(300));
        let err = client
            .with_lock("report", opts, |lock| async move {
                assert!(!lock.is_lost());
                breaker.force_release("report").await.unwrap();
                lock.lost().await;
                std::future::pending::<()>().await
            })
            .await
            .unwrap_err();
        assert!(
            matches!(&err, LockError::Lost { key } if key.as_str() == "report"),
            "{err:?}"
        );
    }

    /// try_with_lock skips the work when the lock is held, and runs it when free.
    #[tokio::test]
    async fn try_with_lock_skips_a_held_lock() {
        let client = LockClient::new(MemoryBackend::new());
        let held = client.lock("cron").acquire().await.unwrap();
        let ran = std::sync::atomic::AtomicBool::new(false);
        let out = client
            .try_with_lock("cron", LockOptions::new(), |_| async {
                ran.store(true, Ordering::SeqCst);
            })
            .await
            .unwrap();
        assert!(out.is_none() && !ran.load(Ordering::SeqCst));
        held.release().await.unwrap();
        let token = client
            .try_with_lock(
                "cron",
                LockOptions::new(),
                |lock| async move { lock.token() },
            )
            .await
            .unwrap();
        assert!(token.is_some());
        assert!(
            client.inspect("cron").await.unwrap().is_none(),
            "released after the work"
        );
    }
}
