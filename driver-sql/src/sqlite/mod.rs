//! SQLite: a lock table in a database file that several processes can share.

mod file;
mod migrate;
mod statements;
mod transaction;

use std::sync::Arc;

use lockcore::driver::{Capabilities, ClockSource, Fairness, FencingGuarantee};
use lockcore::LockError;
use sqlx::sqlite::{SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous};
use sqlx::Sqlite;

use crate::backend::lock::Store;
use crate::backend::{lock_backend, SqlBackend};
use crate::config::SqlOptions;
use crate::dialect::Dialect;
use crate::error::{failure, is_busy, Failure};
use crate::gc::Collect;
use crate::retry::{retry, OPEN_RETRY};
use crate::transaction::transaction_locks;
use crate::wait::poll::{Pace, Waiters};
use file::{database_name, SqliteFile};
use migrate::migrate;
use statements::statements;
use transaction::TransactionStatements;

/// What the SQLite backend declares: clock-assisted fencing (tokens are floored by the
/// database file's clock, in milliseconds × 1000), no release notifications (waiters
/// poll; releases through the same backend wake its own waiters at once), expiry judged by
/// the clock SQLite reads inside each statement, shared claims (read-write locks and
/// semaphores), bounded fairness (a long wait
/// marks the key as its next turn, see
/// [`ClaimRequest::waited`](lockcore::driver::ClaimRequest::waited)).
pub const SQLITE_CAPABILITIES: Capabilities = Capabilities::new(FencingGuarantee::ClockAssisted)
    .with_fairness(Fairness::Bounded)
    .with_notifications(false)
    .with_clock(ClockSource::Store)
    .with_claims(true, true)
    .with_batched_renewals(true);

/// SQLite's dialect: statements that return the fence (`RETURNING`), run on the pool and
/// retried while another connection writes.
#[derive(Debug)]
pub(crate) struct Lite;

impl Dialect for Lite {
    type Run = SqliteFile;

    const NAME: &'static str = "sqlite";
    const GC: Collect = Collect::Batches(None);
}

/// A lock table in a SQLite database: the embedded default of the distlock CLI.
///
/// The file may be shared by several processes (and several backends in one process):
/// the driver switches it to WAL, waits for other writers up to the busy timeout, and
/// retries a write (a release above all) that still meets one. Waiters poll the table
/// (from a few milliseconds up to 100 ms), except that a release through this backend
/// wakes its own waiters at once.
///
/// Every `sqlite::memory:` URL is a database of its own: use a file to share locks.
///
/// # Examples
///
/// ```
/// # extern crate lockcore as distlock_core; // the workspace's name for it
/// # #[tokio::main] async fn main() -> Result<(), distlock_core::LockError> {
/// use distlock_sql::{SqlOptions, sqlite::SqliteBackend};
/// use distlock_core::LockClient;
///
/// let dir = std::env::temp_dir().join(format!("distlock-doc-{}", std::process::id()));
/// std::fs::create_dir_all(&dir).unwrap();
/// let url = format!("sqlite:{}", dir.join("locks.db").display());
/// let backend = SqliteBackend::connect(&url, SqlOptions::new()).await?;
/// let locks = LockClient::new(backend);
/// let guard = locks.lock("report").try_acquire().await?.expect("free");
/// guard.release().await?;
/// # std::fs::remove_dir_all(&dir).ok();
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct SqliteBackend(SqlBackend<Lite, Arc<Waiters>>, TransactionStatements);

lock_backend!(SqliteBackend, Lite, SQLITE_CAPABILITIES);

