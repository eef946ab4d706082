use std::sync::Arc;

use lockcore::{Owner, ReleaseOutcome};

use crate::scenarios::{clients, Keys};
use crate::{check, Harness, Outcome};

/// A release by an owner that does not hold the lock (even one with the holder's label)
/// answers `NotHeld` and leaves the holder's lock in place.
pub async fn release_by_stranger_is_not_held(h: Arc<dyn Harness>) -> Outcome {
    let keys = Keys::new();
    let key = keys.key("mine");
    let lkey = lockcore::LockKey::new(&key)?;
    let ttl = h.ttl() * 10;
    let c = clients(&*h, 2).await?;
    let a = c[0]
        .lock(&key)
        .ttl(ttl)
        .owner(Owner::new("same-label"))
        .acquire()
        .await?;
    for stranger in [Owner::new("stranger"), Owner::new("same-label")] {
        let outcome = c[1].backend().release(&lkey, &stranger).await?;
        check!(
            outcome == ReleaseOutcome::NotHeld,
            "a stranger's release answered {outcome:?}"
        );
    }
    let info = c[1].inspect(&key).await?;
    check!(
        info.map(|i| i.token) == Some(a.token()),
        "the holder's lock is gone after a stranger's release"
    );
    check!(
        c[1].lock(&key).ttl(ttl).try_acquire().await?.is_none(),
        "the key was granted after a stranger's release"
    );
    let outcome = a.release().await?;
    check!(
        outcome == ReleaseOutcome::Released,
        "the holder's own release answered {outcome:?}"
    );
    Ok(())
}
