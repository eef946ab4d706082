//! The conformance harness of a database with a server (PostgreSQL, MySQL/MariaDB): the
//! shared test server for the suite, servers of their own behind a proxy for the fault
//! scenarios.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use conformance_tests::{FaultClient, FaultStore, Harness, Restart, Tamper, TcpProxy};
use distlock_sql::SqlOptions;
use lockcore::{LockBackend, LockClient, LockError, LockKey};

use super::servers::{shared_url, OwnServer};

/// What differs between the databases with a server: how to reach one.
#[async_trait]
pub trait ServerDb: Send + Sync + 'static {
    /// The backend's name, which is also its URL scheme.
    const NAME: &'static str;
    /// The other URL scheme reaching the same database.
    const OTHER_SCHEME: &'static str;
    /// The variable naming the shared test server's URL.
    const URL_VAR: &'static str;
    /// sqlx's database.
    type Database: sqlx::Database;

    /// A backend of this database.
    async fn connect(url: &str, options: SqlOptions) -> Result<Arc<dyn LockBackend>, LockError>;

    /// A backend over an application's pool.
    async fn from_pool(
        pool: sqlx::Pool<Self::Database>,
        options: SqlOptions,
    ) -> Arc<dyn LockBackend>;

    /// A fresh server of its own.
    async fn own_server() -> OwnServer;

    /// Deletes `key`'s lock record (its row and its shared leases), or with `None` every
    /// row — the database as restored from a backup taken before any lock — from the
    /// default tables of the database at `url`, with plain statements, not the driver's.
    async fn delete_rows(url: &str, key: Option<&LockKey>) -> Result<(), LockError>;

    /// Writes `key`'s row in the default table of the database at `url` again with a plain
    /// `UPDATE`: the same columns, or with `owner` as its owner (token, label and expiry
    /// kept).
    async fn rewrite_row(
        url: &str,
        key: &LockKey,
        owner: Option<[u8; 16]>,
    ) -> Result<(), LockError>;

    /// Puts the sessions opened from now on by the database at `url` in a time zone
    /// `minutes` east of UTC.
    async fn set_time_zone(url: &str, minutes: i32) -> Result<(), LockError>;

    /// A backend whose sessions are in a time zone `minutes` east of UTC, set the way a
    /// user of this database would set it.
    async fn connect_in_zone(
        url: &str,
        minutes: i32,
        options: SqlOptions,
    ) -> Result<Arc<dyn LockBackend>, LockError>;

    /// The shared test server's URL.
    fn url() -> String {
        shared_url(Self::URL_VAR)
    }
}

/// The options of the backends on the shared server.
pub fn options(table: &str) -> SqlOptions {
    SqlOptions::new().table(table).unwrap().max_connections(4)
}

/// The suite's harness: clients of a fresh table on the shared server.
pub struct ServerHarness<D> {
    url: String,
    table: String,
    db: std::marker::PhantomData<D>,
}

impl<D: ServerDb> ServerHarness<D> {
    pub fn new() -> Self {
        ServerHarness {
            url: D::url(),
            table: format!("locks_{}", super::random_suffix()),
            db: std::marker::PhantomData,
        }
    }
}

#[async_trait]
impl<D: ServerDb> Harness for ServerHarness<D> {
    async fn client(&self) -> Result<LockClient, LockError> {
        let backend = D::connect(&self.url, options(&self.table)).await?;
        Ok(LockClient::new(backend))
    }

    fn ttl(&self) -> Duration {
        Duration::from_millis(500)
    }

    async fn fault_store(&self) -> Result<Option<Box<dyn FaultStore>>, LockError> {
        Ok(Some(Box::new(ServerFaultStore::<D> {
            server: D::own_server().await,
            zone: std::sync::atomic::AtomicI32::new(0),
            db: std::marker::PhantomData,
        })))
    }
}

