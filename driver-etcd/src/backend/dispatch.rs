//! The [`LockBackend`] implementation: checks the namespace's layout, then hands each
//! operation to the plain or the FIFO layout.

use std::time::Duration;

use async_trait::async_trait;
use lockcore::driver::{
    renew_each, AcquireOutcome, Capabilities, ClaimRequest, ExtendOutcome, Renewal, WaitHint,
};
use lockcore::{Claim, LockBackend, LockError, LockInfo, LockKey, Owner, ReleaseOutcome};

use super::leases::ttl_secs;
use super::EtcdBackend;
use crate::capabilities::NAME;

#[async_trait]
impl LockBackend for EtcdBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn capabilities(&self) -> Capabilities {
        self.caps
    }

    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<AcquireOutcome, LockError> {
        let (key, owner, claim) = (request.key, request.owner, request.claim);
        let secs = ttl_secs(self.caps.effective_ttl(request.ttl)?);
        self.ensure_layout().await?;
        if !self.fair {
            if !claim.is_exclusive() {
                return Err(plain_claims_unsupported(&claim));
            }
            let _turn = self.attempt_turn().await?;
            return self
                .plain_try_acquire(key, owner, secs, request.waited)
                .await;
        }
        let _turn = self.attempt_turn().await?;
        if claim.is_exclusive() {
            return self.fifo_try_acquire(key, owner, secs).await;
        }
        self.fifo_try_claim(key, owner, secs, claim).await
    }

    async fn release(&self, key: &LockKey, owner: &Owner) -> Result<ReleaseOutcome, LockError> {
        self.ensure_layout().await?;
        if self.fair {
            return self.fifo_release(key, owner).await;
        }
        self.plain_release(key, owner).await
    }

    async fn renew(
        &self,
        renewals: &[Renewal<'_>],
    ) -> Result<Vec<Result<ExtendOutcome, LockError>>, LockError> {
        self.ensure_layout().await?;
        if self.fair {
            // Each place has a lease of its own: renewed one by one, a few at a time.
            return renew_each(renewals, |r| self.fifo_extend(r.key, r.owner)).await;
        }
        self.plain_renew(renewals).await
    }

    async fn holders(&self, key: &LockKey) -> Result<Vec<LockInfo>, LockError> {
        self.ensure_layout().await?;
        if self.fair {
            return self.fifo_holders(key).await;
        }
        Ok(self.plain_holder(key).await?.into_iter().collect())
    }

    async fn wait_released(
        &self,
        key: &LockKey,
        hint: &WaitHint,
        place: u64,
        max_wait: Duration,
    ) -> Result<(), LockError> {
        if self.fair {
            // A FIFO waiter is woken by the deletions in its queue, in the store's order:
            // its place in this process's line plays no part.
            return self.fifo_wait_released(key, hint, max_wait).await;
        }
        self.plain_wait_released(key, hint, place, max_wait).await
    }

    async fn force_release(&self, key: &LockKey) -> Result<ReleaseOutcome, LockError> {
        self.ensure_layout().await?;
        if self.fair {
            return self.fifo_force_release(key).await;
        }
        self.plain_force_release(key).await
    }

    async fn abandon(&self, key: &LockKey, owner: &Owner) -> Result<(), LockError> {
        if self.fair {
            return self.fifo_abandon(key, owner).await;
        }
        self.plain_abandon(key, owner).await
    }

    async fn shutdown(&self) {
        self.places
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        self.leases.revoke_spares().await;
        self.watches.shutdown();
        self.queue_watches.shutdown();
    }
}

/// The answer to a shared or permit claim in the plain layout, which has one key per lock
/// and no room for shares beside it.
fn plain_claims_unsupported(asked: &Claim) -> LockError {
    LockError::config(format!(
        "the etcd backend takes shared (read-write) locks and semaphores only in the FIFO layout \
         (`fair=true`), and this namespace uses the plain layout; asked for {asked}. \
         Use a namespace with `fair=true` for every client of these locks"
    ))
}
