//! The [`LockBackend`](lockcore::LockBackend) operations written once: a lock table
//! ([`Store`]) and how its waiters are woken ([`Waiting`]). Each database's public backend
//! type wraps one and implements the trait with [`lock_backend!`].

use std::sync::Arc;
use std::time::Duration;

use lockcore::driver::{AcquireOutcome, ClaimRequest, Contention, ReleaseNotifier, WaitHint};
use lockcore::{LockError, LockKey, Owner, ReleaseOutcome};

use crate::dialect::Dialect;
use crate::error::waited_for_row_lock;
use crate::run::Run;
use crate::wait::Waiting;
use lock::Store;

pub(crate) mod claims;
pub(crate) mod lock;

/// A lock backend on the lock table of dialect `D`, its waiters woken by `W`.
#[derive(Debug)]
pub(crate) struct SqlBackend<D: Dialect, W> {
    pub(crate) store: Arc<Store<D>>,
    waiting: W,
}

impl<D: Dialect, W: Waiting<D>> SqlBackend<D, W> {
    pub(crate) fn new(store: Store<D>, waiting: W) -> Self {
        SqlBackend {
            store: Arc::new(store),
            waiting,
        }
    }

    /// Where the statements run.
    pub(crate) fn runner(&self) -> &D::Run {
        &self.store.run
    }

    pub(crate) async fn release(
        &self,
        key: &LockKey,
        owner: &Owner,
    ) -> Result<ReleaseOutcome, LockError> {
        let outcome = self.store.release(key, owner).await?;
        self.released(key, outcome)
    }

    pub(crate) async fn wait_released(
        &self,
        key: &LockKey,
        hint: &WaitHint,
        place: u64,
        max_wait: Duration,
    ) -> Result<(), LockError> {
        self.waiting
            .wait(&self.store, key, hint, place, max_wait)
            .await
    }

    /// Takes `request.claim`: an exclusive claim by the one-statement path, any other by
    /// the claim routines.
    pub(crate) async fn claim(
        &self,
        request: &ClaimRequest<'_>,
    ) -> Result<AcquireOutcome, LockError> {
        let ClaimRequest {
            key,
            owner,
            ttl,
            claim,
            ..
        } = *request;
        let outcome = if claim.is_exclusive() {
            async {
                if let Some(waited) = request.waited {
                    // A long wait marks the key as its next turn, then asks as everyone
                    // does: two statements, neither holding the row's lock past its own
                    // round trip. The mark waits for the row's lock too.
                    self.store.mark(key, owner, ttl, waited).await?;
                }
                self.store.acquire(key, owner, ttl).await
            }
            .await
        } else {
            self.store.claim(key, owner, ttl, claim).await
        };
        match outcome {
            // The key's row stayed locked past the session's limit: a transaction holds the
            // key (MySQL's `lock_in`), with no expiry to wait for. Try again after a pause.
            Err(e) if waited_for_row_lock(&e) => {
                let pause = WaitHint::retry_after(crate::transaction::TRANSACTION_POLL);
                Ok(AcquireOutcome::Held(Contention::new(None).with_hint(pause)))
            }
            outcome => outcome,
        }
    }

    /// Removes the owner's reservation; its removal may let other claims in.
    pub(crate) async fn abandon(&self, key: &LockKey, owner: &Owner) -> Result<(), LockError> {
        if self.store.abandon(key, owner).await? {
            self.waiting.released(key);
        }
        Ok(())
    }

    /// The notifier this backend's waiters subscribe with, through which lockcore passes
    /// wake-ups on (see [`Waiting::notifier`]).
    pub(crate) fn notifier(&self) -> Option<&ReleaseNotifier> {
        Some(self.waiting.notifier())
    }

    pub(crate) async fn force_release(&self, key: &LockKey) -> Result<ReleaseOutcome, LockError> {
        let outcome = self.store.force_release(key).await?;
        self.released(key, outcome)
    }

    /// Wakes this backend's waiters of a key it released.
    fn released(
        &self,
        key: &LockKey,
        outcome: ReleaseOutcome,
    ) -> Result<ReleaseOutcome, LockError> {
        if outcome == ReleaseOutcome::Released {
            self.waiting.released(key);
        }
        Ok(outcome)
    }

    pub(crate) async fn shutdown(&self) {
        self.waiting.stop();
        self.store.run.shutdown().await;
        if let Some(batches) = &self.store.batches {
            batches.run.shutdown().await;
        }
    }
}

/// Implements [`LockBackend`](lockcore::LockBackend) for `$backend`, a newtype over a
/// [`SqlBackend`] of dialect `$dialect`, declaring `$capabilities`.
#[rustfmt::skip]
macro_rules! lock_backend {
    ($backend:ty, $dialect:ty, $capabilities:expr) => {
        #[async_trait::async_trait]
        impl lockcore::LockBackend for $backend {
            fn name(&self) -> &'static str {
                <$dialect as $crate::dialect::Dialect>::NAME
            }

            fn capabilities(&self) -> lockcore::driver::Capabilities {
                $capabilities
            }

            async fn claim(&self, request: &lockcore::driver::ClaimRequest<'_>) -> Result<lockcore::driver::AcquireOutcome, lockcore::LockError> {
                self.0.claim(request).await
            }

            async fn claim_all(&self, requests: &[lockcore::driver::ClaimRequest<'_>]) -> Result<Option<lockcore::driver::SetOutcome>, lockcore::LockError> {
                self.0.store.claim_all(requests).await
            }

            async fn release(&self, key: &lockcore::LockKey, owner: &lockcore::Owner) -> Result<lockcore::ReleaseOutcome, lockcore::LockError> {
                self.0.release(key, owner).await
            }

            async fn renew(&self, renewals: &[lockcore::driver::Renewal<'_>]) -> Result<Vec<Result<lockcore::driver::ExtendOutcome, lockcore::LockError>>, lockcore::LockError> {
                self.0.store.extend_many(renewals).await
            }

            async fn holders(&self, key: &lockcore::LockKey) -> Result<Vec<lockcore::LockInfo>, lockcore::LockError> {
                self.0.store.holders(key).await
            }

            async fn wait_released(&self, key: &lockcore::LockKey, hint: &lockcore::driver::WaitHint, place: u64, max_wait: std::time::Duration) -> Result<(), lockcore::LockError> {
                self.0.wait_released(key, hint, place, max_wait).await
            }

            async fn abandon(&self, key: &lockcore::LockKey, owner: &lockcore::Owner) -> Result<(), lockcore::LockError> {
                self.0.abandon(key, owner).await
            }

            async fn force_release(&self, key: &lockcore::LockKey) -> Result<lockcore::ReleaseOutcome, lockcore::LockError> {
                self.0.force_release(key).await
            }

            fn notifier(&self) -> Option<&lockcore::driver::ReleaseNotifier> {
                self.0.notifier()
            }

            async fn shutdown(&self) {
                self.0.shutdown().await
            }
        }
    };
}
pub(crate) use lock_backend;
