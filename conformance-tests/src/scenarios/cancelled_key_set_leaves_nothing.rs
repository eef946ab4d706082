use std::sync::Arc;
use std::time::Duration;

use crate::scenarios::cancelled_acquire_leaves_nothing::cancel_once_applied;
use crate::scenarios::Keys;
use crate::{check, Failure, Harness, Outcome};

/// A set acquisition cancelled after the store applied it but before its answer arrived
/// (answers delayed) leaves no key held beyond the delay: whether the store took the set in
/// one request or key by key, what the attempt in flight acquired is released, not left to
/// the TTL.
pub async fn cancelled_key_set_leaves_nothing(h: Arc<dyn Harness>) -> Outcome {
    let Some(store) = h.fault_store().await? else {
        return Err(Failure("no fault store".into()));
    };
    let keys = Keys::new();
    let ttl = h.ttl();
    let slow = store.client().await?;
    let other = store.client().await?;
    let set = [keys.key("set-a"), keys.key("set-b"), keys.key("set-c")];
    let first = set[0].clone();
    // Warm the slow client's connections so the delay hits the request itself.
    let _ = slow.client.inspect_all(&first).await?;
    let delay = ttl * 2;
    slow.link.delay_answers(delay).await;
    // Cancelled once the first key is applied: in one request, every key is held by then;
    // key by key, the first key's grant is the attempt in flight.
    let request = slow.client.lock_all(set.clone()).ttl(ttl * 60).acquire();
    let cancelled = cancel_once_applied(request, &other.client, &first, delay * 10).await?;
    slow.link.delay_answers(Duration::ZERO).await;
    let g = other
        .client
        .lock_all(set)
        .ttl(ttl * 20)
        .wait(ttl * 30)
        .acquire()
        .await?;
    let freed = cancelled.elapsed();
    // The answer lands at most `delay` after the cancel; keys left to their TTL would take
    // 60 ttl.
    check!(
        freed <= delay + ttl * 4,
        "the cancelled set was freed only after {freed:?}"
    );
    g.release().await?;
    Ok(())
}
