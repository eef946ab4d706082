use std::sync::Arc;

use lockcore::{LockError, ReleaseOutcome};

use crate::harness::Tamper;
use crate::scenarios::Tampered;
use crate::{check, Failure, Harness, Outcome};

/// A lock record deleted behind the driver's back (the store's own tools; the holder's
/// lease, session and the key's fence left as they are) is lost: the next extend says
/// `NotHeld` and fires `lost()` instead of renewing a live lease, another client takes the
/// key at once with a higher token, and the old holder's release leaves the new one alone.
pub async fn deleted_record_seen_as_lost(h: Arc<dyn Harness>) -> Outcome {
    let ttl = h.ttl();
    // The store and the holder's link live in `t` to the end of the scenario.
    let t = Tampered::start(&*h, "deleted", ttl * 10, Tamper::Delete).await?;
    let (key, b, held, fenced) = (t.key.clone(), &t.b, t.held, t.fenced);
    let first = held.token();
    match held.extend().await {
        Err(LockError::NotHeld { .. }) => {}
        other => {
            return Err(Failure(format!(
                "extend after the lock record was deleted answered {other:?}, expected NotHeld \
                 (a live lease or session is not proof that the key is still ours)"
            )))
        }
    }
    check!(
        held.is_lost(),
        "extend found the record deleted but lost() did not fire"
    );
    let Some(next) = b.client.lock(&key).ttl(ttl * 10).try_acquire().await? else {
        return Err(Failure(
            "the key stayed held after its record was deleted and its holder's extend failed"
                .into(),
        ));
    };
    check!(
        !fenced || next.token() > first,
        "the holder after a deleted record got token {} — not above the deleted holder's {} \
         (the fence must not live in the record a deletion removes)",
        next.token(),
        first
    );
    let late = held.release().await?;
    check!(
        late == ReleaseOutcome::NotHeld,
        "the deleted holder's release answered {late:?}, expected NotHeld"
    );
    let info = b.client.inspect(&key).await?;
    check!(
        info.as_ref().map(|i| i.token) == Some(next.token()),
        "the deleted holder's release disturbed the new holder: inspect shows {info:?}"
    );
    next.release().await?;
    Ok(())
}
