//! Guards: what a holder keeps, and how a hold ends.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::hold::{Hold, RenewalHealth};
use crate::inner::ClientInner;
use crate::lease::now_on;
use crate::metrics::Meter;
use crate::slots::Slot;
use crate::LockBackendExt;
use crate::{
    ErrorChain, ExtendOutcome, FencingToken, Lease, LockBackend, LockError, LockKey, Operation,
    Owner, ReleaseOutcome, RetryPolicy,
};

/// A held lock. Release it with [`release`](Self::release); dropping it releases in the
/// background.
///
/// While the guard lives, a watchdog renews the lease every `ttl / 3`. If renewal finds the
/// lock gone, or keeps failing until shortly before [`valid_until`](LockHandle::valid_until),
/// [`lost`](LockHandle::lost) fires; the first failed renewal already shows in
/// [`renewal_failing`](LockHandle::renewal_failing).
///
/// Everything that observes the hold (key, token, lease, `lost()`, `extend()`) is on
/// [`LockHandle`], which the guard dereferences to; [`handle`](Self::handle) gives a
/// cloneable copy for other tasks. Only the guard releases.
///
/// # Drop
///
/// Dropping a guard without [`release`](Self::release) counts one reentrant hold down; at
/// zero it stops the watchdog and releases in the background on the tokio runtime that
/// acquired the lock, never blocking the dropping thread. If that runtime is gone, the TTL
/// frees the lock. [`LockClient::shutdown`](crate::LockClient::shutdown) waits for such background releases.
///
/// Guards are `Send` and not tied to a thread or task.
#[must_use = "dropping the guard releases the lock at once"]
pub struct LockGuard {
    handle: LockHandle,
    /// What the release needs; taken by it (or by the drop).
    held: Option<Held>,
}

/// What a guard's release needs besides the hold.
struct Held {
    client: Arc<ClientInner>,
    slot: Arc<Slot>,
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.handle.debug_fields(&mut f.debug_struct("LockGuard"))
    }
}

impl std::ops::Deref for LockGuard {
    type Target = LockHandle;

    fn deref(&self) -> &LockHandle {
        &self.handle
    }
}

/// A held lock as seen by work running under it: its key, fencing token and lease, the
/// [`lost`](Self::lost) and [`renewal_failing`](Self::renewal_failing) signals, and
/// [`extend`](Self::extend). It cannot release the lock (only the [`LockGuard`] does) and
/// does not keep it: once the guard is released, the handle reports a lease that is no
/// longer renewed.
///
/// Cheap to clone. [`LockRequest::with_lock`](crate::LockRequest::with_lock) hands one to its work; a [`LockGuard`]
/// dereferences to one, and [`LockGuard::handle`] clones it for another task.
#[derive(Clone)]
pub struct LockHandle {
    hold: Arc<Hold>,
}

impl std::fmt::Debug for LockHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.debug_fields(&mut f.debug_struct("LockHandle"))
    }
}

impl LockGuard {
    pub(crate) fn new(client: Arc<ClientInner>, slot: Arc<Slot>, hold: Arc<Hold>) -> Self {
        LockGuard {
            handle: LockHandle { hold },
            held: Some(Held { client, slot }),
        }
    }

    /// A handle to the hold for another task (or for [`LockRequest::with_lock`](crate::LockRequest::with_lock)-style work):
    /// token, lease, `lost()`, `extend()`, but no release.
    pub fn handle(&self) -> LockHandle {
        self.handle.clone()
    }

