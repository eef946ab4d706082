//! Redlock (`DISTLOCK_TEST_REDLOCK_URLS`, five redis-servers). Ours: `LockClient` over
//! `driver_redlock::RedlockBackend` with the driver's defaults, on 3 and on 5 of the
//! instances, with fencing on and off (`redlock3`, `redlock5`, `redlock3_nofence`,
//! `redlock5_nofence`).
//!
//! Baselines, each on connections of its own with the driver's settings (one multiplexed
//! `ConnectionManager` per instance), fanned out to every instance in parallel and waiting
//! for the same number of answers as the driver (a majority of grants, acknowledgements or
//! releases; a failed attempt is released everywhere; the releases still unanswered finish
//! in the background, as the driver's do, so every instance is released):
//! * `raw` — what a careful user writes by hand for the same guarantees:
//!   * fencing off: the plain Redlock, `SET key owner NX PX ttl` on every instance, then
//!     `EVALSHA` of the classic compare-and-delete (no token, no notification);
//!   * fencing on: the driver's three rounds with its own scripts by `EVALSHA`: the grant
//!     with its fence bump, the fencing write-back of T = max to every granting instance
//!     (to late granters in the background, as the driver does), the release with
//!     `PUBLISH`.
//! * `rslock` — the `rslock` crate (parallel Redlock, no fencing), one attempt per try
//!   (`set_retry(1, …)`).
//! * `driver` — the driver's `LockBackend` methods called directly, without lockcore: the
//!   gap between `raw` and `driver` is the driver's share of the cost, the gap between
//!   `driver` and ours lockcore's.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use driver_redlock::__driver_redis::__redlock as scripts;
use driver_redlock::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use driver_redlock::redis::{self, Script, Value};
use driver_redlock::RedlockBackend;
use futures_util::stream::{FuturesUnordered, StreamExt};
use lockcore::driver::BoxError;
use lockcore::driver::{AcquireOutcome, LockBackendExt};
use lockcore::{LockBackend, LockKey, Owner, ReleaseOutcome};

use crate::target::{RawLock, Target};

const RAW_PREFIX: &str = "lockbench-raw:";

fn urls(instances: usize) -> Result<Vec<String>, BoxError> {
    let urls: Vec<String> = std::env::var("DISTLOCK_TEST_REDLOCK_URLS")
        .unwrap_or_default()
        .split_whitespace()
        .take(instances)
        .map(str::to_owned)
        .collect();
    if urls.len() < instances {
        return Err(
            "DISTLOCK_TEST_REDLOCK_URLS does not hold five redis URLs: run \
                    `scripts/servers.sh start` and export the variables from \
                    target/test-servers.env"
                .into(),
        );
    }
    Ok(urls)
}

/// One `redlock://` URL for the instances at `urls` (`redis://` URLs without TLS; `None`
/// for any other, whose settings one URL cannot carry).
fn redlock_url(urls: &[String], fencing: bool) -> Option<String> {
    let mut instances = Vec::with_capacity(urls.len());
    let mut db = String::new();
    for u in urls {
        let u = url::Url::parse(u).ok()?;
        if u.scheme() != "redis" || u.query().is_some() {
            return None;
        }
        let auth = match (u.username(), u.password()) {
            ("", None) => String::new(),
            (user, None) => format!("{user}@"),
            (user, Some(pass)) => format!("{user}:{pass}@"),
        };
        instances.push(format!(
            "{auth}{}:{}",
            u.host_str()?,
            u.port().unwrap_or(6379)
        ));
        db = u.path().trim_matches('/').to_owned();
    }
    let db = if db.is_empty() {
        String::new()
    } else {
        format!("/{db}")
    };
    let options = if fencing { "" } else { "?fencing=false" };
    Some(format!("redlock://{}{db}{options}", instances.join(",")))
}

macro_rules! target {
    ($type:ident, $name:literal, $instances:literal, $fencing:literal) => {
        #[doc = concat!("Redlock on ", stringify!($instances), " instances, fencing ", stringify!($fencing), ".")]
        pub struct $type {
            urls: Vec<String>,
        }

        impl Target for $type {
            const NAME: &'static str = $name;
            type Raw = RedlockRaw;

            async fn setup() -> Result<Self, BoxError> {
                let urls = urls($instances)?;
                // Fail here, clearly, if the servers are not there.
                RedlockBackend::builder(urls.clone()).build().await?;
                Ok($type { urls })
            }

            async fn backend(&self) -> Result<Arc<dyn LockBackend>, BoxError> {
                Ok(RedlockBackend::builder(self.urls.clone())
                    .fencing($fencing)
                    .build()
                    .await?)
            }

            fn url(&self) -> Option<String> {
                redlock_url(&self.urls, $fencing)
            }

            async fn raw(&self) -> Result<Vec<(&'static str, RedlockRaw)>, BoxError> {
                Ok(vec![
                    (
                        "raw",
                        RedlockRaw::FanOut(FanOut::connect(&self.urls, $fencing).await?),
                    ),
                    ("rslock", RedlockRaw::Rslock(Rslock::connect(&self.urls))),
                    ("driver", RedlockRaw::Driver(self.backend().await?)),
                ])
            }
        }
    };
}

