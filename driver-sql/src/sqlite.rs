//! SQLite: a lock table in a database file that several processes can share.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lockcore::{
    AcquireOutcome, Capabilities, ClockSource, Contention, ExtendOutcome, FencingGuarantee, Grant,
    LockBackend, LockError, LockInfo, LockKey, Owner, ReleaseOutcome, WaitHint,
};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{AssertSqlSafe, Row};

use crate::common::{
    check_version, failure, is_busy, micros, token, ttl_micros, Failure, GcTimer, SqlOptions,
    GC_BATCH, SCHEMA_VERSION,
};
use crate::poll::{KeyState, Probe, Waiters};

const NAME: &str = "sqlite";

/// What the SQLite backend declares: clock-assisted fencing (tokens are floored by the
/// database file's clock, in milliseconds × 1000), no release notifications (waiters
/// poll; releases through the same backend wake its own waiters at once), expiry judged by
/// the clock SQLite reads inside each statement.
pub const SQLITE_CAPABILITIES: Capabilities = Capabilities::new(FencingGuarantee::ClockAssisted)
    .with_notifications(false)
    .with_clock(ClockSource::Store);

/// SQLite's own clock in whole microseconds (millisecond resolution). `'now'` is fixed for
/// the duration of one statement step, so every use in a statement sees the same instant.
const NOW_US: &str = "(CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000)";

/// How often a release (or another write) that keeps meeting another process's write is
/// tried again, beyond SQLite's own busy timeout.
const BUSY_RETRIES: u32 = 5;

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
/// # #[tokio::main] async fn main() -> Result<(), lockcore::LockError> {
/// use driver_sql::{SqlOptions, sqlite::SqliteBackend};
/// use lockcore::LockClient;
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
pub struct SqliteBackend {
    store: Arc<Store>,
    waiters: Arc<Waiters>,
}

#[derive(Debug)]
struct Store {
    pool: SqlitePool,
    sql: Statements,
    gc: GcTimer,
    /// `SQLite database PATH`: every error names the file.
    file: Arc<str>,
}

/// How errors name the database of `options`.
fn database_name(options: &SqliteConnectOptions) -> String {
    format!("SQLite database {}", options.get_filename().display())
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
        let now = NOW_US;
        Statements {
            // Take the row if it is free or expired, re-grant it to its owner (same token,
            // expiry never shortened), or change nothing and return no row.
            acquire: format!(
                "INSERT INTO {t} (lock_key, owner, label, fence, expires_at) \
                 VALUES (?1, ?2, ?3, {now}, {now} + ?4) \
                 ON CONFLICT (lock_key) DO UPDATE SET \
                   owner = excluded.owner, \
                   label = CASE WHEN expires_at <= {now} THEN excluded.label ELSE label END, \
                   fence = CASE WHEN expires_at <= {now} THEN MAX(fence + 1, {now}) ELSE fence END, \
                   expires_at = MAX(expires_at, excluded.expires_at) \
                 WHERE expires_at <= {now} OR owner = excluded.owner \
                 RETURNING fence"
            )
            .into(),
            state: format!(
                "SELECT label, fence, expires_at - {now} FROM {t} \
                 WHERE lock_key = ?1 AND expires_at > {now}"
            )
            .into(),
            extend: format!(
                "UPDATE {t} SET expires_at = MAX(expires_at, {now} + ?3) \
                 WHERE lock_key = ?1 AND owner = ?2 AND expires_at > {now} RETURNING fence"
            )
            .into(),
            // Released rows stay (expired) so the next holder's token counts up from this
            // one's; the garbage collector removes them later.
            release: format!(
                "UPDATE {t} SET expires_at = 0 \
                 WHERE lock_key = ?1 AND owner = ?2 AND expires_at > {now}"
            )
            .into(),
            force_release: format!(
                "UPDATE {t} SET expires_at = 0 WHERE lock_key = ?1 AND expires_at > {now}"
            )
            .into(),
            gc: format!(
                "DELETE FROM {t} WHERE lock_key IN (SELECT lock_key FROM {t} \
                 WHERE expires_at <= {now} AND fence < {now} - ?1 LIMIT {GC_BATCH})"
            )
            .into(),
        }
    }
}

