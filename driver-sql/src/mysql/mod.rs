//! MySQL and MariaDB: a lock table with a byte-exact key, one `INSERT … ON DUPLICATE KEY
//! UPDATE` per acquisition whose outcome comes back through `LAST_INSERT_ID(…)`, and
//! polling waiters.

mod migrate;
mod statements;
mod transaction;

use std::sync::Arc;
use std::time::Duration;

use lockcore::driver::{Capabilities, ClockSource, Fairness, FencingGuarantee};
use lockcore::LockError;
use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlQueryResult};
use sqlx::MySql;

use crate::backend::lock::Store;
use crate::backend::{lock_backend, SqlBackend};
use crate::config::SqlOptions;
use crate::conns::{Connections, Endpoint};
use crate::dialect::{BatchLimit, Dialect, Upsert};
use crate::gc::Collect;
use crate::open::{open, own_pool_options};
use crate::transaction::transaction_locks;
use crate::wait::poll::Waiters;
use statements::statements;
use transaction::TransactionStatements;

/// What the MySQL/MariaDB backend declares: clock-assisted fencing, shared claims (read-write
/// locks and semaphores), no release
/// notifications (waiters poll; releases through the same backend wake its own waiters at
/// once), expiry judged by the server's clock, bounded fairness (a long wait
/// marks the key as its next turn, see
/// [`ClaimRequest::waited`](lockcore::driver::ClaimRequest::waited)).
pub const MYSQL_CAPABILITIES: Capabilities = Capabilities::new(FencingGuarantee::ClockAssisted)
    .with_fairness(Fairness::Bounded)
    .with_notifications(false)
    .with_clock(ClockSource::Store)
    .with_claims(true, true)
    .with_batched_renewals(true);

/// Marks a refused acquisition in the value `LAST_INSERT_ID` carries back: the holder's
/// remaining microseconds are added to it. Tokens (microseconds since 1970) stay far below.
const HELD_MARK: u64 = 1 << 62;

/// Marks an acquisition refused for the claim call to decide (leases hold the key, or a
/// reservation lives: the claim call grants its owner). Below [`HELD_MARK`], far above tokens.
const CLAIM_MARK: u64 = 1 << 61;

/// The owner of a key's row while shared leases hold it, as the files spell it: 16 zero
/// bytes, which no random owner token is.
#[cfg(test)]
const MARKER: &str = "X'00000000000000000000000000000000'";

/// The capacity of an exclusive or read-write key, as the files spell it.
#[cfg(test)]
const RW: u64 = lockcore::driver::READ_WRITE_CAPACITY;

/// MySQL's dialect: the acquiring statement reports through `LAST_INSERT_ID(expr)`;
/// statements run on kept connections.
#[derive(Debug)]
pub(crate) struct My;

impl Dialect for My {
    type Run = Arc<Connections<MySql>>;

    const NAME: &'static str = "mysql";
    /// Each batch runs READ COMMITTED (for that one transaction only, so a shared pool's
    /// sessions keep their level): the scan then locks only the rows it deletes, not every
    /// row and gap it passes, which under REPEATABLE READ would block acquisitions of other
    /// keys while it runs.
    const GC: Collect = Collect::Batches(Some("SET TRANSACTION ISOLATION LEVEL READ COMMITTED"));
    const UPSERT: Option<fn(&MySqlQueryResult) -> Upsert> = Some(upsert);
    const BATCH_LIMIT: BatchLimit = BatchLimit::Prefix(max_statement_time);
}

/// MariaDB's limit on the one statement that follows (10.1 and later), in a comment only
/// MariaDB runs: MySQL limits only a `SELECT` (`MAX_EXECUTION_TIME`), so it runs the batch
/// without one, as before.
fn max_statement_time(limit: Duration) -> String {
    let ms = limit.as_millis();
    format!(
        "/*M!100100 SET STATEMENT max_statement_time = {}.{:03} FOR */ ",
        ms / 1000,
        ms % 1000
    )
}

/// The acquiring statement's outcome: the token, or [`HELD_MARK`] + the holder's remaining
/// microseconds.
fn upsert(done: &MySqlQueryResult) -> Upsert {
    let outcome = done.last_insert_id();
    if outcome >= HELD_MARK {
        Upsert::Held(i64::try_from(outcome - HELD_MARK).unwrap_or(i64::MAX))
    } else if outcome >= CLAIM_MARK {
        Upsert::Claim
    } else {
        Upsert::Granted(i64::try_from(outcome).unwrap_or(0))
    }
}

/// The sessions of a backend's own pool wait at most 1 s (the least InnoDB counts) for a
/// row's lock: a claim of a key a transaction holds (`lock_in`) then answers the key held
/// instead of waiting for the transaction's end. A claim waits for another claim's row lock
/// for a round trip or two.
const SESSION: &str = "SET SESSION innodb_lock_wait_timeout = 1";

