//! Why not sqlx's pool alone: it pings each returned connection, and says refusals are timeouts.
//!
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
//!
//! Connecting goes through here too, to say *why* there is no connection: sqlx's pool
//! retries a refused connection until its acquire timeout and then reports only
//! `pool timed out`. When the pool has not handed out a connection within [`PROBE_AFTER`],
//! the backend checks whether the server's port accepts a connection at all (one check at
//! a time, at most once per [`PROBE_FRESH`]: a TCP or socket connect, no database session)
//! and reports a refusal at once.

use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use lockcore::LockError;
use sqlx::pool::PoolConnection;
use sqlx::{Database, Pool};

use crate::db::{Ask, Db};
use crate::error::{ends_session, failure, is_conflict, map_err, Failure};
use crate::gc::{on_connection, Collect, GcError};
use crate::opening::Opening;
use crate::retry::{retry, CONFLICT_RETRY};
use crate::run::{Leased, Run};
use crate::store::Call;

/// How long a connection may wait in the cache for the next operation.
pub(crate) const IDLE_MAX: Duration = Duration::from_secs(1);

/// How long a connection may stay out of the pool in all before it is handed back.
pub(crate) const OUT_MAX: Duration = Duration::from_secs(60);

/// How long an operation waits for the pool before checking whether the server's port
/// accepts connections at all. A new session takes a few milliseconds on loopback (tens on
/// a loaded machine); a refused connection is then reported within about this time instead
/// of after the acquire timeout.
pub(crate) const PROBE_AFTER: Duration = Duration::from_millis(200);

/// How long the outcome of one probe answers for every operation waiting for the pool.
pub(crate) const PROBE_FRESH: Duration = Duration::from_secs(1);

/// Where a pool connects: shown in errors (never with credentials), and checked by the
/// probe.
#[derive(Clone, Debug)]
pub(crate) enum Endpoint {
    Tcp { host: String, port: u16 },
    Socket(PathBuf),
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            // IPv6 literals in brackets, as in URLs.
            Endpoint::Tcp { host, port } if host.contains(':') => write!(f, "[{host}]:{port}"),
            Endpoint::Tcp { host, port } => write!(f, "{host}:{port}"),
            Endpoint::Socket(path) => write!(f, "{}", path.display()),
        }
    }
}

impl Endpoint {
    /// The Unix socket `socket` if there is one, else `host:port`.
    pub(crate) fn new(socket: Option<PathBuf>, host: &str, port: u16) -> Self {
        match socket {
            Some(path) => Endpoint::Socket(path),
            None => Endpoint::Tcp {
                host: host.to_owned(),
                port,
            },
        }
    }

    /// Whether the server accepts a connection (no session is started).
    async fn reachable(&self) -> std::io::Result<()> {
        match self {
            Endpoint::Tcp { host, port } => {
                tokio::net::TcpStream::connect((host.as_str(), *port)).await?;
            }
            #[cfg(unix)]
            Endpoint::Socket(path) => {
                tokio::net::UnixStream::connect(path).await?;
            }
            #[cfg(not(unix))]
            Endpoint::Socket(_) => {}
        }
        Ok(())
    }
}

/// The connections a backend keeps between operations, over the pool they come from.
pub(crate) struct Connections<DB: Database> {
    pool: Pool<DB>,
    capacity: usize,
    cache: Mutex<Cache<DB>>,
    /// The backend's name, for errors.
    name: &'static str,
    /// Where the pool connects, for errors and the probe.
    endpoint: Endpoint,
    /// The endpoint as shown in errors.
    shown: Arc<str>,
    /// The last probe's outcome (see [`PROBE_AFTER`]); held while probing, so one probe
    /// runs at a time.
    probed: tokio::sync::Mutex<Option<Probed>>,
    /// Sessions opened apart from the operations waiting for them (see [`Self::warm`] and
    /// [`Self::acquire`]).
    opening: Opening<DB>,
}

/// What a probe found, and when.
struct Probed {
    at: Instant,
    /// `None`: the database accepted a connection (or did not answer: the pool's timeout
    /// then says so).
    failure: Option<Failure>,
}