target!(Redlock3, "redlock3", 3, true);
target!(Redlock5, "redlock5", 5, true);
target!(Redlock3NoFence, "redlock3_nofence", 3, false);
target!(Redlock5NoFence, "redlock5_nofence", 5, false);

/// The Redlock baselines.
pub enum RedlockRaw {
    /// The driver's rounds, fanned out by hand.
    FanOut(FanOut),
    /// The `rslock` crate.
    Rslock(Rslock),
    /// The driver's backend methods, without lockcore.
    Driver(Arc<dyn LockBackend>),
}

impl RawLock for RedlockRaw {
    async fn try_acquire(
        &self,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<bool, BoxError> {
        match self {
            RedlockRaw::FanOut(f) => f.try_acquire(key, owner, ttl).await,
            RedlockRaw::Rslock(r) => r.try_acquire(key, ttl).await,
            RedlockRaw::Driver(b) => Ok(matches!(
                b.try_acquire(key, owner, ttl).await?,
                AcquireOutcome::Acquired(_)
            )),
        }
    }

    async fn release(&self, key: &LockKey, owner: &Owner) -> Result<bool, BoxError> {
        match self {
            RedlockRaw::FanOut(f) => f.release(key, owner).await,
            RedlockRaw::Rslock(r) => r.release(key).await,
            RedlockRaw::Driver(b) => Ok(b.release(key, owner).await? == ReleaseOutcome::Released),
        }
    }
}

/// The classic compare-and-delete of the plain Redlock's release.
static CAD: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
",
    )
});

/// Redlock by hand on every instance in parallel: the plain one (fencing off) or the
/// driver's rounds with its scripts (fencing on).
pub struct FanOut {
    conns: Vec<ConnectionManager>,
    fencing: bool,
    quorum: usize,
}

