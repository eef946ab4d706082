use std::sync::Arc;
use std::time::Instant;

use crate::scenarios::cancelled_acquire_leaves_nothing::cancel_applied_request;
use crate::scenarios::Keys;
use crate::{check, Failure, Harness, Outcome};

/// A shared claim cancelled after the store applied it but before its answer arrived
/// (answers delayed) leaves no lease beyond the delay; a shared claim cancelled while it
/// waits behind a writer leaves no reservation that would keep the next writer out.
pub async fn cancelled_shared_claim_leaves_nothing(h: Arc<dyn Harness>) -> Outcome {
    let Some(store) = h.fault_store().await? else {
        return Err(Failure("no fault store".into()));
    };
    let keys = Keys::new();
    let ttl = h.ttl();
    let slow = store.client().await?;
    let other = store.client().await?;

    // Applied, then cancelled before the answer came.
    let key = keys.key("cancelled-grant");
    cancel_applied_request(&slow, &other, &key, ttl, true).await?;

    // Refused (held by a writer), waiting, then cancelled: its reservation goes with it.
    let key = keys.key("cancelled-wait");
    let writer = other.client.lock(&key).ttl(ttl * 20).acquire().await?;
    let mut claim = Box::pin(
        slow.client
            .lock(&key)
            .shared()
            .ttl(ttl * 60)
            .wait(ttl * 60)
            .acquire(),
    );
    tokio::select! {
        r = &mut claim => return Err(Failure(format!("a shared claim got in while a writer held the key: {:?}", r.map(|g| g.token())))),
        _ = tokio::time::sleep(ttl) => {}
    }
    drop(claim);
    writer.release().await?;
    let next = store.client().await?;
    let asked = Instant::now();
    let g = next
        .client
        .lock(&key)
        .ttl(ttl * 10)
        .wait(ttl * 20)
        .acquire()
        .await
        .map_err(|e| {
            Failure(format!(
                "the next writer could not get in after the reader gave up: {e}"
            ))
        })?;
    check!(
        asked.elapsed() <= ttl * 4,
        "the next writer got in only after {:?}: the cancelled reader's reservation stayed",
        asked.elapsed()
    );
    g.release().await?;
    Ok(())
}
