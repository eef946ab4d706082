//! Redis (`DISTLOCK_TEST_REDIS_URL`). Ours: `LockClient` over `driver_redis::RedisBackend`.
//!
//! Baselines, each on a connection of its own with the driver's settings (one multiplexed
//! `ConnectionManager`):
//! * `raw` — the plain hand-written lock: `SET key owner NX PX ttl`, then `EVALSHA` of a
//!   compare-and-delete script. No fencing token, no notification: the price of the
//!   guarantees is measured against it.
//! * `raw_scripts` — the driver's own scripts (fence bump from `TIME`, `PUBLISH` on the
//!   release of a lock a waiter marked)
//!   called by hand through `RedisBackend`'s methods, without lockcore: the framework's
//!   overhead is measured against it.
//! * `raw_pubsub` — the plain lock whose release also `PUBLISH`es, and a hand-written
//!   pub/sub wait: one subscriber connection per client (RESP3 pushes) that wakes *every*
//!   waiter of the client on each message. Runs the hand-off case (`handoff_raw_pubsub`).
//!
//! * `distributed_lock` — the `distributed-lock-redis` crate (0.2, on the `fred` client), the
//!   lock a Rust user would pick instead: `create_lock(name)` per acquisition (the crate
//!   draws the owner value when the lock object is made), `try_acquire()`, then
//!   `handle.release()`; its expiry set to the bench's TTL (with `min_validity` 9/10 of it
//!   and renewal every third, the crate's default proportions). Its `acquire(timeout)`
//!   makes one attempt on a single server and never waits, so the hand-off case
//!   (`handoff_distributed_lock`) runs the loop its user has to write: `try_acquire()`,
//!   then a nap of 10 ms doubling to 200 ms — the crate's own busy-wait schedule (its
//!   semaphore's) — until taken. No fencing token, no release notification.
//!
//! `redis_nofence` is the driver with fencing switched off (`?fencing=false`: a plain
//! `SET NX PX` grant, token 0) against the same `raw` lock, and its own operations called
//! by hand as `raw_scripts`.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use distributed_lock_core::{DistributedLock, LockHandle, LockProvider};
use distributed_lock_redis::{RedisLockHandle, RedisLockProvider};

use driver_redis::redis::aio::{ConnectionManager, MultiplexedConnection};
use driver_redis::redis::{self, AsyncConnectionConfig, PushInfo, PushKind, Script, Value};
use driver_redis::RedisBackend;
use lockcore::driver::BoxError;
use lockcore::driver::{AcquireOutcome, LockBackendExt};
use lockcore::{LockBackend, LockKey, Owner, ReleaseOutcome};
use tokio::sync::Notify;

use crate::target::{with_param, RawLock, Target};

const RAW_PREFIX: &str = "lockbench-raw:";

/// The compare-and-delete every Redis lock write-up shows.
const CAD: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
";

/// The same, announcing the release for pub/sub waiters.
const CAD_PUBLISH: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], '1')
  return 1
end
return 0
";

/// The shared Redis test server.
pub struct Redis {
    url: String,
}

impl Target for Redis {
    const NAME: &'static str = "redis";
    type Raw = RedisRaw;

    async fn setup() -> Result<Self, BoxError> {
        let url = std::env::var("DISTLOCK_TEST_REDIS_URL")
            .ok()
            .filter(|u| !u.trim().is_empty())
            .ok_or(
                "DISTLOCK_TEST_REDIS_URL is not set: run `scripts/servers.sh start` and export \
                 the variables from target/test-servers.env",
            )?;
        // Fail here, clearly, if the server is not there.
        driver_redis::connect(&url).await?;
        Ok(Redis { url })
    }

    async fn backend(&self) -> Result<Arc<dyn LockBackend>, BoxError> {
        Ok(driver_redis::connect(&self.url).await?)
    }

    fn url(&self) -> Option<String> {
        Some(self.url.clone())
    }

