//! Holds taken and given back by a backend's own calls (MySQL, PostgreSQL), no watchdog:
//! the tests renew them themselves; and batch renewals stuck on the server, the check both
//! database files run over a backend of one connection and another session's open
//! transaction.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lockcore::driver::{AcquireOutcome, ExtendOutcome, LockBackendExt, Renewal};
use lockcore::{LockBackend, LockError, LockKey, Owner};

/// `n` keys under a fresh prefix, held by `owner` on `b` for a minute (no watchdog: the
/// tests renew them themselves).
pub async fn hold(b: &dyn LockBackend, owner: &Owner, n: usize) -> Vec<LockKey> {
    let prefix = super::random_suffix();
    let mut keys = Vec::with_capacity(n);
    for i in 0..n {
        let key = LockKey::new(format!("{prefix}-{i}")).unwrap();
        let outcome = b
            .try_acquire(&key, owner, Duration::from_secs(60))
            .await
            .unwrap();
        assert!(
            matches!(outcome, AcquireOutcome::Acquired(_)),
            "{outcome:?}"
        );
        keys.push(key);
    }
    keys
}

/// One batch renewal of `keys` at `ttl`, given up as the watchdog gives it up: after a
/// quarter of the TTL (`None`).
async fn renew(
    b: &dyn LockBackend,
    owner: &Owner,
    keys: &[LockKey],
    ttl: Duration,
) -> Option<Result<Vec<Result<ExtendOutcome, LockError>>, LockError>> {
    let renewals: Vec<Renewal<'_>> = keys.iter().map(|k| Renewal::new(k, owner, ttl)).collect();
    tokio::time::timeout(ttl / 4, b.renew(&renewals)).await.ok()
}

/// Asserts that the batch renewed every one of `keys`.
fn all_renewed(
    answer: Option<Result<Vec<Result<ExtendOutcome, LockError>>, LockError>>,
    keys: &[LockKey],
    what: &str,
) {
    let Some(answer) = answer else {
        panic!("{what}: no answer within the watchdog's allowance");
    };
    let outcomes = answer.unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(outcomes.len(), keys.len(), "{what}");
    for (key, outcome) in keys.iter().zip(outcomes) {
        assert!(
            matches!(outcome, Ok(ExtendOutcome::Extended(_))),
            "{what}: {key}: {outcome:?}"
        );
    }
}

/// A batch renewal of `keys` (held by `owner` on `b`, a backend of one connection) at
/// `ttl`, the first key's row locked by `blocker` (another session's open transaction):
/// the server ends it within the time the watchdog allows the batch (a quarter of the
/// TTL), and it answers an error the watchdog retries; right after, the backend renews the
/// other keys (the one connection the stuck batch ran on is free), and all of them once
/// the blocker is gone.
pub async fn stuck_batch_is_ended_by_the_server<DB: sqlx::Database>(
    b: Arc<dyn LockBackend>,
    owner: &Owner,
    keys: &[LockKey],
    ttl: Duration,
    blocker: sqlx::Transaction<'static, DB>,
) {
    let started = Instant::now();
    let answer = renew(&*b, owner, keys, ttl).await;
    let took = started.elapsed();
    match answer {
        None => panic!(
            "a batch renewal at TTL {ttl:?} behind a locked row was still running after \
             {took:?}, the time the watchdog allows it"
        ),
        Some(Ok(outcomes)) => panic!("a batch renewal went past a locked row: {outcomes:?}"),
        Some(Err(e)) => {
            assert!(e.is_retryable(), "TTL {ttl:?}: {e}");
            eprintln!(
                "TTL {ttl:?}: the server ended the stuck batch after {took:?}: {}",
                lockcore::ErrorChain(&e)
            );
        }
    }
    let others = renew(&*b, owner, &keys[1..], ttl).await;
    all_renewed(others, &keys[1..], "the batch right after the stuck one");
    blocker.rollback().await.unwrap();
    let all = renew(&*b, owner, keys, ttl).await;
    all_renewed(all, keys, "the batch once the row was free");
}

/// Releases `keys`, held by `owner` on `b`.
pub async fn release(b: &dyn LockBackend, owner: &Owner, keys: &[LockKey]) {
    for key in keys {
        b.release(key, owner).await.unwrap();
    }
}
