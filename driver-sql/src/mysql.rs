//! MySQL and MariaDB: a lock table with a byte-exact key, one `INSERT … ON DUPLICATE KEY
//! UPDATE` per acquisition whose outcome comes back through `LAST_INSERT_ID(…)`, and
//! polling waiters.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lockcore::{
    AcquireOutcome, Capabilities, ClockSource, Contention, ExtendOutcome, FencingGuarantee, Grant,
    LockBackend, LockError, LockInfo, LockKey, Owner, ReleaseOutcome, WaitHint,
};
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlPool, MySqlPoolOptions};
use sqlx::{AssertSqlSafe, MySql, Row};

use crate::common::{
    check_version, map_err, micros, token, ttl_micros, GcTimer, SqlOptions, GC_BATCH,
    SCHEMA_VERSION,
};
use crate::conns::{run_on, Connections, Endpoint};
use crate::poll::{KeyState, Probe, Waiters};

const NAME: &str = "mysql";

/// What the MySQL/MariaDB backend declares: clock-assisted fencing, no release
/// notifications (waiters poll; releases through the same backend wake its own waiters at
/// once), expiry judged by the server's clock.
pub const MYSQL_CAPABILITIES: Capabilities = Capabilities::new(FencingGuarantee::ClockAssisted)
    .with_notifications(false)
    .with_clock(ClockSource::Store);

/// The server's UTC clock, evaluated once per statement. `NOW()` would follow the session
/// time zone of a pool the application may have configured differently.
const NOW: &str = "UTC_TIMESTAMP(6)";
const NOW_US: &str = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))";

/// Marks a refused acquisition in the value `LAST_INSERT_ID` carries back: the holder's
/// remaining microseconds are added to it. Tokens (microseconds since 1970) stay far below.
const HELD_MARK: u64 = 1 << 62;

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
/// # Examples
///
/// ```no_run
/// # #[tokio::main] async fn main() -> Result<(), lockcore::LockError> {
/// use driver_sql::{SqlOptions, mysql::MySqlBackend};
/// use lockcore::LockClient;
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
pub struct MySqlBackend {
    store: Arc<Store>,
    waiters: Arc<Waiters>,
}

#[derive(Debug)]
struct Store {
    conns: Arc<Connections<MySql>>,
    sql: Statements,
    gc: GcTimer,
}

#[derive(Debug)]
struct Statements {
    acquire: Arc<str>,
    state: Arc<str>,
    extend: Arc<str>,
    release: Arc<str>,
    force_release: Arc<str>,
    gc: Arc<str>,
}

impl Statements {
    fn new(t: &str) -> Self {
        Statements {
            // MySQL applies ON DUPLICATE KEY UPDATE assignments left to right, each seeing
            // the columns already assigned: `fence`, `label` and `owner` decide on the old
            // row; `expires_at` then sees the new owner, which is ours exactly when the row
            // was taken or re-granted. Every path calls LAST_INSERT_ID(expr) once, last:
            // the token, or HELD_MARK + the holder's remaining microseconds.
            acquire: format!(
                "INSERT INTO {t} (lock_key, owner, label, fence, expires_at) \
                 VALUES (?, ?, ?, LAST_INSERT_ID({NOW_US}), {NOW} + INTERVAL ? MICROSECOND) \
                 ON DUPLICATE KEY UPDATE \
                   fence = IF(expires_at <= {NOW}, \
                              LAST_INSERT_ID(GREATEST(fence + 1, {NOW_US})), \
                              IF(owner = VALUES(owner), \
                                 LAST_INSERT_ID(fence), \
                                 fence + 0 * LAST_INSERT_ID({HELD_MARK} + \
                                   GREATEST(0, TIMESTAMPDIFF(MICROSECOND, {NOW}, expires_at))))), \
                   label = IF(expires_at <= {NOW}, VALUES(label), label), \
                   owner = IF(expires_at <= {NOW}, VALUES(owner), owner), \
                   expires_at = IF(owner = VALUES(owner), \
                                   GREATEST(expires_at, VALUES(expires_at)), expires_at)"
            )
            .into(),
            state: format!(
                "SELECT label, fence, TIMESTAMPDIFF(MICROSECOND, {NOW}, expires_at) FROM {t} \
                 WHERE lock_key = ? AND expires_at > {NOW}"
            )
            .into(),
            extend: format!(
                "UPDATE {t} SET fence = LAST_INSERT_ID(fence), \
                   expires_at = GREATEST(expires_at, {NOW} + INTERVAL ? MICROSECOND) \
                 WHERE lock_key = ? AND owner = ? AND expires_at > {NOW}"
            )
            .into(),
            // The row stays, expired, so the next holder's token counts up from it.
            release: format!(
                "UPDATE {t} SET expires_at = '1970-01-01 00:00:00' \
                 WHERE lock_key = ? AND owner = ? AND expires_at > {NOW}"
            )
            .into(),
            force_release: format!(
                "UPDATE {t} SET expires_at = '1970-01-01 00:00:00' \
                 WHERE lock_key = ? AND expires_at > {NOW}"
            )
            .into(),
            gc: format!(
                "DELETE FROM {t} WHERE expires_at <= {NOW} AND fence < {NOW_US} - ? \
                 LIMIT {GC_BATCH}"
            )
            .into(),
        }
    }
}

