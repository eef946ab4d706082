//! Test harness for the etcd backend: clients under a fresh random namespace of a shared
//! server, and fault stores on etcd members of their own.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use conformance_tests::process::{free_port, ServerProcess};
use conformance_tests::{FaultClient, FaultStore, Harness, Restart, Tamper, TcpProxy};
use distlock_etcd::{EtcdBackend, EtcdConfig};
use lockcore::{LockClient, LockError, LockKey};

/// The TTL unit of the scenarios: etcd's minimum lease TTL.
pub const TTL: Duration = Duration::from_secs(2);

/// The URL in `var`, or a failure telling how to get one.
pub fn url_from_env(var: &str) -> String {
    match std::env::var(var) {
        Ok(url) if !url.is_empty() => url,
        _ => panic!("{var} is not set: run `scripts/servers.sh start` and the tests through `scripts/test.sh` (or source target/test-servers.env)"),
    }
}

/// A random namespace, so runs and scenarios never see each other's keys.
pub fn random_namespace() -> String {
    let token = lockcore::driver::OwnerToken::generate().to_hex();
    format!("distlock-test/{}/", &token[..12])
}

/// Clients of a shared etcd (one member or a cluster) under a namespace of their own.
pub struct EtcdHarness {
    cfg: EtcdConfig,
}

impl EtcdHarness {
    pub fn from_env(var: &str) -> Self {
        let cfg = EtcdConfig::parse(&url_from_env(var))
            .unwrap()
            .with_namespace(&random_namespace())
            .unwrap();
        EtcdHarness { cfg }
    }
}

#[async_trait::async_trait]
impl Harness for EtcdHarness {
    async fn client(&self) -> Result<LockClient, LockError> {
        Ok(LockClient::new(EtcdBackend::new(self.cfg.clone())?))
    }

    fn ttl(&self) -> Duration {
        TTL
    }

    async fn fault_store(&self) -> Result<Option<Box<dyn FaultStore>>, LockError> {
        let store = EtcdFaultStore::start().await.map_err(|e| {
            LockError::config(format!(
                "cannot start an etcd member for a fault scenario: {e}"
            ))
        })?;
        Ok(Some(Box::new(store)))
    }
}

/// The etcd binary: `DISTLOCK_ETCD_BIN` or `etcd` on the PATH.
pub fn etcd_bin() -> String {
    std::env::var("DISTLOCK_ETCD_BIN").unwrap_or_else(|_| "etcd".into())
}

/// A directory under the system temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        let token = lockcore::driver::OwnerToken::generate().to_hex();
        let dir = std::env::temp_dir().join(format!("distlock-{tag}-{}", &token[..12]));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One member of an etcd cluster started by a test.
pub struct Member {
    pub name: String,
    pub client_port: u16,
    pub peer_port: u16,
    pub data_dir: PathBuf,
    pub initial_cluster: String,
    pub process: Option<ServerProcess>,
}

impl Member {
    pub fn client_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.client_port))
    }

    fn command(&self) -> Command {
        let mut cmd = Command::new(etcd_bin());
        let c = format!("http://127.0.0.1:{}", self.client_port);
        let p = format!("http://127.0.0.1:{}", self.peer_port);
        cmd.arg("--name").arg(&self.name);
        cmd.arg("--data-dir").arg(&self.data_dir);
        cmd.args(["--listen-client-urls", &c, "--advertise-client-urls", &c]);
        cmd.args([
            "--listen-peer-urls",
            &p,
            "--initial-advertise-peer-urls",
            &p,
        ]);
        cmd.args(["--initial-cluster", &self.initial_cluster]);
        cmd.args([
            "--initial-cluster-state",
            "new",
            "--initial-cluster-token",
            "distlock-fault",
        ]);
        cmd.args(["--heartbeat-interval", "100", "--election-timeout", "1000"]);
        cmd
    }

    /// Starts (or restarts, on the same data dir) the member's process.
    pub async fn start(&mut self) -> std::io::Result<()> {
        let p = ServerProcess::start(self.command(), self.client_addr(), Duration::from_secs(10))
            .await?;
        self.process = Some(p);
        Ok(())
    }

    pub fn kill(&mut self) {
        if let Some(mut p) = self.process.take() {
            p.kill();
        }
    }
}

