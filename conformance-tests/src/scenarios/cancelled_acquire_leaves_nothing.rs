use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockcore::{LockClient, LockError};

use crate::scenarios::Keys;
use crate::{check, Failure, FaultClient, Harness, Outcome};

/// An acquire cancelled after the store applied it but before its answer arrived (answers
/// delayed) leaves nothing held beyond the delay: the grant is released, not left to the TTL.
pub async fn cancelled_acquire_leaves_nothing(h: Arc<dyn Harness>) -> Outcome {
    let Some(store) = h.fault_store().await? else {
        return Err(Failure("no fault store".into()));
    };
    let keys = Keys::new();
    let slow = store.client().await?;
    let other = store.client().await?;
    cancel_applied_request(&slow, &other, &keys.key("cancelled"), h.ttl(), false).await
}

/// A request of `slow` (shared or exclusive) cancelled after the store applied it but
/// before its answer arrived leaves nothing beyond the delay: a writer of `other` gets in.
pub(crate) async fn cancel_applied_request(
    slow: &FaultClient,
    other: &FaultClient,
    key: &str,
    ttl: Duration,
    shared: bool,
) -> Outcome {
    // Warm the slow client's connections so the delay hits the request itself.
    let _ = slow.client.inspect_all(key).await?;
    let delay = ttl * 2;
    slow.link.delay_answers(delay).await;
    // Cancel the request as soon as the store has applied it (the answer is still on its
    // way): a backend needing several round trips applies it only after some of them.
    let request = slow.client.lock(key).ttl(ttl * 60);
    let request = if shared { request.shared() } else { request };
    let cancelled = cancel_once_applied(request.acquire(), &other.client, key, delay * 10).await?;
    slow.link.delay_answers(Duration::ZERO).await;
    // The waiter's TTL keeps its naps (half of it at most) above the bound below, so a
    // waiter that is never woken is caught too.
    let g = other
        .client
        .lock(key)
        .ttl(ttl * 20)
        .wait(ttl * 30)
        .acquire()
        .await?;
    let freed = cancelled.elapsed();
    // The answer lands at most `delay` after the cancel; a grant left to its TTL would take 60 ttl.
    check!(
        freed <= delay + ttl * 4,
        "the cancelled {} was freed only after {freed:?}",
        if shared { "shared lease" } else { "grant" }
    );
    g.release().await?;
    Ok(())
}

/// Polls `request` (sent by a client whose answers are delayed) until `observer` sees it
/// applied in the store, then cancels it — drops it — before its answer arrives: the
/// instant of the cancel. Fails if it answers first, or is not applied within `limit`.
pub(crate) async fn cancel_once_applied<T>(
    request: impl Future<Output = Result<T, LockError>>,
    observer: &LockClient,
    key: &str,
    limit: Duration,
) -> Result<Instant, Failure> {
    // Boxed, so that dropping it below really drops (cancels) the future.
    let mut request = Box::pin(request);
    let limit = Instant::now() + limit;
    loop {
        tokio::select! {
            r = &mut request => return Err(Failure(format!(
                "the request answered before it could be cancelled (with {})",
                match r {
                    Ok(_) => "the lock".to_owned(),
                    Err(e) => format!("the error {e}"),
                }
            ))),
            _ = tokio::time::sleep(Duration::from_millis(5)) => {}
        }
        if !observer.inspect_all(key).await?.is_empty() {
            break;
        }
        if Instant::now() > limit {
            return Err(Failure(
                "the store never applied the delayed request".into(),
            ));
        }
    }
    let cancelled = Instant::now();
    drop(request);
    Ok(cancelled)
}
