//! Test harness for the ZooKeeper backend: clients under a fresh random root of a shared
//! server, and fault stores on ZooKeeper servers of their own.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use conformance_tests::process::{free_port, ScratchDir, ServerProcess};
use conformance_tests::{FaultClient, FaultStore, Harness, Restart, Tamper, TcpProxy};
use distlock_zookeeper::zookeeper_client::{Acls, Client, CreateMode};
use distlock_zookeeper::{ZkBackend, ZkConfig};
use lockcore::{LockClient, LockError, LockKey};

/// The TTL unit of the scenarios, and the session timeout of their clients.
pub const TTL: Duration = Duration::from_secs(2);

/// The URL in `var`, or a failure telling how to get one.
pub fn url_from_env(var: &str) -> String {
    match std::env::var(var) {
        Ok(url) if !url.is_empty() => url,
        _ => panic!("{var} is not set: run `scripts/servers.sh start` and the tests through `scripts/test.sh` (or source target/test-servers.env)"),
    }
}

/// A random root, so runs and scenarios never see each other's nodes.
pub fn random_root() -> String {
    let token = lockcore::driver::OwnerToken::generate().to_hex();
    format!("/distlock-test/{}", &token[..12])
}

/// The session timeout of test clients: long enough that a lease of `TTL` is not cut
/// short by it, short enough that a paused holder's node goes within 3 TTLs.
pub const SESSION: Duration = Duration::from_millis(5000);

/// The configuration of a test client of `hosts`: connections and requests wait out the
/// suite's delayed answers (twice the TTL).
pub fn test_config(hosts: &str, root: &str) -> ZkConfig {
    ZkConfig::parse(&format!("zk://{hosts}"))
        .unwrap()
        .with_root(root)
        .unwrap()
        .with_session_timeout(SESSION)
        .with_connection_timeout(SESSION * 9 / 10)
        .with_timeout(SESSION)
}

/// Clients of a shared ZooKeeper (one server or an ensemble) under a root of their own.
pub struct ZkHarness {
    cfg: ZkConfig,
}

impl ZkHarness {
    pub fn from_env(var: &str) -> Self {
        let cfg = ZkConfig::parse(&url_from_env(var)).unwrap();
        ZkHarness {
            cfg: test_config(&cfg.place(), &random_root()),
        }
    }
}

#[async_trait::async_trait]
impl Harness for ZkHarness {
    async fn client(&self) -> Result<LockClient, LockError> {
        Ok(LockClient::new(ZkBackend::new(self.cfg.clone())))
    }

    fn ttl(&self) -> Duration {
        TTL
    }

    async fn fault_store(&self) -> Result<Option<Box<dyn FaultStore>>, LockError> {
        let store = ZkFaultStore::start().await.map_err(|e| {
            LockError::config(format!(
                "cannot start a ZooKeeper server for a fault scenario: {e}"
            ))
        })?;
        Ok(Some(Box::new(store)))
    }
}

/// The ZooKeeper jar: `DISTLOCK_ZK_JAR` or Debian's.
pub fn zk_jar() -> String {
    std::env::var("DISTLOCK_ZK_JAR").unwrap_or_else(|_| "/usr/share/java/zookeeper.jar".into())
}

/// One ZooKeeper server started by a test (standalone, or a member of an ensemble).
pub struct Server {
    pub client_port: u16,
    pub dir: std::path::PathBuf,
    pub process: Option<ServerProcess>,
}

