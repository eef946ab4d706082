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
/// [`LockError::Unavailable`] (retryable); the rest are [`LockError::Backend`]. A database's
/// own error becomes a [`DbMessage`].
#[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
pub(crate) fn map_err(backend: &'static str, e: sqlx::Error) -> LockError {
    let unavailable = is_unavailable(backend, &e);
    match (e, unavailable) {
        (sqlx::Error::Database(db), true) if is_mysql_lock_wait_timeout(&*db) => {
            LockError::unavailable(backend, RowLockWait(DbMessage::of(&*db)))
        }
        (sqlx::Error::Database(db), true) => LockError::unavailable(backend, DbMessage::of(&*db)),
        (sqlx::Error::Database(db), false) => LockError::backend(backend, DbMessage::of(&*db)),
        (e, true) => LockError::unavailable(backend, e),
        (e, false) => LockError::backend(backend, e),
    }
}

/// A statement waited its session's limit for a row's lock (MySQL's 1205). A transaction
/// holding the key (`lock_in`) keeps the key's row locked to its end, so a claim that meets
/// this answers the key held ([`waited_for_row_lock`]).
#[derive(Debug)]
pub(crate) struct RowLockWait(DbMessage);

impl fmt::Display for RowLockWait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for RowLockWait {}

/// Whether `e` is a statement that waited its limit for a row's lock ([`RowLockWait`]).
pub(crate) fn waited_for_row_lock(e: &LockError) -> bool {
    std::error::Error::source(e).is_some_and(|source| source.is::<RowLockWait>())
}

/// A database's error as a person reads it: its message, PostgreSQL's detail and hint, and
/// its code. Not sqlx's text of it, which says "error returned from database" and appends
/// the line of the *database server's* source file that raised it ("… at line 3655").
#[derive(Debug)]
pub(crate) struct DbMessage(String);

impl DbMessage {
    pub(crate) fn of(db: &dyn sqlx::error::DatabaseError) -> Self {
        #[cfg(feature = "postgres")]
        if let Some(pg) = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
            let mut text = pg.message().to_string();
            if let Some(detail) = pg.detail() {
                text.push_str(&format!(" ({detail})"));
            }
            if let Some(hint) = pg.hint() {
                text.push_str(&format!("; hint: {hint}"));
            }
            text.push_str(&format!(" (SQLSTATE {})", pg.code()));
            return DbMessage(text);
        }
        // MySQL's ("1142 (42000): CREATE command denied …") and SQLite's ("(code: 14)
        // unable to open database file") say it well already.
        DbMessage(db.to_string())
    }
}

impl fmt::Display for DbMessage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DbMessage {}

/// A failed creation, upgrade or check of the lock table `table` (its migration): as
/// [`map_err`] sorts it, named as what it happened to, and when the role lacks a right,
/// with what to do about it.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn migration_failed(backend: &'static str, table: &str, e: sqlx::Error) -> LockError {
    if is_unavailable(backend, &e) {
        return map_err(backend, e);
    }
    let sqlx::Error::Database(db) = &e else {
        return map_err(backend, e);
    };
    let mut text = format!(
        "cannot create the lock table {table}: {}",
        DbMessage::of(&**db)
    );
    if is_denied(&**db) {
        text.push_str(&format!(
            ". The first use of a table creates it, its routines and its schema stamp: give \
             this role {}, or have a role that may run distlock once on {table} and grant \
             this one the rights listed in docs/sql.md, \"Rights\"",
            match backend {
                "postgres" => {
                    "CREATE on the schema (PostgreSQL 15 and later no longer grant it on \
                     `public` to every role: GRANT CREATE ON SCHEMA public TO <role>)"
                }
                _ => "CREATE, CREATE ROUTINE and ALTER ROUTINE on the database",
            }
        ));
    }
    LockError::backend(backend, DbMessage(text))
}

/// Whether a database refused a statement for a right the role lacks: PostgreSQL's
/// `insufficient_privilege`; MySQL/MariaDB's denied command, database or routine.
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn is_denied(db: &dyn sqlx::error::DatabaseError) -> bool {
    #[cfg(feature = "mysql")]
    if let Some(e) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
        // 1044 database, 1142 table command, 1227 SUPER-like, 1370 routine, 1419 SUPER
        // with binary logging (stored routines)
        return matches!(e.number(), 1044 | 1142 | 1227 | 1370 | 1419);
    }
    db.code().as_deref() == Some("42501")
}

/// A sqlx error with what it happened to: `cannot connect`,
/// `SQLite database /var/lib/app/locks.db`, with the cause (`Connection refused (os error
/// 111)`, `(code: 14) unable to open database file`, …) as its source. Cheap to clone: one
/// probe's outcome answers every operation waiting for it.
#[derive(Clone, Debug)]
pub(crate) struct Failure {
    context: Arc<str>,
    cause: Arc<sqlx::Error>,
    /// The database's error, as people read it, when the cause is one.
    said: Option<Arc<DbMessage>>,
}

impl Failure {
    /// `cause`, which happened to `context` (shown first).
    pub(crate) fn new(context: impl Into<Arc<str>>, cause: sqlx::Error) -> Self {
        let said = match &cause {
            sqlx::Error::Database(db) => Some(Arc::new(DbMessage::of(&**db))),
            _ => None,
        };
        Failure {
            context: context.into(),
            cause: Arc::new(cause),
            said,
        }
    }

    /// A failed connection (the error names the server: [`LockError::at`]).
    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
    pub(crate) fn connect(cause: sqlx::Error) -> Self {
        Failure::new("cannot connect", cause)
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
        // chain says each thing once; a database's error as `DbMessage` reads it.
        if let Some(said) = &self.said {
            return Some(&**said);
        }
        Some(match &*self.cause {
            sqlx::Error::Io(e) => e,
            sqlx::Error::Tls(e) => &**e,
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

/// A statement's answer of an unexpected shape (`what`: the statement).
pub(crate) fn shape(what: &str) -> sqlx::Error {
    sqlx::Error::Protocol(format!(
        "the {what} statement answered with an unexpected row"
    ))
}
