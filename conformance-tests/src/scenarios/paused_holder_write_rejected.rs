use std::sync::Arc;
use std::time::Duration;

use lockcore::FencedResource;

use crate::scenarios::Keys;
use crate::{check, Failure, Harness, Outcome};

/// A holder paused past its TTL (its link to the store frozen, as in a GC pause) cannot
/// renew; another client takes over; when the paused holder wakes, `lost()` has fired and
/// its stale write is rejected by a `FencedResource`.
pub async fn paused_holder_write_rejected(h: Arc<dyn Harness>) -> Outcome {
    let Some(store) = h.fault_store().await? else {
        return Err(Failure("no fault store".into()));
    };
    let keys = Keys::new();
    let key = keys.key("paused");
    let ttl = h.ttl();
    let a = store.client().await?;
    let b = store.client().await?;
    let resource = FencedResource::new(0u32);
    let ga = a.client.lock(&key).ttl(ttl).acquire().await?;
    check!(
        resource.write(ga.token(), |v| *v = 1).is_ok(),
        "the first holder's write was rejected"
    );
    a.link.pause().await;
    let gb = b
        .client
        .lock(&key)
        .ttl(ttl * 10)
        .wait(ttl * 20)
        .acquire()
        .await?;
    check!(
        gb.token() > ga.token(),
        "the take-over token {} is not above {}",
        gb.token(),
        ga.token()
    );
    check!(
        resource.write(gb.token(), |v| *v = 2).is_ok(),
        "the new holder's write was rejected"
    );
    // The paused holder's own process still runs its timers: lost() fires by valid_until.
    let lost = tokio::time::timeout(ttl * 2 + Duration::from_secs(1), ga.lost()).await;
    a.link.resume().await;
    check!(
        lost.is_ok(),
        "lost() did not fire although the holder could not renew"
    );
    check!(
        resource.write(ga.token(), |v| *v = 99).is_err(),
        "the paused holder's stale write was accepted"
    );
    check!(
        resource.read() == 2,
        "the resource holds {}",
        resource.read()
    );
    gb.release().await?;
    drop(ga);
    Ok(())
}
