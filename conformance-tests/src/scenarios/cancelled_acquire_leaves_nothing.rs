use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::scenarios::Keys;
use crate::{check, Failure, Harness, Outcome};

/// An acquire cancelled after the store applied it but before its answer arrived (answers
/// delayed) leaves nothing held beyond the delay: the grant is released, not left to the TTL.
pub async fn cancelled_acquire_leaves_nothing(h: Arc<dyn Harness>) -> Outcome {
    let Some(store) = h.fault_store().await? else {
        return Err(Failure("no fault store".into()));
    };
    let keys = Keys::new();
    let key = keys.key("cancelled");
    let ttl = h.ttl();
    let slow = store.client().await?;
    let other = store.client().await?;
    // Warm the slow client's connections so the delay hits the acquire itself.
    let _ = slow.client.inspect(&key).await?;
    let delay = ttl * 2;
    slow.link.delay_answers(delay).await;
    let attempt =
        tokio::time::timeout(delay / 2, slow.client.lock(&key).ttl(ttl * 60).acquire()).await;
    check!(
        attempt.is_err(),
        "the acquire answered within half the answer delay"
    );
    let cancelled = Instant::now();
    // The premise: the store applied the acquire before the caller went away.
    let applied = other.client.inspect(&key).await?;
    check!(
        applied.is_some(),
        "the store had not applied the acquire when it was cancelled"
    );
    slow.link.delay_answers(Duration::ZERO).await;
    let g = other
        .client
        .lock(&key)
        .ttl(ttl * 10)
        .wait(ttl * 20)
        .acquire()
        .await?;
    let freed = cancelled.elapsed();
    // The answer lands `delay/2` after the cancel; a grant left to its TTL would take 60 ttl.
    check!(
        freed <= delay + ttl * 4,
        "the cancelled grant was freed only after {freed:?}"
    );
    g.release().await?;
    Ok(())
}