    /// Releases the lock: counts a reentrant hold down, and at zero stops the watchdog and
    /// frees the lock in the store (retrying transient failures while the lease is valid).
    ///
    /// Returns [`ReleaseOutcome::Released`], [`ReleaseOutcome::StillHeld`] while other
    /// reentrant guards remain, or [`ReleaseOutcome::NotHeld`] if the lock had already been
    /// lost (someone else may hold it now; it was not touched).
    ///
    /// # Errors
    ///
    /// Store errors as the backend reports them (naming the key and the operation), once
    /// retries within the lease are spent; the lock then expires after its TTL.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if this future is dropped midway, the release is finished by a
    /// background task (which [`LockClient::shutdown`](crate::LockClient::shutdown) waits for).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> Result<(), distlock_core::LockError> {
    /// use distlock_core::{LockClient, ReleaseOutcome, memory::MemoryBackend};
    ///
    /// let locks = LockClient::new(MemoryBackend::new());
    /// let owner = locks.new_owner();
    /// let outer = locks.lock("k").owner(owner.clone()).acquire().await?;
    /// let inner = locks.lock("k").owner(owner).acquire().await?; // re-entry
    /// assert_eq!(inner.release().await?, ReleaseOutcome::StillHeld { holds: 1 });
    /// assert_eq!(outer.release().await?, ReleaseOutcome::Released);
    /// # Ok(()) }
    /// ```
    pub async fn release(mut self) -> Result<ReleaseOutcome, LockError> {
        let hold = self.handle.hold.clone();
        let Some(Held { client, slot }) = self.held.take() else {
            return Ok(ReleaseOutcome::NotHeld); // unreachable: only a release or drop takes it
        };
        // Let go of our references now, so the release can forget the (key, owner) slot.
        drop(self);
        let mut release = FinishOnDrop {
            client: client.clone(),
            hold: hold.clone(),
            work: Some(Box::pin(release_hold(client, slot, hold))),
        };
        release.run().await
    }
}

#[cfg(test)]
impl LockHandle {
    /// The hold itself, for tests that drive its renewal by hand.
    pub(crate) fn hold(&self) -> Arc<Hold> {
        self.hold.clone()
    }
}

impl LockHandle {
    fn debug_fields(&self, d: &mut std::fmt::DebugStruct<'_, '_>) -> std::fmt::Result {
        d.field("key", &self.hold.key)
            .field("token", &self.hold.token)
            .field("claim", &self.hold.claim.mode())
            .field("valid_until", &self.hold.valid_until())
            .field("backend", &self.hold.backend.name())
            .finish()
    }

    /// The locked key.
    pub fn key(&self) -> &LockKey {
        &self.hold.key
    }

    /// The fencing token: send it with every write the lock protects.
    pub fn token(&self) -> FencingToken {
        self.hold.token
    }

    /// What the hold takes of its key: [`ClaimMode::Exclusive`](crate::ClaimMode::Exclusive)
    /// for a lock or a writer, [`Shared`](crate::ClaimMode::Shared) for a reader,
    /// [`Permits`](crate::ClaimMode::Permits) for a semaphore's permits
    /// ([`Claim::semaphore_permits`](crate::Claim::semaphore_permits)).
    pub fn claim(&self) -> crate::Claim {
        self.hold.claim
    }

    /// The owner holding the lock; pass it to [`LockRequest::owner`](crate::LockRequest::owner)
    /// to re-enter.
    pub fn owner(&self) -> &Owner {
        &self.hold.owner
    }

    /// Until when the hold is valid on this process's monotonic clock (moved forward by
    /// every renewal).
    pub fn valid_until(&self) -> Instant {
        self.hold.valid_until()
    }

    /// A snapshot of the lease: key, token, TTL, validity.
    pub fn lease(&self) -> Lease {
        Lease {
            key: self.hold.key.clone(),
            token: self.hold.token,
            ttl: self.hold.ttl,
            valid_until: self.valid_until(),
        }
    }

