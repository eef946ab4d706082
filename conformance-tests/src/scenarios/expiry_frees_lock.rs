use std::sync::Arc;
use std::time::Instant;

use crate::scenarios::{clients, Keys};
use crate::{check, Harness, Outcome};

/// A holder that never renews or releases loses the lock after its TTL (and is told so);
/// another client then acquires it with a higher token (on a backend that hands out
/// fencing tokens), not before the TTL ran out.
pub async fn expiry_frees_lock(h: Arc<dyn Harness>) -> Outcome {
    let keys = Keys::new();
    let key = keys.key("expiring");
    let ttl = h.ttl();
    let c = clients(&*h, 2).await?;
    let acquired = Instant::now();
    let a = c[0].lock(&key).ttl(ttl).watchdog(false).acquire().await?;
    let effective = a.lease().ttl();
    check!(
        c[1].lock(&key).ttl(ttl).try_acquire().await?.is_none(),
        "the key was free right after acquisition"
    );
    let b = c[1]
        .lock(&key)
        .ttl(ttl * 10)
        .wait(effective * 10)
        .acquire()
        .await?;
    let waited = acquired.elapsed();
    check!(
        waited + effective / 10 >= effective,
        "the lock was taken over after {waited:?}, before its TTL of {effective:?} ran out"
    );
    let fenced = c[1].capabilities().fencing != lockcore::driver::FencingGuarantee::None;
    check!(
        !fenced || b.token() > a.token(),
        "take-over token {} is not above the expired holder's {}",
        b.token(),
        a.token()
    );
    check!(
        a.is_lost(),
        "the expired holder was not told it lost the lock"
    );
    b.release().await?;
    Ok(())
}
