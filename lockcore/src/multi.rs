//! Several locks at once: all or nothing, one fencing token per key.
//!
//! A store that can take a set in one atomic step ([`LockBackend::claim_all`]; which stores
//! can is in docs/multi-key.md) gets one request for the whole set, made with a fresh owner; the
//! set machinery is in `set.rs`. Otherwise (Redlock, Redis Cluster across slots, a set by
//! an owner the caller gave, which may re-enter some keys) the keys are taken one by one
//! here. Either way they are taken in one canonical order (their bytes, ascending),
//! whatever order the caller gave: two requests for overlapping sets then take their common
//! keys, and their turns in this client's lines, in the same order, so neither can hold
//! what the other needs while waiting for what the other holds. A key that cannot be had
//! (deadline, error) releases the keys taken before it, and the request answers only once
//! they are released.
//!
//! [`LockBackend::claim_all`]: crate::LockBackend::claim_all

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::{join_all, select_all};

use tokio::runtime::Handle;

use crate::acquire::no_runtime;
use crate::guard::{LockGuard, LockHandle};
use crate::inner::ClientInner;
use crate::request::{LockOptions, LockRequest};
use crate::set::{SetAnswer, SetRequest};
use crate::{FencingToken, LockError, LockKey, Owner, ReleaseOutcome, RetryPolicy};

/// A request for several locks at once, built by
/// [`LockClient::lock_all`](crate::LockClient::lock_all). Its options apply to every key.
#[derive(Debug)]
#[must_use = "a lock request does nothing until `acquire()` or `try_acquire()` is awaited"]
pub struct MultiLockRequest {
    client: Arc<ClientInner>,
    keys: Vec<String>,
    options: LockOptions,
}

impl MultiLockRequest {
    pub(crate) fn new(client: Arc<ClientInner>, keys: Vec<String>) -> Self {
        MultiLockRequest {
            client,
            keys,
            options: LockOptions::default(),
        }
    }