    /// Resolves when the lock is lost: at the first renewal that finds it gone, or at the
    /// latest shortly before [`valid_until`](Self::valid_until) while renewals keep
    /// failing. Never resolves after a normal release.
    ///
    /// This signal is advisory: timers fire late in exactly the stalls (GC pause, VM
    /// freeze) that make a lock unsafe. The fencing token is what protects the resource.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the future only observes a signal; create it as often as needed.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> Result<(), distlock_core::LockError> {
    /// use std::time::Duration;
    /// use distlock_core::{LockClient, memory::MemoryBackend};
    ///
    /// let locks = LockClient::new(MemoryBackend::new());
    /// let guard = locks.lock("job").ttl(Duration::from_secs(10)).acquire().await?;
    /// tokio::select! {
    ///     _ = guard.lost() => eprintln!("lock lost: stop writing"),
    ///     _ = tokio::time::sleep(Duration::from_millis(10)) => { /* the work */ }
    /// }
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        self.hold.lost_signal().clone().cancelled_owned()
    }

    /// Whether [`lost`](Self::lost) has fired.
    pub fn is_lost(&self) -> bool {
        self.hold.is_lost()
    }

    /// A token cancelled when the lock is lost, for handing to code that takes a
    /// `CancellationToken`.
    pub fn lost_token(&self) -> CancellationToken {
        self.hold.lost_signal().child_token()
    }

    /// Resolves as soon as a renewal of the lease fails (at once if renewals are failing
    /// now): the early warning, while the lock is still valid, that [`lost`](Self::lost)
    /// may follow. Renewals go on being retried; [`renewal_health`](Self::renewal_health)
    /// shows when they recover. Explicit [`extend`](Self::extend) calls count as renewals.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the future only observes a signal; create it as often as needed.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> Result<(), distlock_core::LockError> {
    /// use std::time::Duration;
    /// use distlock_core::{LockClient, memory::MemoryBackend};
    ///
    /// let locks = LockClient::new(MemoryBackend::new());
    /// let guard = locks.lock("job").ttl(Duration::from_secs(10)).acquire().await?;
    /// tokio::select! {
    ///     _ = guard.renewal_failing() => eprintln!("renewals failing: finish up or checkpoint"),
    ///     _ = tokio::time::sleep(Duration::from_millis(10)) => { /* the work */ }
    /// }
    /// assert!(!guard.renewal_health().borrow().is_failing());
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn renewal_failing(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut health = self.hold.health().subscribe();
        async move {
            // The sender lives as long as the hold (which this future keeps alive through
            // nothing): if it is gone, the hold is gone too and nothing will ever fail.
            if health.wait_for(RenewalHealth::is_failing).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// The renewals' health now, and every change from here on (a `tokio::sync::watch`
    /// receiver: `borrow()` for the current value, `changed().await` for the next).
    pub fn renewal_health(&self) -> tokio::sync::watch::Receiver<RenewalHealth> {
        self.hold.health().subscribe()
    }

    /// Renews the lease now, to its TTL from now (the watchdog does this on its own).
    ///
    /// # Errors
    ///
    /// [`LockError::NotHeld`] if the lock was lost (and [`lost`](Self::lost) fires); store
    /// errors as the backend reports them (and [`renewal_failing`](Self::renewal_failing)
    /// fires).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a renewal that is dropped midway can only fail to extend, never create
    /// or shorten the lock.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> Result<(), distlock_core::LockError> {
    /// use std::time::Duration;
    /// use distlock_core::{LockClient, memory::MemoryBackend};
    ///
    /// let locks = LockClient::new(MemoryBackend::new());
    /// let guard = locks.lock("job").ttl(Duration::from_secs(10)).watchdog(false).acquire().await?;
    /// let before = guard.valid_until();
    /// guard.extend().await?;
    /// assert!(guard.valid_until() >= before);
    /// # Ok(()) }
    /// ```
    pub async fn extend(&self) -> Result<(), LockError> {
        let hold = &self.hold;
        let started = hold.now();
        let span = tracing::info_span!(
            "distlock.extend",
            key = %hold.key,
            backend = hold.backend.name(),
            token = hold.token.get(),
            outcome = tracing::field::Empty,
        );
        let outcome = hold
            .backend
            .extend(&hold.key, &hold.owner, hold.ttl)
            .instrument(span.clone())
            .await
            .map_err(|e| {
                hold.meter.store_error(&hold.key, Operation::Extend, &e);
                e.during(Operation::Extend, &hold.key)
            });
        span.record(
            "outcome",
            match &outcome {
                Ok(ExtendOutcome::Extended(_)) => "extended",
                Ok(ExtendOutcome::NotHeld) => "not_held",
                Err(_) => "error",
            },
        );
        match outcome {
            Ok(ExtendOutcome::Extended(grant)) => {
                hold.extended(started, &grant);
                Ok(())
            }
            Ok(ExtendOutcome::NotHeld) => {
                hold.mark_lost();
                Err(LockError::NotHeld {
                    key: hold.key.clone(),
                })
            }
            Err(e) => {
                hold.renewal_failed(ErrorChain(&e).to_string());
                Err(e)
            }
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if let Some(Held { client, slot }) = self.held.take() {
            // Detached: the handle captured at acquisition spawns even from a thread
            // without a runtime; a runtime that has shut down drops the task and the TTL
            // frees the lock.
            let hold = &self.handle.hold;
            let pending = client.meter.background_release(&hold.key);
            let release = release_hold(client.clone(), slot, hold.clone());
            drop(client.tasks.spawn_on(
                async move {
                    let _pending = pending;
                    release.await
                },
                &hold.runtime,
            ));
        }
    }
}

type ReleaseWork = Pin<Box<dyn Future<Output = Result<ReleaseOutcome, LockError>> + Send>>;

/// A release polled in place by its caller (no task on the hot path); if the caller drops
/// it midway, the rest runs as a background task tracked by the client.
struct FinishOnDrop {
    work: Option<ReleaseWork>,
    client: Arc<ClientInner>,
    hold: Arc<Hold>,
}

impl FinishOnDrop {
    async fn run(&mut self) -> Result<ReleaseOutcome, LockError> {
        let Some(work) = self.work.as_mut() else {
            return Ok(ReleaseOutcome::NotHeld);
        };
        let outcome = work.await;
        self.work = None;
        outcome
    }
}

impl Drop for FinishOnDrop {
    fn drop(&mut self) {
        if let Some(work) = self.work.take() {
            let pending = self.client.meter.background_release(&self.hold.key);
            let finish = async move {
                let _pending = pending;
                work.await
            };
            drop(self.client.tasks.spawn_on(finish, &self.hold.runtime));
        }
    }
}

async fn release_hold(
    client: Arc<ClientInner>,
    slot: Arc<Slot>,
    hold: Arc<Hold>,
) -> Result<ReleaseOutcome, LockError> {
    let mut state = slot.lock().await;
    state.count = state.count.saturating_sub(1);
    if state.count > 0 {
        return Ok(ReleaseOutcome::StillHeld { holds: state.count });
    }
    hold.stop();
    state.hold = None;
    // Made only when a subscriber may want INFO spans, as `distlock.acquire`'s.
    let span = if crate::info_spans_enabled() {
        tracing::info_span!(
            "distlock.release",
            key = %hold.key,
            backend = client.backend.name(),
            token = hold.token.get(),
            outcome = tracing::field::Empty,
        )
    } else {
        tracing::Span::none()
    };
    // Still under the gate: a new request of this owner waits for the store to see the
    // release, or it would be re-granted the old hold and then lose it to this release.
    let until = hold.valid_until();
    let release = release_with_retry(
        &*client.backend,
        &client.meter,
        &hold.key,
        &hold.owner,
        until,
    );
    let outcome = release
        .instrument(span.clone())
        .await
        .map_err(|e| e.during(Operation::Release, &hold.key));
    client.slots.released(&hold.key, &hold.owner, &slot);
    drop(state);
    client.meter.released(
        &hold.key,
        hold.now().saturating_duration_since(hold.granted),
    );
    span.record(
        "outcome",
        match &outcome {
            Ok(ReleaseOutcome::Released) => "released",
            Ok(_) => "not_held",
            Err(_) => "error",
        },
    );
    match &outcome {
        Ok(o) => tracing::debug!(key = %hold.key, outcome = ?o, "lock released"),
        Err(e) => {
            tracing::warn!(key = %hold.key, error = %ErrorChain(e), "release failed; the lock expires after its TTL")
        }
    }
    outcome
}

/// How a release retries a store that cannot be reached: 20 ms doubling up to 1 s.
const RELEASE_RETRY: RetryPolicy =
    RetryPolicy::doubling(Duration::from_millis(20), Duration::from_secs(1));

/// Releases by owner, retrying retryable failures with backoff until `until`.
pub(crate) async fn release_with_retry(
    backend: &dyn LockBackend,
    meter: &Meter,
    key: &LockKey,
    owner: &Owner,
    until: Instant,
) -> Result<ReleaseOutcome, LockError> {
    // `until` is on the clock of the store's leases.
    let clock = backend.capabilities().clock;
    let mut backoff = RELEASE_RETRY.backoff().until(until);
    loop {
        let answer = backend.release(key, owner).await;
        if let Err(e) = &answer {
            meter.store_error(key, Operation::Release, e);
        }
        match answer {
            Err(e) if e.is_retryable() => {
                let Some(pause) = backoff.next_pause(now_on(clock)) else {
                    return Err(e);
                };
                tracing::debug!(key = %key, error = %ErrorChain(&e), "release failed, retrying");
                tokio::time::sleep(pause).await;
            }
            other => return other,
        }
    }
}