impl Statements {
    /// Every statement, for preparing on each new connection.
    fn all(&self) -> Vec<Arc<str>> {
        [
            &self.acquire,
            &self.state,
            &self.extend,
            &self.release,
            &self.force_release,
            &self.gc,
        ]
        .into_iter()
        .cloned()
        .collect()
    }
}

/// Prepares every statement on `conn` (sqlx caches them per connection), so that each
/// operation is one round trip from its first use: a statement's first use would otherwise
/// wait for a prepare round trip before it runs. Only called once the table exists;
/// failures are left to the statement's own use to report.
async fn prepare_all(conn: &mut MySqlConnection, statements: &[Arc<str>]) {
    use sqlx::{Executor, SqlSafeStr};
    for statement in statements {
        if let Err(e) = conn
            .prepare(AssertSqlSafe(statement.clone()).into_sql_str())
            .await
        {
            tracing::debug!(error = %lockcore::ErrorChain(&e), "preparing a lock statement failed");
        }
    }
}

/// Where `options` connect, for errors and the connection probe.
fn endpoint(options: &MySqlConnectOptions) -> Endpoint {
    match options.get_socket() {
        Some(path) => Endpoint::Socket(path.clone()),
        None => Endpoint::Tcp {
            host: options.get_host().to_owned(),
            port: options.get_port(),
        },
    }
}

fn sql(s: &Arc<str>) -> AssertSqlSafe<Arc<str>> {
    AssertSqlSafe(s.clone())
}

impl MySqlBackend {
    /// Connects with a pool of its own (`test_before_acquire` off) and prepares the lock
    /// table. Accepts `mysql://` and `mariadb://`; TLS options (`ssl-mode`, `ssl-ca`, …) pass
    /// through the URL.
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] for a malformed URL; [`LockError::Unavailable`] if the server
    /// cannot be reached: at once when it refuses the connection (`cannot connect to
    /// HOST:PORT`, the I/O error as the source), after the options' acquire timeout when
    /// it does not answer; [`LockError::Backend`] if it refuses the session
    /// (authentication) or the table cannot be created.
    pub async fn connect(url: &str, options: SqlOptions) -> Result<Arc<Self>, LockError> {
        let (connect, options) = crate::url::mysql(url, options)?;
        let statements = Arc::new(Statements::new(options.table.as_str()).all());
        // Statements are prepared on each new connection once the table exists (see
        // `build`); the pool connects lazily, its first connection made by `build` through
        // the backend's own connection handling, which says why it cannot connect at once.
        let table_ready = Arc::new(AtomicBool::new(false));
        let ready = table_ready.clone();
        let endpoint = endpoint(&connect);
        let pool = MySqlPoolOptions::new()
            .max_connections(options.max_connections)
            .acquire_timeout(options.acquire_timeout)
            .test_before_acquire(false)
            .after_connect(move |conn, _| {
                let statements = statements.clone();
                let ready = ready.load(Ordering::Acquire);
                Box::pin(async move {
                    if ready {
                        prepare_all(conn, &statements).await;
                    }
                    Ok(())
                })
            })
            .connect_lazy_with(connect);
        Self::build(pool, options, endpoint, Some(table_ready)).await
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
        Self::build(pool, options, endpoint, None).await
    }

    /// `table_ready`: set for a pool of the backend's own (see [`connect`](Self::connect))
    /// once its statements can be prepared on new connections.
    async fn build(
        pool: MySqlPool,
        options: SqlOptions,
        endpoint: Endpoint,
        table_ready: Option<Arc<AtomicBool>>,
    ) -> Result<Arc<Self>, LockError> {
        let owned = table_ready.is_some();
        let table = options.table.as_str();
        let sql = Statements::new(table);
        let kept = options.kept_connections(pool.options().get_max_connections(), owned);
        let conns = Connections::new(pool, kept, NAME, endpoint);
        // A pool of our own is connected now (so a server that is down shows at once); a
        // pool passed in is used as the application set it up.
        if options.migrate || owned {
            let mut lease = conns.lease().await?;
            let result = if options.migrate {
                migrate(lease.connection(), table).await
            } else {
                Ok(())
            };
            if let Some(ready) = &table_ready {
                ready.store(result.is_ok(), Ordering::Release);
            }
            if result.is_ok() {
                prepare_all(lease.connection(), &sql.all()).await;
            }
            lease.settle(&Ok::<(), sqlx::Error>(()));
            result?;
        }
        Ok(Arc::new(MySqlBackend {
            store: Arc::new(Store {
                conns,
                sql,
                gc: GcTimer::new(options.gc_grace),
            }),
            waiters: Arc::new(Waiters::default()),
        }))
    }

    /// The pool this backend uses.
    pub fn pool(&self) -> &MySqlPool {
        self.store.conns.pool()
    }
}

