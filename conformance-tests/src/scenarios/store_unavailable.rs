use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::scenarios::Keys;
use crate::{check, Failure, Harness, Outcome};

/// With the store stopped, calls fail with a retryable `Unavailable` error within a bound
/// and a holder's `lost()` fires; after a restart the same client acquires again.
pub async fn store_unavailable(h: Arc<dyn Harness>) -> Outcome {
    let Some(store) = h.fault_store().await? else {
        return Err(Failure("no fault store".into()));
    };
    let keys = Keys::new();
    let ttl = h.ttl();
    let a = store.client().await?;
    let held = a.client.lock(keys.key("held")).ttl(ttl).acquire().await?;
    let effective = held.lease().ttl();
    store.stop().await?;
    let bound = ttl * 10 + Duration::from_secs(10);
    let key = keys.key("down");
    let started = Instant::now();
    let attempt = tokio::time::timeout(bound, a.client.lock(&key).ttl(ttl).try_acquire()).await;
    match attempt {
        Err(_) => {
            return Err(Failure(format!(
                "try_acquire on a stopped store did not answer in {bound:?}"
            )))
        }
        Ok(Ok(_)) => return Err(Failure("try_acquire succeeded on a stopped store".into())),
        Ok(Err(e)) => check!(
            matches!(
                e,
                lockcore::LockError::Unavailable { .. }
                    | lockcore::LockError::QuorumNotReached { .. }
            ) && e.is_retryable(),
            "a stopped store gave a non-retryable error: {e}"
        ),
    }
    let attempt = tokio::time::timeout(bound, a.client.inspect(&key)).await;
    check!(
        matches!(attempt, Ok(Err(_))),
        "inspect on a stopped store answered {attempt:?}"
    );
    let fired = tokio::time::timeout(effective * 2 + Duration::from_secs(1), held.lost()).await;
    check!(
        fired.is_ok(),
        "a holder's lost() did not fire while the store was down"
    );
    let down_for = started.elapsed();
    store.start().await?;
    let g = a.client.lock(&key).ttl(ttl).wait(bound).acquire().await;
    let g = g.map_err(|e| {
        Failure(format!(
            "no recovery after restart (down {down_for:?}): {e}"
        ))
    })?;
    g.release().await?;
    drop(held);
    Ok(())
}
