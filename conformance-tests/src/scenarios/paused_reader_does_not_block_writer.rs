use std::sync::Arc;
use std::time::{Duration, Instant};

use lockcore::FencedResource;

use crate::scenarios::Keys;
use crate::{check, Failure, Harness, Outcome};

/// A reader whose renewals stop (its link to the store frozen, as in a GC pause) blocks a
/// writer no longer than its TTL: the writer gets in by then, with a token above the
/// reader's, the reader's `lost()` fires, and a write fenced with the reader's stale token
/// is rejected.
pub async fn paused_reader_does_not_block_writer(h: Arc<dyn Harness>) -> Outcome {
    let Some(store) = h.fault_store().await? else {
        return Err(Failure("no fault store".into()));
    };
    let keys = Keys::new();
    let key = keys.key("paused-reader");
    let ttl = h.ttl();
    let a = store.client().await?;
    let b = store.client().await?;
    let resource = FencedResource::new(0u32);
    let reader = a.client.lock(&key).shared().ttl(ttl).acquire().await?;
    a.link.pause().await;
    let paused = Instant::now();
    let writer = b
        .client
        .lock(&key)
        .ttl(ttl * 10)
        .wait(ttl * 20)
        .acquire()
        .await
        .map_err(|e| Failure(format!("the paused reader kept the writer out: {e}")))?;
    let waited = paused.elapsed();
    // The reader's last renewal, just before the pause, runs at most one TTL past it.
    check!(
        waited <= ttl * 3,
        "the writer got in {waited:?} after the reader paused (reader TTL {ttl:?})"
    );
    check!(
        writer.token() > reader.token(),
        "the writer's token {} is not above the paused reader's {}",
        writer.token(),
        reader.token()
    );
    check!(
        resource.write(writer.token(), |v| *v = 1).is_ok(),
        "the writer's write was rejected"
    );
    // The paused reader's own process still runs its timers: lost() fires by valid_until.
    let lost = tokio::time::timeout(ttl * 2 + Duration::from_secs(1), reader.lost()).await;
    a.link.resume().await;
    check!(
        lost.is_ok(),
        "the paused reader's lost() did not fire although it could not renew"
    );
    check!(
        resource.write(reader.token(), |v| *v = 99).is_err(),
        "a write fenced with the paused reader's stale token was accepted"
    );
    check!(
        resource.read() == 1,
        "the resource holds {}",
        resource.read()
    );
    writer.release().await?;
    drop(reader);
    Ok(())
}
