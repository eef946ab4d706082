use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lockcore::{
    AcquireOutcome, Capabilities, Claim, ExtendOutcome, LockBackend, LockClient, LockError,
    LockInfo, LockKey, Owner, ReleaseOutcome, WaitHint,
};
use tokio::sync::watch;

use crate::scenarios::{clients, is_free, Keys};
use crate::{check, Harness, Outcome};

/// After `release()`, and after a dropped guard's background release (`shutdown()`), the
/// store sees no further `extend` of the hold, and a clean release never fires `lost()`.
pub async fn no_renewal_after_release(h: Arc<dyn Harness>) -> Outcome {
    let keys = Keys::new();
    let ttl = h.ttl();
    let c = clients(&*h, 2).await?;
    let counted = Arc::new(CountExtends::new(c[0].backend().clone()));
    let client = LockClient::new(counted.clone());

    // Released by `release()`.
    let key = keys.key("released");
    let g = client.lock(&key).ttl(ttl).acquire().await?;
    let effective = g.lease().ttl();
    let lost = g.handle();
    counted.renewed_since(0, effective * 3).await?;
    let outcome = g.release().await?;
    check!(
        outcome == ReleaseOutcome::Released,
        "a release of a watched lock answered {outcome:?}"
    );
    quiet_after(&counted, &lost, effective, "release()").await?;
    check!(
        is_free(&c[1], &key, ttl).await?,
        "the released key stayed held"
    );

    // Released in the background after the guard was dropped.
    let key = keys.key("dropped");
    let g = client.lock(&key).ttl(ttl).acquire().await?;
    let lost = g.handle();
    counted
        .renewed_since(counted.count(), effective * 3)
        .await?;
    drop(g);
    check!(
        client.shutdown().await,
        "shutdown did not finish the dropped guard's release"
    );
    quiet_after(&counted, &lost, effective, "a dropped guard's release").await?;
    check!(
        is_free(&c[1], &key, ttl).await?,
        "the dropped guard's key stayed held"
    );
    Ok(())
}

/// No extend reaches the store for longer than a renewal period (a third of `effective`)
/// after `what`, and the hold's `lost()` does not fire.
async fn quiet_after(
    counted: &CountExtends,
    hold: &lockcore::LockHandle,
    effective: Duration,
    what: &str,
) -> Outcome {
    let after = counted.count();
    let fired = tokio::time::timeout(effective, hold.lost()).await;
    check!(fired.is_err(), "lost() fired after a clean {what}");
    let later = counted.count();
    check!(
        later == after,
        "{} renewal(s) of the hold were sent after {what}",
        later - after
    );
    Ok(())
}

/// A backend that counts the extends sent through it.
#[derive(Debug)]
struct CountExtends {
    inner: Arc<dyn LockBackend>,
    extends: watch::Sender<u64>,
}

impl CountExtends {
    fn new(inner: Arc<dyn LockBackend>) -> Self {
        CountExtends {
            inner,
            extends: watch::Sender::new(0),
        }
    }

    fn count(&self) -> u64 {
        *self.extends.borrow()
    }

    /// Waits (at most `limit`) for an extend after the first `seen`.
    async fn renewed_since(&self, seen: u64, limit: Duration) -> Outcome {
        let mut rx = self.extends.subscribe();
        let renewed = tokio::time::timeout(limit, rx.wait_for(|n| *n > seen))
            .await
            .is_ok_and(|r| r.is_ok());
        check!(renewed, "the watchdog sent no renewal within {limit:?}");
        Ok(())
    }
}

#[async_trait]
impl LockBackend for CountExtends {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn try_acquire(
        &self,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<AcquireOutcome, LockError> {
        self.inner.try_acquire(key, owner, ttl).await
    }

    async fn try_claim(
        &self,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
        claim: Claim,
    ) -> Result<AcquireOutcome, LockError> {
        self.inner.try_claim(key, owner, ttl, claim).await
    }

    async fn release(&self, key: &LockKey, owner: &Owner) -> Result<ReleaseOutcome, LockError> {
        self.inner.release(key, owner).await
    }

    async fn extend(
        &self,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<ExtendOutcome, LockError> {
        self.extends.send_modify(|n| *n += 1);
        self.inner.extend(key, owner, ttl).await
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        self.inner.inspect(key).await
    }

    async fn inspect_all(&self, key: &LockKey) -> Result<Vec<LockInfo>, LockError> {
        self.inner.inspect_all(key).await
    }

    async fn wait_released(
        &self,
        key: &LockKey,
        hint: &WaitHint,
        max_wait: Duration,
    ) -> Result<(), LockError> {
        self.inner.wait_released(key, hint, max_wait).await
    }

    async fn force_release(&self, key: &LockKey) -> Result<ReleaseOutcome, LockError> {
        self.inner.force_release(key).await
    }

    async fn abandon(&self, key: &LockKey, owner: &Owner) -> Result<(), LockError> {
        self.inner.abandon(key, owner).await
    }

    fn wake_next(&self, key: &LockKey) {
        self.inner.wake_next(key);
    }
}
