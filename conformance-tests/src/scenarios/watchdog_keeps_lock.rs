use std::sync::Arc;

use lockcore::ReleaseOutcome;

use crate::scenarios::{clients, is_free, Keys};
use crate::{check, Harness, Outcome};

/// The watchdog keeps a lock for 5× its TTL; no one else gets it meanwhile, the token does
/// not change, `lost()` stays quiet; after release the lock is free and stays free of the
/// old holder.
pub async fn watchdog_keeps_lock(h: Arc<dyn Harness>) -> Outcome {
    let keys = Keys::new();
    let key = keys.key("watched");
    let ttl = h.ttl();
    let c = clients(&*h, 2).await?;
    let a = c[0].lock(&key).ttl(ttl).acquire().await?;
    let effective = a.lease().ttl();
    let until = std::time::Instant::now() + effective * 5;
    while std::time::Instant::now() < until {
        tokio::time::sleep(effective / 2).await;
        check!(
            c[1].lock(&key).ttl(ttl).try_acquire().await?.is_none(),
            "another owner got a watched lock"
        );
        check!(!a.is_lost(), "lost() fired while renewals succeed");
    }
    let info = c[1].inspect(&key).await?;
    check!(
        info.map(|i| i.token) == Some(a.token()),
        "the token changed under the watchdog"
    );
    check!(
        a.release().await? == ReleaseOutcome::Released,
        "release after 5 TTLs failed"
    );
    let b = c[1].lock(&key).ttl(ttl * 10).try_acquire().await?;
    let Some(b) = b else {
        return Err(crate::Failure("the lock stayed held after release".into()));
    };
    // No renewal after release: a renewal is owner-checked and must not disturb b.
    tokio::time::sleep(effective).await;
    check!(
        c[1].inspect(&key).await?.map(|i| i.token) == Some(b.token()),
        "the new holder was disturbed"
    );
    b.release().await?;
    check!(is_free(&c[0], &key, ttl).await?, "the key stayed held");
    Ok(())
}