transaction_locks!(
    SqliteBackend,
    Sqlite,
    r#"A transfer between two accounts: the lock and the writes commit together. On SQLite
the transaction holds the database's write lock until it ends, as any transaction that
writes does: keep it short.

```
# extern crate lockcore as distlock_core; // the workspace's name for it
# #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
use std::time::Duration;
use distlock_sql::{SqlOptions, sqlite::SqliteBackend};
use distlock_sql::sqlx;

# let dir = std::env::temp_dir().join(format!("distlock-tx-doc-{}", std::process::id()));
# std::fs::create_dir_all(&dir)?;
let url = format!("sqlite:{}", dir.join("app.db").display());
let locks = SqliteBackend::connect(&url, SqlOptions::new()).await?;
sqlx::raw_sql("CREATE TABLE IF NOT EXISTS accounts (id INTEGER PRIMARY KEY, \
    balance INTEGER NOT NULL, fence INTEGER NOT NULL); \
    INSERT OR IGNORE INTO accounts VALUES (1, 500, 0), (2, 0, 0)")
    .execute(locks.pool()).await?;

let mut tx = locks.pool().begin().await?;
let lock = locks.lock_in(&mut tx, "accounts", Duration::from_secs(5)).await?;
let token = i64::try_from(lock.token().0)?;
for (id, delta) in [(1_i64, -100_i64), (2, 100)] {
    let moved = sqlx::query(
        "UPDATE accounts SET balance = balance + ?1, fence = ?2 WHERE id = ?3 AND fence <= ?2",
    )
    .bind(delta).bind(token).bind(id)
    .execute(&mut *tx).await?;
    assert_eq!(moved.rows_affected(), 1, "a later holder wrote first");
}
tx.commit().await?; // the writes and the end of the lock, together
# std::fs::remove_dir_all(&dir).ok();
# Ok(()) }
```"#
);

impl SqliteBackend {
    /// Opens (creating when missing) the database file of a `sqlite:` URL with a pool of
    /// its own, in WAL mode with the options' busy timeout, and prepares the lock table.
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] for a malformed URL; [`LockError::Unavailable`] or
    /// [`LockError::Backend`] if the file cannot be opened or the table prepared.
    pub async fn connect(url: &str, options: SqlOptions) -> Result<Arc<Self>, LockError> {
        let (connect, options) = crate::config::url::sqlite(url, options)?;
        let connect = connect
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(options.busy_timeout);
        let in_memory = url.contains(":memory:") || url.contains("mode=memory");
        let mut pool = SqlitePoolOptions::new()
            .max_connections(options.max_connections)
            .acquire_timeout(options.acquire_timeout)
            .test_before_acquire(false);
        if in_memory {
            // The database lives only as long as a connection to it.
            pool = pool
                .min_connections(1)
                .idle_timeout(None)
                .max_lifetime(None);
        }
        let file = database_name(&connect);
        let open = || pool.clone().connect_with(connect.clone());
        let pool = retry(
            &OPEN_RETRY,
            "sqlite database busy while opening",
            open,
            is_busy,
        )
        .await
        .map_err(|e| {
            file::denied(connect.get_filename(), &e).unwrap_or_else(|| {
                failure(Lite::NAME, Failure::new(format!("cannot open {file}"), e))
            })
        })?;
        Self::from_pool(pool, options).await
    }

    /// Uses an existing pool (so an application shares its own). The pool's settings are
    /// kept; for a file shared with other processes give it WAL mode, a busy timeout and
    /// `test_before_acquire(false)`, as [`connect`](Self::connect) does.
    ///
    /// # Errors
    ///
    /// If the lock table cannot be created or was created by a newer version.
    pub async fn from_pool(pool: SqlitePool, options: SqlOptions) -> Result<Arc<Self>, LockError> {
        let table = options.table.as_str();
        let file = SqliteFile::new(pool);
        if options.migrate {
            migrate(&file, table).await?;
        }
        let store = Store::new(file, statements(table), options.gc_grace);
        let in_transaction = TransactionStatements::new(table);
        Ok(Arc::new(SqliteBackend(
            SqlBackend::new(store, Arc::new(Waiters::new(Pace::LOCAL))),
            in_transaction,
        )))
    }

    /// The pool this backend uses.
    pub fn pool(&self) -> &SqlitePool {
        &self.0.runner().pool
    }
}