async fn migrate(conn: &mut MySqlConnection, t: &str) -> Result<(), LockError> {
    let err = |e| map_err(NAME, e);
    let version_sql = format!("SELECT version FROM {t}_schema WHERE id = 1");
    // Look before reading the version: a query on a missing table would be an error logged
    // on every first start.
    let exists: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.tables \
         WHERE table_schema = DATABASE() AND table_name = ?",
    )
    .bind(format!("{t}_schema"))
    .fetch_one(&mut *conn)
    .await
    .map_err(err)?;
    if exists > 0 {
        let version: Option<i64> = sqlx::query_scalar(AssertSqlSafe(version_sql.clone()))
            .fetch_optional(&mut *conn)
            .await
            .map_err(err)?;
        if let Some(version) = version {
            return check_version(t, version);
        }
    }
    // Serialise concurrent migrations of this table (the lock ends with the session, or
    // is released below).
    sqlx::query("SELECT GET_LOCK(CONCAT('distlock:', ?), 30)")
        .bind(t)
        .execute(&mut *conn)
        .await
        .map_err(err)?;
    let ddl = [
        format!(
            "CREATE TABLE IF NOT EXISTS {t} (\
               lock_key VARBINARY(255) NOT NULL PRIMARY KEY, \
               owner BINARY(16) NOT NULL, \
               label VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, \
               fence BIGINT NOT NULL, \
               expires_at DATETIME(6) NOT NULL\
             ) ENGINE=InnoDB"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {t}_schema (\
               id INT NOT NULL PRIMARY KEY, version BIGINT NOT NULL) ENGINE=InnoDB"
        ),
        format!("INSERT IGNORE INTO {t}_schema (id, version) VALUES (1, {SCHEMA_VERSION})"),
    ];
    let mut result = Ok(());
    for statement in ddl {
        if let Err(e) = sqlx::query(AssertSqlSafe(statement))
            .execute(&mut *conn)
            .await
        {
            result = Err(err(e));
            break;
        }
    }
    let _ = sqlx::query("SELECT RELEASE_LOCK(CONCAT('distlock:', ?))")
        .bind(t)
        .execute(&mut *conn)
        .await;
    result?;
    let version: i64 = sqlx::query_scalar(AssertSqlSafe(version_sql))
        .fetch_one(&mut *conn)
        .await
        .map_err(err)?;
    check_version(t, version)
}

