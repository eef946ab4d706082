//! Locks for code without an async runtime (command-line tools, synchronous services,
//! tests), in the manner of `reqwest::blocking`: the same client, requests, guards and
//! errors as the async API, each call blocking the calling thread until it is answered.
//!
//! A [`LockClient`] runs its own small tokio runtime (one worker thread, named
//! `distlock-blocking`) for the store's connections, the renewal of held locks and
//! background clean-up. Its methods must not be called from inside an async runtime: there
//! they return [`LockError::Config`] saying so (they never panic); async code uses
//! [`crate::LockClient`].
//!
//! A [`LockGuard`] releases its lock when it is dropped, before `drop` returns, as
//! `std::sync::MutexGuard` does; [`LockGuard::release`] does the same and returns the
//! outcome. Whether the lock was lost is a flag ([`LockGuard::is_lost`]) and a wait with a
//! timeout ([`LockGuard::wait_lost`]).
//!
//! # Examples
//!
//! ```
//! use std::time::Duration;
//! use distlock::blocking::LockClient;
//!
//! # fn main() -> Result<(), distlock::LockError> {
//! let locks = LockClient::connect("memory:")?;
//! let guard = locks.lock("invoice:42").ttl(Duration::from_secs(10)).wait(Duration::from_secs(5)).acquire()?;
//! println!("writing with fencing token {}", guard.token());
//! guard.release()?;
//! # Ok(()) }
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::runtime::{Handle, Runtime};

use crate::{
    FencingToken, Lease, LockBackend, LockError, LockInfo, LockKey, Owner, ReleaseOutcome,
    RetryPolicy,
};

/// The runtime a blocking client and its guards share; shut down when the last of them goes.
#[derive(Debug)]
struct Rt {
    runtime: Option<Runtime>,
}

impl Rt {
    fn new() -> Result<Arc<Self>, LockError> {
        refuse_inside_runtime()?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("distlock-blocking")
            .enable_all()
            .build()
            .map_err(|e| {
                LockError::config(format!("cannot start the blocking client's runtime: {e}"))
            })?;
        Ok(Arc::new(Rt {
            runtime: Some(runtime),
        }))
    }

    /// Runs `fut` to completion on the calling thread.
    fn block_on<F: std::future::Future>(&self, fut: F) -> Result<F::Output, LockError> {
        refuse_inside_runtime()?;
        match &self.runtime {
            Some(rt) => Ok(rt.block_on(fut)),
            None => Err(LockError::Shutdown),
        }
    }
}

impl Drop for Rt {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            // Dropping a runtime blocks, which an async context forbids.
            rt.shutdown_background();
        }
    }
}

fn refuse_inside_runtime() -> Result<(), LockError> {
    if Handle::try_current().is_ok() {
        return Err(LockError::config(
            "distlock::blocking cannot be used inside an async runtime (it would block the \
             runtime's thread); use the async distlock::LockClient there",
        ));
    }
    Ok(())
}

/// A blocking handle to a lock store; see the [module docs](self).
///
/// Cheap to clone; clones share the runtime, reentrancy state and background work.
#[derive(Clone, Debug)]
pub struct LockClient {
    inner: crate::LockClient,
    rt: Arc<Rt>,
}

impl LockClient {
    /// Connects to the store named by `url`, as [`crate::connect`] does.
    ///
    /// # Errors
    ///
    /// As [`crate::connect`]; [`LockError::Config`] inside an async runtime.
    pub fn connect(url: &str) -> Result<Self, LockError> {
        let rt = Rt::new()?;
        let inner = rt.block_on(crate::connect(url))??;
        Ok(LockClient { inner, rt })
    }

