use std::sync::Arc;
use std::time::{Duration, Instant};

use lockcore::FencedResource;

use crate::scenarios::Keys;
use crate::{check, Failure, Harness, Outcome};

/// A writer paused past its TTL (its link to the store frozen) loses the key to a reader,
/// whose token is above the writer's; the reader reads with it
/// ([`FencedResource::read_fenced`]); when the paused writer wakes, `lost()` has fired
/// and its late write is refused, so what the reader read stays what it holds. With reads
/// that present no token, the late write got in under the reader's read lock.
pub async fn paused_writer_cannot_write_under_reader(h: Arc<dyn Harness>) -> Outcome {
    let Some(store) = h.fault_store().await? else {
        return Err(Failure("no fault store".into()));
    };
    let keys = Keys::new();
    let key = keys.key("paused-writer");
    let ttl = h.ttl();
    let a = store.client().await?;
    let b = store.client().await?;
    let resource = FencedResource::new(0u32);
    let writer = a.client.lock(&key).ttl(ttl).acquire().await?;
    check!(
        resource.write(writer.token(), |v| *v = 1).is_ok(),
        "the writer's first write was rejected"
    );
    a.link.pause().await;
    let paused = Instant::now();
    let reader = b
        .client
        .lock(&key)
        .shared()
        .ttl(ttl * 10)
        .wait(ttl * 20)
        .acquire()
        .await
        .map_err(|e| Failure(format!("the paused writer kept the reader out: {e}")))?;
    let waited = paused.elapsed();
    check!(
        waited <= ttl * 3,
        "the reader got in {waited:?} after the writer paused (writer TTL {ttl:?})"
    );
    check!(
        reader.token() > writer.token(),
        "the reader's token {} is not above the paused writer's {}",
        reader.token(),
        writer.token()
    );
    let read = resource.read_fenced(reader.token(), |v| *v);
    check!(
        read == Ok(1),
        "the reader's fenced read answered {read:?}, not the writer's 1"
    );
    // The paused writer's own process still runs its timers: lost() fires by valid_until.
    let lost = tokio::time::timeout(ttl * 2 + Duration::from_secs(1), writer.lost()).await;
    a.link.resume().await;
    check!(
        lost.is_ok(),
        "the paused writer's lost() did not fire although it could not renew"
    );
    check!(
        resource.write(writer.token(), |v| *v = 99).is_err(),
        "the paused writer's late write got in under a reader that had read with a newer token"
    );
    let again = resource.read_fenced(reader.token(), |v| *v);
    check!(
        again == Ok(1),
        "the reader read {again:?} the second time, having read 1 under the same read lock"
    );
    reader.release().await?;
    drop(writer);
    Ok(())
}
