//! Kept connections (MySQL, PostgreSQL): the checks both database files run, over a
//! backend built by the database's `from_pool` from an application's pool and options.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_sql::SqlOptions;
use sqlx::pool::PoolOptions;
use sqlx::{Database, Pool};

use super::harness::{options, ServerDb};

/// A counter of connections handed back to a pool (its `after_release` hook), and so of
/// sqlx's pings on return.
#[derive(Clone, Default)]
pub struct Returns(Arc<AtomicU64>);

impl Returns {
    pub fn count(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    pub fn take(&self) -> u64 {
        self.0.swap(0, Ordering::Relaxed)
    }
}

/// A pool of `max` connections to `url` that counts the connections handed back to it.
pub fn counted_pool<DB: Database>(
    url: &str,
    max: u32,
    acquire_timeout: Duration,
    returns: &Returns,
) -> Pool<DB> {
    let returns = returns.clone();
    PoolOptions::<DB>::new()
        .max_connections(max)
        .acquire_timeout(acquire_timeout)
        .test_before_acquire(false)
        .after_release(move |_, _| {
            let returns = returns.clone();
            Box::pin(async move {
                returns.count();
                Ok(true)
            })
        })
        .connect_lazy(url)
        .unwrap()
}

/// The shared server's URL and the options of a fresh table on it.
fn url_and_options<D: ServerDb>() -> (String, SqlOptions) {
    let table = format!("locks_{}", super::random_suffix());
    (D::url(), options(&table))
}

/// Kept connections go from one operation to the next without a trip through the pool
/// (and sqlx's ping on return); a shared pool keeps none by default.
pub async fn skip_the_pool<D: ServerDb>() {
    let (url, options) = url_and_options::<D>();
    let returns = Returns::default();
    let pool = counted_pool::<D::Database>(&url, 4, Duration::from_secs(5), &returns);
    let shared = D::from_pool(pool.clone(), options.clone()).await;
    returns.take();
    super::cycles(&*shared, 50).await;
    // The pool's returns run in tasks of their own: give the last ones a moment.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let through_pool = returns.take();
    assert!(
        through_pool >= 95,
        "{through_pool} returns for 100 operations"
    );
    let kept = D::from_pool(pool, options.keep_connections(4)).await;
    returns.take();
    super::cycles(&*kept, 50).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let through_pool = returns.take();
    assert!(
        through_pool <= 5,
        "{through_pool} returns for 100 operations"
    );
}

/// One connection kept by a backend, many tasks: the ones waiting for the pool take the
/// kept connection when it comes free (the pool would never hand it out).
pub async fn serve_concurrent_operations<D: ServerDb>() {
    let (url, options) = url_and_options::<D>();
    let pool = counted_pool::<D::Database>(&url, 1, Duration::from_secs(2), &Returns::default());
    let b = D::from_pool(pool, options.keep_connections(1)).await;
    super::concurrent_cycles(b, 4, 25, Duration::from_secs(20)).await;
}

/// A kept connection unused for a while goes back to the application's pool.
pub async fn idle_connection_returns<D: ServerDb>() {
    let (url, options) = url_and_options::<D>();
    let pool = counted_pool::<D::Database>(&url, 1, Duration::from_secs(10), &Returns::default());
    let b = D::from_pool(pool.clone(), options.keep_connections(1)).await;
    super::cycles(&*b, 1).await;
    let started = Instant::now();
    let conn = pool.acquire().await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "the pool got its connection back after {:?}",
        started.elapsed()
    );
    drop(conn);
    drop(b);
}