    /// A client over `backend` with default settings.
    ///
    /// A backend whose connections run background tasks (Redis, PostgreSQL, etcd) keeps
    /// them on the runtime that built it, which a blocking program does not have: prefer
    /// [`connect`](Self::connect), which builds the backend on the client's own runtime.
    /// Backends without such tasks (memory) are fine here.
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] inside an async runtime, or if the runtime cannot start.
    pub fn new(backend: Arc<dyn LockBackend>) -> Result<Self, LockError> {
        Self::builder(backend).build()
    }

    /// A builder for a client over `backend`, with the settings of
    /// [`crate::LockClientBuilder`].
    pub fn builder(backend: Arc<dyn LockBackend>) -> LockClientBuilder {
        LockClientBuilder {
            inner: crate::LockClient::builder(backend),
        }
    }

    /// Starts a request for the lock named `key`.
    pub fn lock(&self, key: impl Into<String>) -> LockRequest {
        LockRequest {
            inner: self.inner.lock(key),
            rt: self.rt.clone(),
        }
    }

    /// A request for permits of the semaphore `key` of `capacity` permits (see
    /// [`crate::LockClient::semaphore`]).
    pub fn semaphore(&self, key: impl Into<String>, capacity: u32) -> LockRequest {
        LockRequest {
            inner: self.inner.semaphore(key, capacity),
            rt: self.rt.clone(),
        }
    }

    /// Every live lease on `key` (see [`crate::LockClient::inspect_all`]).
    ///
    /// # Errors
    ///
    /// As [`crate::LockClient::inspect_all`]; [`LockError::Config`] inside an async runtime.
    pub fn inspect_all(&self, key: impl AsRef<str>) -> Result<Vec<LockInfo>, LockError> {
        self.rt.block_on(self.inner.inspect_all(key))?
    }

    /// The holder of `key`, or `None` if it is free (never the owner token).
    ///
    /// # Errors
    ///
    /// As [`crate::LockClient::inspect`]; [`LockError::Config`] inside an async runtime.
    pub fn inspect(&self, key: impl AsRef<str>) -> Result<Option<LockInfo>, LockError> {
        self.rt.block_on(self.inner.inspect(key))?
    }

    /// Frees `key` whoever holds it: an operator's break-lock (see
    /// [`crate::LockClient::force_release`]).
    ///
    /// # Errors
    ///
    /// As [`crate::LockClient::force_release`]; [`LockError::Config`] inside an async
    /// runtime.
    pub fn force_release(&self, key: impl AsRef<str>) -> Result<ReleaseOutcome, LockError> {
        self.rt.block_on(self.inner.force_release(key))?
    }

    /// A new owner with this client's label, for reentrant locking with
    /// [`LockRequest::owner`].
    pub fn new_owner(&self) -> Owner {
        self.inner.new_owner()
    }

    /// Waits for background work (releases that could not finish at once) for at most the
    /// client's shutdown timeout, and stops accepting requests; whether all of it finished.
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] inside an async runtime.
    pub fn shutdown(&self) -> Result<bool, LockError> {
        self.rt.block_on(self.inner.shutdown())
    }

    /// The async client underneath, for code that has both.
    pub fn as_async(&self) -> &crate::LockClient {
        &self.inner
    }
}

/// Builds a blocking [`LockClient`]; the settings are [`crate::LockClientBuilder`]'s.
#[derive(Debug)]
pub struct LockClientBuilder {
    inner: crate::LockClientBuilder,
}

impl LockClientBuilder {
    /// See [`crate::LockClientBuilder::label`].
    pub fn label(self, label: impl Into<String>) -> Self {
        LockClientBuilder {
            inner: self.inner.label(label),
        }
    }

    /// See [`crate::LockClientBuilder::default_ttl`].
    pub fn default_ttl(self, ttl: Duration) -> Self {
        LockClientBuilder {
            inner: self.inner.default_ttl(ttl),
        }
    }

    /// See [`crate::LockClientBuilder::shutdown_timeout`].
    pub fn shutdown_timeout(self, timeout: Duration) -> Self {
        LockClientBuilder {
            inner: self.inner.shutdown_timeout(timeout),
        }
    }

    /// See [`crate::LockClientBuilder::metrics_by_key`].
    #[cfg(feature = "metrics")]
    pub fn metrics_by_key(self, by_key: bool) -> Self {
        LockClientBuilder {
            inner: self.inner.metrics_by_key(by_key),
        }
    }

    /// Builds the client and starts its runtime.
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] inside an async runtime, or if the runtime cannot start.
    pub fn build(self) -> Result<LockClient, LockError> {
        let rt = Rt::new()?;
        Ok(LockClient {
            inner: self.inner.build(),
            rt,
        })
    }
}

/// A request for one lock, built by [`LockClient::lock`]; the options are
/// [`crate::LockRequest`]'s.
#[derive(Debug)]
#[must_use = "a lock request does nothing until `acquire()` or `try_acquire()` is called"]
pub struct LockRequest {
    inner: crate::LockRequest,
    rt: Arc<Rt>,
}

impl LockRequest {
    /// See [`crate::LockRequest::ttl`].
    pub fn ttl(self, ttl: Duration) -> Self {
        self.map(|r| r.ttl(ttl))
    }

    /// See [`crate::LockRequest::wait`].
    pub fn wait(self, wait: Duration) -> Self {
        self.map(|r| r.wait(wait))
    }

    /// See [`crate::LockRequest::owner`].
    pub fn owner(self, owner: Owner) -> Self {
        self.map(|r| r.owner(owner))
    }

    /// See [`crate::LockRequest::watchdog`].
    pub fn watchdog(self, renew: bool) -> Self {
        self.map(|r| r.watchdog(renew))
    }