    async fn raw(&self) -> Result<Vec<(&'static str, RedisRaw)>, BoxError> {
        Ok(vec![
            ("raw", RedisRaw::Plain(Plain::connect(&self.url).await?)),
            (
                "raw_scripts",
                RedisRaw::Scripts(driver_redis::connect(&self.url).await?),
            ),
            (
                "raw_pubsub",
                RedisRaw::PubSub(PubSubLoop::connect(&self.url).await?),
            ),
            (
                "distributed_lock",
                RedisRaw::DistributedLock(DistributedLockRedis::connect(&self.url).await?),
            ),
        ])
    }
}

/// A variant of the driver on the shared Redis test server, chosen by a URL option: its
/// baselines are the plain `raw` lock and its own operations called by hand.
macro_rules! variant {
    ($(#[$doc:meta])* $ty:ident, $name:literal, $option:literal) => {
        $(#[$doc])*
        pub struct $ty {
            url: String,
        }

        impl $ty {
            async fn driver(&self) -> Result<Arc<RedisBackend>, BoxError> {
                Ok(RedisBackend::builder(with_param(&self.url, $option))
                    .build()
                    .await?)
            }
        }

        impl Target for $ty {
            const NAME: &'static str = $name;
            type Raw = RedisRaw;

            async fn setup() -> Result<Self, BoxError> {
                let Redis { url } = Redis::setup().await?;
                Ok($ty { url })
            }

            async fn backend(&self) -> Result<Arc<dyn LockBackend>, BoxError> {
                Ok(self.driver().await?)
            }

            fn url(&self) -> Option<String> {
                Some(with_param(&self.url, $option))
            }

            async fn raw(&self) -> Result<Vec<(&'static str, RedisRaw)>, BoxError> {
                Ok(vec![
                    ("raw", RedisRaw::Plain(Plain::connect(&self.url).await?)),
                    ("raw_scripts", RedisRaw::Scripts(self.driver().await?)),
                ])
            }
        }
    };
}

variant!(
    /// The shared Redis test server, the driver with fencing switched off.
    RedisNoFence,
    "redis_nofence",
    "fencing=false"
);

/// The Redis baselines.
pub enum RedisRaw {
    /// `SET NX PX` + `EVALSHA` compare-and-delete.
    Plain(Plain),
    /// The driver's scripts, called without lockcore.
    Scripts(Arc<RedisBackend>),
    /// The plain lock with a hand-written pub/sub wait that wakes every waiter.
    PubSub(PubSubLoop),
    /// The `distributed-lock-redis` crate.
    DistributedLock(DistributedLockRedis),
}

impl RawLock for RedisRaw {
    async fn try_acquire(
        &self,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<bool, BoxError> {
        match self {
            RedisRaw::Plain(p) => p.try_acquire(key, owner, ttl).await,
            RedisRaw::PubSub(p) => p.plain.try_acquire(key, owner, ttl).await,
            RedisRaw::Scripts(b) => Ok(matches!(
                LockBackendExt::try_acquire(&**b, key, owner, ttl).await?,
                AcquireOutcome::Acquired(_)
            )),
            RedisRaw::DistributedLock(d) => d.try_acquire(key, ttl).await,
        }
    }

    async fn release(&self, key: &LockKey, owner: &Owner) -> Result<bool, BoxError> {
        match self {
            RedisRaw::Plain(p) => p.release(key, owner, None).await,
            RedisRaw::PubSub(p) => p.plain.release(key, owner, Some(&channel(key))).await,
            RedisRaw::Scripts(b) => {
                Ok(LockBackend::release(&**b, key, owner).await? == ReleaseOutcome::Released)
            }
            RedisRaw::DistributedLock(d) => d.release(key).await,
        }
    }

    fn handoff(&self) -> bool {
        matches!(self, RedisRaw::PubSub(_) | RedisRaw::DistributedLock(_))
    }

    fn waits_itself(&self) -> bool {
        matches!(self, RedisRaw::DistributedLock(_))
    }

    async fn acquire_waiting(
        &self,
        key: &LockKey,
        _owner: &Owner,
        ttl: Duration,
        max_wait: Duration,
    ) -> Result<Option<u64>, BoxError> {
        match self {
            RedisRaw::DistributedLock(d) => d.acquire_waiting(key, ttl, max_wait).await,
            _ => Err("this baseline does not wait by itself".into()),
        }
    }

    async fn wait_released(&self, key: &LockKey, max_wait: Duration) -> Result<(), BoxError> {
        match self {
            RedisRaw::PubSub(p) => p.wait_released(key, max_wait).await,
            _ => Err("this baseline does not wait".into()),
        }
    }
}

fn raw_key(key: &LockKey) -> String {
    format!("{RAW_PREFIX}{}", key.as_str())
}

fn channel(key: &LockKey) -> String {
    format!("{RAW_PREFIX}{}:released", key.as_str())
}

/// The hand-written lock on one multiplexed connection (to one server, or a cluster
/// client's connections to its masters).
pub struct Plain<C = ConnectionManager> {
    conn: C,
    cad: Script,
    cad_publish: Script,
}

impl Plain {
    async fn connect(url: &str) -> Result<Self, BoxError> {
        let client = redis::Client::open(url)?;
        Plain::over(client.get_connection_manager().await?).await
    }
}

impl<C: redis::aio::ConnectionLike + Clone + Send + Sync> Plain<C> {
    /// The lock over `conn`, its scripts loaded.
    pub async fn over(mut conn: C) -> Result<Self, BoxError> {
        let (cad, cad_publish) = (Script::new(CAD), Script::new(CAD_PUBLISH));
        cad.load_async(&mut conn).await?;
        cad_publish.load_async(&mut conn).await?;
        Ok(Plain {
            conn,
            cad,
            cad_publish,
        })
    }

    pub async fn try_acquire(
        &self,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<bool, BoxError> {
        let mut conn = self.conn.clone();
        let set: Value = redis::cmd("SET")
            .arg(raw_key(key))
            .arg(owner.token().to_hex())
            .arg("NX")
            .arg("PX")
            .arg(ttl.as_millis().max(1) as u64)
            .query_async(&mut conn)
            .await?;
        Ok(!matches!(set, Value::Nil))
    }

    pub async fn release(
        &self,
        key: &LockKey,
        owner: &Owner,
        channel: Option<&str>,
    ) -> Result<bool, BoxError> {
        let mut conn = self.conn.clone();
        let deleted: i64 = match channel {
            None => {
                self.cad
                    .key(raw_key(key))
                    .arg(owner.token().to_hex())
                    .invoke_async(&mut conn)
                    .await?
            }
            Some(ch) => {
                self.cad_publish
                    .key(raw_key(key))
                    .arg(owner.token().to_hex())
                    .arg(ch)
                    .invoke_async(&mut conn)
                    .await?
            }
        };
        Ok(deleted == 1)
    }
}

/// A hand-written pub/sub wait: one subscriber connection (RESP3 pushes), every message
/// wakes every waiter of this client.
pub struct PubSubLoop {
    plain: Plain,
    subscriber: tokio::sync::Mutex<MultiplexedConnection>,
    subscribed: Mutex<HashSet<String>>,
    wake: Arc<Notify>,
}

impl PubSubLoop {
    async fn connect(url: &str) -> Result<Self, BoxError> {
        let plain = Plain::connect(url).await?;
        let mut resp3 = url::Url::parse(url)?;
        resp3.query_pairs_mut().append_pair("protocol", "resp3");
        let wake = Arc::new(Notify::new());
        let woken = wake.clone();
        let config = AsyncConnectionConfig::new().set_push_sender(move |push: PushInfo| {
            if push.kind == PushKind::Message {
                woken.notify_waiters();
            }
            Ok::<(), std::convert::Infallible>(())
        });
        let subscriber = redis::Client::open(resp3.as_str())?
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        Ok(PubSubLoop {
            plain,
            subscriber: tokio::sync::Mutex::new(subscriber),
            subscribed: Mutex::new(HashSet::new()),
            wake,
        })
    }

    async fn wait_released(&self, key: &LockKey, max_wait: Duration) -> Result<(), BoxError> {
        // Subscribe (in-process, then on the server), then re-check, then wait.
        let notified = self.wake.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let ch = channel(key);
        let known = self
            .subscribed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&ch);
        if !known {
            let mut subscriber = self.subscriber.lock().await;
            subscriber.subscribe(&ch).await?;
            self.subscribed
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(ch);
        }
        let mut conn = self.plain.conn.clone();
        let pttl: i64 = redis::cmd("PTTL")
            .arg(raw_key(key))
            .query_async(&mut conn)
            .await?;
        if pttl == -2 {
            return Ok(());
        }
        let wait =
            u64::try_from(pttl).map_or(max_wait, |ms| max_wait.min(Duration::from_millis(ms)));
        let _ = tokio::time::timeout(wait, notified).await;
        Ok(())
    }
}

/// The first nap of the `distributed_lock` waiting loop, doubled after each failed try up
/// to [`DL_MAX_NAP`]: the busy-wait schedule of the crate's own semaphore (its exclusive
/// lock has none).
const DL_FIRST_NAP: Duration = Duration::from_millis(10);
const DL_MAX_NAP: Duration = Duration::from_millis(200);

/// The `distributed-lock-redis` crate: one provider (one `fred` client, the crate's
/// connection) per baseline instance, the handles of the locks it holds by name.
pub struct DistributedLockRedis {
    provider: RedisLockProvider,
    ttl: Duration,
    held: Mutex<HashMap<String, RedisLockHandle>>,
}

impl DistributedLockRedis {
    async fn connect(url: &str) -> Result<Self, BoxError> {
        let ttl = crate::cases::TTL;
        // The expiry is the provider's, not the call's. `min_validity` must be set with it:
        // left at its default (27 s) above a shorter expiry, the crate's per-attempt
        // timeout (expiry - min_validity) is zero and no attempt ever succeeds.
        let provider = RedisLockProvider::builder()
            .url(url)
            .expiry(ttl)
            .min_validity(ttl * 9 / 10)
            .extension_cadence(ttl / 3)
            .build()
            .await?;
        Ok(DistributedLockRedis {
            provider,
            ttl,
            held: Mutex::new(HashMap::new()),
        })
    }

    fn name(key: &LockKey) -> String {
        format!("lockbench-dl:{}", key.as_str())
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<String, RedisLockHandle>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One attempt, as `try_acquire()` makes it.
    async fn try_acquire(&self, key: &LockKey, ttl: Duration) -> Result<bool, BoxError> {
        if ttl != self.ttl {
            return Err(format!(
                "distributed_lock: built for a {:?} expiry, asked {ttl:?}",
                self.ttl
            )
            .into());
        }
        let name = Self::name(key);
        // A lock object per acquisition: the crate draws the owner value (its lock id) when
        // the object is made, and every acquisition through one object would share it.
        let lock = self.provider.create_lock(&name);
        match lock.try_acquire().await? {
            Some(handle) => {
                self.held().insert(name, handle);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// `handle.release()`: the crate answers `Ok` whether or not the key was still ours.
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

    /// The waiting loop a user of the crate writes: try, nap (10 ms doubling to 200 ms),
    /// try again, until taken or `max_wait` has passed.
    async fn acquire_waiting(
        &self,
        key: &LockKey,
        ttl: Duration,
        max_wait: Duration,
    ) -> Result<Option<u64>, BoxError> {
        let deadline = Instant::now() + max_wait;
        let (mut nap, mut failed) = (DL_FIRST_NAP, 0);
        loop {
            if self.try_acquire(key, ttl).await? {
                return Ok(Some(failed));
            }
            failed += 1;
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            tokio::time::sleep(nap.min(left)).await;
            nap = (nap * 2).min(DL_MAX_NAP);
        }
    }
}