/// A lock table in MySQL or MariaDB.
///
/// Keys are `VARBINARY(255)`: compared byte for byte, so `A`, `a` and `a ` stay three
/// locks whatever the server's default collation. Times are `DATETIME(6)` in UTC from
/// `UTC_TIMESTAMP(6)`. Each operation is one statement; the acquiring upsert reports its
/// outcome and the token through `LAST_INSERT_ID(expr)` in the same round trip (sqlx reports
/// matched rather than changed rows, and there is no `RETURNING` on updates).
///
/// Waiters poll, one poller per key with waiters in this backend, from a few milliseconds
/// up to 100 ms; a release through this backend wakes its own waiters at once.
///
/// On MariaDB the watchdog's batch renewals run under a time limit the server enforces
/// (`SET STATEMENT max_statement_time`, half of what the watchdog allows them), so that a
/// batch it gave up on never keeps a connection busy; MySQL runs them without one.
///
/// # Examples
///
/// ```no_run
/// # extern crate lockcore as distlock_core; // the workspace's name for it
/// # #[tokio::main] async fn main() -> Result<(), distlock_core::LockError> {
/// use distlock_sql::{SqlOptions, mysql::MySqlBackend};
/// use distlock_core::LockClient;
///
/// let backend = MySqlBackend::connect(
///     "mysql://app:secret@db.internal/app?ssl-mode=VERIFY_IDENTITY",
///     SqlOptions::new(),
/// )
/// .await?;
/// let locks = LockClient::new(backend);
/// let guard = locks.lock("invoice:42").acquire().await?;
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct MySqlBackend(SqlBackend<My, Arc<Waiters>>, TransactionStatements);

lock_backend!(MySqlBackend, My, MYSQL_CAPABILITIES);

transaction_locks!(
    MySqlBackend,
    MySql,
    r#"A transfer between two accounts: the lock and the writes commit together.

```no_run
# extern crate lockcore as distlock_core; // the workspace's name for it
# async fn f() -> Result<(), Box<dyn std::error::Error>> {
use std::time::Duration;
use distlock_sql::{SqlOptions, mysql::MySqlBackend};

let locks = MySqlBackend::connect("mysql://app@db.internal/app", SqlOptions::new()).await?;
let mut tx = locks.pool().begin().await?;
let lock = locks.lock_in(&mut tx, "accounts", Duration::from_secs(5)).await?;
let token = i64::try_from(lock.token().0)?;
for (id, delta) in [(1_i64, -100_i64), (2, 100)] {
    let moved = distlock_sql::sqlx::query(
        "UPDATE accounts SET balance = balance + ?, fence = ? WHERE id = ? AND fence <= ?",
    )
    .bind(delta).bind(token).bind(id).bind(token)
    .execute(&mut *tx).await?;
    assert_eq!(moved.rows_affected(), 1, "a later holder wrote first");
}
tx.commit().await?; // the writes and the end of the lock, together
# Ok(()) }
```"#
);

/// Where `options` connect, for errors and the connection probe.
fn endpoint(options: &MySqlConnectOptions) -> Endpoint {
    Endpoint::new(
        options.get_socket().cloned(),
        options.get_host(),
        options.get_port(),
    )
}

impl MySqlBackend {
    /// Connects with a pool of its own (`test_before_acquire` off) and prepares the lock
    /// table. Accepts `mysql://` and `mariadb://`; TLS options (`ssl-mode`, `ssl-ca`, …) pass
    /// through the URL.
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] for a malformed URL; [`LockError::Unavailable`] if the server
    /// cannot be reached (`mysql at HOST:PORT is unavailable`): at once when it refuses
    /// the connection (`cannot connect`, the I/O error as the source), after the options' acquire timeout when
    /// it does not answer; [`LockError::Backend`] if it refuses the session
    /// (authentication) or the table cannot be created.
    pub async fn connect(url: &str, options: SqlOptions) -> Result<Arc<Self>, LockError> {
        let (connect, options) = crate::config::url::mysql(url, options)?;
        let endpoint = endpoint(&connect);
        let pool = own_pool_options::<MySql>(&options)
            .after_connect(|conn, _| {
                Box::pin(async move {
                    sqlx::Executor::execute(&mut *conn, SESSION).await?;
                    Ok(())
                })
            })
            .connect_lazy_with(connect);
        Self::build(pool, options, endpoint, true).await
    }

    /// Uses an existing pool, so an application shares its own. Give it
    /// `test_before_acquire(false)`: sqlx's ping before every use costs a round trip per
    /// lock operation; see [`SqlOptions::keep_connections`] for the ping after every use.
    /// The session time zone does not matter (all times are UTC).
    ///
    /// # Errors
    ///
    /// If the lock table cannot be created or was created by a newer version.
    pub async fn from_pool(pool: MySqlPool, options: SqlOptions) -> Result<Arc<Self>, LockError> {
        let endpoint = endpoint(&pool.connect_options());
        Self::build(pool, options, endpoint, false).await
    }

    /// `owned`: the backend opened the pool itself (see [`connect`](Self::connect)).
    async fn build(
        pool: MySqlPool,
        options: SqlOptions,
        endpoint: Endpoint,
        owned: bool,
    ) -> Result<Arc<Self>, LockError> {
        let sql = statements(options.table.as_str());
        let conns = open(pool, &options, My::NAME, endpoint, owned, migrate::migrate).await?;
        let store = Store::new(conns, sql, options.gc_grace);
        let in_transaction = TransactionStatements::new(options.table.as_str());
        Ok(Arc::new(MySqlBackend(
            SqlBackend::new(store, Arc::new(Waiters::default())),
            in_transaction,
        )))
    }

    /// The pool this backend uses.
    pub fn pool(&self) -> &MySqlPool {
        self.0.runner().pool()
    }
}
