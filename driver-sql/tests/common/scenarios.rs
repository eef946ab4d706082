//! Scenarios every database runs (PostgreSQL, MySQL/MariaDB, SQLite), over backends its
//! test file makes: the checks of `super` within a time bound, hand-off, exclusion across
//! backends, garbage collection.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use lockcore::driver::{AcquireOutcome, LockBackendExt};
use lockcore::{LockBackend, Owner};

/// `check` must finish within `seconds`.
async fn within<T>(seconds: u64, check: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(seconds), check)
        .await
        .unwrap()
}

/// [`super::contract`] within a minute.
pub async fn contract_matches_memory_backend(a: Arc<dyn LockBackend>, b: Arc<dyn LockBackend>) {
    within(60, super::contract(a, b)).await;
}

/// [`super::tokens_increase`] within a minute.
pub async fn tokens_increase(a: Arc<dyn LockBackend>, b: Arc<dyn LockBackend>) {
    within(60, super::tokens_increase(a, b)).await;
}

/// [`super::hostile_keys`] within a minute.
pub async fn hostile_keys_stay_apart(a: Arc<dyn LockBackend>, b: Arc<dyn LockBackend>) {
    within(60, super::hostile_keys(a, b)).await;
}

/// A waiter on `a` itself is woken within 200 ms of a release, one on `b` within `remote`
/// (`how` says by what, for the failure message).
pub async fn waiters_are_woken(
    a: Arc<dyn LockBackend>,
    b: Arc<dyn LockBackend>,
    remote: Duration,
    how: &str,
) {
    let local = within(30, super::local_handoff(a.clone())).await;
    let bound = remote.max(Duration::from_millis(200));
    assert!(
        local < bound,
        "own waiter woken after {local:?} (bound {bound:?})"
    );
    let woke = within(30, super::handoff(a, b)).await;
    assert!(woke < remote, "{how} after {woke:?}");
}

/// Three backends from `backend`, six tasks on each: [`super::mutual_exclusion`] within
/// two minutes.
pub async fn several_backends_exclude_each_other<F, Fut>(mut backend: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Arc<dyn LockBackend>>,
{
    let mut backends: Vec<Arc<dyn LockBackend>> = Vec::new();
    for _ in 0..3 {
        backends.push(backend().await);
    }
    within(120, super::mutual_exclusion(backends, 6, 15)).await;
}

/// On a backend with no grace (`b`), a live lock survives the collection that deletes
/// released rows: afterwards, `count_rows` finds only the live lock and the last released
/// row.
pub async fn garbage_collection_deletes_released_rows<F, Fut>(
    b: Arc<dyn LockBackend>,
    count_rows: F,
) where
    F: FnOnce() -> Fut,
    Fut: Future<Output = i64>,
{
    let keep = super::key("kept");
    let o = Owner::new("o");
    assert!(matches!(
        b.try_acquire(&keep, &o, Duration::from_secs(30))
            .await
            .unwrap(),
        AcquireOutcome::Acquired(_)
    ));
    super::collected_rows_keep_tokens_rising(b.clone()).await;
    // Give the second release's collection no chance (it runs at most once a minute): the
    // first one must have deleted the first row; only the live lock and the last released
    // row remain.
    let rows = count_rows().await;
    assert_eq!(rows, 2, "the live lock and the last released row");
    assert!(
        b.inspect(&keep).await.unwrap().is_some(),
        "a live lock was collected"
    );
}
