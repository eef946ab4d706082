use std::sync::Arc;
use std::time::Duration;

use lockcore::{LockClient, ReleaseOutcome, RenewalHealth};

use crate::scenarios::observed::Observed;
use crate::scenarios::{clients, is_free, Keys};
use crate::{check, Failure, Harness, Outcome};

/// After `release()`, and after a dropped guard's background release (`shutdown()`), the
/// store sees no further renewal of the hold, and a clean release never fires `lost()`.
///
/// A hold whose renewals do not keep up (a store too slow for the TTL) may be declared lost
/// before its release finishes: that round proves nothing and is run again, a few times.
pub async fn no_renewal_after_release(h: Arc<dyn Harness>) -> Outcome {
    let keys = Keys::new();
    let ttl = h.ttl();
    let c = clients(&*h, 2).await?;
    let counted = Arc::new(Observed::new(c[0].backend().clone()));
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
    counted: &Observed,
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
        .renewed_since(counted.extends(), effective * 3)
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
    let after = counted.extends();
    if hold.is_lost() {
        return Ok(Some(health.borrow().clone()));
    }
    let fired = tokio::time::timeout(effective, hold.lost()).await;
    check!(fired.is_err(), "lost() fired after {what}");
    let later = counted.extends();
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
