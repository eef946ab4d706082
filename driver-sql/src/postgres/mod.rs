//! PostgreSQL: a lock table, `INSERT … ON CONFLICT … DO UPDATE … WHERE … RETURNING`, and
//! `LISTEN`/`NOTIFY` to wake waiters.

mod listen;
mod migrate;
mod statements;
mod transaction;

use std::sync::Arc;
use std::time::Duration;

use lockcore::driver::{Capabilities, ClockSource, Fairness, FencingGuarantee};
use lockcore::LockError;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::Postgres;

use crate::backend::lock::{Batches, Store};
use crate::backend::{lock_backend, SqlBackend};
use crate::config::SqlOptions;
use crate::conns::{Connections, Endpoint};
use crate::dialect::{BatchLimit, Dialect};
use crate::gc::Collect;
use crate::open::{open, own_pool};
use crate::transaction::transaction_locks;

use listen::Listener;
use statements::{channel_name, statements};
use transaction::TransactionStatements;

/// What the PostgreSQL backend declares: clock-assisted fencing, shared claims (read-write
/// locks and semaphores), release notifications
/// (`LISTEN`/`NOTIFY`), expiry judged by the server's clock, bounded fairness (a long wait
/// marks the key as its next turn, see
/// [`ClaimRequest::waited`](lockcore::driver::ClaimRequest::waited)).
pub const POSTGRES_CAPABILITIES: Capabilities = Capabilities::new(FencingGuarantee::ClockAssisted)
    .with_fairness(Fairness::Bounded)
    .with_notifications(true)
    .with_clock(ClockSource::Store)
    .with_claims(true, true)
    .with_batched_renewals(true);

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
/// The watchdog's batch renewals run under a time limit the server enforces (half of
/// what the watchdog allows them), so that a batch it gave up on never keeps a connection
/// busy: a backend that opened its pool itself renews on up to two connections of their
/// own, whose sessions carry a 1 s `statement_timeout` (a batch allowed less sets its own
/// in a transaction); over an application's pool each batch sets it in a transaction (two
/// more round trips).
///
/// # Examples
///
/// ```no_run
/// # extern crate lockcore as distlock_core; // the workspace's name for it
/// # #[tokio::main] async fn main() -> Result<(), distlock_core::LockError> {
/// use distlock_sql::{SqlOptions, postgres::PostgresBackend};
/// use distlock_core::LockClient;
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
pub struct PostgresBackend(SqlBackend<Pg, Listener>, TransactionStatements);

lock_backend!(PostgresBackend, Pg, POSTGRES_CAPABILITIES);

transaction_locks!(
    PostgresBackend,
    Postgres,
    r#"A transfer between two accounts: the lock and the writes commit together.

```no_run
# extern crate lockcore as distlock_core; // the workspace's name for it
# async fn f() -> Result<(), Box<dyn std::error::Error>> {
use std::time::Duration;
use distlock_sql::{SqlOptions, postgres::PostgresBackend};

let locks = PostgresBackend::connect("postgres://app@db.internal/app", SqlOptions::new()).await?;
let mut tx = locks.pool().begin().await?;
let lock = locks.lock_in(&mut tx, "accounts", Duration::from_secs(5)).await?;
let token = i64::try_from(lock.token().0)?;
for (id, delta) in [(1_i64, -100_i64), (2, 100)] {
    let moved = distlock_sql::sqlx::query(
        "UPDATE accounts SET balance = balance + $1, fence = $2 WHERE id = $3 AND fence <= $2",
    )
    .bind(delta).bind(token).bind(id)
    .execute(&mut *tx).await?;
    assert_eq!(moved.rows_affected(), 1, "a later holder wrote first");
}
tx.commit().await?; // the writes and the end of the lock, together
# Ok(()) }
```"#
);

/// Where `options` connect, for errors and the connection probe.
fn endpoint(options: &PgConnectOptions) -> Endpoint {
    let socket = options.get_socket();
    let socket = socket.map(|dir| dir.join(format!(".s.PGSQL.{}", options.get_port())));
    Endpoint::new(socket, options.get_host(), options.get_port())
}

/// The owner of a key's row while shared leases hold it, as the files spell it: 16 zero
/// bytes, which no random owner token is.
#[cfg(test)]
const MARKER: &str = "'\\x00000000000000000000000000000000'::bytea";