    /// The lease TTL of every key (see [`LockRequest::ttl`]).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.options.ttl = Some(ttl);
        self
    }

    /// How long [`acquire`](Self::acquire) may wait for the whole set, all keys together,
    /// before failing with [`LockError::Timeout`] (see [`LockRequest::wait`]).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.options.wait = Some(wait);
        self
    }

    /// Acquires every key as `owner`, re-entering the keys it already holds through this
    /// client (see [`LockRequest::owner`]). Without it, each key gets a fresh owner.
    pub fn owner(mut self, owner: Owner) -> Self {
        self.options.owner = Some(owner);
        self
    }

    /// Whether the watchdog renews the leases (default `true`; see
    /// [`LockRequest::watchdog`]).
    pub fn watchdog(mut self, renew: bool) -> Self {
        self.options.no_watchdog = !renew;
        self
    }

    /// Retries store failures following `policy` (see [`LockRequest::retry`]).
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.options.retry = Some(policy);
        self
    }

    /// Takes every key as a read (shared) lock (see [`LockRequest::shared`]).
    pub fn shared(mut self) -> Self {
        self.options.shared = true;
        self
    }

    /// The keys in the order they are taken, checked before anything is sent.
    fn ordered_keys(&self) -> Result<Vec<String>, LockError> {
        if self.keys.is_empty() {
            return Err(LockError::config("lock_all needs at least one key"));
        }
        for key in &self.keys {
            LockKey::new(key)?;
        }
        let mut keys = self.keys.clone();
        keys.sort_unstable();
        if let Some(twice) = keys.windows(2).find(|pair| pair[0] == pair[1]) {
            return Err(LockError::config(format!(
                "lock_all got the key {:?} twice: a set names each key once",
                twice[0]
            )));
        }
        self.options.claim()?;
        Ok(keys)
    }

    /// The request for the whole set in one attempt of the store
    /// ([`LockBackend::claim_all`](crate::LockBackend::claim_all)), for a fresh owner: an
    /// owner the caller gave may hold some of the keys already, and re-entering them is
    /// this client's business, key by key.
    fn one_request(&self, keys: &[String]) -> Result<Option<SetRequest>, LockError> {
        let Some(first) = keys.first().filter(|_| self.options.owner.is_none()) else {
            return Ok(None);
        };
        let req = self.request(first.clone(), None).validate()?;
        let keys = keys.iter().map(LockKey::new).collect::<Result<_, _>>()?;
        let runtime = Handle::try_current().map_err(|_| no_runtime())?;
        Ok(Some(SetRequest::new(
            self.client.clone(),
            keys,
            req,
            runtime,
        )))
    }

    /// The request for one key of the set, with what is left of the set's deadline.
    fn request(&self, key: String, deadline: Option<std::time::Instant>) -> LockRequest {
        let mut options = self.options.clone();
        if let Some(deadline) = deadline {
            options.wait = Some(deadline.saturating_duration_since(self.client.now()));
        }
        LockRequest::new(self.client.clone(), key, options)
    }

    /// Waits until every key is held and returns their guard.
    ///
    /// # Errors
    ///
    /// * [`LockError::InvalidKey`], [`LockError::InvalidTtl`], and [`LockError::Config`]
    ///   for an empty set or a key named twice: before any request is sent.
    /// * [`LockError::Timeout`]: the [`wait`](Self::wait) deadline passed; it names the key
    ///   that was still held by others and how long the whole set waited.
    /// * Otherwise as [`LockRequest::acquire`], for the key that failed.
    ///
    /// On any error nothing of the request is held: the keys taken before the failure are
    /// released before it is returned.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe. If this future is dropped midway, the keys already taken are released
    /// in the background and the attempt in flight is settled as
    /// [`LockRequest::acquire`]'s is ([`LockClient::shutdown`](crate::LockClient::shutdown)
    /// waits for both).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> Result<(), distlock_core::LockError> {
    /// use std::time::Duration;
    /// use distlock_core::{LockClient, memory::MemoryBackend};
    ///
    /// let locks = LockClient::new(MemoryBackend::new());
    /// let both = locks
    ///     .lock_all(["acct:2", "acct:1"])
    ///     .ttl(Duration::from_secs(10))
    ///     .wait(Duration::from_secs(5))
    ///     .acquire()
    ///     .await?;
    /// let from = both.token("acct:1").expect("in the set");
    /// let to = both.token("acct:2").expect("in the set");
    /// // ... debit acct:1 with `from`, credit acct:2 with `to`: each write fenced by its token
    /// # let _ = (from, to);
    /// both.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn acquire(self) -> Result<MultiLockGuard, LockError> {
        let keys = self.ordered_keys()?;
        let started = self.client.now();
        let deadline = self.options.wait.and_then(|w| started.checked_add(w));
        if let Some(set) = self.one_request(&keys)? {
            match set.run(true).await? {
                SetAnswer::Acquired(guards) => return Ok(MultiLockGuard { guards }),
                SetAnswer::Held(key) => {
                    return Err(LockError::Timeout {
                        key,
                        waited: self.client.elapsed(started),
                    })
                }
                SetAnswer::OneByOne => {}
            }
        }
        let mut guards = Vec::with_capacity(keys.len());
        for key in keys {
            match self.request(key, deadline).acquire().await {
                Ok(guard) => guards.push(guard),
                Err(e) => {
                    release_all(guards).await;
                    return Err(match e {
                        LockError::Timeout { key, .. } => LockError::Timeout {
                            key,
                            waited: self.client.elapsed(started),
                        },
                        other => other,
                    });
                }
            }
        }
        Ok(MultiLockGuard { guards })
    }

    /// Makes one attempt at each key: `Ok(Some(guard))` if every key was free (or already
    /// held by this owner through this client), `Ok(None)`, with nothing held, if another
    /// owner holds any of them.
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
    /// # #[tokio::main] async fn main() -> Result<(), distlock_core::LockError> {
    /// use distlock_core::{LockClient, memory::MemoryBackend};
    ///
    /// let locks = LockClient::new(MemoryBackend::new());
    /// let busy = locks.lock("report:b").acquire().await?;
    /// assert!(locks.lock_all(["report:a", "report:b"]).try_acquire().await?.is_none());
    /// assert!(locks.lock("report:a").try_acquire().await?.is_some(), "nothing was left held");
    /// # drop(busy);
    /// # Ok(()) }
    /// ```
    pub async fn try_acquire(self) -> Result<Option<MultiLockGuard>, LockError> {
        let keys = self.ordered_keys()?;
        if let Some(set) = self.one_request(&keys)? {
            match set.run(false).await? {
                SetAnswer::Acquired(guards) => return Ok(Some(MultiLockGuard { guards })),
                SetAnswer::Held(_) => return Ok(None),
                SetAnswer::OneByOne => {}
            }
        }
        let mut guards = Vec::with_capacity(keys.len());
        for key in keys {
            match self.request(key, None).try_acquire().await {
                Ok(Some(guard)) => guards.push(guard),
                answer => {
                    release_all(guards).await;
                    return answer.map(|_| None);
                }
            }
        }
        Ok(Some(MultiLockGuard { guards }))
    }

    /// Runs `work` under every lock of the set and releases them afterwards, waiting for
    /// the set as [`acquire`](Self::acquire) does. `work` gets a handle per key (in the
    /// set's order); it is stopped with [`LockError::Lost`] if any of the locks is lost
    /// first (see [`LockRequest::with_lock`] for what stopping means).
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire), plus [`LockError::Lost`], plus the releases' errors.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future drops `work` and releases the locks in the
    /// background.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> Result<(), distlock_core::LockError> {
    /// use distlock_core::{LockClient, memory::MemoryBackend};
    ///
    /// let locks = LockClient::new(MemoryBackend::new());
    /// let tokens = locks
    ///     .lock_all(["stock:apples", "stock:pears"])
    ///     .with_lock(|locks| async move { locks.iter().map(|l| l.token()).collect::<Vec<_>>() })
    ///     .await?;
    /// assert_eq!(tokens.len(), 2);
    /// # Ok(()) }
    /// ```
    pub async fn with_lock<F, Fut, T>(self, work: F) -> Result<T, LockError>
    where
        F: FnOnce(Vec<LockHandle>) -> Fut,
        Fut: Future<Output = T>,
    {
        let guard = self.acquire().await?;
        guard.run(work).await
    }

    /// Runs `work` under every lock of the set if all are free now, and returns `Ok(None)`
    /// at once, without running it and with nothing held, otherwise. As
    /// [`with_lock`](Self::with_lock) otherwise.
    ///
    /// # Errors
    ///
    /// As [`try_acquire`](Self::try_acquire), plus [`LockError::Lost`], plus the releases'
    /// errors.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, like [`with_lock`](Self::with_lock).
    pub async fn try_with_lock<F, Fut, T>(self, work: F) -> Result<Option<T>, LockError>
    where
        F: FnOnce(Vec<LockHandle>) -> Fut,
        Fut: Future<Output = T>,
    {
        match self.try_acquire().await? {
            Some(guard) => guard.run(work).await.map(Some),
            None => Ok(None),
        }
    }
}