impl Store {
    async fn state(&self, key: &LockKey) -> Result<Option<(String, i64, i64)>, LockError> {
        let row = run_on!(NAME, &self.conns, |conn| sqlx::query(sql(&self.sql.state))
            .bind(key.as_bytes())
            .fetch_optional(conn))
        .await?;
        row.map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?)))
            .transpose()
            .map_err(|e: sqlx::Error| map_err(NAME, e))
    }

    fn collect_garbage(self: &Arc<Self>) {
        if !self.gc.due() {
            return;
        }
        let store = self.clone();
        tokio::spawn(async move {
            match store.collect().await {
                Ok(rows) => tracing::debug!(rows, "mysql lock rows collected"),
                Err(e) => {
                    tracing::debug!(error = %lockcore::ErrorChain(&e), "mysql lock garbage collection failed")
                }
            }
        });
    }

    /// Deletes expired rows in batches. Each batch runs READ COMMITTED (for that one
    /// transaction only, so a shared pool's sessions keep their level): the scan then locks
    /// only the rows it deletes, not every row and gap it passes, which under REPEATABLE
    /// READ would block acquisitions of other keys while it runs.
    async fn collect(&self) -> Result<u64, sqlx::Error> {
        let grace = self.gc.grace_micros();
        let mut conn = self.conns.pool().acquire().await?;
        let mut total = 0;
        loop {
            sqlx::query("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
                .execute(&mut *conn)
                .await?;
            let done = sqlx::query(sql(&self.sql.gc))
                .bind(grace)
                .execute(&mut *conn)
                .await?;
            total += done.rows_affected();
            if done.rows_affected() < GC_BATCH {
                return Ok(total);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Probe for Store {
    fn probe<'a>(
        &'a self,
        key: &'a LockKey,
    ) -> Pin<Box<dyn Future<Output = Result<KeyState, LockError>> + Send + 'a>> {
        Box::pin(async move {
            Ok(match self.state(key).await? {
                None => KeyState::Free,
                Some((_, fence, remaining)) => KeyState::Held {
                    fence,
                    remaining: micros(remaining),
                },
            })
        })
    }
}

#[async_trait]
impl LockBackend for MySqlBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn capabilities(&self) -> Capabilities {
        MYSQL_CAPABILITIES
    }

    async fn try_acquire(
        &self,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<AcquireOutcome, LockError> {
        let s = &self.store;
        let done = run_on!(NAME, &s.conns, |conn| sqlx::query(sql(&s.sql.acquire))
            .bind(key.as_bytes())
            .bind(owner.token().as_bytes().as_slice())
            .bind(owner.label())
            .bind(ttl_micros(ttl))
            .execute(conn))
        .await?;
        let outcome = done.last_insert_id();
        Ok(if outcome >= HELD_MARK {
            let remaining = i64::try_from(outcome - HELD_MARK).unwrap_or(i64::MAX);
            AcquireOutcome::Held(Contention::new(Some(micros(remaining))))
        } else {
            AcquireOutcome::Acquired(Grant::new(token(i64::try_from(outcome).unwrap_or(0)), ttl))
        })
    }

    async fn release(&self, key: &LockKey, owner: &Owner) -> Result<ReleaseOutcome, LockError> {
        let s = &self.store;
        let done = run_on!(NAME, &s.conns, |conn| sqlx::query(sql(&s.sql.release))
            .bind(key.as_bytes())
            .bind(owner.token().as_bytes().as_slice())
            .execute(conn))
        .await?;
        s.collect_garbage();
        if done.rows_affected() == 0 {
            return Ok(ReleaseOutcome::NotHeld);
        }
        self.waiters.notifier.notify_one(key);
        Ok(ReleaseOutcome::Released)
    }

    async fn extend(
        &self,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<ExtendOutcome, LockError> {
        let s = &self.store;
        let done = run_on!(NAME, &s.conns, |conn| sqlx::query(sql(&s.sql.extend))
            .bind(ttl_micros(ttl))
            .bind(key.as_bytes())
            .bind(owner.token().as_bytes().as_slice())
            .execute(conn))
        .await?;
        Ok(if done.rows_affected() == 0 {
            ExtendOutcome::NotHeld
        } else {
            let fence = i64::try_from(done.last_insert_id()).unwrap_or(0);
            ExtendOutcome::Extended(Grant::new(token(fence), ttl))
        })
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        Ok(self
            .store
            .state(key)
            .await?
            .map(|(label, fence, remaining)| {
                LockInfo::new(label, token(fence), Some(micros(remaining)))
            }))
    }

    async fn wait_released(
        &self,
        key: &LockKey,
        _hint: &WaitHint,
        max_wait: Duration,
    ) -> Result<(), LockError> {
        self.waiters.wait(&self.store, key, max_wait).await
    }

    async fn force_release(&self, key: &LockKey) -> Result<ReleaseOutcome, LockError> {
        let s = &self.store;
        let done = run_on!(NAME, &s.conns, |conn| sqlx::query(sql(&s
            .sql
            .force_release))
        .bind(key.as_bytes())
        .execute(conn))
        .await?;
        if done.rows_affected() == 0 {
            return Ok(ReleaseOutcome::NotHeld);
        }
        self.waiters.notifier.notify_one(key);
        Ok(ReleaseOutcome::Released)
    }

    async fn shutdown(&self) {
        self.store.conns.close();
        self.store.conns.pool().close().await;
    }
}
