use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::scenarios::{cancel_once_applied, Keys};
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
    // Warm the slow client's connections so the delay hits the claim itself.
    let _ = slow.client.inspect_all(&key).await?;
    let delay = ttl * 2;
    slow.link.delay_answers(delay).await;
    let claim = slow.client.lock(&key).shared().ttl(ttl * 60).acquire();
    let cancelled = cancel_once_applied(claim, &other.client, &key, delay * 10).await?;
    slow.link.delay_answers(Duration::ZERO).await;
    // The waiter's TTL keeps its naps (half of it at most) above the bound below, so a
    // waiter that is never woken is caught too.
    let g = other
        .client
        .lock(&key)
        .ttl(ttl * 20)
        .wait(ttl * 30)
        .acquire()
        .await?;
    let freed = cancelled.elapsed();
    // The answer lands at most `delay` after the cancel; a lease left to its TTL would
    // keep the writer out for 60 ttl.
    check!(
        freed <= delay + ttl * 4,
        "the cancelled shared lease was freed only after {freed:?}"
    );
    g.release().await?;

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
