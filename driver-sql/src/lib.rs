//! distlock backends on SQL databases through sqlx: PostgreSQL, MySQL/MariaDB and SQLite,
//! each behind the Cargo feature of the same name (`sqlite` is on by default: it is the
//! CLI's embedded store).
//!
//! All three keep one lock table, created by the driver's own idempotent migration and
//! stamped with the schema version ([`SCHEMA_VERSION`]; a table made by a development
//! build is refused, see `docs/sql.md`):
//!
//! | column | PostgreSQL | MySQL/MariaDB | SQLite |
//! |---|---|---|---|
//! | `lock_key` (primary key, byte-exact) | `BYTEA` | `VARBINARY(255)` | `BLOB` |
//! | `owner` (the secret owner token) | `BYTEA` | `BINARY(16)` | `BLOB` |
//! | `label` (shown by `holders`) | `TEXT` | `VARCHAR(255)` | `TEXT` |
//! | `fence` (fencing token) | `BIGINT` | `BIGINT` | `INTEGER` |
//! | `expires_at` | `TIMESTAMPTZ` | `DATETIME(6)` (UTC) | `INTEGER` (µs) |
//!
//! * **The database's clock decides.** Every expiry check reads the database's clock inside
//!   the one statement that changes the row (PostgreSQL `statement_timestamp()`, MySQL
//!   `UTC_TIMESTAMP(6)`, SQLite `unixepoch('subsec')`); the client's wall clock is never
//!   used.
//! * **One statement per operation**, idempotent per owner: an upsert that takes a free or
//!   expired row, re-grants it to its owner (same token, expiry never shortened) or leaves
//!   it alone; owner-checked updates for extend and release.
//! * **Fencing**: the acquiring statement sets `fence = max(fence + 1, now in µs)`. A
//!   release marks the row expired instead of deleting it, so the next holder counts up
//!   from it; a garbage collector deletes rows expired and granted more than a minute ago,
//!   after which a new row starts from the clock (clock-assisted).
//! * **Shared claims** (read-write locks, semaphores): leases in `<table>_leases`, the key's
//!   capacity and reservation on its row, which a marker owner holds while leases live so
//!   the exclusive statement sees the key held. Each claim, lease release and renewal is one
//!   transaction that locks the key's row first; see `docs/sql.md`. On PostgreSQL and
//!   MySQL/MariaDB a free key's first lease is written inline in its row, released and
//!   renewed by the exclusive statements, until a second lease moves it to the leases
//!   table.
//! * **Waiting**: PostgreSQL wakes waiters with `LISTEN`/`NOTIFY` (one channel per table,
//!   the key hex-encoded in the payload, one listening session per backend). MySQL and
//!   SQLite poll, one poller per key with waiters, from a few milliseconds up to 100 ms;
//!   a release through the same backend wakes its waiters at once.
//!
//! Build a backend from a URL with [`connect`], or from a pool the application already
//! has (`PostgresBackend::from_pool`, …). `docs/sql.md` covers poolers, TLS and the DDL.
//!
//! # Examples
//!
//! ```
//! # extern crate lockcore as distlock_core; // the workspace's name for it
//! # #[tokio::main] async fn main() -> Result<(), distlock_core::LockError> {
//! use distlock_core::LockClient;
//!
//! let dir = std::env::temp_dir().join(format!("distlock-lib-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir).unwrap();
//! let backend = distlock_sql::connect(&format!("sqlite:{}", dir.join("locks.db").display())).await?;
//! let locks = LockClient::new(backend);
//! let guard = locks.lock("nightly-report").try_acquire().await?.expect("nobody holds it");
//! println!("fencing token {}", guard.token());
//! guard.release().await?;
//! # std::fs::remove_dir_all(&dir).ok();
//! # Ok(()) }
//! ```
#![warn(missing_docs)]
// On docs.rs (`--cfg docsrs`, see Cargo.toml) every item shows the feature it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

use std::sync::Arc;

use lockcore::{LockBackend, LockError};

#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod backend;
mod config;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod conns;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod db;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod dialect;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod error;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod gc;
#[cfg(feature = "mysql")]
pub mod mysql;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod open;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod opening;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod renew;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod retry;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod run;
mod schema;
#[cfg(feature = "sqlite")]
pub mod sqlite;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod store;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod transaction;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod units;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod wait;

