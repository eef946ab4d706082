//! What the three databases share: the table name, options, error mapping, time
//! conversions and the garbage-collection timer.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockcore::LockError;

/// The version of the lock table layout this crate writes. A table stamped with a newer
/// version was created by a newer distlock and is refused rather than misused.
pub const SCHEMA_VERSION: i64 = 1;

/// The default lock table name.
pub const DEFAULT_TABLE: &str = "distlock_locks";

/// Longest accepted table name. PostgreSQL truncates identifiers at 63 bytes and the driver
/// derives `<table>_schema` from it, so names stay well below that.
pub const MAX_TABLE_NAME_LEN: usize = 48;

/// The pool size of the pools the driver opens itself, unless [`SqlOptions::max_connections`]
/// says otherwise.
pub const DEFAULT_MAX_CONNECTIONS: u32 = 8;

/// How long a released or expired row must be past its grant before the garbage collector
/// may delete it (see [`crate`] docs, "Fencing"): a new row for the key then starts from a
/// clock reading at least this much later than the deleted row's token.
pub(crate) const GC_GRACE: Duration = Duration::from_secs(60);

/// Rows one garbage-collection statement deletes at most (MySQL, SQLite): short statements,
/// so the collector never holds locks (InnoDB) or the database (SQLite) for long.
#[cfg(any(feature = "mysql", feature = "sqlite"))]
pub(crate) const GC_BATCH: u64 = 1000;

/// How often one backend runs the garbage collector (on the first release, then at most
/// this often, in the background).
pub(crate) const GC_INTERVAL: Duration = Duration::from_secs(60);

/// A validated SQL identifier for the lock table: 1 to 48 ASCII letters, digits and
/// underscores, starting with a letter or underscore. It is the only text ever spliced into
/// the driver's SQL; keys, owners and labels are always bound parameters.
///
/// # Examples
///
/// ```
/// use driver_sql::TableName;
///
/// assert!(TableName::new("app_locks").is_ok());
/// assert!(TableName::new("locks; DROP TABLE users").is_err());
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct TableName(Arc<str>);

impl TableName {
    /// Validates `name` as a table identifier.
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] if the name is empty, longer than 48 bytes, or contains
    /// anything but ASCII letters, digits and `_` (or starts with a digit).
    pub fn new(name: &str) -> Result<Self, LockError> {
        let valid_start = name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
        let valid_rest = name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid_start || !valid_rest || name.len() > MAX_TABLE_NAME_LEN {
            return Err(LockError::config(format!(
                "invalid lock table name {name:?}: use 1 to {MAX_TABLE_NAME_LEN} ASCII letters, \
                 digits and underscores, starting with a letter or underscore"
            )));
        }
        Ok(TableName(name.into()))
    }

    /// The name as written into SQL.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for TableName {
    fn default() -> Self {
        TableName(DEFAULT_TABLE.into())
    }
}

impl fmt::Debug for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// How a backend uses its database: table name and, for pools the driver opens itself,
/// their size and timeouts.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use driver_sql::SqlOptions;
///
/// let options = SqlOptions::new()
///     .table("billing_locks")?
///     .acquire_timeout(Duration::from_secs(2));
/// assert_eq!(options.table_name().as_str(), "billing_locks");
/// # Ok::<(), lockcore::LockError>(())
/// ```
#[derive(Clone, Debug)]
pub struct SqlOptions {
    pub(crate) table: TableName,
    pub(crate) max_connections: u32,
    pub(crate) acquire_timeout: Duration,
    pub(crate) busy_timeout: Duration,
    pub(crate) migrate: bool,
    pub(crate) gc_grace: Duration,
    pub(crate) keep_connections: Option<u32>,
}

impl Default for SqlOptions {
    fn default() -> Self {
        SqlOptions {
            table: TableName::default(),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            acquire_timeout: Duration::from_secs(5),
            busy_timeout: Duration::from_secs(5),
            migrate: true,
            gc_grace: GC_GRACE,
            keep_connections: None,
        }
    }
}

impl SqlOptions {
    /// The defaults: table `distlock_locks`, 8 connections, 5 s to get a connection, 5 s
    /// SQLite busy timeout, migration on.
    pub fn new() -> Self {
        Self::default()
    }

