//! Breakages of what a client makes of its link to the store: they sit above the
//! [`FaultLayer`](crate::FaultLayer), where a stopped store shows.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lockcore::driver::{
    AcquireOutcome, Capabilities, ClaimRequest, Contention, ExtendOutcome, ReleaseNotifier,
    Renewal, WaitHint,
};
use lockcore::{LockBackend, LockClient, LockError, LockInfo, LockKey, Owner, ReleaseOutcome};

use super::Breakage;
use crate::harness::{FaultClient, FaultStore, Restart, Tamper};

/// A [`FaultStore`] whose clients break what they see of the store as `breakage` says (for
/// the breakages of the client side, e.g. [`Breakage::UnreachableLooksHeld`]); any other
/// breakage is the store's, and its clients are `inner`'s.
pub struct BrokenStore {
    inner: Box<dyn FaultStore>,
    breakage: Option<Breakage>,
}

impl BrokenStore {
    /// Wraps the clients of `inner`.
    pub fn new(inner: impl FaultStore + 'static, breakage: Option<Breakage>) -> Self {
        BrokenStore {
            inner: Box::new(inner),
            breakage,
        }
    }
}

#[async_trait]
impl FaultStore for BrokenStore {
    async fn client(&self) -> Result<FaultClient, LockError> {
        let c = self.inner.client().await?;
        if self.breakage != Some(Breakage::UnreachableLooksHeld) {
            return Ok(c);
        }
        let backend = Arc::new(ErrorsLookHeld(c.client.backend().clone()));
        Ok(FaultClient {
            client: LockClient::new(backend),
            link: c.link,
        })
    }

    async fn stop(&self) -> Result<(), LockError> {
        self.inner.stop().await
    }

    async fn start(&self) -> Result<(), LockError> {
        self.inner.start().await
    }

    async fn tamper(&self, key: &LockKey, how: Tamper) -> Result<(), LockError> {
        self.inner.tamper(key, how).await
    }

    async fn set_time_zone(&self, minutes: i32) -> Result<bool, LockError> {
        self.inner.set_time_zone(minutes).await
    }

    async fn restart(&self, how: Restart) -> Result<bool, LockError> {
        self.inner.restart(how).await
    }
}

/// Takes a failed acquisition for contention ("held by another").
#[derive(Debug)]
struct ErrorsLookHeld(Arc<dyn LockBackend>);

impl ErrorsLookHeld {
    fn held(answer: Result<AcquireOutcome, LockError>) -> Result<AcquireOutcome, LockError> {
        match answer {
            Err(e) if e.is_retryable() => Ok(AcquireOutcome::Held(Contention::new(None))),
            answer => answer,
        }
    }
}

#[async_trait]
impl LockBackend for ErrorsLookHeld {
    fn name(&self) -> &'static str {
        self.0.name()
    }

    fn capabilities(&self) -> Capabilities {
        self.0.capabilities()
    }

    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<AcquireOutcome, LockError> {
        Self::held(self.0.claim(request).await)
    }

    async fn release(&self, key: &LockKey, owner: &Owner) -> Result<ReleaseOutcome, LockError> {
        self.0.release(key, owner).await
    }

    async fn renew(
        &self,
        renewals: &[Renewal<'_>],
    ) -> Result<Vec<Result<ExtendOutcome, LockError>>, LockError> {
        self.0.renew(renewals).await
    }

    async fn holders(&self, key: &LockKey) -> Result<Vec<LockInfo>, LockError> {
        self.0.holders(key).await
    }

    async fn wait_released(
        &self,
        key: &LockKey,
        hint: &WaitHint,
        place: u64,
        max_wait: Duration,
    ) -> Result<(), LockError> {
        self.0.wait_released(key, hint, place, max_wait).await
    }

    async fn force_release(&self, key: &LockKey) -> Result<ReleaseOutcome, LockError> {
        self.0.force_release(key).await
    }

    async fn abandon(&self, key: &LockKey, owner: &Owner) -> Result<(), LockError> {
        self.0.abandon(key, owner).await
    }

    fn notifier(&self) -> Option<&ReleaseNotifier> {
        self.0.notifier()
    }
}
