use std::sync::Arc;

use lockcore::{LockError, ReleaseOutcome};

use crate::harness::Tamper;
use crate::scenarios::Tampered;
use crate::{check, Failure, Harness, Outcome};

/// A lock record rewritten behind the driver's back to name another holder (the store's
/// own tools; the holder's lease or session left alive) is lost to its holder: the next
/// extend says `NotHeld` and fires `lost()`, the holder's release answers `NotHeld` and
/// leaves the stranger's record alone, inspect never shows a token below the holder's, and
/// the key is taken once the stranger's lease ends, with a higher token.
pub async fn reassigned_record_seen_as_lost(h: Arc<dyn Harness>) -> Outcome {
    let ttl = h.ttl();
    // The store and the holder's link live in `t` to the end of the scenario.
    let t = Tampered::start(&*h, "reassigned", ttl * 4, Tamper::Reassign).await?;
    let (key, b, held, fenced) = (t.key.clone(), &t.b, t.held, t.fenced);
    let first = held.token();
    match held.extend().await {
        Err(LockError::NotHeld { .. }) => {}
        other => {
            return Err(Failure(format!(
                "extend after the lock record was rewritten to name another holder answered \
                 {other:?}, expected NotHeld (the record's owner, not a live lease, says whose \
                 the key is)"
            )))
        }
    }
    check!(
        held.is_lost(),
        "extend found the record naming another holder but lost() did not fire"
    );
    let late = held.release().await?;
    check!(
        late == ReleaseOutcome::NotHeld,
        "the holder's release of a record naming another holder answered {late:?}, expected \
         NotHeld"
    );
    let info = b.client.inspect(&key).await?;
    let Some(info) = info else {
        return Err(Failure(
            "after the old holder's release the key is free: the release deleted a record \
             naming another holder"
                .into(),
        ));
    };
    check!(
        !fenced || info.token >= first,
        "inspect shows token {} for the rewritten record, below its holder's {first}",
        info.token
    );
    check!(
        b.client.lock(&key).ttl(ttl).try_acquire().await?.is_none(),
        "the key was free while a record naming another holder was live"
    );
    // The stranger's lease lasts at most what the holder's had left (4 TTLs).
    let next = b
        .client
        .lock(&key)
        .ttl(ttl)
        .wait(ttl * 12)
        .acquire()
        .await?;
    check!(
        !fenced || next.token() > info.token,
        "the holder after the stranger got token {} — not above the stranger's {}",
        next.token(),
        info.token
    );
    next.release().await?;
    Ok(())
}