    /// Uses the table `name` (validated as an identifier).
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] for a name [`TableName::new`] rejects.
    pub fn table(mut self, name: &str) -> Result<Self, LockError> {
        self.table = TableName::new(name)?;
        Ok(self)
    }

    /// Uses an already validated table name.
    pub fn table_name_value(mut self, name: TableName) -> Self {
        self.table = name;
        self
    }

    /// The table the backend uses.
    pub fn table_name(&self) -> &TableName {
        &self.table
    }

    /// The most connections a pool opened by the driver keeps (PostgreSQL's `LISTEN`
    /// session is a connection of its own, outside this pool).
    pub fn max_connections(mut self, n: u32) -> Self {
        self.max_connections = n.max(1);
        self
    }

    /// How long an operation waits for a pooled connection before failing with
    /// [`LockError::Unavailable`] (`no connection to HOST:PORT within 5s`). A server that
    /// refuses connections (down, wrong port) is reported sooner: when the pool has not
    /// answered within 200 ms the backend checks the server's port, and a refusal fails the
    /// operation at once (`cannot connect to HOST:PORT`, the I/O error as its source).
    pub fn acquire_timeout(mut self, timeout: Duration) -> Self {
        self.acquire_timeout = timeout;
        self
    }

    /// SQLite only: how long a statement waits for another process's write to finish.
    pub fn busy_timeout(mut self, timeout: Duration) -> Self {
        self.busy_timeout = timeout;
        self
    }

    /// How old (by token) an expired row must be before the garbage collector deletes it.
    /// Shortening it weakens fencing after a clock step; for tests.
    #[doc(hidden)]
    pub fn gc_grace(mut self, grace: Duration) -> Self {
        self.gc_grace = grace;
        self
    }

    /// MySQL and PostgreSQL: how many idle connections the backend keeps out of its pool
    /// between operations, handing them straight to the next operation. sqlx pings every
    /// connection returned to a pool, a second round trip for each one-statement lock
    /// operation; a kept connection skips it (a connection goes back to the pool, and
    /// through the ping, when an operation on it failed or was cancelled, or after a second
    /// unused). Default: the whole pool (`max_connections`) for a pool the backend opened
    /// itself, none for a pool passed to `from_pool` (kept connections are unavailable to
    /// the application for up to a second after each operation).
    pub fn keep_connections(mut self, n: u32) -> Self {
        self.keep_connections = Some(n);
        self
    }

    /// The number of connections to keep out of a pool of `pool_size` (see
    /// [`keep_connections`](Self::keep_connections)); `owned` says whether the backend
    /// opened the pool itself.
    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
    pub(crate) fn kept_connections(&self, pool_size: u32, owned: bool) -> usize {
        let n = self
            .keep_connections
            .unwrap_or(if owned { pool_size } else { 0 });
        usize::try_from(n.min(pool_size)).unwrap_or(0)
    }

    /// Whether the backend creates or checks its table when built (default on). Off, the
    /// table must exist already (see `docs/sql.md` for the DDL).
    pub fn migrate(mut self, migrate: bool) -> Self {
        self.migrate = migrate;
        self
    }
}

/// Refuses a table stamped by a newer version of the driver.
pub(crate) fn check_version(table: &str, version: i64) -> Result<(), LockError> {
    if version > SCHEMA_VERSION {
        return Err(LockError::config(format!(
            "lock table {table} has schema version {version}, newer than this driver's \
             {SCHEMA_VERSION}: upgrade distlock or use another table"
        )));
    }
    Ok(())
}

/// Error codes that mean "the database cannot serve this right now, try again later".
fn is_transient_code(backend: &str, code: &str) -> bool {
    match backend {
        // connection exceptions, operator intervention (shutdown, termination, recovery),
        // too many connections, serialization failure / deadlock
        "postgres" => {
            code.starts_with("08")
                || code.starts_with("57P")
                || code == "53300"
                || code == "40001"
                || code == "40P01"
        }
        // connection exceptions (too many connections, server shutdown, lost link),
        // deadlock, connection killed
        "mysql" => code.starts_with("08") || code == "40001" || code == "70100",
        // SQLITE_BUSY, SQLITE_LOCKED (with their extended codes)
        "sqlite" => code
            .parse::<i32>()
            .map(|c| matches!(c & 0xff, 5 | 6))
            .unwrap_or(false),
        _ => false,
    }
}

