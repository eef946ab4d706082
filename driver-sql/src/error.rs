//! How sqlx's errors become [`LockError`]s: what means "the database cannot serve this right
//! now" (retryable), and errors that name what they happened to.

use std::fmt;
use std::sync::Arc;

use lockcore::LockError;

/// Error codes that mean "the database cannot serve this right now, try again later".
fn is_transient_code(backend: &str, code: &str) -> bool {
    match backend {
        // connection exceptions, operator intervention (shutdown, termination, recovery),
        // a statement cancelled (its time limit, as MariaDB's 70100 below), too many
        // connections, serialization failure / deadlock
        "postgres" => {
            code.starts_with("08")
                || code.starts_with("57P")
                || code == "57014"
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
#[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
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
    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
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

/// Whether `e` ended the connection's session: the connection broke (the server went away,
/// a restart), or the server ended the session and said so (PostgreSQL's "terminating
/// connection due to administrator command" at a shutdown, an idle session's time limit;
/// a connection exception of either database). Such a connection serves nothing more, but
/// another one may.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn ends_session(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) | sqlx::Error::Tls(_) | sqlx::Error::Protocol(_) => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|code| {
            code.starts_with("08") || matches!(&*code, "57P01" | "57P02" | "57P05" | "25P03")
        }),
        _ => false,
    }
}

/// Whether the database rolled the statement back for a conflict with another transaction
/// (deadlock, serialization failure): nothing was applied, so it may run again.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn is_conflict(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(db) => matches!(db.code().as_deref(), Some("40001" | "40P01")),
        _ => false,
    }
}
