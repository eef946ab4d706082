//! Why not sqlx's pool alone: it opens a session inside `acquire`, dropped if the caller stops.
//!
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
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use sqlx::pool::PoolConnection;
use sqlx::{Database, Pool};
use tokio::sync::{oneshot, Notify};

/// Sessions of one pool opened apart from the operations that need them.
pub(crate) struct Opening<DB: Database> {
    spare: Arc<Spare<DB>>,
    /// Whether a session was opened ahead of the first use (see [`warm`](Self::warm)).
    warmed: AtomicBool,
}

/// Sessions opened for callers that stopped waiting, handed to callers waiting meanwhile
/// for a session of their own.
struct Spare<DB: Database> {
    conns: Mutex<Vec<PoolConnection<DB>>>,
    /// Callers waiting for a session being opened.
    waiting: AtomicUsize,
    /// Signalled when a session is put in `conns`.
    landed: Notify,
}

impl<DB: Database> Spare<DB> {
    fn conns(&self) -> MutexGuard<'_, Vec<PoolConnection<DB>>> {
        self.conns.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A session opened for a caller that stopped waiting: to a caller waiting for one, or
    /// else back to the pool.
    fn give(&self, conn: PoolConnection<DB>) {
        if self.waiting.load(Ordering::SeqCst) == 0 {
            return;
        }
        self.conns().push(conn);
        self.landed.notify_waiters();
    }

    fn take(&self) -> Option<PoolConnection<DB>> {
        self.conns().pop()
    }
}

/// A caller waiting for a session being opened, counted while it waits (also when
/// cancelled).
struct Waiting<DB: Database>(Arc<Spare<DB>>);

impl<DB: Database> Drop for Waiting<DB> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::SeqCst);
    }
}

impl<DB: Database> Default for Opening<DB> {
    fn default() -> Self {
        Opening {
            spare: Arc::new(Spare {
                conns: Mutex::new(Vec::new()),
                waiting: AtomicUsize::new(0),
                landed: Notify::new(),
            }),
            warmed: AtomicBool::new(false),
        }
    }
}

impl<DB: Database> Opening<DB> {
    /// `pool`'s `acquire`, in a task of its own whenever it may open a session (the pool
    /// has room for one, or an idle connection that may fail its check and be replaced), so
    /// that a caller that stops waiting does not take the opening down with it: the session
    /// goes to a caller waiting meanwhile for a session of its own, which takes it if it
    /// lands first, or else to the pool. (Handed only to the pool, a renewal that gave up
    /// left its session opening, the next attempt started another one, and only the attempt
    /// after that found the first: a lease too short for three attempts was lost.)
    ///
    /// Only when every connection is in use and the pool is full does it wait in the
    /// caller's future: it then waits for a connection that exists, and a cancelled wait
    /// must not keep a place in the pool's queue.
    pub(crate) fn acquire(
        &self,
        pool: &Pool<DB>,
    ) -> impl Future<Output = Result<PoolConnection<DB>, sqlx::Error>> + Send + 'static {
        let may_open = pool.num_idle() > 0 || pool.size() < pool.options().get_max_connections();
        let runtime = if may_open {
            tokio::runtime::Handle::try_current().ok()
        } else {
            None
        };
        let (pool, spare) = (pool.clone(), self.spare.clone());
        async move {
            if let Some(conn) = spare.take() {
                return Ok(conn);
            }
            let Some(runtime) = runtime else {
                return pool.acquire().await;
            };
            spare.waiting.fetch_add(1, Ordering::SeqCst);
            let _waiting = Waiting(spare.clone());
            let (tx, mut rx) = oneshot::channel();
            let (opening, orphans) = (pool.clone(), spare.clone());
            runtime.spawn(async move {
                let result = opening.acquire().await;
                if let Err(Ok(conn)) = tx.send(result) {
                    // Nobody waits for it any more.
                    orphans.give(conn);
                }
            });
            loop {
                // Registered before looking, so a session landing in between is not missed.
                let landed = spare.landed.notified();
                if let Some(conn) = spare.take() {
                    return Ok(conn);
                }
                tokio::select! {
                    result = &mut rx => {
                        return result.unwrap_or_else(|_| {
                            Err(sqlx::Error::Io(std::io::Error::other(
                                "opening a database session stopped",
                            )))
                        });
                    }
                    () = landed => {}
                }
            }
        }
    }

    /// Hands the sessions kept for waiting callers back to the pool: call before closing the
    /// pool, which waits for all its connections.
    pub(crate) fn close(&self) {
        let spare = std::mem::take(&mut *self.spare.conns());
        drop(spare);
    }

    /// Lets the kept sessions go without handing them back (no runtime is left to take them
    /// home).
    pub(crate) fn detach(&self) {
        for conn in std::mem::take(&mut *self.spare.conns()) {
            drop(conn.detach());
        }
    }

    /// Starts opening a session of `pool` in the background if it has none and this was not
    /// asked before: the first operation on the pool then finds it open. Outside a tokio
    /// runtime it does nothing (the first operation opens the session).
    pub(crate) fn warm(&self, pool: &Pool<DB>) {
        if self.warmed.load(Ordering::Relaxed)
            || pool.size() > 0
            || self.warmed.swap(true, Ordering::Relaxed)
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
