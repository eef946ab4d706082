use std::sync::Arc;

use lockcore::{LockKey, ReleaseOutcome};

use crate::harness::Tamper;
use crate::scenarios::Keys;
use crate::{check, Failure, Harness, Outcome};

/// The record of one key of a held set deleted behind the driver's back: the set's
/// `lost()` fires at the next renewal, and releasing the set says it was not held.
pub async fn key_set_lost_when_one_key_lost(h: Arc<dyn Harness>) -> Outcome {
    let Some(store) = h.fault_store().await? else {
        return Err(Failure("no fault store".into()));
    };
    let ttl = h.ttl();
    let keys = Keys::new();
    let names = [keys.key("a"), keys.key("b"), keys.key("c")];
    let holder = store.client().await?;
    let set = holder
        .client
        .lock_all(names.clone())
        .ttl(ttl * 3)
        .acquire()
        .await?;
    store
        .tamper(&LockKey::new(&names[1])?, Tamper::Delete)
        .await?;
    // Renewed every TTL: lost() must fire at the first renewal after the deletion.
    let fired = tokio::time::timeout(ttl * 3, set.lost()).await.is_ok();
    check!(
        fired,
        "one key of the set was deleted, and the set's lost() did not fire within 3 TTLs"
    );
    let outcome = set.release().await?;
    check!(
        outcome == ReleaseOutcome::NotHeld,
        "releasing a set with a lost key answered {outcome:?}, expected NotHeld"
    );
    Ok(())
}
