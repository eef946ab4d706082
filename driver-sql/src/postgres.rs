//! PostgreSQL: a lock table, `INSERT … ON CONFLICT … DO UPDATE … WHERE … RETURNING`, and
//! `LISTEN`/`NOTIFY` to wake waiters.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use lockcore::{
    AcquireOutcome, Capabilities, ClockSource, Contention, ExtendOutcome, FencingGuarantee, Grant,
    LockBackend, LockError, LockInfo, LockKey, Owner, ReleaseNotifier, ReleaseOutcome, WaitHint,
};
use sqlx::postgres::{PgConnectOptions, PgConnection, PgListener, PgPool, PgPoolOptions};
use sqlx::{AssertSqlSafe, Postgres, Row};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::common::{
    check_version, map_err, micros, token, ttl_micros, GcTimer, SqlOptions, SCHEMA_VERSION,
};
use crate::conns::{run_on, Connections, Endpoint};

const NAME: &str = "postgres";

/// What the PostgreSQL backend declares: clock-assisted fencing, release notifications
/// (`LISTEN`/`NOTIFY`), expiry judged by the server's clock.
pub const POSTGRES_CAPABILITIES: Capabilities = Capabilities::new(FencingGuarantee::ClockAssisted)
    .with_notifications(true)
    .with_clock(ClockSource::Store);

/// The server's clock for this statement: fixed for the statement's whole run.
const NOW: &str = "statement_timestamp()";
const NOW_US: &str = "(extract(epoch FROM statement_timestamp()) * 1000000)::bigint";

/// While the listening session is down, waiters re-check at least this often.
const BLIND_POLL: Duration = Duration::from_millis(100);

/// A `LISTEN` session that has been quiet this long is pinged; one that does not answer
/// the ping within [`LISTEN_PING_TIMEOUT`] is replaced.
const LISTEN_PING: Duration = Duration::from_secs(10);
const LISTEN_PING_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a waiter gives a `LISTEN` session that is not ready yet before polling instead.
const LISTEN_READY: Duration = Duration::from_millis(50);

/// A lock table in PostgreSQL.
///
/// Every operation is one statement on a pooled connection (the pool skips sqlx's ping
/// before each use). Waiters are woken by `NOTIFY` on one channel per table, sent by the
/// releasing statement itself, so it is delivered at commit; each backend keeps one
/// `LISTEN` session, opened when something first waits, on a connection of its own
/// (never taken from the lock pool) and wakes its own waiters one at a time.
///
/// `LISTEN` needs a direct session: behind a transaction-pooling proxy (PgBouncer in
/// transaction mode) point the backend's listener at the server, see `docs/sql.md`.
///
/// # Examples
///
/// ```no_run
/// # #[tokio::main] async fn main() -> Result<(), lockcore::LockError> {
/// use driver_sql::{SqlOptions, postgres::PostgresBackend};
/// use lockcore::LockClient;
///
/// let backend = PostgresBackend::connect(
///     "postgres://app:secret@db.internal/app?sslmode=verify-full",
///     SqlOptions::new().table("app_locks")?,
/// )
/// .await?;
/// let locks = LockClient::new(backend);
/// let guard = locks.lock("invoice:42").acquire().await?;
/// guard.release().await?;
/// # Ok(()) }
/// ```
pub struct PostgresBackend {
    conns: Arc<Connections<Postgres>>,
    sql: Statements,
    channel: String,
    gc: GcTimer,
    notifier: Arc<ReleaseNotifier>,
    ready: watch::Sender<bool>,
    listener: Mutex<Option<JoinHandle<()>>>,
    listen: PgConnectOptions,
    acquire_timeout: Duration,
}