    /// See [`crate::LockRequest::retry`].
    pub fn retry(self, policy: RetryPolicy) -> Self {
        self.map(|r| r.retry(policy))
    }

    /// See [`crate::LockRequest::shared`].
    pub fn shared(self) -> Self {
        self.map(|r| r.shared())
    }

    /// See [`crate::LockRequest::permits`].
    pub fn permits(self, permits: u32) -> Self {
        self.map(|r| r.permits(permits))
    }

    fn map(self, f: impl FnOnce(crate::LockRequest) -> crate::LockRequest) -> Self {
        LockRequest {
            inner: f(self.inner),
            rt: self.rt,
        }
    }

    /// Blocks until the lock is held (or the [`wait`](Self::wait) deadline passes).
    ///
    /// # Errors
    ///
    /// As [`crate::LockRequest::acquire`]; [`LockError::Config`] inside an async runtime.
    pub fn acquire(self) -> Result<LockGuard, LockError> {
        let guard = self.rt.block_on(self.inner.acquire())??;
        Ok(LockGuard {
            inner: Some(guard),
            rt: self.rt,
        })
    }

    /// One attempt: `Ok(None)` if another owner holds the lock.
    ///
    /// # Errors
    ///
    /// As [`crate::LockRequest::try_acquire`]; [`LockError::Config`] inside an async
    /// runtime.
    pub fn try_acquire(self) -> Result<Option<LockGuard>, LockError> {
        let guard = self.rt.block_on(self.inner.try_acquire())??;
        Ok(guard.map(|guard| LockGuard {
            inner: Some(guard),
            rt: self.rt,
        }))
    }
}

/// A held lock; released when dropped (before `drop` returns) or by
/// [`release`](Self::release). Renewed by the client's watchdog while it lives.
#[must_use = "dropping the guard releases the lock at once"]
#[derive(Debug)]
pub struct LockGuard {
    inner: Option<crate::LockGuard>,
    rt: Arc<Rt>,
}

impl LockGuard {
    fn guard(&self) -> &crate::LockGuard {
        match &self.inner {
            Some(guard) => guard,
            None => unreachable!("the inner guard is only taken by release and drop"),
        }
    }

    /// The locked key.
    pub fn key(&self) -> &LockKey {
        self.guard().key()
    }

    /// The fencing token: send it with every write the lock protects.
    pub fn token(&self) -> FencingToken {
        self.guard().token()
    }

    /// The owner holding the lock (for re-entry with [`LockRequest::owner`]).
    pub fn owner(&self) -> &Owner {
        self.guard().owner()
    }

    /// What the hold takes of its key (see [`crate::LockHandle::claim`]).
    pub fn claim(&self) -> crate::Claim {
        self.guard().claim()
    }

    /// Until when the hold is valid on this process's monotonic clock.
    pub fn valid_until(&self) -> Instant {
        self.guard().valid_until()
    }

    /// A snapshot of the lease.
    pub fn lease(&self) -> Lease {
        self.guard().lease()
    }

    /// Whether the lock is known (or must be assumed) lost; see
    /// [`crate::LockHandle::lost`]. Advisory: the fencing token protects the resource.
    pub fn is_lost(&self) -> bool {
        self.guard().is_lost()
    }

    /// Blocks until the lock is lost or `timeout` passes: whether it was lost.
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] inside an async runtime.
    pub fn wait_lost(&self, timeout: Duration) -> Result<bool, LockError> {
        let lost = self.guard().lost();
        self.rt
            .block_on(async { tokio::time::timeout(timeout, lost).await.is_ok() })
    }

    /// Renews the lease now (the watchdog does this on its own).
    ///
    /// # Errors
    ///
    /// As [`crate::LockHandle::extend`]; [`LockError::Config`] inside an async runtime.
    pub fn extend(&self) -> Result<(), LockError> {
        self.rt.block_on(self.guard().extend())?
    }

    /// Releases the lock and returns the outcome ([`ReleaseOutcome::StillHeld`] while
    /// reentrant guards remain).
    ///
    /// # Errors
    ///
    /// As [`crate::LockGuard::release`]; [`LockError::Config`] inside an async runtime
    /// (the lock is then released in the background, as a drop would).
    pub fn release(mut self) -> Result<ReleaseOutcome, LockError> {
        match self.inner.take() {
            // Refused inside a runtime, the unpolled release drops the guard, which
            // releases in the background.
            Some(guard) => self.rt.block_on(guard.release())?,
            None => Ok(ReleaseOutcome::NotHeld),
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if let Some(guard) = self.inner.take() {
            // A failed release is logged by lockcore; the lock then expires after its TTL.
            // Inside an async runtime, where blocking is refused, the unpolled release drops
            // the guard, which releases in the background.
            let _ = self.rt.block_on(guard.release());
        }
    }
}
