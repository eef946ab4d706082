use std::sync::Arc;

use lockcore::ReleaseOutcome;

use crate::scenarios::{clients, Keys};
use crate::{check, Harness, Outcome};

/// A holder whose lease expired and was taken over releases late: it hears `NotHeld`, and
/// the new holder keeps its lock (the classic misrelease).
pub async fn late_release_keeps_new_holder(h: Arc<dyn Harness>) -> Outcome {
    let keys = Keys::new();
    let key = keys.key("misrelease");
    let ttl = h.ttl();
    let c = clients(&*h, 3).await?;
    let a = c[0].lock(&key).ttl(ttl).watchdog(false).acquire().await?;
    let b = c[1]
        .lock(&key)
        .ttl(ttl * 20)
        .wait(ttl * 20)
        .acquire()
        .await?;
    let late = a.release().await?;
    check!(
        late == ReleaseOutcome::NotHeld,
        "a late release after take-over answered {late:?}"
    );
    let info = c[2].inspect(&key).await?;
    check!(
        info.map(|i| i.token) == Some(b.token()),
        "the new holder lost its lock to a late release"
    );
    check!(
        c[2].lock(&key).ttl(ttl).try_acquire().await?.is_none(),
        "the key became free after a late release"
    );
    check!(
        b.release().await? == ReleaseOutcome::Released,
        "the new holder could not release"
    );
    Ok(())
}
