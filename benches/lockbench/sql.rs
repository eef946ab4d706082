//! SQL databases through `driver-sql`: PostgreSQL (`DISTLOCK_TEST_POSTGRES_URL`),
//! MySQL/MariaDB (`DISTLOCK_TEST_MYSQL_URL`) and SQLite (a file under cargo's temp dir).
//! Ours: `LockClient` over the driver's backend with its default options.
//!
//! Baselines, each on a pool of its own with the driver's pool settings (same size,
//! `test_before_acquire(false)`, statements prepared once per connection by sqlx's cache):
//! * `raw` — the plain lease table a careful user writes by hand: one upsert that takes
//!   the row if absent or expired, judged by the database's clock (PostgreSQL and SQLite
//!   `INSERT … ON CONFLICT … DO UPDATE … WHERE … RETURNING`; MySQL `INSERT … ON DUPLICATE
//!   KEY UPDATE` reporting through `LAST_INSERT_ID`), and one owner-checked `DELETE`. No
//!   fencing token, no re-grant to the same owner, no notification.
//! * `raw_held` (PostgreSQL, MySQL) — the `raw` statements on one connection the loop
//!   keeps checked out: sqlx pings every connection handed back to a pool, a second round
//!   trip per statement, which `raw` pays and the driver (keeping connections between
//!   operations) does not. This row is the statements' own time.
//! * `raw_driver` — the driver's own statements (fence bump, re-grant, NOTIFY) called
//!   through the backend's methods without lockcore: the framework's overhead is measured
//!   against it.
//! * `raw_notify` (PostgreSQL) — the plain lock whose release also `NOTIFY`s, and a
//!   hand-written wait: one `LISTEN` session per client that wakes *every* waiter of the
//!   client on each notification. Runs the hand-off case (`handoff_raw_notify`).

use std::sync::Arc;
use std::time::Duration;

use driver_sql::sqlx;
use lockcore::driver::BoxError;
use lockcore::driver::{AcquireOutcome, LockBackendExt};
use lockcore::{LockBackend, LockKey, Owner, ReleaseOutcome};

use crate::target::{RawLock, Target};

#[cfg(any(feature = "postgres", feature = "mysql"))]
fn env_url(var: &str) -> Result<String, BoxError> {
    std::env::var(var)
        .ok()
        .filter(|u| !u.trim().is_empty())
        .ok_or_else(|| {
            format!(
                "{var} is not set: run `scripts/servers.sh start` and export the variables \
                 from target/test-servers.env"
            )
            .into()
        })
}

fn ttl_us(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_micros()).unwrap_or(i64::MAX)
}

/// The driver's own operations, called without lockcore.
async fn driver_acquire(
    b: &Arc<dyn LockBackend>,
    key: &LockKey,
    owner: &Owner,
    ttl: Duration,
) -> Result<bool, BoxError> {
    Ok(matches!(
        b.try_acquire(key, owner, ttl).await?,
        AcquireOutcome::Acquired(_)
    ))
}

async fn driver_release(
    b: &Arc<dyn LockBackend>,
    key: &LockKey,
    owner: &Owner,
) -> Result<bool, BoxError> {
    Ok(b.release(key, owner).await? == ReleaseOutcome::Released)
}

// ---------------------------------------------------------------------------------------
// PostgreSQL
// ---------------------------------------------------------------------------------------

#[cfg(feature = "postgres")]
pub use pg::Postgres;

#[cfg(feature = "postgres")]
mod pg {
    use super::*;
    use sqlx::pool::PoolConnection;
    use sqlx::postgres::{PgConnection, PgListener, PgPool, PgPoolOptions};
    use tokio::sync::{Mutex, Notify};

