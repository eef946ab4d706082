//! The Redis Sentinel test harness: clients of the shared test set-up (a master, a replica
//! and three sentinels, from `scripts/servers.sh`) under a fresh prefix, and for each fault
//! scenario a master of its own, watched by one sentinel per client that reaches it through
//! that client's proxy.

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use conformance_tests::process::{free_port, ScratchDir, ServerProcess};
use conformance_tests::{FaultClient, FaultStore, Harness, Restart, Tamper, TcpProxy};
use driver_redis::RedisBackend;
use lockcore::{LockClient, LockError, LockKey};

use super::{fresh_prefix, server_bin, RedisFaultStore, TIMEOUT};

/// The name the test sentinels monitor.
pub const MASTER: &str = "distlock-master";

/// The shared sentinel set-up's URL, or a failure that says how to get one.
pub fn sentinel_url() -> String {
    match std::env::var("DISTLOCK_TEST_REDIS_SENTINEL_URL") {
        Ok(url) if !url.trim().is_empty() => url,
        _ => panic!(
            "DISTLOCK_TEST_REDIS_SENTINEL_URL is not set: run `scripts/servers.sh start` and the \
             tests through `scripts/test.sh` (or export the variables from target/test-servers.env)"
        ),
    }
}

/// Clients of the shared sentinel set-up, all under one fresh prefix.
pub struct SentinelHarness {
    pub url: String,
    pub prefix: String,
}

impl SentinelHarness {
    pub fn new() -> Self {
        SentinelHarness {
            url: sentinel_url(),
            prefix: fresh_prefix(),
        }
    }

    pub async fn backend(&self) -> Result<Arc<RedisBackend>, LockError> {
        RedisBackend::builder(&self.url)
            .prefix(&self.prefix)
            .connect_timeout(TIMEOUT)
            .response_timeout(TIMEOUT)
            .build()
            .await
    }
}

#[async_trait::async_trait]
impl Harness for SentinelHarness {
    async fn client(&self) -> Result<LockClient, LockError> {
        Ok(LockClient::new(self.backend().await?))
    }

    fn ttl(&self) -> Duration {
        Duration::from_millis(400)
    }

    async fn fault_store(&self) -> Result<Option<Box<dyn FaultStore>>, LockError> {
        let master = RedisFaultStore::start(&[])
            .await
            .map_err(|e| LockError::unavailable("redis", e))?;
        Ok(Some(Box::new(SentinelFaultStore {
            master,
            sentinels: tokio::sync::Mutex::new(Vec::new()),
        })))
    }
}

/// Starts a sentinel on a free port that watches the master at `master` as [`MASTER`]
/// (quorum 1, and never judging it down within a test, so that it never tries a failover).
pub async fn start_sentinel(
    master: std::net::SocketAddr,
) -> std::io::Result<(ServerProcess, ScratchDir, u16)> {
    let port = free_port()?;
    let dir = ScratchDir::new("redis-sentinel")?;
    let conf = dir.path().join("sentinel.conf");
    std::fs::write(
        &conf,
        format!(
            "sentinel monitor {MASTER} {} {} 1\nsentinel down-after-milliseconds {MASTER} 600000\n",
            master.ip(),
            master.port()
        ),
    )?;
    let mut cmd = Command::new(server_bin());
    cmd.arg(&conf)
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--sentinel",
        ])
        .args(["--dir", &dir.path().display().to_string()]);
    let server =
        ServerProcess::start(cmd, ([127, 0, 0, 1], port).into(), Duration::from_secs(10)).await?;
    Ok((server, dir, port))
}

/// A master for one fault scenario; each client asks a sentinel of its own, which names
/// the master at the address of that client's proxy.
pub struct SentinelFaultStore {
    pub master: RedisFaultStore,
    sentinels: tokio::sync::Mutex<Vec<(ServerProcess, ScratchDir)>>,
}

#[async_trait::async_trait]
impl FaultStore for SentinelFaultStore {
    async fn client(&self) -> Result<FaultClient, LockError> {
        let failed = |e| LockError::unavailable("redis", e);
        let proxy = Arc::new(TcpProxy::start(self.master.addr()).await.map_err(failed)?);
        let (sentinel, dir, port) = start_sentinel(proxy.addr()).await.map_err(failed)?;
        self.sentinels.lock().await.push((sentinel, dir));
        let backend = RedisBackend::builder(format!("redis+sentinel://127.0.0.1:{port}/{MASTER}"))
            .prefix(&self.master.prefix)
            .connect_timeout(TIMEOUT)
            .response_timeout(TIMEOUT)
            .build()
            .await?;
        Ok(FaultClient {
            client: LockClient::new(backend),
            link: proxy,
        })
    }

    async fn stop(&self) -> Result<(), LockError> {
        self.master.stop().await
    }

    async fn start(&self) -> Result<(), LockError> {
        self.master.start().await
    }

    async fn restart(&self, how: Restart) -> Result<bool, LockError> {
        self.master.restart(how).await
    }

    async fn tamper(&self, key: &LockKey, how: Tamper) -> Result<(), LockError> {
        self.master.tamper(key, how).await
    }
}
