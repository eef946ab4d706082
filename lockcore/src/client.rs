//! The client: the handle users hold, its builder, and the calls that run work under a
//! lock.

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::inner::ClientInner;
use crate::line::Lines;
use crate::metrics::Meter;
use crate::multi::MultiLockRequest;
use crate::request::{LockOptions, LockRequest};
use crate::slots::SlotMap;
use crate::LockBackendExt;
use crate::{
    Capabilities, LockBackend, LockError, LockInfo, LockKey, Operation, Owner, ReleaseOutcome,
};

/// A handle to a lock store: hands out [`LockGuard`](crate::LockGuard)s.
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
/// * [`LockRequest::with_lock`] runs a future under the lock and stops it if the lock
///   is lost.
///
/// # Examples
///
/// ```
/// # #[tokio::main] async fn main() -> Result<(), distlock_core::LockError> {
/// use std::time::Duration;
/// use distlock_core::{LockClient, memory::MemoryBackend};
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

/// Builds a [`LockClient`] with non-default settings.
#[derive(Debug)]
pub struct LockClientBuilder {
    backend: Arc<dyn LockBackend>,
    label: Option<String>,
    default_ttl: Duration,
    shutdown_timeout: Duration,
    metrics_by_key: bool,
}

impl LockClientBuilder {
    /// The label of the owners this client creates (default: `hostname/pid`).
    pub fn label(mut self, label: impl Into<String>) -> Self {
        self.label = Some(label.into());
        self
    }

    /// The TTL of requests that set none (default: [`LockClient::DEFAULT_TTL`], 30 s).
    pub fn default_ttl(mut self, ttl: Duration) -> Self {
        self.default_ttl = ttl;
        self
    }

    /// How long [`LockClient::shutdown`] waits for background work (releases of dropped
    /// guards, clean-up of cancelled acquisitions) before giving up on it (default
    /// [`LockClient::DEFAULT_SHUTDOWN_TIMEOUT`], 5 s). Locks whose release did not finish expire after
    /// their TTL. Keep it below your orchestrator's grace period (Kubernetes: 30 s).
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.shutdown_timeout = timeout;
        self
    }

    /// Whether the client's [metrics](crate::metrics) carry the lock key as a label `key`
    /// (default `false`). Every distinct key becomes a time series of its own in the
    /// exporter: turn it on only where the keys are few and known (a handful of singleton
    /// jobs), never for per-entity locks (`invoice:42`).
    ///
    /// # Examples
    ///
    /// ```
    /// use distlock_core::{LockClient, memory::MemoryBackend};
    ///
    /// let locks = LockClient::builder(MemoryBackend::new()).metrics_by_key(true).build();
    /// ```
    #[cfg(feature = "metrics")]
    pub fn metrics_by_key(mut self, by_key: bool) -> Self {
        self.metrics_by_key = by_key;
        self
    }

    /// Builds the client.
    pub fn build(self) -> LockClient {
        let caps = self.backend.capabilities();
        let label = self.label.unwrap_or_else(crate::owner::default_label);
        let meter = Meter::new(self.backend.name(), self.metrics_by_key);
        LockClient {
            inner: Arc::new(ClientInner {
                meter,
                backend: self.backend,
                caps,
                label: Owner::new(label).shared_label().clone(),
                default_ttl: self.default_ttl,
                shutdown_timeout: self.shutdown_timeout,
                slots: SlotMap::default(),
                lines: Lines::default(),
                tasks: TaskTracker::new(),
                closed: CancellationToken::new(),
                marked: AtomicUsize::new(0),
            }),
        }
    }
}

impl LockClient {
    /// The TTL used when a request sets none.
    pub const DEFAULT_TTL: Duration = Duration::from_secs(30);

    /// How long [`shutdown`](Self::shutdown) waits for background work by default.
    pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

    /// A client over `backend` with default settings.
    pub fn new(backend: Arc<dyn LockBackend>) -> Self {
        Self::builder(backend).build()
    }

    /// A builder for a client over `backend`.
    pub fn builder(backend: Arc<dyn LockBackend>) -> LockClientBuilder {
        LockClientBuilder {
            backend,
            label: None,
            default_ttl: LockClient::DEFAULT_TTL,
            shutdown_timeout: LockClient::DEFAULT_SHUTDOWN_TIMEOUT,
            metrics_by_key: false,
        }
    }

