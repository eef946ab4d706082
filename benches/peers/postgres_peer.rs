//! `postgres` as lockbench measures it (ours, `raw`, `raw_held`, `raw_driver`,
//! `raw_notify`: `benches/lockbench/sql.rs`), and beside them the `distributed-lock-postgres`
//! crate (0.2), the lock a Rust user would pick instead. It locks with session advisory
//! locks (`pg_advisory_lock` on a 64-bit key hashed from the name with SHA-1) on a
//! connection it keeps out of the pool for as long as the lock is held; it is given a pool
//! with the driver's pool settings (the builder's `pool`), as a user with a pool does.
//!
//! * `distributed_lock` — the documented call: `create_lock(name)`, `acquire(Some(timeout))`,
//!   `handle.release()`. The acquire is `BEGIN`, `SAVEPOINT`, `SET LOCAL lock_timeout`, a
//!   blocking `SELECT pg_advisory_lock(k)`, `COMMIT`; the release `SELECT
//!   pg_advisory_unlock(k)`. It waits in the server, so it runs the hand-off case too
//!   (`handoff_distributed_lock`; no failed tries to count).
//! * `distributed_lock_try` — `try_acquire()`: one `SELECT pg_try_advisory_lock(k)`, the
//!   cheapest way the crate takes a free lock (uncontended cases only).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use distributed_lock_core::{DistributedLock, LockError as PeerError, LockHandle, LockProvider};
use distributed_lock_postgres::handle::PostgresLockHandle;
use distributed_lock_postgres::PostgresLockProvider;
use lockcore::driver::BoxError;
use lockcore::{LockBackend, LockKey, Owner};

use crate::sql::Postgres;
use crate::target::{RawLock, Target};

/// The shared PostgreSQL test server: lockbench's `postgres` target and the peer.
pub struct PostgresPeers {
    inner: Postgres,
    url: String,
}

impl Target for PostgresPeers {
    const NAME: &'static str = "postgres";
    type Raw = PeerRaw;

    async fn setup() -> Result<Self, BoxError> {
        let inner = Postgres::setup().await?;
        let url = inner.url().ok_or("postgres: the target has no URL")?;
        Ok(PostgresPeers { inner, url })
    }

    async fn backend(&self) -> Result<std::sync::Arc<dyn LockBackend>, BoxError> {
        self.inner.backend().await
    }

    fn url(&self) -> Option<String> {
        self.inner.url()
    }

    async fn raw(&self) -> Result<Vec<(&'static str, PeerRaw)>, BoxError> {
        let mut raws: Vec<(&'static str, PeerRaw)> = self
            .inner
            .raw()
            .await?
            .into_iter()
            .map(|(name, raw)| (name, PeerRaw::Lockbench(raw)))
            .collect();
        raws.push((
            "distributed_lock",
            PeerRaw::DistributedLock(DistributedLockPostgres::connect(&self.url, true).await?),
        ));
        raws.push((
            "distributed_lock_try",
            PeerRaw::DistributedLock(DistributedLockPostgres::connect(&self.url, false).await?),
        ));
        Ok(raws)
    }
}

/// lockbench's own PostgreSQL baselines, and the peer.
pub enum PeerRaw {
    Lockbench(<Postgres as Target>::Raw),
    DistributedLock(DistributedLockPostgres),
}

impl RawLock for PeerRaw {
    async fn try_acquire(
        &self,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<bool, BoxError> {
        match self {
            PeerRaw::Lockbench(r) => r.try_acquire(key, owner, ttl).await,
            // Free keys only (the uncontended cases): the documented acquire waits at most
            // as long as a lock of the bench lives.
            PeerRaw::DistributedLock(d) => Ok(d.take(key, ttl).await?.is_some()),
        }
    }

    async fn release(&self, key: &LockKey, owner: &Owner) -> Result<bool, BoxError> {
        match self {
            PeerRaw::Lockbench(r) => r.release(key, owner).await,
            PeerRaw::DistributedLock(d) => d.release(key).await,
        }
    }

    fn handoff(&self) -> bool {
        match self {
            PeerRaw::Lockbench(r) => r.handoff(),
            PeerRaw::DistributedLock(d) => d.waits,
        }
    }

    fn waits_itself(&self) -> bool {
        matches!(self, PeerRaw::DistributedLock(d) if d.waits)
    }

    async fn acquire_waiting(
        &self,
        key: &LockKey,
        _owner: &Owner,
        _ttl: Duration,
        max_wait: Duration,
    ) -> Result<Option<u64>, BoxError> {
        match self {
            // The server queues the waiter: no try is answered "held".
            PeerRaw::DistributedLock(d) if d.waits => Ok(d.take(key, max_wait).await?.map(|()| 0)),
            _ => Err("this baseline does not wait by itself".into()),
        }
    }

    async fn wait_released(&self, key: &LockKey, max_wait: Duration) -> Result<(), BoxError> {
        match self {
            PeerRaw::Lockbench(r) => r.wait_released(key, max_wait).await,
            PeerRaw::DistributedLock(_) => Err("this baseline does not wait that way".into()),
        }
    }
}

/// The `distributed-lock-postgres` crate: one provider (one pool) per baseline instance,
/// the handles of the locks it holds by name.
pub struct DistributedLockPostgres {
    provider: PostgresLockProvider,
    /// `acquire(Some(timeout))` (true) or `try_acquire()`.
    waits: bool,
    held: Mutex<HashMap<String, PostgresLockHandle>>,
}

impl DistributedLockPostgres {
    async fn connect(url: &str, waits: bool) -> Result<Self, BoxError> {
        // The driver's pool settings, as lockbench's own baselines have them. The crate's
        // own pool (`PostgresLockProvider::new(url)`) is sqlx's default: 10 connections,
        // each pinged when taken from the pool.
        let pool = sqlx08::postgres::PgPoolOptions::new()
            .max_connections(driver_sql::DEFAULT_MAX_CONNECTIONS)
            .test_before_acquire(false)
            .connect(url)
            .await?;
        let provider = PostgresLockProvider::builder().pool(pool).build().await?;
        Ok(DistributedLockPostgres {
            provider,
            waits,
            held: Mutex::new(HashMap::new()),
        })
    }

    fn name(key: &LockKey) -> String {
        format!("lockbench-dl:{}", key.as_str())
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<String, PostgresLockHandle>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes `key`: `acquire(Some(max_wait))` (`None` once it times out) or one
    /// `try_acquire()`.
    async fn take(&self, key: &LockKey, max_wait: Duration) -> Result<Option<()>, BoxError> {
        let name = Self::name(key);
        let lock = self.provider.create_lock(&name);
        let handle = if self.waits {
            match lock.acquire(Some(max_wait)).await {
                Ok(handle) => Some(handle),
                Err(PeerError::Timeout(_)) => None,
                Err(e) => return Err(e.into()),
            }
        } else {
            lock.try_acquire().await?
        };
        Ok(handle.map(|handle| {
            self.held().insert(name, handle);
        }))
    }

    /// `handle.release()`: the crate answers `Ok` whether or not the key was still held
    /// (a failed unlock is only logged).
    async fn release(&self, key: &LockKey) -> Result<bool, BoxError> {
        let handle = self.held().remove(&Self::name(key));
        match handle {
            Some(handle) => {
                handle.release().await?;
                Ok(true)
            }
            None => Ok(false),
        }
    }
}