/// Releases `guards` together; what fails to release expires after its TTL.
async fn release_all(guards: Vec<LockGuard>) {
    join_all(guards.into_iter().map(LockGuard::release)).await;
}

/// Several held locks, from [`MultiLockRequest`]: one guard per key, in the set's order
/// (the keys' bytes, ascending). Each key has its own fencing token and lease, renewed by
/// the watchdog; [`lost`](Self::lost) fires when any of them is lost.
///
/// Dropping it drops every guard: each lock is released in the background.
#[derive(Debug)]
#[must_use = "the locks are released when this is dropped"]
pub struct MultiLockGuard {
    guards: Vec<LockGuard>,
}

impl MultiLockGuard {
    /// The guard of each key, in the set's order.
    pub fn guards(&self) -> &[LockGuard] {
        &self.guards
    }

    /// The guards, to hold and release one by one.
    pub fn into_guards(self) -> Vec<LockGuard> {
        self.guards
    }

    /// The fencing token of `key`, if it is in the set.
    pub fn token(&self, key: &str) -> Option<FencingToken> {
        self.guards
            .iter()
            .find(|g| g.key().as_str() == key)
            .map(|g| g.token())
    }

    /// Each key with its fencing token, in the set's order.
    pub fn tokens(&self) -> impl Iterator<Item = (&LockKey, FencingToken)> + '_ {
        self.guards.iter().map(|g| (g.key(), g.token()))
    }

    /// Resolves when any lock of the set is lost (see
    /// [`LockHandle::lost`]). The set is then no longer held as a whole.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        let signals: Vec<_> = self.guards.iter().map(|g| Box::pin(g.lost())).collect();
        async move {
            select_all(signals).await;
        }
    }

    /// Whether any lock of the set is known to be lost.
    pub fn is_lost(&self) -> bool {
        self.guards.iter().any(|g| g.is_lost())
    }

    /// Renews every lease now, as [`LockHandle::extend`] does for one.
    ///
    /// # Errors
    ///
    /// The first key's error, naming it ([`LockError::NotHeld`] for a lost one); every key
    /// is tried.
    pub async fn extend(&self) -> Result<(), LockError> {
        let answers = join_all(self.guards.iter().map(|g| g.extend())).await;
        answers.into_iter().collect()
    }

    /// Releases every lock of the set, together.
    ///
    /// Returns [`ReleaseOutcome::Released`] when each lock was freed (or counted down by a
    /// re-entry: then [`ReleaseOutcome::StillHeld`] with the most holds left on a key),
    /// and [`ReleaseOutcome::NotHeld`] if any had already been lost.
    ///
    /// # Errors
    ///
    /// The first key's store error, once every release was tried; a lock that could not
    /// be released expires after its TTL.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: each release is finished in the background if this future is dropped.
    pub async fn release(self) -> Result<ReleaseOutcome, LockError> {
        let answers = join_all(self.guards.into_iter().map(LockGuard::release)).await;
        let mut outcome = ReleaseOutcome::Released;
        for answer in answers {
            outcome = match (outcome, answer?) {
                (_, ReleaseOutcome::NotHeld) | (ReleaseOutcome::NotHeld, _) => {
                    ReleaseOutcome::NotHeld
                }
                (
                    ReleaseOutcome::StillHeld { holds: a },
                    ReleaseOutcome::StillHeld { holds: b },
                ) => ReleaseOutcome::StillHeld { holds: a.max(b) },
                (ReleaseOutcome::StillHeld { holds }, _)
                | (_, ReleaseOutcome::StillHeld { holds }) => ReleaseOutcome::StillHeld { holds },
                _ => ReleaseOutcome::Released,
            };
        }
        Ok(outcome)
    }

    /// Runs `work` with a handle per key, stopping it if any lock is lost first.
    async fn run<F, Fut, T>(self, work: F) -> Result<T, LockError>
    where
        F: FnOnce(Vec<LockHandle>) -> Fut,
        Fut: Future<Output = T>,
    {
        let lost = self.lost();
        let handles = self.guards.iter().map(LockGuard::handle).collect();
        let out = tokio::select! {
            biased;
            _ = lost => None,
            v = work(handles) => Some(v),
        };
        match out {
            Some(v) => {
                self.release().await?;
                Ok(v)
            }
            None => {
                // The one that fired; a set is never empty.
                let lost = self.guards.iter().find(|g| g.is_lost());
                let key = lost.or(self.guards.first()).map(|g| g.key().clone());
                drop(self);
                Err(match key {
                    Some(key) => LockError::Lost { key },
                    None => LockError::config("lock_all needs at least one key"),
                })
            }
        }
    }

    /// Until when the whole set is valid: the earliest [`valid_until`](LockHandle::valid_until)
    /// of its keys, on this process's monotonic clock. Renewals move it forward; a key whose
    /// renewals fail holds it back, so work that must end while every key is held can watch
    /// this one instant.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> Result<(), distlock_core::LockError> {
    /// use std::time::{Duration, Instant};
    /// use distlock_core::{LockClient, memory::MemoryBackend};
    ///
    /// let locks = LockClient::new(MemoryBackend::new());
    /// let both = locks.lock_all(["acct:1", "acct:2"]).ttl(Duration::from_secs(10)).acquire().await?;
    /// let earliest = both.guards().iter().map(|g| g.valid_until()).min();
    /// assert_eq!(Some(both.valid_until()), earliest);
    /// assert!(both.valid_until() > Instant::now());
    /// both.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn valid_until(&self) -> std::time::Instant {
        self.guards
            .iter()
            .map(|g| g.valid_until())
            .min()
            // A set is never empty; an empty one would hold nothing, from now on.
            .unwrap_or_else(std::time::Instant::now)
    }
}
