//! The pools the PostgreSQL and MySQL backends open themselves, and the sequence every
//! backend over kept connections runs when it is built: connect, migrate.

use std::sync::Arc;

use lockcore::LockError;
use sqlx::pool::PoolOptions;
use sqlx::{Connection, Pool};

use crate::config::SqlOptions;
use crate::conns::{Connections, Endpoint};
use crate::db::{BoxFuture, Db};
use crate::run::Conn;

/// A migration's run.
pub(crate) type Migration<'c> = BoxFuture<'c, Result<(), LockError>>;

/// A migration: creates or checks the lock table (second argument) on a connection.
pub(crate) type Migrate<DB> = for<'c> fn(&'c mut Conn<DB>, &'c str) -> Migration<'c>;

/// A pool of the backend's own, sized and timed by `options`, without sqlx's ping before
/// each use.
///
/// Lazy: the first connection is opened by [`open`], through the backend's own connection
/// handling, which reports why it cannot connect (refused, …) at once rather than sqlx's
/// "pool timed out" after the whole acquire timeout.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub(crate) fn own_pool<DB: Db>(
    connect: <DB::Connection as Connection>::Options,
    options: &SqlOptions,
) -> Pool<DB> {
    own_pool_options(options).connect_lazy_with(connect)
}

/// The options of [`own_pool`], for a database that adds to them.
pub(crate) fn own_pool_options<DB: Db>(options: &SqlOptions) -> PoolOptions<DB> {
    PoolOptions::<DB>::new()
        .max_connections(options.max_connections)
        .acquire_timeout(options.acquire_timeout)
        .test_before_acquire(false)
}

/// The connections of a backend over `pool`. `owned`: the backend opened the pool itself
/// (see [`own_pool`]); such a pool is connected now, so a bad URL or a server that is down
/// shows at once, while a pool passed in is used as the application set it up.
pub(crate) async fn open<DB: Db>(
    pool: Pool<DB>,
    options: &SqlOptions,
    name: &'static str,
    endpoint: Endpoint,
    owned: bool,
    migrate: Migrate<DB>,
) -> Result<Arc<Connections<DB>>, LockError> {
    let kept = options.kept_connections(pool.options().get_max_connections(), owned);
    let conns = Connections::new(pool, kept, name, endpoint);
    if options.migrate || owned {
        let mut lease = conns.lease().await?;
        let result = if options.migrate {
            migrate(lease.connection(), options.table.as_str()).await
        } else {
            Ok(())
        };
        lease.settle(&Ok::<(), sqlx::Error>(()));
        result?;
    }
    Ok(conns)
}
