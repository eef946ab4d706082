use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lockcore::{
    AcquireOutcome, Capabilities, Claim, ExtendOutcome, LockBackend, LockClient, LockError,
    LockInfo, LockKey, Owner, ReleaseOutcome, RenewalHealth, WaitHint,
};
use tokio::sync::watch;

use crate::scenarios::{clients, is_free, Keys};
use crate::{check, Failure, Harness, Outcome};

/// After `release()`, and after a dropped guard's background release (`shutdown()`), the
/// store sees no further `extend` of the hold, and a clean release never fires `lost()`.
///
/// A hold whose renewals do not keep up (a store too slow for the TTL) may be declared lost
/// before its release finishes: that round proves nothing and is run again, a few times.
pub async fn no_renewal_after_release(h: Arc<dyn Harness>) -> Outcome {
    let keys = Keys::new();
    let ttl = h.ttl();
    let c = clients(&*h, 2).await?;
    let counted = Arc::new(CountExtends::new(c[0].backend().clone()));
    for how in [Release::Call, Release::Drop] {
        let mut round = 0;
        loop {
            let key = keys.key(&format!("{}-{round}", how.name()));
            // A fresh client each round: `shutdown` ends one.
            let client = LockClient::new(counted.clone());
            let early = released_quietly(&counted, &client, &c[1], &key, ttl, how).await?;
            let Some(health) = early else { break };
            round += 1;
            check!(
                round < ROUNDS,
                "in {ROUNDS} rounds the watched lock was declared lost before {} (renewals \
                 answered NotHeld, or did not keep up with a TTL of {ttl:?}); renewal health: \
                 {health:?}",
                how.what()
            );
        }
    }
    Ok(())
}

/// Rounds run before a store too slow to keep the lease fails the scenario.
const ROUNDS: u32 = 3;

#[derive(Clone, Copy)]
enum Release {
    /// `release()`.
    Call,
    /// Dropped, then `shutdown()`.
    Drop,
}

impl Release {
    fn name(self) -> &'static str {
        match self {
            Release::Call => "released",
            Release::Drop => "dropped",
        }
    }

    fn what(self) -> &'static str {
        match self {
            Release::Call => "release() returned",
            Release::Drop => "shutdown() finished a dropped guard's release",
        }
    }
}

/// One round: takes `key`, waits for a renewal, lets go of it `how`; then no renewal and no
/// `lost()` follow, and `other` finds the key free. `Ok(Some(health))` if the hold was
/// declared lost before the release finished (the round proves nothing).
async fn released_quietly(
    counted: &CountExtends,
    client: &LockClient,
    other: &LockClient,
    key: &str,
    ttl: Duration,
    how: Release,
) -> Result<Option<RenewalHealth>, Failure> {
    let g = client.lock(key).ttl(ttl).acquire().await?;
    let effective = g.lease().ttl();
    let hold = g.handle();
    let health = hold.renewal_health();
    counted
        .renewed_since(counted.count(), effective * 3)
        .await?;
    let what = how.what();
    match how {
        Release::Call => {
            let outcome = g.release().await?;
            check!(
                outcome == ReleaseOutcome::Released,
                "a release of a watched lock answered {outcome:?}"
            );
        }
        Release::Drop => {
            drop(g);
            check!(
                client.shutdown().await,
                "shutdown did not finish the dropped guard's release"
            );
        }
    }
    let after = counted.count();
    if hold.is_lost() {
        return Ok(Some(health.borrow().clone()));
    }
    let fired = tokio::time::timeout(effective, hold.lost()).await;
    check!(fired.is_err(), "lost() fired after {what}");
    let later = counted.count();
    check!(
        later == after,
        "{} renewal(s) of the hold were sent after {what}",
        later - after
    );
    check!(
        is_free(other, key, ttl).await?,
        "the key stayed held after {what}"
    );
    Ok(None)
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