impl Server {
    pub fn client_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.client_port))
    }

    /// Writes the server's `zoo.cfg` (and `myid` for an ensemble's member).
    pub fn configure(&self, myid: Option<usize>, servers: &str) -> std::io::Result<()> {
        let data = self.dir.join("data");
        std::fs::create_dir_all(&data)?;
        let cfg = format!(
            "tickTime=100\ninitLimit=50\nsyncLimit=20\ndataDir={}\nclientPort={}\n\
             clientPortAddress=127.0.0.1\nmaxSessionTimeout=60000\nadmin.enableServer=false\n\
             4lw.commands.whitelist=srvr,ruok\nforceSync=no\n{servers}",
            data.display(),
            self.client_port
        );
        std::fs::write(self.dir.join("zoo.cfg"), cfg)?;
        if let Some(id) = myid {
            std::fs::write(data.join("myid"), format!("{id}\n"))?;
        }
        Ok(())
    }

    fn command(&self) -> Command {
        let mut cmd = Command::new("java");
        cmd.args([
            "-Xmx256m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-cp",
        ]);
        cmd.arg(zk_jar());
        cmd.arg("org.apache.zookeeper.server.quorum.QuorumPeerMain");
        cmd.arg(self.dir.join("zoo.cfg"));
        cmd
    }

    /// Starts (or restarts, on the same data) the server's process.
    pub async fn start(&mut self) -> std::io::Result<()> {
        let p = ServerProcess::start(self.command(), self.client_addr(), Duration::from_secs(20))
            .await?;
        self.process = Some(p);
        Ok(())
    }

    pub fn kill(&mut self) {
        if let Some(mut p) = self.process.take() {
            p.kill();
        }
    }

    /// `srvr`'s `Mode:` line: `standalone`, `leader` or `follower`, once serving.
    pub fn mode(&self) -> Option<String> {
        use std::io::{Read, Write};
        let mut s =
            std::net::TcpStream::connect_timeout(&self.client_addr(), Duration::from_millis(500))
                .ok()?;
        s.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
        s.write_all(b"srvr").ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        out.lines()
            .find_map(|l| l.strip_prefix("Mode: ").map(str::to_owned))
    }
}

