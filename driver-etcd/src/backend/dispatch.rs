//! The [`LockBackend`] implementation: checks the namespace's layout, then hands each
//! operation to the plain or the FIFO layout.

use std::time::Duration;

use async_trait::async_trait;
use lockcore::{
    AcquireOutcome, Capabilities, Claim, ExtendOutcome, LockBackend, LockError, LockInfo, LockKey,
    Owner, ReleaseOutcome, Renewal, WaitHint,
};

use super::leases::ttl_secs;
use super::EtcdBackend;
use crate::capabilities::NAME;

/// FIFO layout: how many renewals of a batch are in flight at once.
const FIFO_RENEWALS_IN_FLIGHT: usize = 16;

#[async_trait]
impl LockBackend for EtcdBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn capabilities(&self) -> Capabilities {
        self.caps
    }

    async fn try_acquire(
        &self,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<AcquireOutcome, LockError> {
        let secs = ttl_secs(self.caps.effective_ttl(ttl)?);
        self.ensure_layout().await?;
        let _turn = self.attempt_turn().await?;
        if self.fair {
            return self.fifo_try_acquire(key, owner, secs).await;
        }
        self.plain_try_acquire(key, owner, secs).await
    }

    async fn try_claim(
        &self,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
        claim: Claim,
    ) -> Result<AcquireOutcome, LockError> {
        if claim.is_exclusive() {
            return self.try_acquire(key, owner, ttl).await;
        }
        let secs = ttl_secs(self.caps.effective_ttl(ttl)?);
        self.ensure_layout().await?;
        if !self.fair {
            return Err(plain_claims_unsupported(&claim));
        }
        let _turn = self.attempt_turn().await?;
        self.fifo_try_claim(key, owner, secs, claim).await
    }

    async fn release(&self, key: &LockKey, owner: &Owner) -> Result<ReleaseOutcome, LockError> {
        self.ensure_layout().await?;
        if self.fair {
            return self.fifo_release(key, owner).await;
        }
        self.plain_release(key, owner).await
    }

    async fn extend(
        &self,
        key: &LockKey,
        owner: &Owner,
        _ttl: Duration,
    ) -> Result<ExtendOutcome, LockError> {
        self.ensure_layout().await?;
        if self.fair {
            return self.fifo_extend(key, owner).await;
        }
        self.plain_extend(key, owner).await
    }

    async fn extend_many(
        &self,
        renewals: &[Renewal<'_>],
    ) -> Result<Vec<Result<ExtendOutcome, LockError>>, LockError> {
        self.ensure_layout().await?;
        if self.fair {
            // Each place has a lease of its own: renewed one by one, a few at a time.
            let mut outcomes = Vec::with_capacity(renewals.len());
            for chunk in renewals.chunks(FIFO_RENEWALS_IN_FLIGHT) {
                let sent = chunk.iter().map(|r| self.fifo_extend(r.key, r.owner));
                outcomes.extend(futures_util::future::join_all(sent).await);
            }
            return Ok(outcomes);
        }
        self.plain_extend_many(renewals).await
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        self.ensure_layout().await?;
        if self.fair {
            return self.fifo_inspect(key).await;
        }
        self.plain_inspect(key).await
    }

    async fn inspect_all(&self, key: &LockKey) -> Result<Vec<LockInfo>, LockError> {
        self.ensure_layout().await?;
        if self.fair {
            return self.fifo_inspect_all(key).await;
        }
        Ok(self.plain_inspect(key).await?.into_iter().collect())
    }

    async fn wait_released(
        &self,
        key: &LockKey,
        hint: &WaitHint,
        max_wait: Duration,
    ) -> Result<(), LockError> {
        if self.fair {
            return self.fifo_wait_released(key, hint, max_wait).await;
        }
        self.plain_wait_released(key, hint, max_wait).await
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
