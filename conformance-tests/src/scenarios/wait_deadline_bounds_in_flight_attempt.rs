use std::sync::Arc;
use std::time::{Duration, Instant};

use lockcore::{LockClient, LockError};

use crate::scenarios::Keys;
use crate::{check, Failure, Harness, Outcome};

/// A `wait` deadline that passes while an attempt is in flight (answers delayed past it)
/// fails with `Timeout` soon after the deadline, and leaves nothing held once the delayed
/// answers arrive.
pub async fn wait_deadline_bounds_in_flight_attempt(h: Arc<dyn Harness>) -> Outcome {
    let Some(store) = h.fault_store().await? else {
        return Err(Failure("no fault store".into()));
    };
    let keys = Keys::new();
    let (held_key, free_key) = (keys.key("held"), keys.key("free"));
    let ttl = h.ttl();
    let slow = store.client().await?;
    let other = store.client().await?;
    let _ = slow.client.inspect(&held_key).await?;
    let holder = other.client.lock(&held_key).ttl(ttl * 30).acquire().await?;
    // The answers come well after the deadline, and under half the TTL scale, so a
    // driver's request timeout (Redlock's per-instance one) lets them through.
    let (deadline, delay) = (ttl / 10, ttl * 2 / 5);
    slow.link.delay_answers(delay).await;
    // One attempt finds the key held, the other is granted; both answers come after the
    // deadline.
    let (on_held, on_free) = tokio::join!(
        timed_out(&slow.client, &held_key, deadline, delay, ttl),
        timed_out(&slow.client, &free_key, deadline, delay, ttl),
    );
    on_held?;
    let timed_out_at = on_free?;
    // The grant the timed-out request got once its answer arrived is released, not left
    // to its 60-ttl lease.
    let g = other
        .client
        .lock(&free_key)
        .ttl(ttl * 20)
        .wait(ttl * 30)
        .acquire()
        .await?;
    let freed = timed_out_at.elapsed();
    check!(
        freed <= delay * 3 + ttl * 2,
        "the grant of a timed-out request was freed only {freed:?} after the timeout"
    );
    g.release().await?;
    // The request that found the key held is over too: once its holder lets go, the key
    // stays free (the answers are still slow, so a grant would stay for a while).
    holder.release().await?;
    tokio::time::sleep(delay / 2).await;
    let left = other.client.inspect(&held_key).await?;
    slow.link.delay_answers(Duration::ZERO).await;
    check!(
        left.is_none(),
        "a request that timed out took the key after its holder released it: {left:?}"
    );
    Ok(())
}

/// Runs a `wait(deadline)` acquire of `key` and checks it fails with `Timeout` after the
/// deadline and well before the answer `delay`ed: the instant it did.
async fn timed_out(
    client: &LockClient,
    key: &str,
    deadline: Duration,
    delay: Duration,
    ttl: Duration,
) -> Result<Instant, Failure> {
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
            return Err(Failure(format!(
                "a wait({deadline:?}) acquire of {key:?} answered {e} after {waited:?}, expected Timeout"
            )))
        }
    }
    check!(
        waited + deadline / 10 >= deadline,
        "timed out after {waited:?}, before the {deadline:?} deadline"
    );
    check!(
        waited + ttl / 20 <= delay,
        "a wait({deadline:?}) acquire of {key:?} with its attempt in flight timed out only after {waited:?}"
    );
    Ok(Instant::now())
}