fn sql(s: &Arc<str>) -> AssertSqlSafe<Arc<str>> {
    AssertSqlSafe(s.clone())
}

impl SqliteBackend {
    /// Opens (creating when missing) the database file of a `sqlite:` URL with a pool of
    /// its own, in WAL mode with the options' busy timeout, and prepares the lock table.
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] for a malformed URL; [`LockError::Unavailable`] or
    /// [`LockError::Backend`] if the file cannot be opened or the table prepared.
    pub async fn connect(url: &str, options: SqlOptions) -> Result<Arc<Self>, LockError> {
        let (connect, options) = crate::url::sqlite(url, options)?;
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
        let pool = pool
            .connect_with(connect)
            .await
            .map_err(|e| failure(NAME, Failure::new(format!("cannot open {file}"), e)))?;
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
        let file: Arc<str> = database_name(&pool.connect_options()).into();
        if options.migrate {
            migrate(&pool, table, &file).await?;
        }
        Ok(Arc::new(SqliteBackend {
            store: Arc::new(Store {
                pool,
                sql: Statements::new(table),
                gc: GcTimer::new(options.gc_grace),
                file,
            }),
            waiters: Arc::new(Waiters::default()),
        }))
    }

    /// The pool this backend uses.
    pub fn pool(&self) -> &SqlitePool {
        &self.store.pool
    }
}

async fn migrate(pool: &SqlitePool, t: &str, file: &Arc<str>) -> Result<(), LockError> {
    let err = |e| failure(NAME, Failure::new(file.clone(), e));
    let version_sql = format!("SELECT version FROM {t}_schema WHERE id = 1");
    // Look before reading the version: a missing table is not an error to log (and a file
    // that is not a database is reported as such, not taken for one without the table).
    let exists: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?1 COLLATE NOCASE",
    )
    .bind(format!("{t}_schema"))
    .fetch_one(pool)
    .await
    .map_err(err)?;
    let version: Option<i64> = if exists > 0 {
        sqlx::query_scalar(AssertSqlSafe(version_sql.clone()))
            .fetch_optional(pool)
            .await
            .map_err(err)?
    } else {
        None
    };
    let version = match version {
        Some(v) => v,
        None => {
            let ddl = [
                format!(
                    "CREATE TABLE IF NOT EXISTS {t} (\
                       lock_key BLOB NOT NULL PRIMARY KEY, \
                       owner BLOB NOT NULL, \
                       label TEXT NOT NULL, \
                       fence INTEGER NOT NULL, \
                       expires_at INTEGER NOT NULL\
                     ) WITHOUT ROWID"
                ),
                format!(
                    "CREATE TABLE IF NOT EXISTS {t}_schema (\
                       id INTEGER NOT NULL PRIMARY KEY, version INTEGER NOT NULL)"
                ),
                format!(
                    "INSERT OR IGNORE INTO {t}_schema (id, version) VALUES (1, {SCHEMA_VERSION})"
                ),
            ];
            for statement in ddl {
                sqlx::query(AssertSqlSafe(statement))
                    .execute(pool)
                    .await
                    .map_err(err)?;
            }
            sqlx::query_scalar(AssertSqlSafe(version_sql))
                .fetch_one(pool)
                .await
                .map_err(err)?
        }
    };
    check_version(t, version)
}

impl Store {
    /// `e`, naming the database file.
    fn err(&self, e: sqlx::Error) -> LockError {
        failure(NAME, Failure::new(self.file.clone(), e))
    }

    /// Runs one write statement, trying again while another connection (this process's or
    /// another's) keeps the database locked past the busy timeout.
    async fn write<T, F, Fut>(&self, mut op: F) -> Result<T, LockError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, sqlx::Error>>,
    {
        let mut attempt = 0;
        loop {
            match op().await {
                Ok(v) => return Ok(v),
                Err(e) if is_busy(&e) && attempt < BUSY_RETRIES => {
                    attempt += 1;
                    tracing::debug!(attempt, "sqlite database busy; trying again");
                    tokio::time::sleep(Duration::from_millis(5 << attempt)).await;
                }
                Err(e) => return Err(self.err(e)),
            }
        }
    }