impl std::fmt::Debug for PostgresBackend {
    // Not derived: the connect options hold the password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresBackend")
            .field("conns", &self.conns)
            .field("channel", &self.channel)
            .finish_non_exhaustive()
    }
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
    fn new(t: &str, channel: &str) -> Self {
        let ttl = "($4::bigint * interval '1 microsecond')";
        let remaining = format!("(extract(epoch FROM expires_at - {NOW}) * 1000000)::bigint");
        Statements {
            // Take a free or expired row, re-grant it to its owner (same token, expiry never
            // shortened), or leave it and return no row.
            acquire: format!(
                "INSERT INTO {t} AS l (lock_key, owner, label, fence, expires_at) \
                 VALUES ($1, $2, $3, {NOW_US}, {NOW} + {ttl}) \
                 ON CONFLICT (lock_key) DO UPDATE SET \
                   owner = EXCLUDED.owner, \
                   label = CASE WHEN l.expires_at <= {NOW} THEN EXCLUDED.label ELSE l.label END, \
                   fence = CASE WHEN l.expires_at <= {NOW} \
                             THEN GREATEST(l.fence + 1, EXCLUDED.fence) ELSE l.fence END, \
                   expires_at = GREATEST(l.expires_at, EXCLUDED.expires_at) \
                 WHERE l.expires_at <= {NOW} OR l.owner = EXCLUDED.owner \
                 RETURNING l.fence"
            )
            .into(),
            state: format!(
                "SELECT label, fence, {remaining} FROM {t} \
                 WHERE lock_key = $1 AND expires_at > {NOW}"
            )
            .into(),
            extend: format!(
                "UPDATE {t} SET expires_at = GREATEST(expires_at, {NOW} + ($3::bigint * interval '1 microsecond')) \
                 WHERE lock_key = $1 AND owner = $2 AND expires_at > {NOW} RETURNING fence"
            )
            .into(),
            // The row stays, expired, so the next holder's token counts up from it; the
            // NOTIFY goes out when the release commits. The key travels hex-encoded: any
            // key fits the payload limit and the server encoding.
            release: format!(
                "WITH released AS (\
                   UPDATE {t} SET expires_at = 'epoch' \
                   WHERE lock_key = $1 AND owner = $2 AND expires_at > {NOW} RETURNING lock_key) \
                 SELECT pg_notify('{channel}', encode(lock_key, 'hex')) FROM released"
            )
            .into(),
            force_release: format!(
                "WITH released AS (\
                   UPDATE {t} SET expires_at = 'epoch' \
                   WHERE lock_key = $1 AND expires_at > {NOW} RETURNING lock_key) \
                 SELECT pg_notify('{channel}', encode(lock_key, 'hex')) FROM released"
            )
            .into(),
            gc: format!("DELETE FROM {t} WHERE expires_at <= {NOW} AND fence < {NOW_US} - $1")
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
async fn prepare_all(conn: &mut PgConnection, statements: &[Arc<str>]) {
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
fn endpoint(options: &PgConnectOptions) -> Endpoint {
    match options.get_socket() {
        Some(dir) => Endpoint::Socket(dir.join(format!(".s.PGSQL.{}", options.get_port()))),
        None => Endpoint::Tcp {
            host: options.get_host().to_owned(),
            port: options.get_port(),
        },
    }
}

/// The NOTIFY channel of a table's releases.
fn channel_name(table: &str) -> String {
    format!("{table}_released")
}

fn sql(s: &Arc<str>) -> AssertSqlSafe<Arc<str>> {
    AssertSqlSafe(s.clone())
}

impl PostgresBackend {
    /// Connects with a pool of its own (`test_before_acquire` off) and prepares the lock
    /// table. TLS options (`sslmode`, `sslrootcert`, …) pass through the URL.
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] for a malformed URL; [`LockError::Unavailable`] if the server
    /// cannot be reached: at once when it refuses the connection (`cannot connect to
    /// HOST:PORT`, the I/O error as the source), after the options' acquire timeout when
    /// it does not answer; [`LockError::Backend`] if it refuses the session
    /// (authentication) or the table cannot be created.
    pub async fn connect(url: &str, options: SqlOptions) -> Result<Arc<Self>, LockError> {
        let (connect, options) = crate::url::postgres(url, options)?;
        let table = options.table.as_str();
        let statements = Arc::new(Statements::new(table, &channel_name(table)).all());
        // Statements are prepared on each new connection once the table exists: before the
        // migration every one of them would fail ("relation … does not exist").
        let table_ready = Arc::new(AtomicBool::new(false));
        let ready = table_ready.clone();
        // Lazy: the first connection is opened by `build`, through the backend's own
        // connection handling, which reports why it cannot connect (refused, …) at once
        // rather than sqlx's "pool timed out" after the whole acquire timeout.
        let pool = PgPoolOptions::new()
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
        let listen = (*pool.connect_options()).clone();
        Self::build(pool, listen, options, Some(table_ready)).await
    }

    /// Uses an existing pool, so an application shares its own. Give it
    /// `test_before_acquire(false)`: sqlx's ping before every use costs a round trip per
    /// lock operation; see [`SqlOptions::keep_connections`] for the ping after every use. The `LISTEN` session is opened with the pool's connect options on a
    /// connection of its own.
    ///
    /// # Errors
    ///
    /// If the lock table cannot be created or was created by a newer version.
    pub async fn from_pool(pool: PgPool, options: SqlOptions) -> Result<Arc<Self>, LockError> {
        let listen = (*pool.connect_options()).clone();
        Self::from_pool_with_listener(pool, listen, options).await
    }

    /// Like [`from_pool`](Self::from_pool), with the `LISTEN` session opened with `listen`
    /// instead of the pool's options: for a pool behind a transaction-pooling proxy
    /// (PgBouncer in transaction mode), which cannot keep a `LISTEN` — point `listen` at the
    /// server itself (or at a session-mode pool). See `docs/sql.md`.
    ///
    /// # Errors
    ///
    /// If the lock table cannot be created or was created by a newer version.
    pub async fn from_pool_with_listener(
        pool: PgPool,
        listen: PgConnectOptions,
        options: SqlOptions,
    ) -> Result<Arc<Self>, LockError> {
        Self::build(pool, listen, options, None).await
    }

    /// `table_ready`: set for a pool of the backend's own (see [`connect`](Self::connect))
    /// once its statements can be prepared on new connections.
    async fn build(
        pool: PgPool,
        listen: PgConnectOptions,
        options: SqlOptions,
        table_ready: Option<Arc<AtomicBool>>,
    ) -> Result<Arc<Self>, LockError> {
        let owned = table_ready.is_some();
        let table = options.table.as_str();
        let channel = channel_name(table);
        let sql = Statements::new(table, &channel);
        let kept = options.kept_connections(pool.options().get_max_connections(), owned);
        let conns = Connections::new(pool, kept, NAME, endpoint(&listen));
        // A pool of our own is connected now (so a bad URL or a server that is down shows
        // at once); a pool passed in is used as the application set it up.
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
        let (ready, _) = watch::channel(false);
        Ok(Arc::new(PostgresBackend {
            sql,
            channel,
            conns,
            gc: GcTimer::new(options.gc_grace),
            notifier: Arc::new(ReleaseNotifier::new()),
            ready,
            listener: Mutex::new(None),
            listen,
            acquire_timeout: options.acquire_timeout,
        }))
    }

    /// The pool this backend uses.
    pub fn pool(&self) -> &PgPool {
        self.conns.pool()
    }

    async fn state(&self, key: &LockKey) -> Result<Option<(String, i64, i64)>, LockError> {
        let row = run_on!(NAME, &self.conns, |conn| sqlx::query(sql(&self.sql.state))
            .bind(key.as_bytes())
            .fetch_optional(conn))
        .await?;
        row.map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?)))
            .transpose()
            .map_err(|e: sqlx::Error| map_err(NAME, e))
    }

    fn collect_garbage(&self) {
        if !self.gc.due() {
            return;
        }
        let (pool, statement) = (self.conns.pool().clone(), self.sql.gc.clone());
        let grace = self.gc.grace_micros();
        tokio::spawn(async move {
            match sqlx::query(sql(&statement))
                .bind(grace)
                .execute(&pool)
                .await
            {
                Ok(done) => {
                    tracing::debug!(rows = done.rows_affected(), "postgres lock rows collected")
                }
                Err(e) => {
                    tracing::debug!(error = %lockcore::ErrorChain(&e), "postgres lock garbage collection failed")
                }
            }
        });
    }

    /// Starts the `LISTEN` session on first use.
    fn ensure_listener(&self) {
        let mut listener = self.listener.lock().unwrap_or_else(|e| e.into_inner());
        if listener.as_ref().is_some_and(|h| !h.is_finished()) {
            return;
        }
        // A pool of one connection of its own (by default with the lock pool's connect
        // options): the session is never taken from, or returned to, the lock pool.
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(self.acquire_timeout)
            .test_before_acquire(false)
            .idle_timeout(None)
            .max_lifetime(None)
            .connect_lazy_with(self.listen.clone());
        *listener = Some(tokio::spawn(listen(
            pool,
            self.channel.clone(),
            self.notifier.clone(),
            self.ready.clone(),
        )));
    }
}

