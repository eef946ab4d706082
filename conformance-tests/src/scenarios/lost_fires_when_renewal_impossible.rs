use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::scenarios::Keys;
use crate::{check, Failure, Harness, Outcome};

/// `lost()` fires at the first renewal that finds the lock gone (force-released and taken
/// over), and by the end of the lease when renewals cannot reach the store at all.
pub async fn lost_fires_when_renewal_impossible(h: Arc<dyn Harness>) -> Outcome {
    let Some(store) = h.fault_store().await? else {
        return Err(Failure("no fault store".into()));
    };
    let keys = Keys::new();
    let ttl = h.ttl();
    let a = store.client().await?;
    let b = store.client().await?;

    // Broken off: the operator breaks the lock and someone else takes it.
    let key = keys.key("broken");
    let ga = a.client.lock(&key).ttl(ttl).acquire().await?;
    let effective = ga.lease().ttl();
    b.client.force_release(&key).await?;
    let gb = b
        .client
        .lock(&key)
        .ttl(ttl * 10)
        .wait(ttl * 10)
        .acquire()
        .await?;
    let fired = tokio::time::timeout(effective * 2, ga.lost()).await;
    check!(
        fired.is_ok(),
        "lost() did not fire after the lock was taken over"
    );
    check!(
        b.client.inspect(&key).await?.map(|i| i.token) == Some(gb.token()),
        "renewal disturbed the new holder"
    );
    gb.release().await?;
    drop(ga);

    // Cut off: the store cannot be reached; lost() fires by the end of the lease.
    let key = keys.key("cut");
    let ga = a.client.lock(&key).ttl(ttl).acquire().await?;
    let deadline = ga.valid_until();
    a.link.pause().await;
    let fired = tokio::time::timeout(effective * 2, ga.lost()).await;
    let at = Instant::now();
    a.link.resume().await;
    check!(
        fired.is_ok(),
        "lost() did not fire while the store was unreachable"
    );
    check!(
        at <= deadline + effective + Duration::from_millis(50),
        "lost() fired {:?} after the lease's end",
        at.saturating_duration_since(deadline)
    );
    drop(ga);
    Ok(())
}