pub use config::{
    SqlOptions, TableName, DEFAULT_MAX_CONNECTIONS, DEFAULT_TABLE, MAX_TABLE_NAME_LEN,
};
pub use schema::SCHEMA_VERSION;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub use transaction::TransactionLock;

/// The sqlx this driver is built with, for building the pools passed to `from_pool`.
pub use sqlx;

/// Connects to the database of `url` with the default [`SqlOptions`]; see [`connect_with`].
///
/// # Errors
///
/// As [`connect_with`].
pub async fn connect(url: &str) -> Result<Arc<dyn LockBackend>, LockError> {
    connect_with(url, SqlOptions::default()).await
}

/// Connects to the database of `url` and prepares the lock table.
///
/// * `postgres://…`, `postgresql://…` (feature `postgres`): the options sqlx knows
///   (`sslmode`, `sslrootcert`, `sslcert`, `sslkey`, `application_name`, `options`,
///   `host`, `port`, `dbname`, `statement-cache-capacity`, …).
/// * `mysql://…`, `mariadb://…` (feature `mysql`): `ssl-mode`, `ssl-ca`, `ssl-cert`,
///   `ssl-key`, `charset`, `collation`, `timezone`, `socket`, `statement-cache-capacity`.
/// * `sqlite:path`, `sqlite://path` (feature `sqlite`): `mode`, `cache`, `immutable`,
///   `vfs`; the file is created when missing.
///
/// The URL is parsed once with [`lockcore::store_url`]: an option the database does not
/// know is refused with the list of the known ones (sqlx would ignore it). The password
/// (userinfo, or `?password=`) is kept as a secret and handed to sqlx apart from the URL,
/// so no error or log line can show it. A `distlock_table=NAME` option picks the lock
/// table (validated as an identifier; it overrides the options' table); it is not passed
/// on to the database.
///
/// # Errors
///
/// [`LockError::Config`] for an unknown scheme, a scheme whose feature is not compiled in,
/// a malformed URL or a bad table name; [`LockError::Unavailable`] if the database cannot
/// be reached (a refused connection within a fraction of a second, naming the server; no
/// answer within the options' acquire timeout); [`LockError::Backend`] if it refuses
/// (authentication, permissions to create the table) or, for SQLite, the file cannot be
/// used (the error names the file).
///
/// # Examples
///
/// ```
/// # extern crate lockcore as distlock_core; // the workspace's name for it
/// # #[tokio::main] async fn main() {
/// let err = distlock_sql::connect("ftp://example.invalid/").await.unwrap_err();
/// assert!(matches!(err, distlock_core::LockError::Config { .. }));
/// # }
/// ```
#[cfg_attr(
    not(any(feature = "postgres", feature = "mysql", feature = "sqlite")),
    allow(unused_variables)
)]
pub async fn connect_with(
    url: &str,
    options: SqlOptions,
) -> Result<Arc<dyn LockBackend>, LockError> {
    let scheme = lockcore::store_url::StoreUrl::parse(url)
        .map_err(|e| {
            LockError::config(format!(
                "{e} (a database URL: postgres://…, mysql://…, mariadb://… or sqlite:PATH)"
            ))
        })?
        .scheme()
        .to_owned();
    // A database whose feature is off has no backend arm: its scheme reaches the arm
    // below that names the feature to turn on.
    #[allow(unreachable_patterns)]
    match scheme.as_str() {
        #[cfg(feature = "sqlite")]
        "sqlite" => Ok(sqlite::SqliteBackend::connect(url, options).await?),
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => Ok(postgres::PostgresBackend::connect(url, options).await?),
        #[cfg(feature = "mysql")]
        "mysql" | "mariadb" => Ok(mysql::MySqlBackend::connect(url, options).await?),
        "sqlite" => Err(missing_feature("sqlite")),
        "postgres" | "postgresql" => Err(missing_feature("postgres")),
        "mysql" | "mariadb" => Err(missing_feature("mysql")),
        other => Err(LockError::config(format!(
            "unknown database URL scheme {other:?}: driver-sql handles postgres://, \
             postgresql://, mysql://, mariadb:// and sqlite:"
        ))),
    }
}

/// The error for a URL of a database whose feature this build does not have.
#[allow(dead_code)]
fn missing_feature(feature: &str) -> LockError {
    LockError::config(format!(
        "{feature} URLs need driver-sql's `{feature}` feature (distlock's `{feature}` feature), \
         which this build does not have"
    ))
}
