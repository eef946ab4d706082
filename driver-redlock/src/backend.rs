//! [`RedlockBackend`], what it declares, and its [`LockBackend`] impl. The operations that
//! are rounds of the algorithm have files of their own under `backend/`: `acquire` (round
//! 1, the grant, and a failed attempt undone everywhere), `release` and `inspect`.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lockcore::driver::{
    renew_each, AcquireOutcome, Capabilities, ClaimRequest, ExtendOutcome, Fairness,
    FencingGuarantee, ReleaseNotifier, Renewal, WaitHint,
};
use lockcore::{LockBackend, LockError, LockInfo, LockKey, Owner, ReleaseOutcome};

use crate::store::{Inner, NAME};

mod acquire;
mod inspect;
mod release;
#[cfg(test)]
mod tests;

/// What the redlock backend declares: clock-assisted fencing, release notifications by
/// pub/sub on every instance, bounded fairness (a long wait marks the key on every
/// instance, see [`ClaimRequest::waited`]), TTLs from 100 ms (below that, the drift
/// allowance of 1% + 2 ms and two rounds to N instances leave too little validity for a
/// lease to be useful, and a slow round makes every attempt run out of it) to 24 hours,
/// expiry judged by the instances' clocks, read-write locks (shared claims, granted by a
/// majority like the lock: a reader's and a writer's majorities share an instance, which
/// refuses one of them) but no semaphores (a semaphore of `C ≥ 2` permits needs more than
/// a majority, `⌊N·C/(C+1)⌋ + 1` instances, which this backend does not implement: see
/// `docs/redlock.md`). With fencing switched off the backend declares
/// [`FencingGuarantee::None`] and no shared claims instead ([`UNFENCED_CAPABILITIES`]).
pub const CAPABILITIES: Capabilities = Capabilities::new(FencingGuarantee::ClockAssisted)
    .with_notifications(true)
    .with_fairness(Fairness::Bounded)
    .with_min_ttl(Duration::from_millis(100))
    .with_max_ttl(Duration::from_secs(24 * 3600))
    .with_claims(true, false);

/// What the redlock backend declares with fencing switched off: [`CAPABILITIES`] without
/// fencing tokens (every token is 0), without shared claims and without fairness (the
/// unfenced grant is a plain `SET NX PX`, which does not see the shared leases or marks
/// beside the lock).
pub const UNFENCED_CAPABILITIES: Capabilities = CAPABILITIES
    .with_fencing(FencingGuarantee::None)
    .with_fairness(Fairness::None)
    .with_claims(false, false);

/// Redlock over N independent Redis masters (not replicas of each other).
///
/// Every operation goes to all instances **in parallel**, each bounded by a per-instance
/// timeout far below the TTL, and runs there the same Lua script as driver-redis's
/// single-instance lock. An acquisition succeeds only when a majority (N/2+1) granted it
/// within `ttl − elapsed − drift` (drift = 1% of the TTL + 2 ms); the lease's validity is
/// exactly that. When it fails, it is released on every instance, including those that did
/// not answer in time, so a late grant cannot linger.
///
/// * Contention (another owner holds a majority) is [`AcquireOutcome::Held`] with the time
///   until enough instances free up; [`LockError::QuorumNotReached`] is only for too few
///   instances *answering*. A split vote (no owner has a majority) is `Held` with a short
///   random back-off, after which the client tries again.
/// * Fencing (on by default, [`RedlockBackendBuilder::fencing`](crate::RedlockBackendBuilder::fencing)): each grant bumps that
///   instance's fence to `max(c + 1, now_us)`; the client takes T = max over the grants,
///   writes `max(c, T)` back to every granting instance (and T into the lock value there),
///   and hands out the lease only when a majority acknowledged and validity is still
///   positive. Tokens are *clock-assisted*: see `docs/redlock.md` for the assumption.
///   Without fencing, a round and the fence key are saved and every token is 0.
/// * Release and extend go to all instances; extend succeeds only with a majority within
///   the new validity. Their `debug` tracing events (`redlock release`, `redlock extend`)
///   say how many instances agreed and answered.
/// * Waiting: one pub/sub connection per instance (driver-redis's waiters); a waiter's
///   re-check marks the copies it finds held, and a release announces itself on the
///   instances where its copy was marked; this backend wakes one waiter at the first
///   announcement of a release — the one that has waited longest, counting from its first
///   failed attempt. A release nobody marked wakes the releasing backend's own waiters
///   in-process.
///
/// # Examples
///
/// ```no_run
/// # extern crate lockcore as distlock_core; // the workspace's name for it
/// # async fn demo() -> Result<(), distlock_core::LockError> {
/// use std::time::Duration;
/// use distlock_core::LockClient;
///
/// let backend = distlock_redlock::RedlockBackend::builder([
///     "redis://10.0.0.1:6379/",
///     "redis://10.0.0.2:6379/",
///     "rediss://10.0.0.3:6380/",
/// ])
/// .prefix("billing:")
/// .build()
/// .await?;
/// let locks = LockClient::new(backend);
/// let guard = locks.lock("invoice:42").ttl(Duration::from_secs(30)).acquire().await?;
/// guard.release().await?;
/// # Ok(()) }
/// ```
pub struct RedlockBackend {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for RedlockBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let labels: Vec<&str> = self
            .inner
            .instances
            .iter()
            .map(|i| i.label.as_str())
            .collect();
        f.debug_struct("RedlockBackend")
            .field("instances", &labels)
            .field("quorum", &self.inner.quorum)
            .field("prefix", &self.inner.prefix)
            .field("fencing", &self.inner.fencing)
            .finish_non_exhaustive()
    }
}

