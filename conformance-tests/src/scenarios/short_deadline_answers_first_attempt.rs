use std::sync::Arc;
use std::time::{Duration, Instant};

use lockcore::{LockClient, LockError};

use crate::scenarios::{is_free, while_delayed, Keys};
use crate::{check, Failure, Harness, Outcome};

/// A `wait` deadline that passes while an attempt is in flight (answers delayed past it)
/// fails with `Timeout` soon after the deadline, and leaves nothing held or queued once the
/// delayed answers are settled.
pub async fn wait_deadline_bounds_in_flight_attempt(h: Arc<dyn Harness>) -> Outcome {
    let Some(store) = h.fault_store().await? else {
        return Err(Failure("no fault store".into()));
    };
    let keys = Keys::new();
    let (held_key, free_key) = (keys.key("held"), keys.key("free"));
    let ttl = h.ttl();
    let slow = store.client().await?;
    let other = store.client().await?;
    // Warm the slow client's connections — as many as it sends requests at once below — so
    // the delay hits the requests, not the opening of connections (many round trips each).
    let (a, b, c) = tokio::join!(
        slow.client.inspect(&held_key),
        slow.client.inspect(&free_key),
        slow.client.inspect(&held_key),
    );
    a?;
    b?;
    c?;
    let holder = other.client.lock(&held_key).ttl(ttl * 30).acquire().await?;
    // The answers come well after the deadline (eight times as long: room for a loaded
    // machine's scheduling between the two), and under half the TTL scale, so a driver's
    // request timeout (Redlock's per-instance one) lets them through.
    let (deadline, delay) = (ttl / 20, ttl * 2 / 5);
    slow.link.delay_answers(delay).await;
    // One attempt finds the key held, the other is granted; both answers come after the
    // deadline.
    let (on_held, on_free) = tokio::join!(
        timed_out(&slow.client, &held_key, deadline, delay, ttl),
        timed_out(&slow.client, &free_key, deadline, delay, ttl),
    );
    on_held?;
    on_free?;
    // The attempts still in flight are settled in the background: the grant released, the
    // refused request abandoned. The client's shutdown waits for that work.
    let settling = Instant::now();
    let settled = tokio::time::timeout(delay * 10 + ttl * 4, slow.client.shutdown()).await;
    let settling = settling.elapsed();
    slow.link.delay_answers(Duration::ZERO).await;
    check!(
        matches!(settled, Ok(true)),
        "the attempts in flight when their deadlines passed were not settled after {settling:?}: {settled:?}"
    );
    let left = other.client.inspect(&free_key).await?;
    check!(
        left.is_none(),
        "the grant a timed-out request got was left held: {left:?}"
    );
    let info = other.client.inspect(&held_key).await?;
    check!(
        info.as_ref().map(|i| i.token) == Some(holder.token()),
        "a timed-out request disturbed the holder: {info:?}"
    );
    // Nothing of the request that found the key held is left either (no place in a queue):
    // once its holder lets go, the key is free.
    holder.release().await?;
    check!(
        is_free(&other.client, &held_key, ttl).await?,
        "a request that timed out took the key after its holder released it"
    );
    Ok(())
}

/// Runs a `wait(deadline)` acquire of `key` and checks it fails with `Timeout` after the
/// deadline and before the answer `delay`ed: an acquire that waits for its attempt's answer
/// can only answer after `delay`, however fast the machine.
async fn timed_out(
    client: &LockClient,
    key: &str,
    deadline: Duration,
    delay: Duration,
    ttl: Duration,
) -> Outcome {
    let started = Instant::now();
    let answer = client
        .lock(key)
        .ttl(ttl * 60)
        .wait(deadline)
        .acquire()
        .await;
    let waited = started.elapsed();
    match answer {
        Err(LockError::Timeout { .. }) => {}
        Ok(g) => {
            let token = g.token();
            drop(g);
            return Err(Failure(format!(
                "a wait({deadline:?}) acquire of {key:?} answered after {waited:?} with a lock (token {token}) instead of Timeout"
            )));
        }
        Err(e) => {
            let e = while_delayed(e, delay);
            return Err(Failure(format!(
                "a wait({deadline:?}) acquire of {key:?} answered after {waited:?}, expected Timeout: {e}"
            )));
        }
    }
    check!(
        waited + deadline / 10 >= deadline,
        "timed out after {waited:?}, before the {deadline:?} deadline"
    );
    check!(
        waited < delay,
        "a wait({deadline:?}) acquire of {key:?} with its attempt in flight timed out only after {waited:?}"
    );
    Ok(())
}