struct Cache<DB: Database> {
    /// Most recently used last.
    idle: Vec<Held<DB>>,
    /// Operations waiting for the pool. While there are any, finished operations give
    /// their connections back to the pool (which hands them out in order) instead of
    /// keeping them: the pool never sees a kept connection, so would never hand it out.
    /// Under contention this is the pool's own behaviour, ping included, which also keeps
    /// the number of statements in flight at once below the pool size: a server with as
    /// many statements in flight as the pool has connections serves them slower, not
    /// faster (lockbench `postgres --case concurrent64`).
    waiting: usize,
    closed: bool,
}

struct Held<DB: Database> {
    conn: PoolConnection<DB>,
    out_since: Instant,
    idle_since: Instant,
}

impl<DB: Database> Held<DB> {
    /// Whether it may stay in the cache: used lately, and not out too long.
    fn fresh(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.idle_since) <= IDLE_MAX && self.usable(now)
    }

    /// Whether an operation may take it: not out of the pool too long (the pool's
    /// lifetime limits are checked when it goes back). A connection idle in the cache
    /// longer than [`IDLE_MAX`] is as good as one idle in the pool, which hands those out
    /// unchecked: giving it back first sent a ping before the pool took it, and an
    /// operation that asked the pool meanwhile found nothing idle and opened a new session
    /// (a renewal every TTL/3 of a TTL above 3 s, over a link slow to connect, gave up
    /// waiting for it).
    fn usable(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.out_since) <= OUT_MAX
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
    /// the pool). `name` and `endpoint` (the server's address, without credentials) go
    /// into connection errors. Call from inside a tokio runtime: the task returning idle
    /// connections runs on it.
    pub(crate) fn new(
        pool: Pool<DB>,
        capacity: usize,
        name: &'static str,
        endpoint: Endpoint,
    ) -> Arc<Self> {
        let conns = Arc::new(Connections {
            pool,
            capacity,
            cache: Mutex::new(Cache {
                idle: Vec::new(),
                waiting: 0,
                closed: false,
            }),
            name,
            shown: endpoint.to_string().into(),
            endpoint,
            probed: tokio::sync::Mutex::new(None),
            opening: Opening::default(),
        });
        if capacity > 0 {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(return_idle(Arc::downgrade(&conns)));
            }
        }
        conns
    }

    /// Starts opening a session in the background if the pool has none yet (once): the
    /// first operation then finds it open instead of waiting for it.
    pub(crate) fn warm(&self) {
        self.opening.warm(&self.pool);
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
    /// [`LockError::Unavailable`] naming the endpoint and the cause when the database
    /// cannot be connected to (refused, unreachable), or the time waited when no connection
    /// came within the acquire timeout; [`LockError::Backend`] when the database refused
    /// the session (authentication).
    pub(crate) async fn lease(&self) -> Result<Lease<'_, DB>, LockError> {
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
                if held.usable(Instant::now()) {
                    return Ok(Lease::new(self, held.conn, held.out_since));
                }
                // Out too long: back to the pool, through its checks (dropped outside the
                // lock).
                drop(held);
            }
            let _waiting = Waiting(self);
            return Ok(Lease::new(self, self.acquire().await?, Instant::now()));
        }
        Ok(Lease::new(self, self.acquire().await?, Instant::now()))
    }

    /// A connection from the pool, or why there is none.
    async fn acquire(&self) -> Result<PoolConnection<DB>, LockError> {
        // A session being opened outlives a caller that stops waiting (see `opening`).
        let acquire = self.opening.acquire(&self.pool);
        tokio::pin!(acquire);
        let result = match tokio::time::timeout(PROBE_AFTER, &mut acquire).await {
            Ok(result) => result,
            // Slow: the pool is busy, or retrying a refused connection until its timeout.
            Err(_) => tokio::select! {
                biased;
                result = &mut acquire => result,
                found = self.probe() => return Err(self.failure(found)),
            },
        };
        result.map_err(|e| self.pool_error(e))
    }

    /// Resolves with the reason the server cannot be connected to; stays pending while its
    /// port accepts connections (the caller keeps waiting for the pool meanwhile).
    async fn probe(&self) -> Failure {
        let failure = {
            let mut probed = self.probed.lock().await;
            match &*probed {
                Some(p) if p.at.elapsed() < PROBE_FRESH => p.failure.clone(),
                _ => {
                    let failure = match tokio::time::timeout(
                        self.pool.options().get_acquire_timeout(),
                        self.endpoint.reachable(),
                    )
                    .await
                    {
                        // The port is open: the pool is busy, or the server is slow to
                        // start sessions; the pool's own timeout says so.
                        Ok(Ok(())) | Err(_) => None,
                        Ok(Err(e)) => Some(Failure::connect(sqlx::Error::Io(e))),
                    };
                    *probed = Some(Probed {
                        at: Instant::now(),
                        failure: failure.clone(),
                    });
                    failure
                }
            }
        };
        match failure {
            Some(failure) => failure,
            None => std::future::pending().await,
        }
    }

    /// A statement's error: the database's own answers as they are (a conflict is retried);
    /// a broken connection (the server went away mid-statement) names the server.
    fn statement_error(&self, e: sqlx::Error) -> OpError {
        match e {
            e if !ends_session(&e) => OpError::Sql(e),
            // The server said why: its own words.
            e @ sqlx::Error::Database(_) => OpError::Broken(map_err(self.name, e)),
            e => OpError::Broken(self.failure(Failure::new("lost the connection", e))),
        }
    }

    /// How many times a statement is sent again after its connection turned out broken:
    /// once per connection the pool may hold (each broken one is closed when handed back),
    /// plus one on a new connection.
    fn resends(&self) -> u32 {
        self.pool.options().get_max_connections() + 1
    }

    /// An error of the pool's `acquire`, with the endpoint and the time waited.
    fn pool_error(&self, e: sqlx::Error) -> LockError {
        match e {
            sqlx::Error::PoolTimedOut => LockError::unavailable(
                self.name,
                format!(
                    "no connection within {:?}: the pool's {} connections stayed busy, \
                     or the server did not answer",
                    self.pool.options().get_acquire_timeout(),
                    self.pool.options().get_max_connections(),
                ),
            )
            .at(&*self.shown),
            sqlx::Error::PoolClosed => LockError::unavailable(self.name, e).at(&*self.shown),
            // Anything else comes from opening a connection.
            e => self.failure(Failure::connect(e)),
        }
    }

    /// `f` as a [`LockError`] that names the server.
    fn failure(&self, f: Failure) -> LockError {
        failure(self.name, f).at(&*self.shown)
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
        self.opening.close();
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
            self.opening.detach();
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
    /// from the database that leaves the session usable); anything else may have left it
    /// half-read or broken, or ended its session, so the pool checks it.
    pub(crate) fn settle<T>(self, result: &Result<T, sqlx::Error>) {
        match result {
            Ok(_) => self.conns.put(self.conn, self.out_since),
            Err(e @ sqlx::Error::Database(_)) if !ends_session(e) => {
                self.conns.put(self.conn, self.out_since)
            }
            Err(_) => drop(self.conn),
        }
    }
}