impl RedlockBackend {
    /// The number of instances.
    pub fn instances(&self) -> usize {
        self.inner.instances.len()
    }

    /// The majority needed: N/2+1.
    pub fn quorum(&self) -> usize {
        self.inner.quorum
    }

    /// The key prefix this backend stores locks under.
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// Whether acquisitions run the fencing write-back round.
    pub fn fencing(&self) -> bool {
        self.inner.fencing
    }
}

#[async_trait]
impl LockBackend for RedlockBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn capabilities(&self) -> Capabilities {
        if self.fencing() {
            CAPABILITIES
        } else {
            UNFENCED_CAPABILITIES
        }
    }

    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<AcquireOutcome, LockError> {
        if !self.capabilities().supports(&request.claim) {
            return Err(LockError::claims_unsupported(NAME, &request.claim));
        }
        self.inner.claim(request).await
    }

    async fn release(&self, key: &LockKey, owner: &Owner) -> Result<ReleaseOutcome, LockError> {
        self.inner.release(key, owner).await.map(|t| t.outcome)
    }

    /// Each renewal is a round of its own on every instance (`renew.rs`), decided by its
    /// own majority within its own validity; 16 are sent at once.
    async fn renew(
        &self,
        renewals: &[Renewal<'_>],
    ) -> Result<Vec<Result<ExtendOutcome, LockError>>, LockError> {
        renew_each(renewals, |r| async move {
            self.inner
                .extend(r.key, r.owner, r.ttl)
                .await
                .map(|t| t.outcome)
        })
        .await
    }

    /// The holder a majority agrees on, with its settled token (see `backend/inspect.rs`);
    /// without one, the shared leases a majority holds.
    async fn holders(&self, key: &LockKey) -> Result<Vec<LockInfo>, LockError> {
        if let Some(info) = self.inner.inspect(key).await? {
            return Ok(vec![info]);
        }
        if !self.capabilities().shared {
            return Ok(Vec::new());
        }
        // Not an exclusive copy the listing may show: a majority did not show it just
        // before, so its acquisition is in flight (its token not yet settled) or failing.
        let mut leases = self.inner.inspect_all(key).await?;
        leases.retain(|info| !info.claim.is_exclusive());
        Ok(leases)
    }

    async fn wait_released(
        &self,
        key: &LockKey,
        hint: &WaitHint,
        place: u64,
        max_wait: Duration,
    ) -> Result<(), LockError> {
        self.inner.wait_released(key, hint, place, max_wait).await
    }

    async fn force_release(&self, key: &LockKey) -> Result<ReleaseOutcome, LockError> {
        self.inner.force_release(key).await
    }

    async fn abandon(&self, key: &LockKey, owner: &Owner) -> Result<(), LockError> {
        if self.capabilities().shared {
            self.inner.give_up(key, owner).await;
        }
        Ok(())
    }

    fn notifier(&self) -> Option<&ReleaseNotifier> {
        Some(&self.inner.notifier)
    }

    async fn shutdown(&self) {
        for instance in &self.inner.instances {
            if let Some(b) = instance.backend.get() {
                b.shutdown().await;
            }
        }
    }
}