impl FanOut {
    async fn connect(urls: &[String], fencing: bool) -> Result<Self, BoxError> {
        let mut conns = Vec::new();
        for url in urls {
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(driver_redlock::DEFAULT_CONNECT_TIMEOUT))
                .set_response_timeout(Some(Duration::from_secs(2)))
                .set_number_of_retries(0);
            let mut conn =
                ConnectionManager::new_with_config(redis::Client::open(url.as_str())?, config)
                    .await?;
            for script in scripts::scripts::all() {
                script.load_async(&mut conn).await?;
            }
            CAD.load_async(&mut conn).await?;
            conns.push(conn);
        }
        let quorum = conns.len() / 2 + 1;
        Ok(FanOut {
            conns,
            fencing,
            quorum,
        })
    }

    async fn try_acquire(
        &self,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<bool, BoxError> {
        if self.fencing {
            self.try_acquire_fenced(key, owner, ttl).await
        } else {
            self.try_acquire_plain(key, owner, ttl).await
        }
    }

    /// `SET key owner NX PX ttl` everywhere; a majority of `OK`s wins.
    async fn try_acquire_plain(
        &self,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<bool, BoxError> {
        let lock = scripts::names(RAW_PREFIX, key).lock;
        let owner_hex = owner.token().to_hex();
        let ttl_ms = ttl.as_millis() as u64;
        let mut round: FuturesUnordered<_> = self
            .conns
            .iter()
            .map(|conn| {
                let mut conn = conn.clone();
                let mut cmd = redis::cmd("SET");
                cmd.arg(&lock)
                    .arg(&owner_hex)
                    .arg("NX")
                    .arg("PX")
                    .arg(ttl_ms);
                async move { cmd.query_async::<Option<String>>(&mut conn).await }
            })
            .collect();
        let mut granted = 0;
        while let Some(reply) = round.next().await {
            if matches!(reply, Ok(Some(_))) {
                granted += 1;
            }
            if granted >= self.quorum || granted + round.len() < self.quorum {
                break;
            }
        }
        drop(round);
        if granted < self.quorum {
            self.release(key, owner).await?;
            return Ok(false);
        }
        Ok(true)
    }

    /// The driver's rounds: grant with fence bump, write-back of T = max, by hand.
    async fn try_acquire_fenced(
        &self,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<bool, BoxError> {
        let names = scripts::names(RAW_PREFIX, key);
        let fence = names.fence();
        let owner_hex = owner.token().to_hex();
        let ttl_ms = ttl.as_millis() as u64;
        let fence_ttl = scripts::fence_ttl_millis();
        let mut round: FuturesUnordered<_> = self
            .conns
            .iter()
            .enumerate()
            .map(|(i, conn)| {
                let mut conn = conn.clone();
                let mut inv = scripts::ACQUIRE.key(&names.lock);
                inv.key(&fence)
                    .arg(&owner_hex)
                    .arg(ttl_ms)
                    .arg(owner.label())
                    .arg(fence_ttl);
                async move { (i, inv.invoke_async::<Vec<Value>>(&mut conn).await) }
            })
            .collect();
        let mut granted = Vec::new();
        while let Some((i, reply)) = round.next().await {
            if let Ok([flag, token]) = reply.as_deref() {
                if scripts::as_int(flag) == Some(1) {
                    granted.push((i, scripts::as_token(token).map_or(0, |t| t.0)));
                }
            }
            if granted.len() >= self.quorum || granted.len() + round.len() < self.quorum {
                break;
            }
        }
        if granted.len() < self.quorum {
            drop(round);
            self.release(key, owner).await?;
            return Ok(false);
        }
        // Round 2: T = max over the grants, written back to every granter — those that
        // grant after the majority too, in the background (the protocol's "every granting
        // instance", which keeps every copy's token at T).
        let t = granted
            .iter()
            .map(|(_, t)| *t)
            .max()
            .unwrap_or(0)
            .to_string();
        if !round.is_empty() {
            let (conns, lock, fence, owner_hex, t) = (
                self.conns.clone(),
                names.lock.clone(),
                fence.clone(),
                owner_hex.clone(),
                t.clone(),
            );
            tokio::spawn(async move {
                while let Some((i, reply)) = round.next().await {
                    if let Ok([flag, _]) = reply.as_deref() {
                        if scripts::as_int(flag) == Some(1) {
                            let mut conn = conns[i].clone();
                            let mut inv = scripts::WRITE_BACK.key(&lock);
                            inv.key(&fence).arg(&owner_hex).arg(&t).arg(fence_ttl);
                            let _ = inv.invoke_async::<i64>(&mut conn).await;
                        }
                    }
                }
            });
        }
        let mut round: FuturesUnordered<_> = granted
            .iter()
            .map(|(i, _)| {
                let mut conn = self.conns[*i].clone();
                let mut inv = scripts::WRITE_BACK.key(&names.lock);
                inv.key(&fence).arg(&owner_hex).arg(&t).arg(fence_ttl);
                async move { inv.invoke_async::<i64>(&mut conn).await }
            })
            .collect();
        let mut acks = 0;
        while let Some(ack) = round.next().await {
            if matches!(ack, Ok(1)) {
                acks += 1;
            }
            if acks >= self.quorum || acks + round.len() < self.quorum {
                break;
            }
        }
        if acks < self.quorum {
            drop(round);
            self.release(key, owner).await?;
            return Ok(false);
        }
        Ok(true)
    }

    /// Owner-checked release everywhere: the classic compare-and-delete (fencing off) or
    /// the driver's release script with its `PUBLISH` (fencing on).
    async fn release(&self, key: &LockKey, owner: &Owner) -> Result<bool, BoxError> {
        let names = scripts::names(RAW_PREFIX, key);
        let owner_hex = owner.token().to_hex();
        let mut round: FuturesUnordered<_> = self
            .conns
            .iter()
            .map(|conn| {
                let mut conn = conn.clone();
                let inv = if self.fencing {
                    let mut inv = scripts::RELEASE.key(&names.lock);
                    inv.arg(&owner_hex);
                    inv
                } else {
                    let mut inv = CAD.key(&names.lock);
                    inv.arg(&owner_hex);
                    inv
                };
                async move { inv.invoke_async::<i64>(&mut conn).await }
            })
            .collect();
        let mut released = 0;
        while let Some(r) = round.next().await {
            // The driver's release answers 2 when it announced the release.
            if matches!(r, Ok(1 | 2)) {
                released += 1;
            }
            if released >= self.quorum || released + round.len() < self.quorum {
                break;
            }
        }
        // The rest finish in the background. Dropped instead, a request the connection had
        // not yet written is never sent (redis-rs skips a request whose caller went away),
        // and its instance keeps the lock until its TTL: with a majority awaited, about
        // half the releases of the other instances were lost that way at 64 tasks (seen
        // in `INFO commandstats`: DEL calls half the SET calls).
        if !round.is_empty() {
            tokio::spawn(round.for_each(|_| async {}));
        }
        Ok(released >= self.quorum)
    }
}

/// The `rslock` crate, one attempt per try.
pub struct Rslock {
    manager: rslock::LockManager,
    held: Mutex<HashMap<Vec<u8>, rslock::Lock>>,
}

impl Rslock {
    fn connect(urls: &[String]) -> Self {
        let mut manager = rslock::LockManager::new(urls.to_vec());
        manager.set_retry(1, Duration::from_millis(1));
        Rslock {
            manager,
            held: Mutex::new(HashMap::new()),
        }
    }

    fn resource(key: &LockKey) -> Vec<u8> {
        format!("lockbench-rslock:{}", key.as_str()).into_bytes()
    }

    async fn try_acquire(&self, key: &LockKey, ttl: Duration) -> Result<bool, BoxError> {
        let resource = Self::resource(key);
        match self.manager.lock(resource.as_slice(), ttl).await {
            Ok(lock) => {
                self.held
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(resource, lock);
                Ok(true)
            }
            Err(rslock::LockError::Unavailable) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    async fn release(&self, key: &LockKey) -> Result<bool, BoxError> {
        let lock = self
            .held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&Self::resource(key));
        match lock {
            Some(lock) => {
                self.manager.unlock(&lock).await;
                Ok(true)
            }
            None => Ok(false),
        }
    }
}
