//! Garbage collection of released and expired rows: when a backend runs it, and the
//! batches it deletes in.

use std::future::Future;
#[cfg(any(feature = "postgres", feature = "mysql"))]
use std::sync::Arc;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

#[cfg(any(feature = "postgres", feature = "mysql"))]
use sqlx::Pool;

#[cfg(any(feature = "postgres", feature = "mysql"))]
use crate::db::Db;
#[cfg(any(feature = "postgres", feature = "mysql"))]
use crate::store::Call;

/// Rows one garbage-collection statement deletes at most (MySQL, SQLite): short statements,
/// so the collector never holds locks (InnoDB) or the database (SQLite) for long.
pub(crate) const GC_BATCH: u64 = 1000;

/// How often one backend runs the garbage collector (on the first release, then at most
/// this often, in the background).
pub(crate) const GC_INTERVAL: Duration = Duration::from_secs(60);

/// A collection's failure, as its database reported it.
pub(crate) type GcError = Box<dyn std::error::Error + Send + Sync>;

/// Decides when a backend runs its garbage collector: on the first release, then at most
/// once per [`GC_INTERVAL`].
#[derive(Debug)]
pub(crate) struct GcTimer {
    grace: Duration,
    /// When it last ran.
    last: Mutex<Option<Instant>>,
}

impl GcTimer {
    pub(crate) fn new(grace: Duration) -> Self {
        GcTimer {
            grace,
            last: Mutex::new(None),
        }
    }

    /// The grace in microseconds, bound into the collector's statement.
    pub(crate) fn grace_micros(&self) -> i64 {
        i64::try_from(self.grace.as_micros()).unwrap_or(i64::MAX)
    }

    /// True (once) when a run is due; the caller then runs it.
    pub(crate) fn due(&self) -> bool {
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        if last.is_some_and(|at| at.elapsed() < GC_INTERVAL) {
            return false;
        }
        *last = Some(Instant::now());
        true
    }
}

/// How a dialect's garbage collector deletes.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Collect {
    /// One statement (PostgreSQL: its `DELETE` locks only the rows it deletes).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    Once,
    /// In batches of at most [`GC_BATCH`] rows (the statement's `LIMIT`), 10 ms apart, so
    /// no one statement holds locks (InnoDB) or the database (SQLite) for long; each batch
    /// after this statement, if any, on the same connection.
    #[cfg_attr(not(any(feature = "mysql", feature = "sqlite")), allow(dead_code))]
    Batches(#[cfg_attr(not(feature = "mysql"), allow(dead_code))] Option<&'static str>),
}

/// Runs `batch` (handed `state` and handing it back) until one deletes fewer than
/// [`GC_BATCH`] rows, or once if `how` says so; 10 ms between batches. The rows deleted.
pub(crate) async fn in_batches<S, E, Fut>(
    how: Collect,
    mut state: S,
    mut batch: impl FnMut(S) -> Fut,
) -> Result<u64, E>
where
    Fut: Future<Output = Result<(S, u64), E>>,
{
    let mut total = 0;
    loop {
        let (back, rows) = batch(state).await?;
        state = back;
        total += rows;
        if matches!(how, Collect::Once) || rows < GC_BATCH {
            return Ok(total);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Collects on one connection of `pool`, every batch on that connection after `how`'s
/// prelude (PostgreSQL, MySQL).
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) async fn on_connection<DB: Db>(
    pool: &Pool<DB>,
    how: Collect,
    call: Call<'_>,
) -> Result<u64, sqlx::Error> {
    let conn = pool.acquire().await?;
    let prelude: Option<Arc<str>> = match how {
        Collect::Batches(Some(prelude)) => Some(Arc::from(prelude)),
        _ => None,
    };
    let prelude = prelude.as_ref();
    in_batches(how, conn, |mut conn| async move {
        if let Some(statement) = prelude {
            let bare = Call {
                statement,
                values: &[],
            };
            DB::execute(&mut conn, bare).await?;
        }
        let done = DB::execute(&mut conn, call).await?;
        Ok((conn, DB::rows_affected(&done)))
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::GC_GRACE;

    #[test]
    fn gc_runs_first_then_rarely() {
        let t = GcTimer::new(GC_GRACE);
        assert!(t.due());
        assert!(!t.due());
    }
}