    async fn state(&self, key: &LockKey) -> Result<Option<(String, i64, i64)>, LockError> {
        let row = sqlx::query(sql(&self.sql.state))
            .bind(key.as_bytes().to_vec())
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| self.err(e))?;
        row.map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?)))
            .transpose()
            .map_err(|e: sqlx::Error| self.err(e))
    }

    fn collect_garbage(self: &Arc<Self>) {
        if !self.gc.due() {
            return;
        }
        let store = self.clone();
        tokio::spawn(async move {
            match store.collect().await {
                Ok(rows) => tracing::debug!(rows, "sqlite lock rows collected"),
                Err(e) => {
                    tracing::debug!(error = %lockcore::ErrorChain(&e), "sqlite lock garbage collection failed")
                }
            }
        });
    }

    /// Deletes expired rows in batches, so no one statement keeps other writers waiting.
    async fn collect(&self) -> Result<u64, LockError> {
        let grace = self.gc.grace_micros();
        let mut total = 0;
        loop {
            let done = self
                .write(|| {
                    sqlx::query(sql(&self.sql.gc))
                        .bind(grace)
                        .execute(&self.pool)
                })
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
impl LockBackend for SqliteBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn capabilities(&self) -> Capabilities {
        SQLITE_CAPABILITIES
    }

    async fn try_acquire(
        &self,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<AcquireOutcome, LockError> {
        let s = &self.store;
        // The holder can release between the refused upsert and the read of its TTL: then
        // the key is worth another attempt rather than a report of contention.
        for _ in 0..3 {
            let fence: Option<i64> = s
                .write(|| {
                    sqlx::query_scalar(sql(&s.sql.acquire))
                        .bind(key.as_bytes().to_vec())
                        .bind(owner.token().as_bytes().to_vec())
                        .bind(owner.label().to_owned())
                        .bind(ttl_micros(ttl))
                        .fetch_optional(&s.pool)
                })
                .await?;
            if let Some(fence) = fence {
                return Ok(AcquireOutcome::Acquired(Grant::new(token(fence), ttl)));
            }
            if let Some((_, _, remaining)) = s.state(key).await? {
                return Ok(AcquireOutcome::Held(Contention::new(Some(micros(
                    remaining,
                )))));
            }
        }
        Ok(AcquireOutcome::Held(Contention::new(None)))
    }

    async fn release(&self, key: &LockKey, owner: &Owner) -> Result<ReleaseOutcome, LockError> {
        let s = &self.store;
        let done = s
            .write(|| {
                sqlx::query(sql(&s.sql.release))
                    .bind(key.as_bytes().to_vec())
                    .bind(owner.token().as_bytes().to_vec())
                    .execute(&s.pool)
            })
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
        let fence: Option<i64> = s
            .write(|| {
                sqlx::query_scalar(sql(&s.sql.extend))
                    .bind(key.as_bytes().to_vec())
                    .bind(owner.token().as_bytes().to_vec())
                    .bind(ttl_micros(ttl))
                    .fetch_optional(&s.pool)
            })
            .await?;
        Ok(match fence {
            Some(fence) => ExtendOutcome::Extended(Grant::new(token(fence), ttl)),
            None => ExtendOutcome::NotHeld,
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
        let done = s
            .write(|| {
                sqlx::query(sql(&s.sql.force_release))
                    .bind(key.as_bytes().to_vec())
                    .execute(&s.pool)
            })
            .await?;
        if done.rows_affected() == 0 {
            return Ok(ReleaseOutcome::NotHeld);
        }
        self.waiters.notifier.notify_one(key);
        Ok(ReleaseOutcome::Released)
    }

    async fn shutdown(&self) {
        self.store.pool.close().await;
    }
}
