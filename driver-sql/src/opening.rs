//! Opening database sessions apart from the operation that needs one.
//!
//! An operation that finds no idle connection waits while the pool opens a session: TCP,
//! TLS, authentication (SCRAM-SHA-256 on PostgreSQL hashes the password thousands of
//! times), the session's settings. On a distant server, or on a loaded machine, that takes
//! longer than a renewal may wait: the watchdog gives a renewal a quarter of the TTL and
//! then tries again. Opened inside the renewal's future, the half-open session was dropped
//! with it, the next attempt started another, and every attempt gave up in turn although the
//! database answered each statement in a millisecond: the hold was lost. (The suite's
//! renewal scenarios failed that way on PostgreSQL, whose batch renewals have a pool of
//! their own opened by the first renewal, whenever the machine was busy.)
//!
//! So a session is opened in a task of its own: an operation that stops waiting leaves the
//! opening to finish, and the session goes to the pool for the next attempt.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};

use sqlx::pool::PoolConnection;
use sqlx::{Database, Pool};

/// `pool`'s `acquire`, in a task of its own whenever it may open a session (the pool has
/// room for one, or an idle connection that may fail its check and be replaced), so that a
/// caller that stops waiting does not take the opening down with it. Only when every
/// connection is in use and the pool is full does it wait in the caller's future: it then
/// waits for a connection that exists, and a cancelled wait must not keep a place in the
/// pool's queue.
pub(crate) fn acquire_apart<DB: Database>(
    pool: &Pool<DB>,
) -> impl Future<Output = Result<PoolConnection<DB>, sqlx::Error>> + Send + 'static {
    let may_open = pool.num_idle() > 0 || pool.size() < pool.options().get_max_connections();
    let runtime = if may_open {
        tokio::runtime::Handle::try_current().ok()
    } else {
        None
    };
    let pool = pool.clone();
    async move {
        let Some(runtime) = runtime else {
            return pool.acquire().await;
        };
        // The task's connection, if nobody waits for it any more, is dropped at its end:
        // back to the pool.
        match runtime.spawn(async move { pool.acquire().await }).await {
            Ok(result) => result,
            Err(e) => Err(sqlx::Error::Io(std::io::Error::other(format!(
                "opening a database session stopped: {e}"
            )))),
        }
    }
}

/// Opens one session of a pool ahead of its first use, once.
#[derive(Debug, Default)]
pub(crate) struct Warm(AtomicBool);

impl Warm {
    /// Starts opening a session of `pool` in the background if it has none and this was not
    /// asked before: the first operation on the pool then finds it open. Outside a tokio
    /// runtime it does nothing (the first operation opens the session).
    pub(crate) fn warm<DB: Database>(&self, pool: &Pool<DB>) {
        if self.0.load(Ordering::Relaxed) || pool.size() > 0 || self.0.swap(true, Ordering::Relaxed)
        {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let pool = pool.clone();
            runtime.spawn(async move {
                if let Err(e) = pool.acquire().await {
                    tracing::debug!(error = %e, "opening a session ahead of its use failed; the first use opens one");
                }
            });
        }
    }
}
