use std::sync::Arc;

use lockcore::ReleaseOutcome;

use crate::scenarios::{clients, is_free, Keys};
use crate::{check, Harness, Outcome};

/// Re-entry by the same owner through the same client counts up with the same token;
/// releases count down; the store frees the lock only at zero.
pub async fn reentrant_counts(h: Arc<dyn Harness>) -> Outcome {
    let keys = Keys::new();
    let key = keys.key("reentrant");
    let ttl = h.ttl() * 10;
    let c = clients(&*h, 2).await?;
    let owner = c[0].new_owner();
    let g1 = c[0]
        .lock(&key)
        .ttl(ttl)
        .owner(owner.clone())
        .acquire()
        .await?;
    let g2 = c[0]
        .lock(&key)
        .ttl(ttl)
        .owner(owner.clone())
        .acquire()
        .await?;
    let g3 = c[0].lock(&key).ttl(ttl).owner(owner).try_acquire().await?;
    let Some(g3) = g3 else {
        return Err(crate::Failure("re-entry by the holder was refused".into()));
    };
    check!(
        g1.token() == g2.token() && g2.token() == g3.token(),
        "re-entry changed the token"
    );
    check!(
        c[0].lock(&key).ttl(ttl).try_acquire().await?.is_none(),
        "another owner of the same client got the lock"
    );
    let r3 = g3.release().await?;
    check!(
        r3 == ReleaseOutcome::StillHeld { holds: 2 },
        "first release of three answered {r3:?}"
    );
    let r2 = g2.release().await?;
    check!(
        r2 == ReleaseOutcome::StillHeld { holds: 1 },
        "second release of three answered {r2:?}"
    );
    check!(
        !is_free(&c[1], &key, ttl).await?,
        "the store freed the lock before the last release"
    );
    let r1 = g1.release().await?;
    check!(
        r1 == ReleaseOutcome::Released,
        "the last release answered {r1:?}"
    );
    check!(
        is_free(&c[1], &key, ttl).await?,
        "the lock stayed held after the last release"
    );
    Ok(())
}
