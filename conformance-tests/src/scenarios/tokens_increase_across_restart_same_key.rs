use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::harness::Restart;
use crate::scenarios::Keys;
use crate::{check, Failure, Harness, Outcome};

/// Tokens of one key keep increasing across a store restart — also for a re-acquire at
/// once after it, within the second of the last grant, and across restarts that keep and
/// that lose the store's data — and across an idle gap longer than the lease.
pub async fn tokens_increase_across_restart_same_key(h: Arc<dyn Harness>) -> Outcome {
    let Some(store) = h.fault_store().await? else {
        return Err(Failure("no fault store".into()));
    };
    let keys = Keys::new();
    let key = keys.key("restarted");
    let ttl = h.ttl();
    let a = store.client().await?;
    let mut tokens = Vec::new();
    for _ in 0..2 {
        let g = a.client.lock(&key).ttl(ttl).acquire().await?;
        tokens.push(g.token());
        g.release().await?;
    }
    let last_grant = Instant::now();
    store.stop().await?;
    store.start().await?;
    // At once, with retries while the client reconnects.
    let g = a
        .client
        .lock(&key)
        .ttl(ttl)
        .wait(ttl * 10 + Duration::from_secs(10))
        .acquire()
        .await
        .map_err(|e| Failure(format!("no acquire after the restart: {e}")))?;
    let after_restart = last_grant.elapsed();
    tokens.push(g.token());
    let effective = g.lease().ttl();
    g.release().await?;
    check!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens of one key went back across a store restart ({after_restart:?} after the last grant): {tokens:?}"
    );
    // Restarts that say what survives: the store's data, then nothing.
    for how in [Restart::KeepData, Restart::LoseData] {
        if !store.restart(how).await? {
            continue;
        }
        let g = a
            .client
            .lock(&key)
            .ttl(ttl)
            .wait(ttl * 10 + Duration::from_secs(10))
            .acquire()
            .await
            .map_err(|e| Failure(format!("no acquire after a restart ({how:?}): {e}")))?;
        tokens.push(g.token());
        g.release().await?;
        check!(
            tokens.windows(2).all(|w| w[0] < w[1]),
            "tokens of one key went back across a store restart ({how:?}): {tokens:?}"
        );
    }
    // Idle for longer than a lease: nothing of the key is left but what keeps its tokens.
    tokio::time::sleep(effective + effective / 2).await;
    let g = a.client.lock(&key).ttl(ttl).acquire().await?;
    tokens.push(g.token());
    g.release().await?;
    check!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens of one key went back after an idle gap longer than the lease: {tokens:?}"
    );
    Ok(())
}