impl Drop for PostgresBackend {
    fn drop(&mut self) {
        if let Some(handle) = self
            .listener
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            handle.abort();
        }
    }
}

/// The listening session: wakes one local waiter per NOTIFY for its key, and every waiter
/// whenever notifications may have been missed (connected, reconnected).
async fn listen(
    pool: PgPool,
    channel: String,
    notifier: Arc<ReleaseNotifier>,
    ready: watch::Sender<bool>,
) {
    let mut backoff = Duration::from_millis(10);
    let mut lost_once = false;
    loop {
        let listener = async {
            let mut listener = PgListener::connect_with(&pool).await?;
            listener.listen(&channel).await?;
            Ok::<_, sqlx::Error>(listener)
        };
        let mut listener = match listener.await {
            Ok(listener) => listener,
            Err(e) => {
                tracing::debug!(error = %lockcore::ErrorChain(&e), "postgres LISTEN session cannot connect; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
                continue;
            }
        };
        backoff = Duration::from_millis(10);
        // Waiters that subscribed while no session was listening re-check the key after
        // this (they wait for `ready`); only after a loss can a release have been missed.
        let reconnected = ready.send_replace(true) || lost_once;
        if reconnected {
            notifier.notify_everyone();
        }
        loop {
            let received = match tokio::time::timeout(LISTEN_PING, listener.try_recv()).await {
                Ok(received) => received,
                // Quiet for a while: make sure the session is still there. A link that died
                // without a reset would otherwise leave waiters to their holders' TTLs.
                Err(_) => {
                    let ping = sqlx::query("SELECT 1").execute(&mut listener);
                    match tokio::time::timeout(LISTEN_PING_TIMEOUT, ping).await {
                        Ok(Ok(_)) => continue,
                        Ok(Err(e)) => {
                            tracing::debug!(error = %lockcore::ErrorChain(&e), "postgres LISTEN session lost");
                            break;
                        }
                        Err(_) => {
                            tracing::debug!("postgres LISTEN session stopped answering");
                            break;
                        }
                    }
                }
            };
            match received {
                Ok(Some(notification)) => match decode_key(notification.payload()) {
                    Some(key) => notifier.notify_one(&key),
                    None => tracing::debug!("ignoring a malformed lock release notification"),
                },
                // Lost and re-established (sqlx LISTENs again): releases in the gap are
                // unknown.
                Ok(None) => notifier.notify_everyone(),
                Err(e) => {
                    tracing::debug!(error = %lockcore::ErrorChain(&e), "postgres LISTEN session lost");
                    break;
                }
            }
        }
        ready.send_replace(false);
        lost_once = true;
        notifier.notify_everyone();
    }
}

fn decode_key(hex: &str) -> Option<LockKey> {
    if hex.len() % 2 != 0 {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect();
    LockKey::new(String::from_utf8(bytes?).ok()?).ok()
}

async fn migrate(conn: &mut PgConnection, t: &str) -> Result<(), LockError> {
    use sqlx::Connection;
    let err = |e| map_err(NAME, e);
    let version_sql = format!("SELECT version FROM {t}_schema WHERE id = 1");
    // Look before reading the version: a query on a missing table would be an error the
    // server logs, and sqlx with it at debug level, on every first start.
    let exists: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(format!("{t}_schema"))
        .fetch_one(&mut *conn)
        .await
        .map_err(err)?;
    if exists {
        let version: Option<i64> = sqlx::query_scalar(AssertSqlSafe(version_sql.clone()))
            .fetch_optional(&mut *conn)
            .await
            .map_err(err)?;
        if let Some(version) = version {
            return check_version(t, version);
        }
    }
    let mut tx = conn.begin().await.map_err(err)?;
    // Concurrent CREATE TABLE IF NOT EXISTS can still collide in the catalog: serialise
    // the migrations of this table.
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('distlock migration ' || $1))")
        .bind(t)
        .execute(&mut *tx)
        .await
        .map_err(err)?;
    let ddl = [
        format!(
            "CREATE TABLE IF NOT EXISTS {t} (\
               lock_key BYTEA NOT NULL PRIMARY KEY, \
               owner BYTEA NOT NULL, \
               label TEXT NOT NULL, \
               fence BIGINT NOT NULL, \
               expires_at TIMESTAMPTZ NOT NULL)"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {t}_schema (\
               id INTEGER NOT NULL PRIMARY KEY, version BIGINT NOT NULL)"
        ),
        format!(
            "INSERT INTO {t}_schema (id, version) VALUES (1, {SCHEMA_VERSION}) \
             ON CONFLICT (id) DO NOTHING"
        ),
    ];
    for statement in ddl {
        sqlx::query(AssertSqlSafe(statement))
            .execute(&mut *tx)
            .await
            .map_err(err)?;
    }
    let version: i64 = sqlx::query_scalar(AssertSqlSafe(version_sql))
        .fetch_one(&mut *tx)
        .await
        .map_err(err)?;
    tx.commit().await.map_err(err)?;
    check_version(t, version)
}

#[async_trait]
impl LockBackend for PostgresBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn capabilities(&self) -> Capabilities {
        POSTGRES_CAPABILITIES
    }

    async fn try_acquire(
        &self,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<AcquireOutcome, LockError> {
        // The holder can release between the refused upsert and the read of its TTL: then
        // the key is worth another attempt rather than a report of contention.
        for _ in 0..3 {
            let fence: Option<i64> =
                run_on!(NAME, &self.conns, |conn| sqlx::query_scalar(sql(&self
                    .sql
                    .acquire))
                .bind(key.as_bytes())
                .bind(owner.token().as_bytes().as_slice())
                .bind(owner.label())
                .bind(ttl_micros(ttl))
                .fetch_optional(conn))
                .await?;
            if let Some(fence) = fence {
                return Ok(AcquireOutcome::Acquired(Grant::new(token(fence), ttl)));
            }
            if let Some((_, _, remaining)) = self.state(key).await? {
                return Ok(AcquireOutcome::Held(Contention::new(Some(micros(
                    remaining,
                )))));
            }
        }
        Ok(AcquireOutcome::Held(Contention::new(None)))
    }

    async fn release(&self, key: &LockKey, owner: &Owner) -> Result<ReleaseOutcome, LockError> {
        let done = run_on!(NAME, &self.conns, |conn| sqlx::query(sql(&self
            .sql
            .release))
        .bind(key.as_bytes())
        .bind(owner.token().as_bytes().as_slice())
        .execute(conn))
        .await?;
        self.collect_garbage();
        Ok(if done.rows_affected() == 0 {
            ReleaseOutcome::NotHeld
        } else {
            ReleaseOutcome::Released
        })
    }

    async fn extend(
        &self,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<ExtendOutcome, LockError> {
        let fence: Option<i64> = run_on!(NAME, &self.conns, |conn| sqlx::query_scalar(sql(&self
            .sql
            .extend))
        .bind(key.as_bytes())
        .bind(owner.token().as_bytes().as_slice())
        .bind(ttl_micros(ttl))
        .fetch_optional(conn))
        .await?;
        Ok(match fence {
            Some(fence) => ExtendOutcome::Extended(Grant::new(token(fence), ttl)),
            None => ExtendOutcome::NotHeld,
        })
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        Ok(self.state(key).await?.map(|(label, fence, remaining)| {
            LockInfo::new(label, token(fence), Some(micros(remaining)))
        }))
    }

    async fn wait_released(
        &self,
        key: &LockKey,
        _hint: &WaitHint,
        max_wait: Duration,
    ) -> Result<(), LockError> {
        let subscription = self.notifier.subscribe(key);
        self.ensure_listener();
        let mut ready = self.ready.subscribe();
        // A session being opened is ready within a few milliseconds; one that is down is
        // not waited for: the key is polled meanwhile.
        let listening = *ready.borrow()
            || tokio::time::timeout(max_wait.min(LISTEN_READY), ready.wait_for(|r| *r))
                .await
                .is_ok_and(|r| r.is_ok());
        let remaining = match self.state(key).await? {
            None => return Ok(()),
            Some((_, _, remaining)) => micros(remaining),
        };
        let mut bound = max_wait.min(remaining + Duration::from_millis(1));
        if !listening {
            bound = bound.min(BLIND_POLL);
        }
        let _ = tokio::time::timeout(bound, subscription.released()).await;
        Ok(())
    }

    async fn force_release(&self, key: &LockKey) -> Result<ReleaseOutcome, LockError> {
        let done = run_on!(NAME, &self.conns, |conn| sqlx::query(sql(&self
            .sql
            .force_release))
        .bind(key.as_bytes())
        .execute(conn))
        .await?;
        Ok(if done.rows_affected() == 0 {
            ReleaseOutcome::NotHeld
        } else {
            ReleaseOutcome::Released
        })
    }

    async fn shutdown(&self) {
        if let Some(handle) = self
            .listener
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            handle.abort();
        }
        self.conns.close();
        self.conns.pool().close().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_through_hex() {
        let key = LockKey::new("a'b%_\\é日").unwrap();
        let hex: String = key.as_bytes().iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(decode_key(&hex), Some(key));
        assert_eq!(decode_key("6"), None);
        assert_eq!(decode_key("zz"), None);
        assert_eq!(decode_key("00"), None);
    }
}
