//! Connections kept out of the pool between lock operations (MySQL, PostgreSQL).
//!
//! sqlx (0.9) pings every connection handed back to its pool, in a task of its own, to
//! flush whatever a cancelled statement may have left on it. For a lock operation of one
//! short statement that ping is a second round trip, costing the client and the server
//! about as much CPU as the statement itself: on loopback MariaDB an uncontended
//! acquire+release of the plain statements took 75 µs p50 through the pool and 40 µs on a
//! connection kept by the caller (PostgreSQL alike). So the backends keep the connections
//! of finished operations in a small cache of their own and hand them straight to the next
//! operation. A connection still goes back through the pool, and its ping, whenever that
//! check is worth something:
//!
//! * another operation is waiting for the pool (see `Cache::waiting`);
//! * the operation failed other than with a database error (I/O, protocol, timeout), or
//!   was cancelled midway: the pool's ping drains or discards it;
//! * it sat in the cache longer than [`IDLE_MAX`] (a background task returns it): a
//!   shared pool gets its connection back, and the next operation after a quiet spell
//!   takes a connection from the pool like any other user;
//! * it has been out of the pool longer than [`OUT_MAX`], so the pool's lifetime limits
//!   still apply to it.

use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use sqlx::pool::PoolConnection;
use sqlx::{Database, Pool};

/// How long a connection may wait in the cache for the next operation.
pub(crate) const IDLE_MAX: Duration = Duration::from_secs(1);

/// How long a connection may stay out of the pool in all before it is handed back.
pub(crate) const OUT_MAX: Duration = Duration::from_secs(60);

/// The connections a backend keeps between operations, over the pool they come from.
pub(crate) struct Connections<DB: Database> {
    pool: Pool<DB>,
    capacity: usize,
    cache: Mutex<Cache<DB>>,
}

struct Cache<DB: Database> {
    /// Most recently used last.
    idle: Vec<Held<DB>>,
    /// Operations waiting for the pool. While there are any, finished operations give
    /// their connections back to the pool (which hands them out in order) instead of
    /// keeping them: the pool never sees a kept connection, so would never hand it out.
    /// Under contention this is the pool's own behaviour, ping included, which also keeps
    /// the number of statements in flight at once below the pool size; measured on two
    /// cores, handing connections straight from one operation to the next (all of the pool
    /// busy all the time) made PostgreSQL slower, not faster, with 64 tasks.
    waiting: usize,
    closed: bool,
}

struct Held<DB: Database> {
    conn: PoolConnection<DB>,
    out_since: Instant,
    idle_since: Instant,
}

impl<DB: Database> Held<DB> {
    fn fresh(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.idle_since) <= IDLE_MAX
            && now.saturating_duration_since(self.out_since) <= OUT_MAX
    }
}

impl<DB: Database> std::fmt::Debug for Connections<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connections")
            .field("capacity", &self.capacity)
            .field("cached", &self.lock().idle.len())
            .finish_non_exhaustive()
    }
}

impl<DB: Database> Connections<DB> {
    /// Keeps up to `capacity` idle connections of `pool` (0: every operation goes through
    /// the pool). Call from inside a tokio runtime: the task returning idle connections
    /// runs on it.
    pub(crate) fn new(pool: Pool<DB>, capacity: usize) -> Arc<Self> {
        let conns = Arc::new(Connections {
            pool,
            capacity,
            cache: Mutex::new(Cache {
                idle: Vec::new(),
                waiting: 0,
                closed: false,
            }),
        });
        if capacity > 0 {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(return_idle(Arc::downgrade(&conns)));
            }
        }
        conns
    }

    /// The pool the connections come from.
    pub(crate) fn pool(&self) -> &Pool<DB> {
        &self.pool
    }

    fn lock(&self) -> MutexGuard<'_, Cache<DB>> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A connection for one operation: the most recently used fresh cached one, else one
    /// from the pool.
    ///
    /// # Errors
    ///
    /// The pool's: timed out, closed, cannot connect.
    pub(crate) async fn lease(&self) -> Result<Lease<'_, DB>, sqlx::Error> {
        if self.capacity > 0 {
            loop {
                let held = {
                    let mut cache = self.lock();
                    match cache.idle.pop() {
                        Some(held) => held,
                        None => {
                            // Registered under the lock that `put` checks: a connection
                            // finished after this point goes to the pool, to us.
                            cache.waiting += 1;
                            break;
                        }
                    }
                };
                if held.fresh(Instant::now()) {
                    return Ok(Lease::new(self, held.conn, held.out_since));
                }
                // Stale: back to the pool, through its ping (dropped outside the lock).
                drop(held);
            }
            let _waiting = Waiting(self);
            return Ok(Lease::new(self, self.pool.acquire().await?, Instant::now()));
        }
        Ok(Lease::new(self, self.pool.acquire().await?, Instant::now()))
    }

    /// After a successful operation: caches `conn`, or gives it back to the pool when an
    /// operation waits for one, the cache is full or closed, or the connection has been out
    /// long enough.
    fn put(&self, conn: PoolConnection<DB>, out_since: Instant) {
        let now = Instant::now();
        if now.saturating_duration_since(out_since) > OUT_MAX {
            return;
        }
        let mut cache = self.lock();
        if !cache.closed && cache.waiting == 0 && cache.idle.len() < self.capacity {
            cache.idle.push(Held {
                conn,
                out_since,
                idle_since: now,
            });
            return;
        }
        drop(cache);
        drop(conn);
    }

    /// Hands stale cached connections back to the pool; `false` once closed.
    fn return_stale(&self) -> bool {
        let now = Instant::now();
        let stale: Vec<Held<DB>> = {
            let mut cache = self.lock();
            if cache.closed {
                return false;
            }
            let (fresh, stale) = std::mem::take(&mut cache.idle)
                .into_iter()
                .partition(|held| held.fresh(now));
            cache.idle = fresh;
            stale
        };
        drop(stale);
        true
    }

    /// Hands every cached connection back to the pool and caches none from now on: call
    /// before closing the pool, which waits for all its connections.
    pub(crate) fn close(&self) {
        let idle = {
            let mut cache = self.lock();
            cache.closed = true;
            std::mem::take(&mut cache.idle)
        };
        drop(idle);
    }
}