    const ACQUIRE: &str = "INSERT INTO lockbench_raw AS l (k, owner, expires_at) \
        VALUES ($1, $2, now() + $3::bigint * interval '1 microsecond') \
        ON CONFLICT (k) DO UPDATE SET owner = EXCLUDED.owner, expires_at = EXCLUDED.expires_at \
        WHERE l.expires_at <= now() RETURNING 1";
    const RELEASE: &str = "DELETE FROM lockbench_raw WHERE k = $1 AND owner = $2";
    const RELEASE_NOTIFY: &str =
        "WITH d AS (DELETE FROM lockbench_raw WHERE k = $1 AND owner = $2 \
        RETURNING k) SELECT pg_notify('lockbench_raw_released', encode(k, 'hex')) FROM d";
    const HELD: &str = "SELECT 1 FROM lockbench_raw WHERE k = $1 AND expires_at > now()";

    /// The shared PostgreSQL test server.
    pub struct Postgres {
        url: String,
    }

    async fn pool(url: &str) -> Result<PgPool, BoxError> {
        Ok(PgPoolOptions::new()
            .max_connections(driver_sql::DEFAULT_MAX_CONNECTIONS)
            .test_before_acquire(false)
            .connect(url)
            .await?)
    }

    impl Target for Postgres {
        const NAME: &'static str = "postgres";
        type Raw = PostgresRaw;

        async fn setup() -> Result<Self, BoxError> {
            let url = env_url("DISTLOCK_TEST_POSTGRES_URL")?;
            driver_sql::connect(&url).await?;
            let pool = pool(&url).await?;
            sqlx::query(
                "CREATE TABLE IF NOT EXISTS lockbench_raw (k BYTEA PRIMARY KEY, \
                 owner BYTEA NOT NULL, expires_at TIMESTAMPTZ NOT NULL)",
            )
            .execute(&pool)
            .await?;
            Ok(Postgres { url })
        }

        async fn backend(&self) -> Result<Arc<dyn LockBackend>, BoxError> {
            Ok(driver_sql::connect(&self.url).await?)
        }

        fn url(&self) -> Option<String> {
            Some(self.url.clone())
        }

        async fn raw(&self) -> Result<Vec<(&'static str, PostgresRaw)>, BoxError> {
            Ok(vec![
                ("raw", PostgresRaw::Plain(pool(&self.url).await?)),
                (
                    "raw_held",
                    PostgresRaw::Held(Mutex::new(pool(&self.url).await?.acquire().await?)),
                ),
                (
                    "raw_driver",
                    PostgresRaw::Driver(driver_sql::connect(&self.url).await?),
                ),
                (
                    "raw_notify",
                    PostgresRaw::Notify(NotifyLoop::connect(&self.url).await?),
                ),
            ])
        }
    }

    /// The PostgreSQL baselines.
    pub enum PostgresRaw {
        /// Upsert + owner-checked `DELETE`.
        Plain(PgPool),
        /// The same on one connection kept out of the pool.
        Held(Mutex<PoolConnection<sqlx::Postgres>>),
        /// The driver's statements, called without lockcore.
        Driver(Arc<dyn LockBackend>),
        /// The plain lock, `NOTIFY` on release, a hand-written `LISTEN` wait.
        Notify(NotifyLoop),
    }

    async fn plain_acquire<'c, E>(
        on: E,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<bool, BoxError>
    where
        E: sqlx::Executor<'c, Database = sqlx::Postgres>,
    {
        let row: Option<i32> = sqlx::query_scalar(ACQUIRE)
            .bind(key.as_bytes())
            .bind(owner.token().as_bytes().as_slice())
            .bind(ttl_us(ttl))
            .fetch_optional(on)
            .await?;
        Ok(row.is_some())
    }

