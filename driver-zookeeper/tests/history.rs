//! The history checker (`conformance_tests::history`) on ZooKeeper: worker processes lock
//! one key on a server of the test's own while a nemesis pauses a holder past its lease,
//! kills one, and restarts the server (SIGKILL, then the same data directory: sessions and
//! their ephemeral nodes survive, expiring unless their clients come back; tokens are
//! czxids).

mod common;

use std::time::Duration;

use common::{standalone, test_config, wait_ready, Server, TTL};
use conformance_tests::history::{HistoryStore, Mode, Workload};
use conformance_tests::process::ScratchDir;
use distlock_zookeeper::ZkBackend;
use lockcore::LockClient;

/// The root every worker of one run shares (each run has a server of its own).
const ROOT: &str = "/distlock-history";

/// A ZooKeeper server of the test's own, restartable on its data directory.
struct OwnServer {
    server: tokio::sync::Mutex<Server>,
    addr: String,
    _dir: ScratchDir,
}

impl OwnServer {
    async fn start() -> OwnServer {
        let dir = ScratchDir::new("zk-history").unwrap();
        let server = standalone(dir.path()).await.unwrap();
        let addr = server.client_addr().to_string();
        OwnServer {
            server: tokio::sync::Mutex::new(server),
            addr,
            _dir: dir,
        }
    }
}

#[async_trait::async_trait]
impl HistoryStore for OwnServer {
    fn address(&self) -> String {
        self.addr.clone()
    }

    fn endpoints(&self) -> Vec<std::net::SocketAddr> {
        self.addr.parse().into_iter().collect()
    }

    fn address_via(&self, via: &[std::net::SocketAddr]) -> String {
        via[0].to_string()
    }

    fn can_restart(&self) -> bool {
        true
    }

    async fn restart(&self) -> Result<(), String> {
        let mut server = self.server.lock().await;
        server.kill();
        server.start().await.map_err(|e| e.to_string())?;
        wait_ready(&self.addr, Duration::from_secs(20)).await
    }
}

/// A client of the server at `addr`, each call bounded well under the TTL.
async fn connect(addr: String) -> Result<LockClient, lockcore::LockError> {
    let cfg = test_config(&addr, ROOT).with_timeout(Duration::from_millis(700));
    Ok(LockClient::new(ZkBackend::new(cfg)))
}

conformance_tests::history_test!(
    history,
    workload: Workload::new(TTL),
    connect: connect,
    store: OwnServer::start,
);

conformance_tests::history_test!(
    history_read_write,
    workload: Workload::new(TTL).mode(Mode::ReadWrite),
    connect: connect,
    store: OwnServer::start,
);

conformance_tests::history_test!(
    history_semaphore,
    workload: Workload::new(TTL).mode(Mode::Semaphore(2)),
    connect: connect,
    store: OwnServer::start,
);
