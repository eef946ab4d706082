use std::sync::Arc;
use std::time::{Duration, Instant};

use lockcore::{LockClient, LockError, LockGuard};

use crate::scenarios::{is_free, while_delayed, Keys};
use crate::{check, Failure, Harness, Outcome};

/// A `wait` deadline shorter than the store's answer does not cut the first attempt short:
/// with answers delayed well past the deadline, a free key is granted (never refused because
/// the store was slow, nor left held by a grant nobody saw), and a held key is refused with
/// `Timeout` once the refusal came, not before; it does not hang either (a claim that waits
/// for the holder instead of answering is caught here), and leaves nothing queued.
pub async fn short_deadline_answers_first_attempt(h: Arc<dyn Harness>) -> Outcome {
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
    // The answers come well after the deadline (eight times as long), and two of them
    // (Redlock's fenced grant takes two rounds) within half the TTL scale, so a driver's
    // request timeout (Redlock's per-instance one) lets a whole first attempt through.
    let delay = ttl / 6;
    let deadline = delay / 8;
    slow.link.delay_answers(delay).await;
    let (on_held, on_free) = tokio::join!(
        answered(&slow.client, &held_key, deadline, delay, ttl),
        answered(&slow.client, &free_key, deadline, delay, ttl),
    );
    slow.link.delay_answers(Duration::ZERO).await;
    match on_held? {
        Err(LockError::Timeout { .. }) => {}
        Ok(g) => {
            let token = g.token();
            drop(g);
            return Err(Failure(format!(
                "a wait({deadline:?}) acquire of a held key was granted (token {token}) while its holder held it"
            )));
        }
        Err(e) => {
            return Err(Failure(format!(
                "a wait({deadline:?}) acquire of a held key, answers delayed by {delay:?}, expected Timeout: {}",
                while_delayed(e, delay).0
            )))
        }
    }
    match on_free? {
        Ok(g) => {
            check!(
                g.valid_until() > Instant::now(),
                "the grant of a free key came with a lease already over"
            );
            g.release().await?;
        }
        Err(LockError::Timeout { .. }) => {
            return Err(Failure(format!(
                "a wait({deadline:?}) acquire of a free key was refused (Timeout) because the store answered after {delay:?}: the first attempt must be answered whatever the deadline"
            )))
        }
        Err(e) => {
            return Err(Failure(format!(
                "a wait({deadline:?}) acquire of a free key, answers delayed by {delay:?}: {}",
                while_delayed(e, delay).0
            )))
        }
    }
    check!(
        is_free(&other.client, &free_key, ttl).await?,
        "the free key is still held after its grant was released"
    );
    let info = other.client.inspect(&held_key).await?;
    check!(
        info.as_ref().map(|i| i.token) == Some(holder.token()),
        "a timed-out request disturbed the holder: {info:?}"
    );
    // Nothing of the request that found the key held is left (no place in a queue): once
    // its holder lets go, the key is free.
    holder.release().await?;
    check!(
        slow.client.shutdown().await,
        "the slow client's background work did not finish"
    );
    check!(
        is_free(&other.client, &held_key, ttl).await?,
        "a request that timed out took the key after its holder released it"
    );
    Ok(())
}

/// Runs a `wait(deadline)` acquire of `key` with answers `delay`ed, and checks that it
/// answered after the first answer could come (not at the deadline: the first attempt is
/// not cut short) and within a bound (not hanging for a holder).
async fn answered(
    client: &LockClient,
    key: &str,
    deadline: Duration,
    delay: Duration,
    ttl: Duration,
) -> Result<Result<LockGuard, LockError>, Failure> {
    let started = Instant::now();
    let bound = delay * 4 + ttl;
    let answer = tokio::time::timeout(
        bound,
        client.lock(key).ttl(ttl * 60).wait(deadline).acquire(),
    )
    .await;
    let waited = started.elapsed();
    let Ok(answer) = answer else {
        return Err(Failure(format!(
            "a wait({deadline:?}) acquire of {key:?}, answers delayed by {delay:?}, did not answer within {bound:?}: does the backend's claim wait for the holder instead of answering?"
        )));
    };
    check!(
        waited + delay / 10 >= delay,
        "a wait({deadline:?}) acquire of {key:?} answered after {waited:?}, before the store's answer (delayed by {delay:?}) could come: its first attempt was cut short ({answer:?})"
    );
    Ok(answer)
}