    /// Starts a request for the lock named `key`; set options, then
    /// [`acquire`](LockRequest::acquire) or [`try_acquire`](LockRequest::try_acquire).
    /// The key is validated when the request is sent, before any store round trip.
    pub fn lock(&self, key: impl Into<String>) -> LockRequest {
        LockRequest::new(self.inner.clone(), key.into(), LockOptions::default())
    }

    /// A request for several locks at once, all or nothing: exclusive locks on each of
    /// `keys` (or read locks, with [`shared`](MultiLockRequest::shared)), each with its own
    /// fencing token, taken in one canonical order so that sets that overlap never wait for
    /// each other in a circle. See [`MultiLockRequest::acquire`].
    pub fn lock_all<I, K>(&self, keys: I) -> MultiLockRequest
    where
        I: IntoIterator<Item = K>,
        K: Into<String>,
    {
        MultiLockRequest::new(
            self.inner.clone(),
            keys.into_iter().map(Into::into).collect(),
        )
    }

    /// A request for `permits` (default 1, see [`LockRequest::permits`]) of the counting
    /// semaphore `key` of `capacity` permits: at most `capacity` permits are out at once
    /// across every client and process, as `consul lock -n` or
    /// [`tokio::sync::Semaphore`] within one process. Each holder has its own lease,
    /// fencing token, watchdog and [`lost`](crate::LockHandle::lost) signal; a dead holder's
    /// permits come back after its TTL.
    ///
    /// The capacity is stored with the key while anyone holds or waits for it: a request
    /// with another capacity (or a plain [`lock`](Self::lock) on the key) is refused with
    /// [`LockError::Config`] naming both, never redefining the key.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> Result<(), distlock_core::LockError> {
    /// use distlock_core::{LockClient, memory::MemoryBackend};
    ///
    /// let locks = LockClient::new(MemoryBackend::new());
    /// let two = locks.semaphore("encoders", 3).permits(2).acquire().await?;
    /// let one = locks.semaphore("encoders", 3).acquire().await?;
    /// assert!(locks.semaphore("encoders", 3).try_acquire().await?.is_none()); // 3 of 3 out
    /// assert_eq!(two.claim().semaphore_permits(), Some(2));
    /// two.release().await?;
    /// one.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn semaphore(&self, key: impl Into<String>, capacity: u32) -> LockRequest {
        LockRequest::new(
            self.inner.clone(),
            key.into(),
            LockOptions::semaphore(capacity),
        )
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
        let info = self
            .inner
            .backend
            .inspect(&key)
            .instrument(tracing::debug_span!("distlock.inspect", key = %key, backend = self.inner.backend.name()))
            .await;
        info.map_err(|e| self.store_error(e, Operation::Inspect, &key))
    }

    /// Every live lease on `key` in grant order (tokens ascending): the exclusive holder,
    /// or each reader, or each semaphore holder with its permits ([`LockInfo::claim`]).
    /// Empty if the key is free. Never shows owner tokens.
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidKey`] for a bad key; store errors as the backend reports them.
    pub async fn inspect_all(&self, key: impl AsRef<str>) -> Result<Vec<LockInfo>, LockError> {
        let key = LockKey::new(key)?;
        let info = self
            .inner
            .backend
            .holders(&key)
            .instrument(tracing::debug_span!("distlock.inspect_all", key = %key, backend = self.inner.backend.name()))
            .await;
        info.map_err(|e| self.store_error(e, Operation::Inspect, &key))
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
        let outcome = self
            .inner
            .backend
            .force_release(&key)
            .instrument(tracing::info_span!("distlock.force_release", key = %key, backend = self.inner.backend.name()))
            .await;
        outcome.map_err(|e| self.store_error(e, Operation::ForceRelease, &key))
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

    /// A store error of `operation`, counted and put in context.
    fn store_error(&self, e: LockError, operation: Operation, key: &LockKey) -> LockError {
        self.inner.meter.store_error(key, operation, &e);
        e.during(operation, key)
    }

    /// How many of this client's requests are in `key`'s line.
    #[cfg(test)]
    pub(crate) fn in_line(&self, key: &str) -> usize {
        let key = LockKey::new(key).expect("a valid key");
        self.inner.lines.len(&key)
    }

    #[cfg(test)]
    pub(crate) fn slot_count(&self) -> usize {
        self.inner.slots.len()
    }
}