impl<DB: Database> Drop for Connections<DB> {
    fn drop(&mut self) {
        // A pooled connection goes home through a spawned task; without a runtime (a
        // backend dropped after its runtime) let the connections go instead of panicking.
        if tokio::runtime::Handle::try_current().is_err() {
            let cache = self.cache.get_mut().unwrap_or_else(|e| e.into_inner());
            for held in cache.idle.drain(..) {
                drop(held.conn.detach());
            }
        }
    }
}

/// An operation waiting for the pool, counted while it waits (also when cancelled).
struct Waiting<'a, DB: Database>(&'a Connections<DB>);

impl<DB: Database> Drop for Waiting<'_, DB> {
    fn drop(&mut self) {
        let mut cache = self.0.lock();
        cache.waiting = cache.waiting.saturating_sub(1);
    }
}

/// Returns connections idle longer than [`IDLE_MAX`] to the pool until the backend is gone.
async fn return_idle<DB: Database>(conns: Weak<Connections<DB>>) {
    loop {
        tokio::time::sleep(IDLE_MAX).await;
        match conns.upgrade() {
            Some(conns) if conns.return_stale() => {}
            _ => return,
        }
    }
}

/// One operation's connection. [`settle`](Self::settle) it with the operation's result:
/// dropped unsettled (the operation was cancelled), it goes back through the pool.
pub(crate) struct Lease<'a, DB: Database> {
    conns: &'a Connections<DB>,
    conn: PoolConnection<DB>,
    out_since: Instant,
}

impl<'a, DB: Database> Lease<'a, DB> {
    fn new(conns: &'a Connections<DB>, conn: PoolConnection<DB>, out_since: Instant) -> Self {
        Lease {
            conns,
            conn,
            out_since,
        }
    }

    /// The connection to run the statement on.
    pub(crate) fn connection(&mut self) -> &mut DB::Connection {
        &mut self.conn
    }

    /// Caches the connection if the statement completed (successfully or with an error
    /// from the database, which leaves the session usable); anything else may have left
    /// it half-read or broken, so the pool checks it.
    pub(crate) fn settle<T>(self, result: &Result<T, sqlx::Error>) {
        match result {
            Ok(_) | Err(sqlx::Error::Database(_)) => self.conns.put(self.conn, self.out_since),
            Err(_) => drop(self.conn),
        }
    }
}

/// Runs a single-statement lock operation on a connection leased from `$conns` (a
/// `&Connections`), again when the database rolled it back for a conflict (see
/// `retry_conflicts`). `$run` builds the statement's future on `$conn`, a `&mut`
/// connection; everything it uses must be `Copy` (references).
macro_rules! run_on {
    ($backend:expr, $conns:expr, |$conn:ident| $run:expr) => {
        $crate::common::retry_conflicts($backend, || async move {
            let mut lease = $conns.lease().await?;
            let result = {
                let $conn = lease.connection();
                $run.await
            };
            lease.settle(&result);
            result
        })
    };
}
pub(crate) use run_on;
