//! Guards: what a holder keeps, and how a hold ends.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;

use crate::client::{LockClient, Validated};
use crate::lease::{lost_margin, valid_until};
use crate::watchdog::{self, Watch};
use crate::{
    ExtendOutcome, FencingToken, Grant, Lease, LockBackend, LockError, LockKey, Owner,
    ReleaseOutcome,
};

/// The reentrancy state of one (key, owner) in one client. Its async mutex serialises
/// acquisition, re-entry and release of that hold.
#[derive(Debug, Default)]
pub(crate) struct Slot {
    pub(crate) gate: Arc<tokio::sync::Mutex<SlotState>>,
    /// Requests using the slot (changed only under the client's slot map mutex).
    pub(crate) pending: std::sync::atomic::AtomicUsize,
}

#[derive(Debug, Default)]
pub(crate) struct SlotState {
    pub(crate) hold: Option<Arc<Hold>>,
    pub(crate) count: usize,
}

/// One hold in the store, shared by every reentrant guard on it.
#[derive(Debug)]
pub(crate) struct Hold {
    pub(crate) key: LockKey,
    pub(crate) owner: Owner,
    pub(crate) token: FencingToken,
    pub(crate) ttl: Duration,
    valid_until: Mutex<Instant>,
    /// Fires when the hold is known (or must be assumed) lost.
    lost: CancellationToken,
    /// Stops the watchdog when the hold is released.
    stop: CancellationToken,
    pub(crate) runtime: Handle,
    pub(crate) backend: Arc<dyn LockBackend>,
    /// Whether the watchdog renews the lease.
    pub(crate) renew: bool,
    /// The hold's identity in the watchdog's schedule.
    pub(crate) id: u64,
    pub(crate) watch: Mutex<Watch>,
}

impl Hold {
    /// A new hold, watched by the watchdog.
    ///
    /// # Errors
    ///
    /// [`LockError::Backend`] if the watchdog cannot run (the operating system refused to
    /// start its thread).
    pub(crate) fn start(
        client: &LockClient,
        req: &Validated,
        attempt_started: Instant,
        grant: Grant,
        runtime: &Handle,
    ) -> Result<Arc<Hold>, LockError> {
        let schedule = watchdog::schedule()?;
        let hold = Arc::new(Hold {
            key: req.key.clone(),
            owner: req.owner.clone(),
            token: grant.token,
            ttl: grant.ttl,
            valid_until: Mutex::new(valid_until(attempt_started, grant.ttl, grant.valid_until)),
            lost: CancellationToken::new(),
            stop: CancellationToken::new(),
            runtime: runtime.clone(),
            backend: client.inner.backend.clone(),
            renew: req.renew,
            id: watchdog::next_id(),
            watch: Mutex::new(Watch::new(Instant::now() + grant.ttl / 3)),
        });
        schedule.start(&hold);
        Ok(hold)
    }

    /// When the hold must be assumed lost if renewals keep failing.
    pub(crate) fn lost_at(&self) -> Instant {
        let end = self.valid_until();
        end.checked_sub(lost_margin(self.ttl)).unwrap_or(end)
    }

    pub(crate) fn valid_until(&self) -> Instant {
        *self.valid_until.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn set_valid_until(&self, at: Instant) {
        *self.valid_until.lock().unwrap_or_else(|e| e.into_inner()) = at;
    }

    pub(crate) fn mark_lost(&self) {
        if !self.lost.is_cancelled() {
            tracing::warn!(key = %self.key, token = %self.token, "lock lost");
            self.lost.cancel();
        }
    }

    pub(crate) fn stopped(&self) -> &CancellationToken {
        &self.stop
    }
}

/// A held lock. Release it with [`release`](Self::release); dropping it releases in the
/// background.
///
/// While the guard lives, a watchdog renews the lease every `ttl / 3`. If renewal finds the
/// lock gone, or keeps failing until shortly before [`valid_until`](Self::valid_until),
/// [`lost`](Self::lost) fires.
///
/// # Drop
///
/// Dropping a guard without [`release`](Self::release) counts one reentrant hold down; at
/// zero it stops the watchdog and releases in the background on the tokio runtime that
/// acquired the lock, never blocking the dropping thread. If that runtime is gone, the TTL
/// frees the lock. [`LockClient::shutdown`] waits for such background releases.
///
/// Guards are `Send` and not tied to a thread or task.
#[must_use = "dropping the guard releases the lock at once"]
#[derive(Debug)]
pub struct LockGuard {
    client: LockClient,
    slot: Arc<Slot>,
    hold: Arc<Hold>,
    done: bool,
}

impl LockGuard {
    pub(crate) fn new(client: LockClient, slot: Arc<Slot>, hold: Arc<Hold>) -> Self {
        LockGuard {
            client,
            slot,
            hold,
            done: false,
        }
    }

    /// The locked key.
    pub fn key(&self) -> &LockKey {
        &self.hold.key
    }

    /// The fencing token: send it with every write the lock protects.
    pub fn token(&self) -> FencingToken {
        self.hold.token
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
    /// # #[tokio::main] async fn main() -> Result<(), lockcore::LockError> {
    /// use std::time::Duration;
    /// use lockcore::{LockClient, memory::MemoryBackend};
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
        self.hold.lost.clone().cancelled_owned()
    }

