//! Redis Cluster. `redis_cluster`: the shared test cluster (`DISTLOCK_TEST_REDIS_CLUSTER_URL`,
//! three masters); `redis_cluster1`: a one-node cluster (one master owning every slot) that
//! lockbench starts itself, so that the same run shows how 64 tasks over many keys scale
//! from one master to three. Ours: `LockClient` over `driver_redis::RedisBackend` on a
//! `redis+cluster://` URL.
//!
//! Baselines, as for one server: `raw` (`SET NX PX` + `EVALSHA` compare-and-delete through
//! the redis crate's cluster client) and `raw_scripts` (the driver's own scripts called by
//! hand, without lockcore).

use std::sync::Arc;
use std::time::Duration;

use conformance_tests::process::{free_port, ScratchDir, ServerProcess};
use driver_redis::redis::cluster::ClusterClient;
use driver_redis::redis::cluster_async::ClusterConnection;
use driver_redis::redis::{self, ProtocolVersion};
use driver_redis::RedisBackend;
use lockcore::driver::BoxError;
use lockcore::driver::{AcquireOutcome, LockBackendExt};
use lockcore::{LockBackend, LockKey, Owner, ReleaseOutcome};

use crate::redis::Plain;
use crate::target::{RawLock, Target};

/// The shared test cluster.
pub struct RedisCluster {
    url: String,
}

/// A one-node cluster of lockbench's own (stopped when the run ends).
pub struct RedisCluster1 {
    url: String,
    _server: ServerProcess,
    _dir: ScratchDir,
}

/// The seed nodes of a `redis+cluster://h1:p1,h2:p2/` URL, as `redis://h:p/` URLs.
fn nodes(url: &str) -> Vec<String> {
    let hosts = url
        .trim_start_matches("redis+cluster://")
        .split(['/', '?'])
        .next()
        .unwrap_or_default();
    hosts
        .split(',')
        .filter(|h| !h.is_empty())
        .map(|h| format!("redis://{h}/"))
        .collect()
}

async fn raw_of(url: &str) -> Result<Vec<(&'static str, ClusterRaw)>, BoxError> {
    let conn = ClusterClient::builder(nodes(url))
        .use_protocol(ProtocolVersion::RESP3)
        .build()?
        .get_async_connection()
        .await?;
    Ok(vec![
        ("raw", ClusterRaw::Plain(Plain::over(conn).await?)),
        (
            "raw_scripts",
            ClusterRaw::Scripts(RedisBackend::builder(url).build().await?),
        ),
    ])
}

impl Target for RedisCluster {
    const NAME: &'static str = "redis_cluster";
    type Raw = ClusterRaw;

    async fn setup() -> Result<Self, BoxError> {
        let url = std::env::var("DISTLOCK_TEST_REDIS_CLUSTER_URL")
            .ok()
            .filter(|u| !u.trim().is_empty())
            .ok_or(
                "DISTLOCK_TEST_REDIS_CLUSTER_URL is not set: run `scripts/servers.sh start` and \
                 export the variables from target/test-servers.env",
            )?;
        driver_redis::connect(&url).await?;
        Ok(RedisCluster { url })
    }

    async fn backend(&self) -> Result<Arc<dyn LockBackend>, BoxError> {
        Ok(driver_redis::connect(&self.url).await?)
    }

    fn url(&self) -> Option<String> {
        Some(self.url.clone())
    }

    async fn raw(&self) -> Result<Vec<(&'static str, ClusterRaw)>, BoxError> {
        raw_of(&self.url).await
    }
}

impl Target for RedisCluster1 {
    const NAME: &'static str = "redis_cluster1";
    type Raw = ClusterRaw;

    async fn setup() -> Result<Self, BoxError> {
        let port = free_port()?;
        let bus = free_port()?;
        let dir = ScratchDir::new("lockbench-cluster")?;
        let bin =
            std::env::var("DISTLOCK_REDIS_SERVER_BIN").unwrap_or_else(|_| "redis-server".into());
        let mut cmd = std::process::Command::new(bin);
        cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args([
                "--cluster-enabled",
                "yes",
                "--cluster-port",
                &bus.to_string(),
            ])
            .arg("--cluster-config-file")
            .arg(dir.path().join("nodes.conf"))
            .arg("--dir")
            .arg(dir.path());
        let server =
            ServerProcess::start(cmd, ([127, 0, 0, 1], port).into(), Duration::from_secs(10))
                .await?;
        let mut conn = redis::Client::open(format!("redis://127.0.0.1:{port}/"))?
            .get_multiplexed_async_connection()
            .await?;
        let _: () = redis::cmd("CLUSTER")
            .arg("ADDSLOTSRANGE")
            .arg(0)
            .arg(16383)
            .query_async(&mut conn)
            .await?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let info: String = redis::cmd("CLUSTER")
                .arg("INFO")
                .query_async(&mut conn)
                .await?;
            if info.contains("cluster_state:ok") {
                break;
            }
            if tokio::time::Instant::now() > deadline {
                return Err("the one-node cluster did not reach cluster_state:ok".into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(RedisCluster1 {
            url: format!("redis+cluster://127.0.0.1:{port}/"),
            _server: server,
            _dir: dir,
        })
    }

    async fn backend(&self) -> Result<Arc<dyn LockBackend>, BoxError> {
        Ok(driver_redis::connect(&self.url).await?)
    }

    fn url(&self) -> Option<String> {
        Some(self.url.clone())
    }

    async fn raw(&self) -> Result<Vec<(&'static str, ClusterRaw)>, BoxError> {
        raw_of(&self.url).await
    }
}

/// The Redis Cluster baselines.
pub enum ClusterRaw {
    /// `SET NX PX` + `EVALSHA` compare-and-delete through the cluster client.
    Plain(Plain<ClusterConnection>),
    /// The driver's scripts, called without lockcore.
    Scripts(Arc<RedisBackend>),
}

impl RawLock for ClusterRaw {
    async fn try_acquire(
        &self,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<bool, BoxError> {
        match self {
            ClusterRaw::Plain(p) => p.try_acquire(key, owner, ttl).await,
            ClusterRaw::Scripts(b) => Ok(matches!(
                LockBackendExt::try_acquire(&**b, key, owner, ttl).await?,
                AcquireOutcome::Acquired(_)
            )),
        }
    }

    async fn release(&self, key: &LockKey, owner: &Owner) -> Result<bool, BoxError> {
        match self {
            ClusterRaw::Plain(p) => p.release(key, owner, None).await,
            ClusterRaw::Scripts(b) => {
                Ok(LockBackend::release(&**b, key, owner).await? == ReleaseOutcome::Released)
            }
        }
    }
}
