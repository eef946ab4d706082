//! The [`LockBackend`](lockcore::LockBackend) operations written once: a lock table
//! ([`Store`]) and how its waiters are woken ([`Waiting`]). Each database's public backend
//! type wraps one and implements the trait with [`lock_backend!`].

use std::sync::Arc;
use std::time::Duration;

use lockcore::{
    AcquireOutcome, Capabilities, Claim, LockError, LockKey, Owner, ReleaseOutcome, WaitHint,
};

use crate::dialect::Dialect;
use crate::run::Run;
use crate::store::Store;
use crate::wait::Waiting;

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
        max_wait: Duration,
    ) -> Result<(), LockError> {
        self.waiting.wait(&self.store, key, hint, max_wait).await
    }

    /// Takes a claim.
    pub(crate) async fn try_claim(
        &self,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
        claim: Claim,
    ) -> Result<AcquireOutcome, LockError> {
        if claim.is_exclusive() {
            if let Some(waited) = lockcore::starving_for().filter(|_| !self.store.fair) {
                // A long wait marks the key as its next turn, then asks as everyone does:
                // two statements, neither holding the row's lock past its own round trip.
                self.store.mark(key, owner, ttl, waited).await?;
            }
            let outcome = self.store.acquire(key, owner, ttl).await?;
            if self.store.fair {
                match &outcome {
                    AcquireOutcome::Held(_) => self.waiting.queued(key, owner.token(), ttl),
                    _ => self.waiting.left_queue(key, owner.token()),
                }
            }
            Ok(outcome)
        } else if self.store.fair {
            Err(LockError::claims_unsupported(D::NAME, &claim))
        } else {
            self.store.claim(key, owner, ttl, claim).await
        }
    }

    /// A hand-over: in one call where the store has one (never for a fair store, whose
    /// claims are exclusive), else the release and then the claim. A waiter of this backend
    /// is woken when the release freed room the claim did not take.
    pub(crate) async fn release_and_claim(
        &self,
        key: &LockKey,
        owner: &Owner,
        next: &Owner,
        ttl: Duration,
        claim: Claim,
    ) -> Result<(ReleaseOutcome, Result<AcquireOutcome, LockError>), LockError> {
        if !claim.is_exclusive() && !self.store.fair {
            let handed = self
                .store
                .release_and_claim(key, owner, next, ttl, claim)
                .await?;
            if let Some((released, claimed)) = handed {
                if !matches!(claimed, Ok(AcquireOutcome::Acquired(_))) {
                    self.released(key, released)?;
                }
                return Ok((released, claimed));
            }
        }
        // `lockcore::release_then_claim`'s two requests, on this generic core's own
        // methods (it is not itself the `LockBackend`).
        let released = self.release(key, owner).await?;
        Ok((released, self.try_claim(key, next, ttl, claim).await))
    }

    /// What the backend declares: the database's `plain` capabilities, or `fair` ones for
    /// a fair store.
    pub(crate) fn capabilities(&self, plain: Capabilities, fair: Capabilities) -> Capabilities {
        if self.store.fair {
            fair
        } else {
            plain
        }
    }

    /// Removes the owner's reservation (a fair store: its place in the queue); its removal
    /// may let other claims in.
    pub(crate) async fn abandon(&self, key: &LockKey, owner: &Owner) -> Result<(), LockError> {
        let removed = if self.store.fair {
            self.waiting.left_queue(key, owner.token());
            self.store.leave_queue(key, owner).await?
        } else {
            self.store.abandon(key, owner).await?
        };
        if removed {
            self.waiting.released(key);
        }
        Ok(())
    }

    pub(crate) fn wake_next(&self, key: &LockKey) {
        self.waiting.wake_next(key);
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
/// [`SqlBackend`] of dialect `$dialect`, declaring `$capabilities` (`$fair` when its store
/// is fair).
#[rustfmt::skip]
macro_rules! lock_backend {
    ($backend:ty, $dialect:ty, $capabilities:expr, $fair:expr) => {
        #[async_trait::async_trait]
        impl lockcore::LockBackend for $backend {
            fn name(&self) -> &'static str {
                <$dialect as $crate::dialect::Dialect>::NAME
            }

            fn capabilities(&self) -> lockcore::Capabilities {
                self.0.capabilities($capabilities, $fair)
            }

            async fn try_acquire(&self, key: &lockcore::LockKey, owner: &lockcore::Owner, ttl: std::time::Duration) -> Result<lockcore::AcquireOutcome, lockcore::LockError> {
                self.0.try_claim(key, owner, ttl, lockcore::Claim::exclusive()).await
            }

            async fn try_claim(&self, key: &lockcore::LockKey, owner: &lockcore::Owner, ttl: std::time::Duration, claim: lockcore::Claim) -> Result<lockcore::AcquireOutcome, lockcore::LockError> {
                self.0.try_claim(key, owner, ttl, claim).await
            }

            async fn inspect_all(&self, key: &lockcore::LockKey) -> Result<Vec<lockcore::LockInfo>, lockcore::LockError> {
                self.0.store.inspect_all(key).await
            }

            async fn abandon(&self, key: &lockcore::LockKey, owner: &lockcore::Owner) -> Result<(), lockcore::LockError> {
                self.0.abandon(key, owner).await
            }

            fn wake_next(&self, key: &lockcore::LockKey) {
                self.0.wake_next(key)
            }

            async fn release(&self, key: &lockcore::LockKey, owner: &lockcore::Owner) -> Result<lockcore::ReleaseOutcome, lockcore::LockError> {
                self.0.release(key, owner).await
            }

            async fn release_and_claim(&self, key: &lockcore::LockKey, owner: &lockcore::Owner, next: &lockcore::Owner, ttl: std::time::Duration, claim: lockcore::Claim) -> Result<(lockcore::ReleaseOutcome, Result<lockcore::AcquireOutcome, lockcore::LockError>), lockcore::LockError> {
                self.0.release_and_claim(key, owner, next, ttl, claim).await
            }

            async fn extend(&self, key: &lockcore::LockKey, owner: &lockcore::Owner, ttl: std::time::Duration) -> Result<lockcore::ExtendOutcome, lockcore::LockError> {
                self.0.store.extend(key, owner, ttl).await
            }

            async fn extend_many(&self, renewals: &[lockcore::Renewal<'_>]) -> Result<Vec<Result<lockcore::ExtendOutcome, lockcore::LockError>>, lockcore::LockError> {
                self.0.store.extend_many(renewals).await
            }

            async fn inspect(&self, key: &lockcore::LockKey) -> Result<Option<lockcore::LockInfo>, lockcore::LockError> {
                self.0.store.inspect(key).await
            }

            async fn wait_released(&self, key: &lockcore::LockKey, hint: &lockcore::WaitHint, max_wait: std::time::Duration) -> Result<(), lockcore::LockError> {
                self.0.wait_released(key, hint, max_wait).await
            }

            async fn force_release(&self, key: &lockcore::LockKey) -> Result<lockcore::ReleaseOutcome, lockcore::LockError> {
                self.0.force_release(key).await
            }

            async fn shutdown(&self) {
                self.0.shutdown().await
            }
        }
    };
}
pub(crate) use lock_backend;