    async fn held_release(
        conn: &mut PgConnection,
        key: &LockKey,
        owner: &Owner,
    ) -> Result<bool, BoxError> {
        let done = sqlx::query(RELEASE)
            .bind(key.as_bytes())
            .bind(owner.token().as_bytes().as_slice())
            .execute(conn)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    impl RawLock for PostgresRaw {
        async fn try_acquire(
            &self,
            key: &LockKey,
            owner: &Owner,
            ttl: Duration,
        ) -> Result<bool, BoxError> {
            match self {
                PostgresRaw::Plain(pool) => plain_acquire(pool, key, owner, ttl).await,
                PostgresRaw::Held(conn) => {
                    plain_acquire(&mut **conn.lock().await, key, owner, ttl).await
                }
                PostgresRaw::Notify(n) => plain_acquire(&n.pool, key, owner, ttl).await,
                PostgresRaw::Driver(b) => driver_acquire(b, key, owner, ttl).await,
            }
        }

        async fn release(&self, key: &LockKey, owner: &Owner) -> Result<bool, BoxError> {
            let (pool, statement) = match self {
                PostgresRaw::Plain(pool) => (pool, RELEASE),
                PostgresRaw::Notify(n) => (&n.pool, RELEASE_NOTIFY),
                PostgresRaw::Held(conn) => {
                    return held_release(&mut **conn.lock().await, key, owner).await
                }
                PostgresRaw::Driver(b) => return driver_release(b, key, owner).await,
            };
            let done = sqlx::query(statement)
                .bind(key.as_bytes())
                .bind(owner.token().as_bytes().as_slice())
                .execute(pool)
                .await?;
            Ok(done.rows_affected() == 1)
        }

        fn handoff(&self) -> bool {
            matches!(self, PostgresRaw::Notify(_))
        }

        async fn wait_released(&self, key: &LockKey, max_wait: Duration) -> Result<(), BoxError> {
            match self {
                PostgresRaw::Notify(n) => n.wait_released(key, max_wait).await,
                _ => Err("this baseline does not wait".into()),
            }
        }
    }

    /// One `LISTEN` session per client; every notification wakes every waiter.
    pub struct NotifyLoop {
        pool: PgPool,
        released: Arc<Notify>,
        task: tokio::task::JoinHandle<()>,
    }

    impl Drop for NotifyLoop {
        fn drop(&mut self) {
            self.task.abort();
        }
    }

    impl NotifyLoop {
        async fn connect(url: &str) -> Result<Self, BoxError> {
            let pool = pool(url).await?;
            let mut listener = PgListener::connect(url).await?;
            listener.listen("lockbench_raw_released").await?;
            let released = Arc::new(Notify::new());
            let wake = released.clone();
            let task = tokio::spawn(async move {
                while listener.recv().await.is_ok() {
                    wake.notify_waiters();
                }
            });
            Ok(NotifyLoop {
                pool,
                released,
                task,
            })
        }

        async fn wait_released(&self, key: &LockKey, max_wait: Duration) -> Result<(), BoxError> {
            let notified = self.released.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let held: Option<i32> = sqlx::query_scalar(HELD)
                .bind(key.as_bytes())
                .fetch_optional(&self.pool)
                .await?;
            if held.is_some() {
                let _ = tokio::time::timeout(max_wait, notified).await;
            }
            Ok(())
        }
    }
}

// ---------------------------------------------------------------------------------------
// MySQL / MariaDB
// ---------------------------------------------------------------------------------------

#[cfg(feature = "mysql")]
pub use my::Mysql;

#[cfg(feature = "mysql")]
mod my {
    use super::*;
    use sqlx::mysql::{MySqlPool, MySqlPoolOptions};
    use sqlx::pool::PoolConnection;
    use tokio::sync::Mutex;

    /// `LAST_INSERT_ID` reports the outcome in the same round trip: 1 when the row was
    /// inserted or taken over, 2 when another owner holds it.
    const ACQUIRE: &str = "INSERT INTO lockbench_raw (k, owner, expires_at) \
        VALUES (?, ?, UTC_TIMESTAMP(6) + INTERVAL (? + 0 * LAST_INSERT_ID(1)) MICROSECOND) \
        ON DUPLICATE KEY UPDATE \
          owner = IF(expires_at <= UTC_TIMESTAMP(6), VALUES(owner), owner), \
          expires_at = IF(owner = VALUES(owner), VALUES(expires_at), \
                          expires_at + INTERVAL (0 * LAST_INSERT_ID(2)) MICROSECOND)";
    const RELEASE: &str = "DELETE FROM lockbench_raw WHERE k = ? AND owner = ?";