/// Waits until a session can be opened on `hosts` and a read answers.
pub async fn wait_ready(hosts: &str, within: Duration) -> Result<(), String> {
    let deadline = Instant::now() + within;
    loop {
        let attempt = async {
            let client = tokio::time::timeout(
                Duration::from_secs(2),
                Client::connector()
                    .with_session_timeout(Duration::from_secs(2))
                    .with_fail_eagerly()
                    .connect(hosts),
            )
            .await
            .map_err(|_| "timeout".to_string())?
            .map_err(|e| e.to_string())?;
            client.list_children("/").await.map_err(|e| e.to_string())
        };
        match attempt.await {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() > deadline => {
                return Err(format!("ZooKeeper at {hosts} not ready in {within:?}: {e}"))
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// A standalone server on a free port with its data in `dir`, started.
pub async fn standalone(dir: &Path) -> Result<Server, String> {
    let mut server = Server {
        client_port: free_port().map_err(|e| e.to_string())?,
        dir: dir.to_owned(),
        process: None,
    };
    server.configure(None, "").map_err(|e| e.to_string())?;
    server.start().await.map_err(|e| e.to_string())?;
    wait_ready(&server.client_addr().to_string(), Duration::from_secs(20)).await?;
    Ok(server)
}

/// A ZooKeeper server of its own for one fault scenario; each client talks to it through
/// a [`TcpProxy`] of its own. `stop` kills the process (SIGKILL); `start` restarts it on
/// the same data, so what was written survives, sessions included (they expire unless
/// their clients reconnect within their timeout).
pub struct ZkFaultStore {
    server: tokio::sync::Mutex<Server>,
    root: String,
    _dir: ScratchDir,
    proxies: Mutex<Vec<Arc<TcpProxy>>>,
}

impl ZkFaultStore {
    pub async fn start() -> Result<Self, String> {
        let dir = ScratchDir::new("zk-fault").map_err(|e| e.to_string())?;
        let server = standalone(dir.path()).await?;
        Ok(ZkFaultStore {
            server: tokio::sync::Mutex::new(server),
            root: random_root(),
            _dir: dir,
            proxies: Mutex::new(Vec::new()),
        })
    }

    /// A raw client of the server, as an operator's `zkCli.sh` would be.
    async fn raw(&self, session: Duration) -> Result<Client, LockError> {
        let addr = self.server.lock().await.client_addr();
        Client::connector()
            .with_session_timeout(session)
            .with_detached()
            .connect(&addr.to_string())
            .await
            .map_err(|e| LockError::unavailable("zookeeper", e))
    }
}

#[async_trait::async_trait]
impl FaultStore for ZkFaultStore {
    async fn client(&self) -> Result<FaultClient, LockError> {
        let addr = self.server.lock().await.client_addr();
        let proxy = Arc::new(
            TcpProxy::start(addr)
                .await
                .map_err(|e| LockError::unavailable("zookeeper", e))?,
        );
        self.proxies.lock().unwrap().push(proxy.clone());
        let cfg = test_config(&proxy.addr().to_string(), &self.root);
        Ok(FaultClient {
            client: LockClient::new(ZkBackend::new(cfg)),
            link: proxy,
        })
    }

    async fn stop(&self) -> Result<(), LockError> {
        self.server.lock().await.kill();
        Ok(())
    }

    async fn start(&self) -> Result<(), LockError> {
        let mut s = self.server.lock().await;
        s.start()
            .await
            .map_err(|e| LockError::unavailable("zookeeper", format!("restart: {e}")))?;
        wait_ready(&s.client_addr().to_string(), Duration::from_secs(20))
            .await
            .map_err(|e| LockError::unavailable("zookeeper", e))
    }

    /// Keeping the data: the server killed and started on its data directory (its
    /// transaction log is written before it answers). Losing it: not done — an ensemble
    /// that loses its data numbers zxids from the start again, and with them the fencing
    /// tokens (docs/zookeeper.md).
    async fn restart(&self, how: Restart) -> Result<bool, LockError> {
        if how != Restart::KeepData {
            return Ok(false);
        }
        self.stop().await?;
        self.start().await?;
        Ok(true)
    }

    /// Plain requests on the lock's node, as `zkCli.sh` would make them: `deleteall` of
    /// its children (the holders' sessions stay alive); each child deleted and a node of a
    /// stranger created in the line (Curator's shape, on a session of the stranger's own
    /// that expires after the TTL); or `set` of each child's data as it is (only the
    /// mzxid and version move).
    async fn tamper(&self, key: &LockKey, how: Tamper) -> Result<(), LockError> {
        let cfg = test_config("127.0.0.1:1", &self.root);
        let kp = ZkBackend::new(cfg).lock_path(key);
        let client = self.raw(TTL).await?;
        let fail =
            |e: distlock_zookeeper::zookeeper_client::Error| LockError::backend("zookeeper", e);
        let children = client.list_children(&kp).await.map_err(fail)?;
        if children.is_empty() && how != Tamper::Delete {
            return Err(LockError::config(format!(
                "no node of {:?} to change",
                key.as_str()
            )));
        }
        for child in &children {
            let path = format!("{kp}/{child}");
            match how {
                Tamper::Delete | Tamper::Reassign => {
                    client.delete(&path, None).await.map_err(fail)?
                }
                Tamper::Rewrite => {
                    let (data, _) = client.get_data(&path).await.map_err(fail)?;
                    client.set_data(&path, &data, None).await.map_err(fail)?;
                }
                other => return Err(LockError::config(format!("{other:?} is not implemented"))),
            }
        }
        if how == Tamper::Reassign {
            let id = lockcore::driver::OwnerToken::generate().to_hex();
            let name = format!(
                "{kp}/_c_{}-{}-{}-{}-{}-lock-",
                &id[..8],
                &id[8..12],
                &id[12..16],
                &id[16..20],
                &id[20..32]
            );
            client
                .create(
                    &name,
                    b"stranger",
                    &CreateMode::EphemeralSequential.with_acls(Acls::anyone_all()),
                )
                .await
                .map_err(fail)?;
        }
        Ok(())
    }

    fn connect_allowance(&self) -> Duration {
        Duration::from_millis(300)
    }
}
