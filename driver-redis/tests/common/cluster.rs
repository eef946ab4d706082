//! The Redis Cluster test harness: clients of the shared test cluster (three masters, three
//! replicas, from `scripts/servers.sh`) under a fresh prefix, and for each fault scenario a
//! cluster of its own: one node owning every slot, reached by each client through a proxy
//! of its own.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use conformance_tests::process::{free_port, ScratchDir, ServerProcess};
use conformance_tests::{FaultClient, FaultStore, Harness, Restart, Tamper, TcpProxy};
use distlock_redis::RedisBackend;
use lockcore::{LockClient, LockError, LockKey};

use super::{fresh_prefix, start_server, RedisFaultStore, TIMEOUT};

/// The shared test cluster's URL, or a failure that says how to get one.
pub fn cluster_url() -> String {
    match std::env::var("DISTLOCK_TEST_REDIS_CLUSTER_URL") {
        Ok(url) if !url.trim().is_empty() => url,
        _ => panic!(
            "DISTLOCK_TEST_REDIS_CLUSTER_URL is not set: run `scripts/servers.sh start` and the \
             tests through `scripts/test.sh` (or export the variables from target/test-servers.env)"
        ),
    }
}

/// The ports of the shared test cluster's nodes (masters and replicas).
pub fn cluster_ports() -> Vec<u16> {
    std::env::var("DISTLOCK_TEST_REDIS_CLUSTER_PORTS")
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// Clients of the shared test cluster, all under one fresh prefix.
pub struct ClusterHarness {
    pub url: String,
    pub prefix: String,
}

impl ClusterHarness {
    pub fn new() -> Self {
        ClusterHarness {
            url: cluster_url(),
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
impl Harness for ClusterHarness {
    async fn client(&self) -> Result<LockClient, LockError> {
        Ok(LockClient::new(self.backend().await?))
    }

    fn ttl(&self) -> Duration {
        Duration::from_millis(400)
    }

    async fn fault_store(&self) -> Result<Option<Box<dyn FaultStore>>, LockError> {
        let store = ClusterFaultStore::start()
            .await
            .map_err(|e| LockError::unavailable("redis", e))?;
        Ok(Some(Box::new(store)))
    }
}

/// A one-node Redis Cluster for one fault scenario: a [`RedisFaultStore`] whose server is a
/// cluster node owning every slot (it keeps them in `nodes.conf` across restarts). The node
/// names no host for itself (`cluster-preferred-endpoint-type unknown-endpoint`), so a
/// client that came through `127.0.0.N:port` is sent back there: each client's proxy listens
/// on a loopback address of its own, at the node's port.
pub struct ClusterFaultStore {
    pub node: RedisFaultStore,
    /// The last loopback address handed to a client's proxy (127.0.0.N).
    next_host: AtomicU8,
}

impl ClusterFaultStore {
    pub async fn start() -> std::io::Result<Self> {
        let bus = free_port()?.to_string();
        let node = RedisFaultStore::start(&[
            "--cluster-enabled",
            "yes",
            "--cluster-port",
            &bus,
            // Relative to the node's directory.
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-preferred-endpoint-type",
            "unknown-endpoint",
            "--cluster-node-timeout",
            "2000",
        ])
        .await?;
        let store = ClusterFaultStore {
            node,
            next_host: AtomicU8::new(1),
        };
        store.assign_slots().await?;
        Ok(store)
    }

    /// Gives the node every slot and waits until it serves them.
    async fn assign_slots(&self) -> std::io::Result<()> {
        let mut conn = super::raw(&self.node.url()).await;
        let fail = |e: distlock_redis::redis::RedisError| std::io::Error::other(e.to_string());
        let _: () = distlock_redis::redis::cmd("CLUSTER")
            .arg("ADDSLOTSRANGE")
            .arg(0)
            .arg(16383)
            .query_async(&mut conn)
            .await
            .map_err(fail)?;
        wait_cluster_ok(&mut conn).await
    }

    /// A backend behind a proxy of its own, and the proxy.
    pub async fn proxied_backend(&self) -> Result<(Arc<RedisBackend>, Arc<TcpProxy>), LockError> {
        let n = self
            .next_host
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_add(1)
            .max(2);
        let listen: SocketAddr = ([127, 0, 0, n], self.node.port).into();
        let proxy = Arc::new(
            TcpProxy::start_at(listen, self.node.addr())
                .await
                .map_err(|e| LockError::unavailable("redis", e))?,
        );
        let backend = RedisBackend::builder(format!("redis+cluster://{listen}/"))
            .prefix(&self.node.prefix)
            .connect_timeout(TIMEOUT)
            .response_timeout(TIMEOUT)
            .build()
            .await?;
        Ok((backend, proxy))
    }
}

/// Waits (bounded) until the node at the other end of `conn` says `cluster_state:ok`.
pub async fn wait_cluster_ok(
    conn: &mut distlock_redis::redis::aio::MultiplexedConnection,
) -> std::io::Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let info: String = distlock_redis::redis::cmd("CLUSTER")
            .arg("INFO")
            .query_async(conn)
            .await
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        if info.contains("cluster_state:ok") {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            return Err(std::io::Error::other(format!(
                "the cluster did not reach cluster_state:ok in 10 s: {info}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[async_trait::async_trait]
impl FaultStore for ClusterFaultStore {
    async fn client(&self) -> Result<FaultClient, LockError> {
        let (backend, proxy) = self.proxied_backend().await?;
        Ok(FaultClient {
            client: LockClient::new(backend),
            link: proxy,
        })
    }

    async fn stop(&self) -> Result<(), LockError> {
        self.node.stop().await
    }

    async fn start(&self) -> Result<(), LockError> {
        self.node.start().await
    }

    async fn restart(&self, how: Restart) -> Result<bool, LockError> {
        self.node.restart(how).await
    }

    async fn tamper(&self, key: &LockKey, how: Tamper) -> Result<(), LockError> {
        self.node.tamper(key, how).await
    }
}

/// A Redis Cluster of its own (three masters, three replicas), for failover tests: a node
/// is judged failed after 1 s.
pub struct ClusterSet {
    pub nodes: Vec<(u16, Option<ServerProcess>)>,
    _dirs: Vec<ScratchDir>,
}

impl ClusterSet {
    pub async fn start() -> std::io::Result<Self> {
        let mut nodes = Vec::new();
        let mut dirs = Vec::new();
        for _ in 0..6 {
            let port = free_port()?;
            let bus = free_port()?;
            let dir = ScratchDir::new("redis-cluster-node")?;
            let args: Vec<String> = [
                "--cluster-enabled",
                "yes",
                "--cluster-port",
                &bus.to_string(),
                "--cluster-config-file",
                &dir.path().join("nodes.conf").display().to_string(),
                "--cluster-node-timeout",
                "1000",
                "--repl-diskless-sync-delay",
                "0",
                "--dir",
                &dir.path().display().to_string(),
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            let refs: Vec<&str> = args.iter().map(String::as_str).collect();
            nodes.push((port, Some(start_server(port, &refs).await?)));
            dirs.push(dir);
        }
        let mut create = tokio::process::Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for (port, _) in &nodes {
            create.arg(format!("127.0.0.1:{port}"));
        }
        create
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        let created = tokio::time::timeout(Duration::from_secs(30), create.output())
            .await
            .map_err(|_| std::io::Error::other("redis-cli --cluster create took over 30 s"))??;
        if !created.status.success() {
            return Err(std::io::Error::other(format!(
                "redis-cli --cluster create failed: {}",
                String::from_utf8_lossy(&created.stderr)
            )));
        }
        let set = ClusterSet { nodes, _dirs: dirs };
        for (port, _) in &set.nodes {
            let mut conn = super::raw(&format!("redis://127.0.0.1:{port}/")).await;
            wait_cluster_ok(&mut conn).await?;
        }
        // Every replica streams from its master: a write on each master acknowledged by
        // its replica (after a diskless sync the master streams only after the replica's
        // first acknowledgement, up to a second later).
        for master in set.masters().await? {
            let mut conn = super::raw(&format!("redis://127.0.0.1:{}/", master.0)).await;
            let key = (0..)
                .map(|i| format!("probe-{i}"))
                .find(|k| {
                    master
                        .1
                        .iter()
                        .any(|&(a, b)| (a..=b).contains(&key_slot(k)))
                })
                .unwrap_or_default();
            let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
            loop {
                let _: () = distlock_redis::redis::cmd("SET")
                    .arg(&key)
                    .arg(1)
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| std::io::Error::other(e.to_string()))?;
                let acked: i64 = distlock_redis::redis::cmd("WAIT")
                    .arg(1)
                    .arg(200)
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| std::io::Error::other(e.to_string()))?;
                if acked == 1 {
                    break;
                }
                if tokio::time::Instant::now() > deadline {
                    return Err(std::io::Error::other(format!(
                        "the replica of {} acknowledged nothing in 20 s",
                        master.0
                    )));
                }
            }
        }
        Ok(set)
    }

    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|(p, _)| format!("127.0.0.1:{p}"))
            .collect();
        format!("redis+cluster://{}/", hosts.join(","))
    }

    /// The masters (port, slot ranges) as a live node sees them.
    pub async fn masters(&self) -> std::io::Result<Vec<(u16, Vec<(u16, u16)>)>> {
        let (port, _) = self
            .nodes
            .iter()
            .find(|(_, s)| s.is_some())
            .ok_or_else(|| std::io::Error::other("no live node"))?;
        let mut conn = super::raw(&format!("redis://127.0.0.1:{port}/")).await;
        let nodes: String = distlock_redis::redis::cmd("CLUSTER")
            .arg("NODES")
            .query_async(&mut conn)
            .await
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        Ok(nodes
            .lines()
            .filter_map(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                let flags = fields.get(2)?;
                if !flags.split(',').any(|f| f == "master") || flags.contains("fail") {
                    return None;
                }
                let port = fields[1]
                    .split('@')
                    .next()?
                    .rsplit(':')
                    .next()?
                    .parse()
                    .ok()?;
                let slots: Vec<(u16, u16)> = fields[8..]
                    .iter()
                    .filter_map(|s| match s.split_once('-') {
                        Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                        None => s.parse().ok().map(|a| (a, a)),
                    })
                    .collect();
                (!slots.is_empty()).then_some((port, slots))
            })
            .collect())
    }

    /// Kills the node on `port` (SIGKILL).
    pub fn kill(&mut self, port: u16) {
        if let Some((_, server)) = self.nodes.iter_mut().find(|(p, _)| *p == port) {
            if let Some(mut server) = server.take() {
                server.kill();
            }
        }
    }
}

/// The Redis Cluster slot of `name` (CRC16/XMODEM of its hash tag, modulo 16384).
pub fn key_slot(name: &str) -> u16 {
    let bytes = name.as_bytes();
    let tagged = bytes.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &bytes[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    let data = tagged.unwrap_or(bytes);
    let mut crc: u16 = 0;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}