/// Why a lock statement failed: no connection (already a [`LockError`]), a connection that
/// broke under the statement, or the statement.
enum OpError {
    Lock(LockError),
    Broken(LockError),
    Sql(sqlx::Error),
}

/// Why a statement runs again.
const CONFLICT: &str = "lock statement rolled back by a conflict";

/// Each statement runs on a connection leased from the cache or the pool, again (up to three
/// more times) when the database rolled it back for a conflict: InnoDB may pick a lock
/// upsert as a deadlock victim, and a pool whose sessions default to SERIALIZABLE may see
/// serialization failures.
impl<DB: Db> Run for Arc<Connections<DB>> {
    type DB = DB;

    fn run<'a, A: Ask<DB>>(
        &'a self,
        ask: A,
        call: Call<'a>,
    ) -> impl Future<Output = Result<A::Answer, LockError>> + Send + 'a {
        let conns: &Connections<DB> = self;
        let once = move || async move {
            let mut lease = conns.lease().await.map_err(OpError::Lock)?;
            let result = ask.run(lease.connection(), call).await;
            lease.settle(&result);
            result.map_err(|e| conns.statement_error(e))
        };
        let conflict = |e: &OpError| matches!(e, OpError::Sql(e) if is_conflict(e));
        async move {
            // A connection kept idle may have died with its server (a restart, a session
            // killed by the server's idle timeout): the statement goes again on another
            // one, as Redis sends a command again on a broken connection. Every lock
            // statement is idempotent per owner, so one that did reach the server before
            // its connection broke is answered the same way again (a release, as not held).
            // A server that is down fails to connect instead, and that answers at once.
            let mut resends = 0;
            loop {
                match retry(&CONFLICT_RETRY, CONFLICT, &once, conflict).await {
                    Ok(v) => return Ok(v),
                    Err(OpError::Broken(e)) if resends < conns.resends() => {
                        resends += 1;
                        tracing::debug!(error = %lockcore::ErrorChain(&e), resends, "a kept connection was broken; sending the statement again on another");
                    }
                    Err(OpError::Sql(e)) => return Err(map_err(conns.name, e)),
                    Err(OpError::Lock(e) | OpError::Broken(e)) => return Err(e),
                }
            }
        }
    }

    /// On a connection of the pool's own (the kept ones serve lock operations).
    async fn collect<'a>(&'a self, how: Collect, call: Call<'a>) -> Result<u64, GcError> {
        Ok(on_connection(&self.pool, how, call).await?)
    }

    fn error(&self, e: sqlx::Error) -> LockError {
        map_err(self.name, e)
    }

    async fn shutdown(&self) {
        self.close();
        self.pool.close().await;
    }

    type Leased<'a> = Lease<'a, DB>;

    const BEGIN: &'static str = "BEGIN";

    const TX_RETRY: lockcore::RetryPolicy = CONFLICT_RETRY;

    async fn lease(&self) -> Result<Lease<'_, DB>, LockError> {
        Connections::lease(self).await
    }

    fn warm(&self) {
        Connections::warm(self)
    }

    fn retryable(e: &sqlx::Error) -> bool {
        is_conflict(e)
    }
}

