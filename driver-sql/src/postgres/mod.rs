//! PostgreSQL: a lock table, `INSERT … ON CONFLICT … DO UPDATE … WHERE … RETURNING`, and
//! `LISTEN`/`NOTIFY` to wake waiters.

mod listen;
mod migrate;
mod routines;
mod statements;

use std::sync::Arc;

use lockcore::{Capabilities, ClockSource, Fairness, FencingGuarantee, LockError};
use sqlx::postgres::{PgConnectOptions, PgPool};
use sqlx::Postgres;

use crate::backend::{lock_backend, SqlBackend};
use crate::conns::{Connections, Endpoint};
use crate::dialect::Dialect;
use crate::gc::Collect;
use crate::open::{open, own_pool, TableReady};
use crate::options::SqlOptions;
use crate::store::Store;
use listen::Listener;
use statements::{channel_name, statements};

/// What the PostgreSQL backend declares: clock-assisted fencing, shared claims (read-write
/// locks and semaphores), release notifications
/// (`LISTEN`/`NOTIFY`), expiry judged by the server's clock, bounded fairness (a long wait
/// marks the key as its next turn, see [`lockcore::starving_for`]).
pub const POSTGRES_CAPABILITIES: Capabilities = Capabilities::new(FencingGuarantee::ClockAssisted)
    .with_fairness(Fairness::Bounded)
    .with_notifications(true)
    .with_clock(ClockSource::Store)
    .with_claims(true, true)
    .with_batched_renewals(true);

/// What the backend declares with [`SqlOptions::fair`](crate::SqlOptions::fair): waiters
/// served in arrival order across processes ([`Fairness::Fifo`]), exclusive locks only.
pub const POSTGRES_FAIR_CAPABILITIES: Capabilities = POSTGRES_CAPABILITIES
    .with_fairness(Fairness::Fifo)
    .with_claims(false, false);

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
#[derive(Debug)]
pub struct PostgresBackend(SqlBackend<Pg, Listener>);

lock_backend!(
    PostgresBackend,
    Pg,
    POSTGRES_CAPABILITIES,
    POSTGRES_FAIR_CAPABILITIES
);

/// Where `options` connect, for errors and the connection probe.
fn endpoint(options: &PgConnectOptions) -> Endpoint {
    let socket = options.get_socket();
    let socket = socket.map(|dir| dir.join(format!(".s.PGSQL.{}", options.get_port())));
    Endpoint::new(socket, options.get_host(), options.get_port())
}

/// The owner of a key's row while shared leases hold it: 16 zero bytes, which no random
/// owner token is (a literal for the statements and the functions).
const MARKER: &str = "'\\x00000000000000000000000000000000'::bytea";

/// PostgreSQL's dialect: statements that return the fence (`RETURNING`), run on kept
/// connections.
#[derive(Debug)]
pub(crate) struct Pg;

impl Dialect for Pg {
    type Run = Arc<Connections<Postgres>>;

    const NAME: &'static str = "postgres";
    const GC: Collect = Collect::ONCE;
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
        let sql = statements(table, &channel_name(table));
        let (pool, table_ready) = own_pool::<Postgres>(connect, &options, &sql);
        let listen = (*pool.connect_options()).clone();
        Self::build(pool, listen, options, Some(table_ready)).await
    }

    /// Uses an existing pool, so an application shares its own. Give it
    /// `test_before_acquire(false)`: sqlx's ping before every use costs a round trip per
    /// lock operation; see [`SqlOptions::keep_connections`] for the ping after every use. The
    /// `LISTEN` session is opened with the pool's connect options on a connection of its own.
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
        table_ready: Option<TableReady>,
    ) -> Result<Arc<Self>, LockError> {
        let table = options.table.as_str();
        let channel = channel_name(table);
        let sql = statements(table, &channel);
        let conns = open(
            pool,
            &options,
            Pg::NAME,
            endpoint(&listen),
            table_ready,
            &sql,
            migrate::migrate,
        )
        .await?;
        let listener =
            Listener::new(channel, listen, options.acquire_timeout).waking_everyone(options.fair);
        let store = Store::new(conns, sql, options.gc_grace).fair(options.fair);
        Ok(Arc::new(PostgresBackend(SqlBackend::new(store, listener))))
    }

    /// The pool this backend uses.
    pub fn pool(&self) -> &PgPool {
        self.0.runner().pool()
    }
}
