//! The pools the PostgreSQL and MySQL backends open themselves, and the sequence every
//! backend over kept connections runs when it is built: connect, migrate, mark the table
//! ready, prepare the statements.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use lockcore::LockError;
use sqlx::pool::PoolOptions;
use sqlx::{Connection, Pool};

use crate::config::SqlOptions;
use crate::conns::{Connections, Endpoint};
use crate::db::{BoxFuture, Db};
use crate::run::Conn;
use crate::store::Statements;

/// Set once a pool's new connections may prepare the statements: when the lock table
/// exists (before, every one of them would fail: "relation … does not exist").
pub(crate) type TableReady = Arc<AtomicBool>;

/// A migration's run.
pub(crate) type Migration<'c> = BoxFuture<'c, Result<(), LockError>>;

/// A migration: creates or checks the lock table (second argument) on a connection.
pub(crate) type Migrate<DB> = for<'c> fn(&'c mut Conn<DB>, &'c str) -> Migration<'c>;

/// A pool of the backend's own, sized and timed by `options`, without sqlx's ping before
/// each use, preparing `statements` on each new connection once the table is ready.
///
/// Lazy: the first connection is opened by [`open`], through the backend's own connection
/// handling, which reports why it cannot connect (refused, …) at once rather than sqlx's
/// "pool timed out" after the whole acquire timeout.
pub(crate) fn own_pool<DB: Db>(
    connect: <DB::Connection as Connection>::Options,
    options: &SqlOptions,
    statements: &Statements,
) -> (Pool<DB>, TableReady) {
    let statements = Arc::new(statements.all());
    let table_ready = Arc::new(AtomicBool::new(false));
    let ready = table_ready.clone();
    let pool = PoolOptions::<DB>::new()
        .max_connections(options.max_connections)
        .acquire_timeout(options.acquire_timeout)
        .test_before_acquire(false)
        .after_connect(move |conn, _| {
            let statements = statements.clone();
            let ready = ready.load(Ordering::Acquire);
            Box::pin(async move {
                if ready {
                    prepare_all::<DB>(conn, &statements).await;
                }
                Ok(())
            })
        })
        .connect_lazy_with(connect);
    (pool, table_ready)
}

/// The connections of a backend over `pool`. `table_ready`: set for a pool of the backend's
/// own (see [`own_pool`]); such a pool is connected now, so a bad URL or a server that is
/// down shows at once, while a pool passed in is used as the application set it up.
pub(crate) async fn open<DB: Db>(
    pool: Pool<DB>,
    options: &SqlOptions,
    name: &'static str,
    endpoint: Endpoint,
    table_ready: Option<TableReady>,
    statements: &Statements,
    migrate: Migrate<DB>,
) -> Result<Arc<Connections<DB>>, LockError> {
    let owned = table_ready.is_some();
    let kept = options.kept_connections(pool.options().get_max_connections(), owned);
    let conns = Connections::new(pool, kept, name, endpoint);
    if options.migrate || owned {
        let mut lease = conns.lease().await?;
        let result = if options.migrate {
            migrate(lease.connection(), options.table.as_str()).await
        } else {
            Ok(())
        };
        if let Some(ready) = &table_ready {
            ready.store(result.is_ok(), Ordering::Release);
        }
        if result.is_ok() {
            prepare_all::<DB>(lease.connection(), &statements.all()).await;
        }
        lease.settle(&Ok::<(), sqlx::Error>(()));
        result?;
    }
    Ok(conns)
}

/// Prepares every statement on `conn` (sqlx caches them per connection), so that each
/// operation is one round trip from its first use: a statement's first use would otherwise
/// wait for a prepare round trip before it runs. Only called once the table exists;
/// failures are left to the statement's own use to report.
async fn prepare_all<DB: Db>(conn: &mut Conn<DB>, statements: &[Arc<str>]) {
    for statement in statements {
        if let Err(e) = DB::prepare(conn, statement).await {
            tracing::debug!(error = %lockcore::ErrorChain(&e), "preparing a lock statement failed");
        }
    }
}