/// Whether a sqlx error means "the database cannot serve this right now": connection
/// failures, pool timeouts and transient database states.
fn is_unavailable(backend: &str, e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Protocol(_) => true,
        sqlx::Error::Database(db) => {
            db.code()
                .is_some_and(|code| is_transient_code(backend, &code))
                || is_mysql_lock_wait_timeout(&**db)
        }
        _ => false,
    }
}

/// Maps a sqlx error: connection failures, pool timeouts and transient database states are
/// [`LockError::Unavailable`] (retryable); the rest are [`LockError::Backend`].
pub(crate) fn map_err(backend: &'static str, e: sqlx::Error) -> LockError {
    if is_unavailable(backend, &e) {
        LockError::unavailable(backend, e)
    } else {
        LockError::backend(backend, e)
    }
}

/// A sqlx error with what it happened to: `cannot connect to 127.0.0.1:5432`,
/// `SQLite database /var/lib/app/locks.db`, with the cause (`Connection refused (os error
/// 111)`, `(code: 14) unable to open database file`, …) as its source. Cheap to clone: one
/// probe's outcome answers every operation waiting for it.
#[derive(Clone, Debug)]
pub(crate) struct Failure {
    context: Arc<str>,
    cause: Arc<sqlx::Error>,
}

impl Failure {
    /// `cause`, which happened to `context` (shown first).
    pub(crate) fn new(context: impl Into<Arc<str>>, cause: sqlx::Error) -> Self {
        Failure {
            context: context.into(),
            cause: Arc::new(cause),
        }
    }

    /// A failed connection to `endpoint`.
    pub(crate) fn connect(endpoint: &str, cause: sqlx::Error) -> Self {
        Failure::new(format!("cannot connect to {endpoint}"), cause)
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.context)
    }
}

impl std::error::Error for Failure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        // sqlx's own wrappers repeat their source's text ("error communicating with
        // database: Connection refused (os error 111)", "error returned from database:
        // (code: 14) …"): hand out the underlying error itself, so a report of the whole
        // chain says each thing once.
        Some(match &*self.cause {
            sqlx::Error::Io(e) => e,
            sqlx::Error::Tls(e) => &**e,
            sqlx::Error::Database(e) => e.as_error(),
            e => e,
        })
    }
}

/// A [`Failure`] as a [`LockError`], sorted as [`map_err`] sorts its cause: unreachable
/// server, transient states → [`LockError::Unavailable`]; the rest (authentication, a file
/// that is not a database, …) → [`LockError::Backend`].
pub(crate) fn failure(backend: &'static str, failure: Failure) -> LockError {
    if is_unavailable(backend, &failure.cause) {
        LockError::unavailable(backend, failure)
    } else {
        LockError::backend(backend, failure)
    }
}

/// Why a lock statement failed: no connection (already a [`LockError`]), or the statement.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) enum OpError {
    Lock(LockError),
    Sql(sqlx::Error),
}

/// MySQL's "lock wait timeout exceeded" (1205) carries the catch-all SQLSTATE `HY000`.
fn is_mysql_lock_wait_timeout(db: &dyn sqlx::error::DatabaseError) -> bool {
    #[cfg(feature = "mysql")]
    if let Some(e) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
        return e.number() == 1205;
    }
    let _ = db;
    false
}

/// Whether an error is SQLite's "database is locked" (another process is writing).
#[cfg(feature = "sqlite")]
pub(crate) fn is_busy(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(db) => db
            .code()
            .is_some_and(|code| is_transient_code("sqlite", &code)),
        _ => false,
    }
}

/// Whether the database rolled the statement back for a conflict with another transaction
/// (deadlock, serialization failure): nothing was applied, so it may run again.
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn is_conflict(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(db) => matches!(db.code().as_deref(), Some("40001" | "40P01")),
        _ => false,
    }
}

