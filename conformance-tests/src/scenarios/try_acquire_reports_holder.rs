use std::sync::Arc;

use crate::scenarios::{clients, Keys};
use crate::{check, Harness, Outcome};

/// `try_acquire` on a held key returns `None` at once, and inspect shows the holder's
/// label, token and a plausible remaining TTL.
pub async fn try_acquire_reports_holder(h: Arc<dyn Harness>) -> Outcome {
    let keys = Keys::new();
    let key = keys.key("held");
    let ttl = h.ttl() * 10;
    let c = clients(&*h, 2).await?;
    let owner = lockcore::Owner::new("holder-a");
    let a = c[0].lock(&key).ttl(ttl).owner(owner).try_acquire().await?;
    let Some(a) = a else {
        return Err(crate::Failure("a free key was reported held".into()));
    };
    let started = std::time::Instant::now();
    check!(
        c[1].lock(&key).ttl(ttl).try_acquire().await?.is_none(),
        "a held key was granted to another owner"
    );
    check!(
        started.elapsed() < h.ttl() * 3,
        "try_acquire waited {:?} on a held key",
        started.elapsed()
    );
    let info = c[1].inspect(&key).await?;
    let Some(info) = info else {
        return Err(crate::Failure("inspect says a held key is free".into()));
    };
    check!(
        info.holder == "holder-a",
        "inspect shows holder {:?}, expected \"holder-a\"",
        info.holder
    );
    check!(
        info.token == a.token(),
        "inspect shows token {}, the holder has {}",
        info.token,
        a.token()
    );
    // Judged by the TTL the store applied, which the lease shows: a backend may round a
    // TTL up to its minimum, or grant at most what its session lasts (ZooKeeper).
    let applied = a.lease().ttl();
    if let Some(left) = info.remaining_ttl {
        check!(
            left <= applied && left >= applied / 2,
            "remaining TTL {left:?} is implausible for a fresh {applied:?} lease (asked {ttl:?})"
        );
    }
    a.release().await?;
    Ok(())
}