/// PostgreSQL's dialect: statements that return the fence (`RETURNING`), run on kept
/// connections.
#[derive(Debug)]
pub(crate) struct Pg;

impl Dialect for Pg {
    type Run = Arc<Connections<Postgres>>;

    const NAME: &'static str = "postgres";
    const GC: Collect = Collect::Once;
    const BATCH_LIMIT: BatchLimit = BatchLimit::Transaction(set_local);
}

/// A transaction whose statements run under `limit` (in milliseconds, PostgreSQL's unit
/// for a bare number), opened in one round trip.
fn set_local(limit: Duration) -> String {
    format!("BEGIN; SET LOCAL statement_timeout = {}", limit.as_millis())
}

/// The `statement_timeout` of the batch connections' sessions (see [`Batches`]): a batch of
/// 1,024 renewals takes milliseconds (6 ms on loopback), and the watchdog allows a batch
/// of holds of the default 30 s TTL 7.5 s (its limit, half of that, is above this one, so
/// it runs in one round trip; from a TTL under 8 s the batch sets its own limit).
const BATCH_SESSION_LIMIT: Duration = Duration::from_secs(1);

/// At most this many batch connections, beside the pool (no more than the pool's size): a
/// batch holds one for milliseconds.
const BATCH_CONNECTIONS: u32 = 2;

impl PostgresBackend {
    /// Connects with a pool of its own (`test_before_acquire` off) and prepares the lock
    /// table. TLS options (`sslmode`, `sslrootcert`, …) pass through the URL.
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] for a malformed URL; [`LockError::Unavailable`] if the server
    /// cannot be reached (`postgres at HOST:PORT is unavailable`): at once when it refuses
    /// the connection (`cannot connect`, the I/O error as the source), after the options' acquire timeout when
    /// it does not answer; [`LockError::Backend`] if it refuses the session
    /// (authentication) or the table cannot be created.
    pub async fn connect(url: &str, options: SqlOptions) -> Result<Arc<Self>, LockError> {
        let (connect, options) = crate::config::url::postgres(url, options)?;
        let batches = batch_pool(&connect, &options);
        let pool = own_pool::<Postgres>(connect, &options);
        let listen = (*pool.connect_options()).clone();
        Self::build(pool, listen, options, Some(batches)).await
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

    /// `batches`: the batch renewals' pool of a backend with a pool of its own (see
    /// [`connect`](Self::connect)).
    async fn build(
        pool: PgPool,
        listen: PgConnectOptions,
        options: SqlOptions,
        batches: Option<PgPool>,
    ) -> Result<Arc<Self>, LockError> {
        let table = options.table.as_str();
        let channel = channel_name(table);
        let sql = statements(table);
        let owned = batches.is_some();
        let at = endpoint(&listen);
        let conns = open(pool, &options, Pg::NAME, at, owned, migrate::migrate).await?;
        let mut store = Store::new(conns, sql, options.gc_grace);
        if let Some(pool) = batches {
            let kept = pool.options().get_max_connections() as usize;
            let run = Connections::new(pool, kept, Pg::NAME, endpoint(&listen));
            store = store.batches(Batches {
                run,
                limit: BATCH_SESSION_LIMIT,
            });
        }
        let listener = Listener::new(channel, listen, options.acquire_timeout);
        let in_transaction = TransactionStatements::new(table);
        Ok(Arc::new(PostgresBackend(
            SqlBackend::new(store, listener),
            in_transaction,
        )))
    }

    /// The pool this backend uses.
    pub fn pool(&self) -> &PgPool {
        self.0.runner().pool()
    }
}

/// A pool of [`BATCH_CONNECTIONS`] at most, connecting as `connect` does, whose sessions
/// run under [`BATCH_SESSION_LIMIT`]: batch renewals alone run there (see [`Batches`]).
/// Lazy: opened by the first batch.
fn batch_pool(connect: &PgConnectOptions, options: &SqlOptions) -> PgPool {
    let limit = BATCH_SESSION_LIMIT.as_millis();
    PgPoolOptions::new()
        .max_connections(BATCH_CONNECTIONS.min(options.max_connections))
        .acquire_timeout(options.acquire_timeout)
        .test_before_acquire(false)
        .connect_lazy_with(connect.clone().options([("statement_timeout", limit)]))
}