/// Runs a single-statement operation, again (up to three more times) when the database
/// rolled it back for a conflict: InnoDB may pick a lock upsert as a deadlock victim, and a
/// pool whose sessions default to SERIALIZABLE may see serialization failures.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) async fn retry_conflicts<T, F, Fut>(
    backend: &'static str,
    mut op: F,
) -> Result<T, LockError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, OpError>>,
{
    let mut attempt = 0u32;
    loop {
        match op().await {
            Ok(v) => return Ok(v),
            Err(OpError::Sql(e)) if is_conflict(&e) && attempt < 3 => {
                attempt += 1;
                tracing::debug!(
                    attempt,
                    "lock statement rolled back by a conflict; trying again"
                );
                tokio::time::sleep(Duration::from_millis(1 << attempt)).await;
            }
            Err(OpError::Sql(e)) => return Err(map_err(backend, e)),
            Err(OpError::Lock(e)) => return Err(e),
        }
    }
}

/// A TTL in whole microseconds, rounded up so a lease is never shorter than asked.
pub(crate) fn ttl_micros(ttl: Duration) -> i64 {
    let micros = ttl.as_nanos().div_ceil(1000);
    i64::try_from(micros).unwrap_or(i64::MAX).max(1)
}

/// A remaining time reported by the database, in microseconds, as a duration (negative
/// values, from rows that expire as we read them, become zero).
pub(crate) fn micros(us: i64) -> Duration {
    Duration::from_micros(u64::try_from(us).unwrap_or(0))
}

/// A fencing token read from a `BIGINT` column.
pub(crate) fn token(fence: i64) -> lockcore::FencingToken {
    lockcore::FencingToken(u64::try_from(fence).unwrap_or(0))
}

/// Decides when a backend runs its garbage collector: on the first release, then at most
/// once per [`GC_INTERVAL`].
#[derive(Debug)]
pub(crate) struct GcTimer {
    grace: Duration,
    origin: Instant,
    /// Milliseconds since `origin` of the last run, plus one (zero: never ran).
    last: AtomicU64,
}

impl GcTimer {
    pub(crate) fn new(grace: Duration) -> Self {
        GcTimer {
            grace,
            origin: Instant::now(),
            last: AtomicU64::new(0),
        }
    }

    /// The grace in microseconds, bound into the collector's statement.
    pub(crate) fn grace_micros(&self) -> i64 {
        i64::try_from(self.grace.as_micros()).unwrap_or(i64::MAX)
    }

    /// True (once) when a run is due; the caller then runs it.
    pub(crate) fn due(&self) -> bool {
        let now = u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX) + 1;
        let last = self.last.load(Ordering::Relaxed);
        let interval = u64::try_from(GC_INTERVAL.as_millis()).unwrap_or(u64::MAX);
        if last != 0 && now.saturating_sub(last) < interval {
            return false;
        }
        self.last
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_identifiers() {
        for good in ["locks", "_x", "A1_b2", &"a".repeat(48)] {
            assert!(TableName::new(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "1abc",
            "a-b",
            "a b",
            "locks; DROP TABLE users; --",
            "a\"b",
            "a`b",
            "é",
            &"a".repeat(49),
        ] {
            assert!(
                matches!(TableName::new(bad), Err(LockError::Config { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn ttl_rounds_up() {
        assert_eq!(ttl_micros(Duration::from_nanos(1)), 1);
        assert_eq!(ttl_micros(Duration::from_millis(3)), 3000);
        assert_eq!(ttl_micros(Duration::from_nanos(1001)), 2);
    }

    #[test]
    fn kept_connections_default_to_owned_pools_only() {
        let o = SqlOptions::new();
        assert_eq!(o.kept_connections(8, true), 8);
        assert_eq!(o.kept_connections(8, false), 0);
        let o = SqlOptions::new().keep_connections(2);
        assert_eq!(
            (o.kept_connections(8, true), o.kept_connections(8, false)),
            (2, 2)
        );
        assert_eq!(
            SqlOptions::new()
                .keep_connections(20)
                .kept_connections(8, false),
            8
        );
    }

    #[test]
    fn gc_runs_first_then_rarely() {
        let t = GcTimer::new(GC_GRACE);
        assert!(t.due());
        assert!(!t.due());
    }
}