    /// The shared MySQL/MariaDB test server.
    pub struct Mysql {
        url: String,
    }

    async fn pool(url: &str) -> Result<MySqlPool, BoxError> {
        Ok(MySqlPoolOptions::new()
            .max_connections(driver_sql::DEFAULT_MAX_CONNECTIONS)
            .test_before_acquire(false)
            .connect(url)
            .await?)
    }

    impl Target for Mysql {
        const NAME: &'static str = "mysql";
        type Raw = MysqlRaw;

        async fn setup() -> Result<Self, BoxError> {
            let url = env_url("DISTLOCK_TEST_MYSQL_URL")?;
            driver_sql::connect(&url).await?;
            let pool = pool(&url).await?;
            sqlx::query(
                "CREATE TABLE IF NOT EXISTS lockbench_raw (k VARBINARY(255) PRIMARY KEY, \
                 owner BINARY(16) NOT NULL, expires_at DATETIME(6) NOT NULL) ENGINE=InnoDB",
            )
            .execute(&pool)
            .await?;
            Ok(Mysql { url })
        }

        async fn backend(&self) -> Result<Arc<dyn LockBackend>, BoxError> {
            Ok(driver_sql::connect(&self.url).await?)
        }

        fn url(&self) -> Option<String> {
            Some(self.url.clone())
        }

        async fn raw(&self) -> Result<Vec<(&'static str, MysqlRaw)>, BoxError> {
            Ok(vec![
                ("raw", MysqlRaw::Plain(pool(&self.url).await?)),
                (
                    "raw_held",
                    MysqlRaw::Held(Mutex::new(pool(&self.url).await?.acquire().await?)),
                ),
                (
                    "raw_driver",
                    MysqlRaw::Driver(driver_sql::connect(&self.url).await?),
                ),
            ])
        }
    }

    /// The MySQL baselines.
    pub enum MysqlRaw {
        /// Upsert + owner-checked `DELETE`.
        Plain(MySqlPool),
        /// The same on one connection kept out of the pool.
        Held(Mutex<PoolConnection<sqlx::MySql>>),
        /// The driver's statements, called without lockcore.
        Driver(Arc<dyn LockBackend>),
    }

    impl RawLock for MysqlRaw {
        async fn try_acquire(
            &self,
            key: &LockKey,
            owner: &Owner,
            ttl: Duration,
        ) -> Result<bool, BoxError> {
            let acquire = sqlx::query(ACQUIRE)
                .bind(key.as_bytes())
                .bind(owner.token().as_bytes().as_slice())
                .bind(ttl_us(ttl));
            match self {
                MysqlRaw::Plain(pool) => Ok(acquire.execute(pool).await?.last_insert_id() == 1),
                MysqlRaw::Held(conn) => Ok(acquire
                    .execute(&mut **conn.lock().await)
                    .await?
                    .last_insert_id()
                    == 1),
                MysqlRaw::Driver(b) => driver_acquire(b, key, owner, ttl).await,
            }
        }