/// Members of a fresh cluster of `n` on free ports, data in `dir` (not started).
pub fn members(n: usize, dir: &TempDir) -> Vec<Member> {
    let ports: Vec<(u16, u16)> = (0..n)
        .map(|_| (free_port().unwrap(), free_port().unwrap()))
        .collect();
    let initial_cluster = ports
        .iter()
        .enumerate()
        .map(|(i, (_, p))| format!("m{i}=http://127.0.0.1:{p}"))
        .collect::<Vec<_>>()
        .join(",");
    ports
        .into_iter()
        .enumerate()
        .map(|(i, (c, p))| Member {
            name: format!("m{i}"),
            client_port: c,
            peer_port: p,
            data_dir: dir.0.join(format!("m{i}")),
            initial_cluster: initial_cluster.clone(),
            process: None,
        })
        .collect()
}

/// Waits until a backend over `cfg` can read, i.e. the cluster has a leader.
pub async fn wait_ready(cfg: &EtcdConfig, within: Duration) -> Result<(), String> {
    let backend = EtcdBackend::new(cfg.clone().with_timeout(Duration::from_millis(500)))
        .map_err(|e| e.to_string())?;
    let probe = LockKey::new("ready-probe").unwrap();
    let deadline = Instant::now() + within;
    loop {
        match lockcore::LockBackend::holders(&*backend, &probe).await {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() > deadline => {
                return Err(format!("etcd not ready in {within:?}: {e}"))
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// A single etcd member of its own for one fault scenario; each client talks to it
/// through a [`TcpProxy`] of its own. `stop` kills the process (SIGKILL); `start` restarts
/// it on the same data directory, so what was written survives (etcd is durable; leases
/// are renewed for a full TTL when the member comes back, as on any leader change).
pub struct EtcdFaultStore {
    member: tokio::sync::Mutex<Member>,
    namespace: String,
    _dir: TempDir,
    proxies: Mutex<Vec<Arc<TcpProxy>>>,
}

impl EtcdFaultStore {
    pub async fn start() -> Result<Self, String> {
        let dir = TempDir::new("etcd-fault");
        let mut member = members(1, &dir).pop().unwrap();
        member.start().await.map_err(|e| e.to_string())?;
        let cfg = EtcdConfig::new([format!("127.0.0.1:{}", member.client_port)]);
        wait_ready(&cfg, Duration::from_secs(10)).await?;
        Ok(EtcdFaultStore {
            member: tokio::sync::Mutex::new(member),
            namespace: random_namespace(),
            _dir: dir,
            proxies: Mutex::new(Vec::new()),
        })
    }
}

#[async_trait::async_trait]
impl FaultStore for EtcdFaultStore {
    async fn client(&self) -> Result<FaultClient, LockError> {
        let addr = self.member.lock().await.client_addr();
        let proxy = Arc::new(
            TcpProxy::start(addr)
                .await
                .map_err(|e| LockError::unavailable("etcd", e))?,
        );
        self.proxies.lock().unwrap().push(proxy.clone());
        let cfg = EtcdConfig::new([proxy.addr().to_string()]).with_namespace(&self.namespace)?;
        Ok(FaultClient {
            client: LockClient::new(EtcdBackend::new(cfg)?),
            link: proxy,
        })
    }

    async fn stop(&self) -> Result<(), LockError> {
        self.member.lock().await.kill();
        Ok(())
    }

    async fn start(&self) -> Result<(), LockError> {
        let mut m = self.member.lock().await;
        m.start()
            .await
            .map_err(|e| LockError::unavailable("etcd", format!("restart: {e}")))?;
        let cfg = EtcdConfig::new([format!("127.0.0.1:{}", m.client_port)]);
        wait_ready(&cfg, Duration::from_secs(10))
            .await
            .map_err(|e| LockError::unavailable("etcd", e))
    }

    /// Keeping the data: the member killed and started on its data directory (etcd syncs
    /// its log before it answers). Losing it: not done — an etcd cluster that loses its data
    /// numbers revisions from 1 again, and with them the fencing tokens (docs/etcd.md).
    async fn restart(&self, how: Restart) -> Result<bool, LockError> {
        if how != Restart::KeepData {
            return Ok(false);
        }
        self.stop().await?;
        self.start().await?;
        Ok(true)
    }

    /// Plain requests on the lock's etcd key and every key under it (a FIFO queue's
    /// places), as `etcdctl` would: `del --prefix` (the holders' leases stay alive); a `put`
    /// of each value naming a stranger, on a lease of the stranger's own that lasts what the
    /// holder's had left (the create revision, the token, stays); or a `put` of each value
    /// as it is on the lease it has (only the mod revision moves).
    async fn tamper(&self, key: &LockKey, how: Tamper) -> Result<(), LockError> {
        use distlock_etcd::etcd_client::{Client, DeleteOptions, GetOptions, PutOptions};
        let addr = self.member.lock().await.client_addr();
        let cfg = EtcdConfig::new([addr.to_string()]).with_namespace(&self.namespace)?;
        let etcd_key = EtcdBackend::new(cfg)?.etcd_key(key);
        let unavailable = |e: distlock_etcd::etcd_client::Error| LockError::unavailable("etcd", e);
        let mut client = Client::connect([addr.to_string()], None)
            .await
            .map_err(unavailable)?;
        if how == Tamper::Delete {
            client
                .delete(etcd_key, Some(DeleteOptions::new().with_prefix()))
                .await
                .map_err(unavailable)?;
            return Ok(());
        }
        let found = client
            .get(etcd_key, Some(GetOptions::new().with_prefix()))
            .await
            .map_err(unavailable)?;
        if found.kvs().is_empty() {
            return Err(LockError::config(format!(
                "no etcd key of {:?} to rewrite",
                key.as_str()
            )));
        }
        let stranger = lockcore::Owner::new("stranger").token().to_hex();
        for kv in found.kvs() {
            let mut value = kv.value().to_vec();
            let lease = match how {
                Tamper::Rewrite => kv.lease(),
                Tamper::Reassign => {
                    // The holder's owner token is the 32 hex digits after the version tag.
                    if value.len() >= 33 {
                        value[1..33].copy_from_slice(stranger.as_bytes());
                    }
                    let left = client
                        .lease_time_to_live(kv.lease(), None)
                        .await
                        .map_err(unavailable)?
                        .ttl()
                        .max(1);
                    client
                        .lease_grant(left, None)
                        .await
                        .map_err(unavailable)?
                        .id()
                }
                other => return Err(LockError::config(format!("{other:?} is not implemented"))),
            };
            let options = (lease != 0).then(|| PutOptions::new().with_lease(lease));
            client
                .put(kv.key().to_vec(), value, options)
                .await
                .map_err(unavailable)?;
        }
        Ok(())
    }
}

/// One test per scenario `fn name(var: &str)` on the single member (`mod single`) and on
/// the cluster (`mod cluster`).
#[allow(unused_macros)]
macro_rules! on_both {
    ($($test:ident),* $(,)?) => {
        mod single {
            $(
                #[test]
                fn $test() {
                    super::$test("DISTLOCK_TEST_ETCD_URL");
                }
            )*
        }
        mod cluster {
            $(
                #[test]
                fn $test() {
                    super::$test("DISTLOCK_TEST_ETCD_CLUSTER_URL");
                }
            )*
        }
    };
}