/// A server of its own, reached by every client through a proxy of its own.
struct ServerFaultStore<D> {
    server: OwnServer,
    /// The time zone new clients' sessions are put in, in minutes east of UTC.
    zone: std::sync::atomic::AtomicI32,
    db: std::marker::PhantomData<D>,
}

#[async_trait]
impl<D: ServerDb> FaultStore for ServerFaultStore<D> {
    /// A session takes several round trips to open (and SCRAM hashes the password on
    /// PostgreSQL), on a server of its own per fault scenario: while the suite runs four
    /// scenarios at once on two cores, each starting such a server, a MariaDB session once
    /// took longer than the 450 ms the scenario leaves by default.
    fn connect_allowance(&self) -> Duration {
        Duration::from_secs(1)
    }

    async fn client(&self) -> Result<FaultClient, LockError> {
        let proxy = TcpProxy::start(self.server.addr())
            .await
            .map_err(|e| LockError::unavailable(D::NAME, e))?;
        let options = SqlOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(2));
        let url = self.server.url_via(proxy.addr());
        let backend = match self.zone.load(std::sync::atomic::Ordering::SeqCst) {
            0 => D::connect(&url, options).await?,
            // sqlx puts sessions in UTC whatever the server's zone: a client in another
            // zone is one its user configured so.
            zone => D::connect_in_zone(&url, zone, options).await?,
        };
        Ok(FaultClient {
            client: LockClient::new(backend),
            link: Arc::new(proxy),
        })
    }

    async fn stop(&self) -> Result<(), LockError> {
        self.server.stop().await;
        Ok(())
    }

    async fn start(&self) -> Result<(), LockError> {
        self.server.start().await;
        Ok(())
    }

    /// Keeping the data: a clean shutdown and start (the database is durable). Losing it:
    /// the same, then every row deleted, as a restore from a backup taken before any lock.
    async fn restart(&self, how: Restart) -> Result<bool, LockError> {
        self.server.stop().await;
        self.server.start().await;
        match how {
            Restart::KeepData => {}
            Restart::LoseData => {
                D::delete_rows(&self.server.url_via(self.server.addr()), None).await?
            }
            other => return Err(LockError::config(format!("{other:?} is not implemented"))),
        }
        Ok(true)
    }

    async fn set_time_zone(&self, minutes: i32) -> Result<bool, LockError> {
        D::set_time_zone(&self.server.url_via(self.server.addr()), minutes).await?;
        self.zone
            .store(minutes, std::sync::atomic::Ordering::SeqCst);
        Ok(true)
    }

    async fn tamper(&self, key: &LockKey, how: Tamper) -> Result<(), LockError> {
        match how {
            Tamper::Delete => {
                D::delete_rows(&self.server.url_via(self.server.addr()), Some(key)).await
            }
            Tamper::Reassign => {
                let stranger = *lockcore::Owner::new("stranger").token().as_bytes();
                D::rewrite_row(
                    &self.server.url_via(self.server.addr()),
                    key,
                    Some(stranger),
                )
                .await
            }
            Tamper::Rewrite => {
                D::rewrite_row(&self.server.url_via(self.server.addr()), key, None).await
            }
            other => Err(LockError::config(format!("{other:?} is not implemented"))),
        }
    }
}

/// A backend on the shared server, on `table`.
pub async fn backend<D: ServerDb>(table: &str) -> Arc<dyn LockBackend> {
    D::connect(&D::url(), options(table)).await.unwrap()
}

/// Two backends on one fresh table of the shared server.
pub async fn two_backends<D: ServerDb>() -> (Arc<dyn LockBackend>, Arc<dyn LockBackend>) {
    let table = format!("locks_{}", super::random_suffix());
    (backend::<D>(&table).await, backend::<D>(&table).await)
}

/// `minutes` east of UTC as `+hh:mm` / `-hh:mm`.
pub fn utc_offset(minutes: i32) -> (char, u32, u32) {
    let sign = if minutes < 0 { '-' } else { '+' };
    let m = minutes.unsigned_abs();
    (sign, m / 60, m % 60)
}
