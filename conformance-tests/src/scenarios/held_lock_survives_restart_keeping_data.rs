use std::sync::Arc;
use std::time::{Duration, Instant};

use lockcore::{LockError, ReleaseOutcome};

use crate::harness::Restart;
use crate::scenarios::Keys;
use crate::{check, Failure, Harness, Outcome};

/// A lock held across a restart that keeps the store's data stays held: its holder renews
/// it once the store is back (the driver reconnects and reloads whatever the store forgot —
/// scripts, prepared statements, sessions), no one else gets it meanwhile, its release
/// frees it, and the next holder's token is higher. Skipped where the store cannot restart
/// keeping its data.
pub async fn held_lock_survives_restart_keeping_data(h: Arc<dyn Harness>) -> Outcome {
    let Some(store) = h.fault_store().await? else {
        return Err(Failure("no fault store".into()));
    };
    let keys = Keys::new();
    let key = keys.key("kept");
    let ttl = h.ttl();
    let a = store.client().await?;
    let b = store.client().await?;
    let _ = b.client.inspect(&key).await?;
    // A lease long enough to outlast the restart, renewed by the watchdog.
    let held = a.client.lock(&key).ttl(ttl * 10).acquire().await?;
    let token = held.token();
    if !store.restart(Restart::KeepData).await? {
        held.release().await?;
        return Ok(());
    }
    let back = Instant::now();
    let bound = ttl * 5 + Duration::from_secs(10);
    // Connections are re-established on demand: retry while they are.
    loop {
        match held.extend().await {
            Ok(()) => break,
            Err(e) if e.is_retryable() && back.elapsed() < bound => {
                tokio::time::sleep(ttl / 10).await;
            }
            Err(e) => {
                return Err(Failure(format!(
                    "the holder could not renew its lock {:?} after the store restarted keeping \
                     its data: {e}",
                    back.elapsed()
                )))
            }
        }
    }
    check!(
        !held.is_lost(),
        "lost() fired for a lock the store kept across its restart"
    );
    let taken = loop {
        match b.client.lock(&key).ttl(ttl).try_acquire().await {
            Ok(taken) => break taken,
            Err(e) if e.is_retryable() && back.elapsed() < bound => {
                tokio::time::sleep(ttl / 10).await;
            }
            Err(e) => return Err(e.into()),
        }
    };
    check!(
        taken.is_none(),
        "another client took a lock held across a restart that kept the store's data"
    );
    let released = held.release().await?;
    check!(
        released == ReleaseOutcome::Released,
        "the holder's release after the restart answered {released:?}"
    );
    let next = b
        .client
        .lock(&key)
        .ttl(ttl)
        .wait(bound)
        .acquire()
        .await
        .map_err(|e: LockError| Failure(format!("the key was not free after its release: {e}")))?;
    let fenced = b.client.capabilities().fencing != lockcore::driver::FencingGuarantee::None;
    check!(
        !fenced || next.token() > token,
        "the holder after the restart got token {} after {token}",
        next.token()
    );
    next.release().await?;
    Ok(())
}
