//! The Redis Sentinel test harness: clients of the shared test set-up (a master, a replica
//! and three sentinels, from `scripts/servers.sh`) under a fresh prefix, and for each fault
//! scenario a master of its own, watched by one sentinel per client that reaches it through
//! that client's proxy.

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use conformance_tests::process::{free_port, ScratchDir, ServerProcess};
use conformance_tests::{FaultClient, FaultStore, Harness, Restart, Tamper, TcpProxy};
use distlock_redis::RedisBackend;
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

/// A master, its replica and three sentinels of their own, for failover tests: the
/// sentinels know each other and the replica from their config files, so they can fail
/// over as soon as they start (quorum 2, a master judged down after 500 ms).
pub struct SentinelSet {
    pub master: Option<ServerProcess>,
    pub master_port: u16,
    pub replica: Option<ServerProcess>,
    pub replica_port: u16,
    pub sentinels: Vec<(ServerProcess, ScratchDir)>,
    pub sentinel_ports: Vec<u16>,
    _dirs: Vec<ScratchDir>,
}

impl SentinelSet {
    pub async fn start() -> std::io::Result<Self> {
        Self::start_with(&[]).await
    }

    /// As [`start`](Self::start), with more options for the master.
    pub async fn start_with(master_args: &[&str]) -> std::io::Result<Self> {
        let master_dir = ScratchDir::new("redis-master")?;
        let replica_dir = ScratchDir::new("redis-replica")?;
        let master_port = free_port()?;
        let replica_port = free_port()?;
        let dir_arg = |d: &ScratchDir| d.path().display().to_string();
        let dir = dir_arg(&master_dir);
        let mut args = vec!["--dir", dir.as_str(), "--repl-diskless-sync-delay", "0"];
        args.extend_from_slice(master_args);
        let master = super::start_server(master_port, &args).await?;
        let replica = super::start_server(
            replica_port,
            &[
                "--dir",
                &dir_arg(&replica_dir),
                "--replicaof",
                "127.0.0.1",
                &master_port.to_string(),
                "--repl-diskless-sync-delay",
                "0",
            ],
        )
        .await?;
        wait_info(replica_port, "master_link_status:up").await?;
        // The link is up before the master streams to it: after a diskless full sync the
        // master waits for the replica's first acknowledgement (sent once a second). Until
        // then a failover would lose every write: wait until one is acknowledged.
        let mut conn = super::raw(&format!("redis://127.0.0.1:{master_port}/")).await;
        let fail = |e: distlock_redis::redis::RedisError| std::io::Error::other(e.to_string());
        let _: () = distlock_redis::redis::cmd("SET")
            .arg("distlock-test:replicated")
            .arg(1)
            .query_async(&mut conn)
            .await
            .map_err(fail)?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            // Short waits: the connection's own response timeout is shorter than a second.
            let acknowledged: i64 = distlock_redis::redis::cmd("WAIT")
                .arg(1)
                .arg(200)
                .query_async(&mut conn)
                .await
                .map_err(fail)?;
            if acknowledged == 1 {
                break;
            }
            if tokio::time::Instant::now() > deadline {
                return Err(std::io::Error::other(
                    "the replica acknowledged no write in 10 s",
                ));
            }
        }
        let sentinel_ports = vec![free_port()?, free_port()?, free_port()?];
        let ids: Vec<String> = (0..3).map(|i| format!("{:040x}", 0xd15 + i)).collect();
        let mut sentinels = Vec::new();
        for (i, &port) in sentinel_ports.iter().enumerate() {
            let dir = ScratchDir::new("redis-sentinel")?;
            let mut conf = format!(
                "sentinel myid {}\nsentinel monitor {MASTER} 127.0.0.1 {master_port} 2\n\
                 sentinel down-after-milliseconds {MASTER} 500\nsentinel failover-timeout {MASTER} 3000\n\
                 sentinel parallel-syncs {MASTER} 1\nsentinel known-replica {MASTER} 127.0.0.1 {replica_port}\n",
                ids[i]
            );
            for (j, &other) in sentinel_ports.iter().enumerate() {
                if j != i {
                    conf.push_str(&format!(
                        "sentinel known-sentinel {MASTER} 127.0.0.1 {other} {}\n",
                        ids[j]
                    ));
                }
            }
            let path = dir.path().join("sentinel.conf");
            std::fs::write(&path, conf)?;
            let mut cmd = Command::new(server_bin());
            cmd.arg(&path)
                .args([
                    "--port",
                    &port.to_string(),
                    "--bind",
                    "127.0.0.1",
                    "--sentinel",
                ])
                .args(["--dir", &dir_arg(&dir)]);
            let server =
                ServerProcess::start(cmd, ([127, 0, 0, 1], port).into(), Duration::from_secs(10))
                    .await?;
            sentinels.push((server, dir));
        }
        Ok(SentinelSet {
            master: Some(master),
            master_port,
            replica: Some(replica),
            replica_port,
            sentinels,
            sentinel_ports,
            _dirs: vec![master_dir, replica_dir],
        })
    }

    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinel_ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!("redis+sentinel://{}/{MASTER}", hosts.join(","))
    }

    /// The master's port as the first sentinel names it now.
    pub async fn named_master(&self) -> Option<u16> {
        let mut conn = super::raw(&format!("redis://127.0.0.1:{}/", self.sentinel_ports[0])).await;
        let answer: Option<(String, String)> = distlock_redis::redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(MASTER)
            .query_async(&mut conn)
            .await
            .ok()?;
        answer.and_then(|(_, port)| port.parse().ok())
    }
}

/// Waits (bounded, 20 s: a sentinel looks at a demoted master every 10 s) until `INFO` of
/// the server at `port` has the line `line`.
pub async fn wait_info(port: u16, line: &str) -> std::io::Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let client = distlock_redis::redis::Client::open(format!("redis://127.0.0.1:{port}/"))
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        if let Ok(mut conn) = client.get_multiplexed_async_connection().await {
            let info: String = distlock_redis::redis::cmd("INFO")
                .query_async(&mut conn)
                .await
                .unwrap_or_default();
            if info.lines().any(|l| l.trim_end() == line) {
                return Ok(());
            }
        }
        if tokio::time::Instant::now() > deadline {
            return Err(std::io::Error::other(format!(
                "the server on {port} did not show {line} in 20 s"
            )));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
