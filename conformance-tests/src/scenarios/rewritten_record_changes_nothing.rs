use std::sync::Arc;

use lockcore::ReleaseOutcome;

use crate::harness::Tamper;
use crate::scenarios::Tampered;
use crate::{check, Failure, Harness, Outcome};

/// A lock record written again with the content it has (the store's own tools: the same
/// value, the same columns, the same lease; modification revisions and row versions move)
/// changes nothing: the holder's extend renews it without `lost()`, the token inspect
/// reports stays the holder's, another client still finds the key held, and the holder's
/// release frees it for a higher token.
pub async fn rewritten_record_changes_nothing(h: Arc<dyn Harness>) -> Outcome {
    let ttl = h.ttl();
    // The store and the holder's link live in `t` to the end of the scenario.
    let t = Tampered::start(&*h, "rewritten", ttl * 4, Tamper::Rewrite).await?;
    let (key, b, held, fenced) = (t.key.clone(), &t.b, t.held, t.fenced);
    let first = held.token();
    if let Err(e) = held.extend().await {
        return Err(Failure(format!(
            "extend after the lock record was written again with the same content failed: {e} \
             (a modification revision is not the holder)"
        )));
    }
    check!(
        !held.is_lost(),
        "lost() fired after the record was written again with the same content"
    );
    check!(
        held.token() == first,
        "the guard's token moved from {first} to {}",
        held.token()
    );
    let info = b.client.inspect(&key).await?;
    check!(
        !fenced || info.as_ref().map(|i| i.token) == Some(first),
        "after the record was written again inspect shows {info:?}, expected the holder's \
         token {first} (a token must not follow the record's modification revision)"
    );
    check!(
        b.client.lock(&key).ttl(ttl).try_acquire().await?.is_none(),
        "another client got the key after its record was written again"
    );
    let released = held.release().await?;
    check!(
        released == ReleaseOutcome::Released,
        "the holder's release after the record was written again answered {released:?}"
    );
    let Some(next) = b.client.lock(&key).ttl(ttl).try_acquire().await? else {
        return Err(Failure(
            "the key stayed held after its holder released it".into(),
        ));
    };
    check!(
        !fenced || next.token() > first,
        "the next holder got token {} — not above {first}",
        next.token()
    );
    next.release().await?;
    Ok(())
}
