use std::sync::Arc;
use std::time::Duration;

use crate::scenarios::{cancel_once_applied, Keys};
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
    // Cancel the acquire as soon as the store has applied it (the answer is still on its
    // way): a backend needing several round trips applies it only after some of them.
    let acquire = slow.client.lock(&key).ttl(ttl * 60).acquire();
    let cancelled = cancel_once_applied(acquire, &other.client, &key, delay * 10).await?;
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
    // The answer lands at most `delay` after the cancel; a grant left to its TTL would take 60 ttl.
    check!(
        freed <= delay + ttl * 4,
        "the cancelled grant was freed only after {freed:?}"
    );
    g.release().await?;
    Ok(())
}