    /// Whether [`lost`](Self::lost) has fired.
    pub fn is_lost(&self) -> bool {
        self.hold.lost.is_cancelled()
    }

    /// A token cancelled when the lock is lost, for handing to code that takes a
    /// `CancellationToken`.
    pub fn lost_token(&self) -> CancellationToken {
        self.hold.lost.child_token()
    }

    /// Renews the lease now, to its TTL from now (the watchdog does this on its own).
    ///
    /// # Errors
    ///
    /// [`LockError::NotHeld`] if the lock was lost (and [`lost`](Self::lost) fires); store
    /// errors as the backend reports them.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a renewal that is dropped midway can only fail to extend, never create
    /// or shorten the lock.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> Result<(), lockcore::LockError> {
    /// use std::time::Duration;
    /// use lockcore::{LockClient, memory::MemoryBackend};
    ///
    /// let locks = LockClient::new(MemoryBackend::new());
    /// let guard = locks.lock("job").ttl(Duration::from_secs(10)).watchdog(false).acquire().await?;
    /// let before = guard.valid_until();
    /// guard.extend().await?;
    /// assert!(guard.valid_until() >= before);
    /// # Ok(()) }
    /// ```
    pub async fn extend(&self) -> Result<(), LockError> {
        let started = Instant::now();
        let hold = &self.hold;
        match self
            .client
            .inner
            .backend
            .extend(&hold.key, &hold.owner, hold.ttl)
            .await?
        {
            ExtendOutcome::Extended(grant) => {
                hold.set_valid_until(
                    valid_until(started, grant.ttl, grant.valid_until).max(hold.valid_until()),
                );
                Ok(())
            }
            ExtendOutcome::NotHeld => {
                hold.mark_lost();
                Err(LockError::NotHeld)
            }
        }
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
    /// Store errors as the backend reports them, once retries within the lease are spent;
    /// the lock then expires after its TTL.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if this future is dropped midway, the release is finished by a
    /// background task (which [`LockClient::shutdown`] waits for).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> Result<(), lockcore::LockError> {
    /// use lockcore::{LockClient, ReleaseOutcome, memory::MemoryBackend};
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
        self.done = true;
        let mut release = FinishOnDrop {
            work: Some(Box::pin(release_hold(
                self.client.clone(),
                self.slot.clone(),
                self.hold.clone(),
            ))),
            client: self.client.clone(),
            runtime: self.hold.runtime.clone(),
        };
        // Let go of our references now, so the release can forget the (key, owner) slot.
        drop(self);
        release.run().await
    }

    fn spawn_release(&self) -> tokio::task::JoinHandle<Result<ReleaseOutcome, LockError>> {
        let (client, slot, hold) = (self.client.clone(), self.slot.clone(), self.hold.clone());
        let runtime = hold.runtime.clone();
        self.client
            .inner
            .tasks
            .spawn_on(release_hold(client, slot, hold), &runtime)
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if !self.done {
            self.done = true;
            // Detached: the handle captured at acquisition spawns even from a thread
            // without a runtime; a runtime that has shut down drops the task and the TTL
            // frees the lock.
            drop(self.spawn_release());
        }
    }
}

type ReleaseWork = Pin<Box<dyn Future<Output = Result<ReleaseOutcome, LockError>> + Send>>;

/// A release polled in place by its caller (no task on the hot path); if the caller drops
/// it midway, the rest runs as a background task tracked by the client.
struct FinishOnDrop {
    work: Option<ReleaseWork>,
    client: LockClient,
    runtime: Handle,
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
            drop(self.client.inner.tasks.spawn_on(work, &self.runtime));
        }
    }
}

async fn release_hold(
    client: LockClient,
    slot: Arc<Slot>,
    hold: Arc<Hold>,
) -> Result<ReleaseOutcome, LockError> {
    let mut state = slot.gate.lock().await;
    state.count = state.count.saturating_sub(1);
    if state.count > 0 {
        return Ok(ReleaseOutcome::StillHeld { holds: state.count });
    }
    hold.stop.cancel();
    if let Ok(schedule) = watchdog::schedule() {
        schedule.stop(&hold);
    }
    state.hold = None;
    // Still under the gate: a new request of this owner waits for the store to see the
    // release, or it would be re-granted the old hold and then lose it to this release.
    let outcome = release_with_retry(
        &*client.inner.backend,
        &hold.key,
        &hold.owner,
        hold.valid_until(),
    )
    .await;
    client.released_slot(&hold.key, &hold.owner, &slot);
    drop(state);
    match &outcome {
        Ok(o) => tracing::debug!(key = %hold.key, outcome = ?o, "lock released"),
        Err(e) => {
            tracing::warn!(key = %hold.key, error = %e, "release failed; the lock expires after its TTL")
        }
    }
    outcome
}

/// Releases by owner, retrying retryable failures with backoff until `until`.
pub(crate) async fn release_with_retry(
    backend: &dyn LockBackend,
    key: &LockKey,
    owner: &Owner,
    until: Instant,
) -> Result<ReleaseOutcome, LockError> {
    let mut backoff = Duration::from_millis(20);
    loop {
        match backend.release(key, owner).await {
            Err(e) if e.is_retryable() && Instant::now() + backoff < until => {
                tracing::debug!(key = %key, error = %e, "release failed, retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
            other => return other,
        }
    }
}