impl<DB: Database> Leased<DB> for Lease<'_, DB> {
    fn conn(&mut self) -> &mut DB::Connection {
        self.connection()
    }

    fn settle<T>(self, result: &Result<T, sqlx::Error>) {
        Lease::settle(self, result)
    }
}

#[cfg(feature = "sqlite")]
#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::time::Duration;

    use sqlx::sqlite::SqlitePoolOptions;

    use super::{Connections, Endpoint, IDLE_MAX};

    /// A connection idle in the cache a little longer than `IDLE_MAX`, before the task
    /// that hands such connections back has run: the next operation takes it instead of
    /// giving it back (a ping before the pool takes it) and finding the pool empty, which
    /// opened a second session.
    #[tokio::test]
    async fn a_connection_idle_past_the_limit_is_taken_not_replaced() {
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect("sqlite::memory:")
            .await
            .unwrap();
        // The task returning idle connections looks at 1 × and 2 × IDLE_MAX from here.
        let conns = Connections::new(pool, 2, "sqlite", Endpoint::Socket(PathBuf::new()));
        tokio::time::sleep(IDLE_MAX / 2).await;
        let lease = conns.lease().await.unwrap();
        lease.settle(&Ok::<(), sqlx::Error>(()));
        assert_eq!(conns.pool().size(), 1);
        // Idle past the limit (IDLE_MAX + 50 ms) halfway between the task's looks.
        tokio::time::sleep(IDLE_MAX + Duration::from_millis(50)).await;
        let lease = conns.lease().await.unwrap();
        assert_eq!(
            conns.pool().size(),
            1,
            "the operation opened a new session although an idle one was kept"
        );
        lease.settle(&Ok::<(), sqlx::Error>(()));
    }
}
