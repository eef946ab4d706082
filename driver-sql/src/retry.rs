//! Why not sqlx's own: sqlx retries no statement the database rolled back or found busy.
//!
//! Statements tried again when the database did not apply them, paced by lockcore's
//! [`RetryPolicy`] (exact pauses, no jitter).

use std::future::Future;
use std::time::{Duration, Instant};

use lockcore::RetryPolicy;

/// A statement rolled back for a conflict with another transaction (PostgreSQL, MySQL):
/// three more tries, after 2, 4 and 8 ms.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) const CONFLICT_RETRY: RetryPolicy =
    RetryPolicy::doubling(Duration::from_millis(2), Duration::from_millis(8)).max_retries(3);

/// A write that keeps meeting another process's write past SQLite's own busy timeout: five
/// more tries, after 10, 20, 40, 80 and 160 ms.
#[cfg(feature = "sqlite")]
pub(crate) const BUSY_RETRY: RetryPolicy =
    RetryPolicy::doubling(Duration::from_millis(10), Duration::from_millis(160)).max_retries(5);

/// Opening a SQLite file that other processes are opening too: switching a new file to WAL
/// can answer "database is locked" without waiting for the busy timeout. About 1.6 s in all.
#[cfg(feature = "sqlite")]
pub(crate) const OPEN_RETRY: RetryPolicy =
    RetryPolicy::doubling(Duration::from_millis(10), Duration::from_millis(500)).max_retries(8);

/// Runs `op` until it succeeds, fails in a way `retryable` rejects, or `policy` gives up
/// (then with its last failure); each retry is logged at debug level as `why; trying again`.
pub(crate) async fn retry<T, E, F, Fut>(
    policy: &RetryPolicy,
    why: &str,
    mut op: F,
    retryable: impl Fn(&E) -> bool,
) -> Result<T, E>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let mut backoff = policy.backoff();
    let mut attempt = 0u32;
    loop {
        match op().await {
            Err(e) if retryable(&e) => match backoff.next_pause(Instant::now()) {
                Some(pause) => {
                    attempt += 1;
                    tracing::debug!(attempt, "{why}; trying again");
                    tokio::time::sleep(pause).await;
                }
                None => return Err(e),
            },
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(any(feature = "postgres", feature = "mysql"))]
    #[test]
    fn conflicts_wait_2_4_8_ms() {
        let mut b = CONFLICT_RETRY.backoff();
        let now = Instant::now();
        let pauses: Vec<_> = std::iter::from_fn(|| b.next_pause(now)).collect();
        assert_eq!(pauses, [2, 4, 8].map(Duration::from_millis));
    }

    #[cfg(feature = "sqlite")]
    #[test]
    fn busy_writes_wait_10_to_160_ms() {
        let mut b = BUSY_RETRY.backoff();
        let now = Instant::now();
        let pauses: Vec<_> = std::iter::from_fn(|| b.next_pause(now)).collect();
        assert_eq!(pauses, [10, 20, 40, 80, 160].map(Duration::from_millis));
    }

    #[cfg(feature = "sqlite")]
    #[test]
    fn opening_waits_under_two_seconds_in_all() {
        let mut b = OPEN_RETRY.backoff();
        let now = Instant::now();
        let total: Duration = std::iter::from_fn(|| b.next_pause(now)).sum();
        assert_eq!(total, Duration::from_millis(1630));
    }
}