        async fn release(&self, key: &LockKey, owner: &Owner) -> Result<bool, BoxError> {
            let release = sqlx::query(RELEASE)
                .bind(key.as_bytes())
                .bind(owner.token().as_bytes().as_slice());
            match self {
                MysqlRaw::Plain(pool) => Ok(release.execute(pool).await?.rows_affected() == 1),
                MysqlRaw::Held(conn) => Ok(release
                    .execute(&mut **conn.lock().await)
                    .await?
                    .rows_affected()
                    == 1),
                MysqlRaw::Driver(b) => driver_release(b, key, owner).await,
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// SQLite
// ---------------------------------------------------------------------------------------

#[cfg(feature = "sqlite")]
pub use lite::Sqlite;

#[cfg(feature = "sqlite")]
mod lite {
    use super::*;
    use std::str::FromStr;

    use sqlx::sqlite::{
        SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
    };

    /// The clock expression is the driver's: SQLite's own clock, in µs, read in the statement.
    const ACQUIRE: &str = "INSERT INTO lockbench_raw (k, owner, expires_at) \
        VALUES (?1, ?2, (CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000) + ?3) \
        ON CONFLICT (k) DO UPDATE SET owner = excluded.owner, expires_at = excluded.expires_at \
        WHERE expires_at <= (CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000) \
        RETURNING 1";

    /// One file for the run, under cargo's temp dir.
    pub struct Sqlite {
        url: String,
    }

    async fn pool(url: &str) -> Result<SqlitePool, BoxError> {
        let options = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(5));
        Ok(SqlitePoolOptions::new()
            .max_connections(driver_sql::DEFAULT_MAX_CONNECTIONS)
            .test_before_acquire(false)
            .connect_with(options)
            .await?)
    }

    impl Target for Sqlite {
        const NAME: &'static str = "sqlite";
        type Raw = SqliteRaw;

        async fn setup() -> Result<Self, BoxError> {
            let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
                .join(format!("lockbench-{}.db", std::process::id()));
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
            }
            let url = format!("sqlite:{}", path.display());
            driver_sql::connect(&url).await?;
            let pool = pool(&url).await?;
            sqlx::query(
                "CREATE TABLE IF NOT EXISTS lockbench_raw (k BLOB PRIMARY KEY, \
                 owner BLOB NOT NULL, expires_at INTEGER NOT NULL) WITHOUT ROWID",
            )
            .execute(&pool)
            .await?;
            Ok(Sqlite { url })
        }

        async fn backend(&self) -> Result<Arc<dyn LockBackend>, BoxError> {
            Ok(driver_sql::connect(&self.url).await?)
        }

        fn url(&self) -> Option<String> {
            Some(self.url.clone())
        }

        async fn raw(&self) -> Result<Vec<(&'static str, SqliteRaw)>, BoxError> {
            Ok(vec![
                ("raw", SqliteRaw::Plain(Box::new(pool(&self.url).await?))),
                (
                    "raw_driver",
                    SqliteRaw::Driver(driver_sql::connect(&self.url).await?),
                ),
            ])
        }
    }

    /// The SQLite baselines.
    pub enum SqliteRaw {
        /// Upsert + owner-checked `DELETE`.
        Plain(Box<SqlitePool>),
        /// The driver's statements, called without lockcore.
        Driver(Arc<dyn LockBackend>),
    }

    impl RawLock for SqliteRaw {
        async fn try_acquire(
            &self,
            key: &LockKey,
            owner: &Owner,
            ttl: Duration,
        ) -> Result<bool, BoxError> {
            match self {
                SqliteRaw::Plain(pool) => {
                    let row: Option<i64> = sqlx::query_scalar(ACQUIRE)
                        .bind(key.as_bytes().to_vec())
                        .bind(owner.token().as_bytes().to_vec())
                        .bind(ttl_us(ttl))
                        .fetch_optional(&**pool)
                        .await?;
                    Ok(row.is_some())
                }
                SqliteRaw::Driver(b) => driver_acquire(b, key, owner, ttl).await,
            }
        }

        async fn release(&self, key: &LockKey, owner: &Owner) -> Result<bool, BoxError> {
            match self {
                SqliteRaw::Plain(pool) => {
                    let done = sqlx::query("DELETE FROM lockbench_raw WHERE k = ?1 AND owner = ?2")
                        .bind(key.as_bytes().to_vec())
                        .bind(owner.token().as_bytes().to_vec())
                        .execute(&**pool)
                        .await?;
                    Ok(done.rows_affected() == 1)
                }
                SqliteRaw::Driver(b) => driver_release(b, key, owner).await,
            }
        }
    }
}
