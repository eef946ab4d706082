use std::sync::Arc;

use lockcore::{FencingGuarantee, LockError, LockKey, ReleaseOutcome};

use crate::harness::Tamper;
use crate::scenarios::Keys;
use crate::{check, Failure, Harness, Outcome};

/// A lock record deleted behind the driver's back (the store's own tools; the holder's
/// lease, session and the key's fence left as they are) is lost: the next extend says
/// `NotHeld` and fires `lost()` instead of renewing a live lease, another client takes the
/// key at once with a higher token, and the old holder's release leaves the new one alone.
pub async fn deleted_record_seen_as_lost(h: Arc<dyn Harness>) -> Outcome {
    let Some(store) = h.fault_store().await? else {
        return Err(Failure("no fault store".into()));
    };
    let keys = Keys::new();
    let key = keys.key("deleted");
    let ttl = h.ttl();
    let a = store.client().await?;
    let b = store.client().await?;
    let fenced = a.client.capabilities().fencing != FencingGuarantee::None;
    // A long lease, renewed by hand: only the deletion can end it within the scenario.
    let held = a
        .client
        .lock(&key)
        .ttl(ttl * 10)
        .watchdog(false)
        .acquire()
        .await?;
    let first = held.token();
    store.tamper(&LockKey::new(&key)?, Tamper::Delete).await?;
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
