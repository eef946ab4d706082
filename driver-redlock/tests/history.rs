//! The history checker (`conformance_tests::history`) on Redlock: worker processes lock one
//! key on five redis-server instances of the test's own while a nemesis pauses a holder
//! past its lease, kills one, and restarts all five instances (losing every key: tokens
//! must keep rising through the per-instance fence keys' clock floor).

mod common;

use std::time::Duration;

use conformance_tests::history::{HistoryStore, Mode, Workload};
use conformance_tests::process::{free_port, ServerProcess};
use distlock_redlock::RedlockBackend;
use lockcore::LockClient;

/// Five redis-servers of the test's own, restartable on their ports.
struct OwnInstances {
    ports: Vec<u16>,
    servers: tokio::sync::Mutex<Vec<ServerProcess>>,
}

impl OwnInstances {
    async fn start() -> OwnInstances {
        let mut ports = Vec::new();
        let mut servers = Vec::new();
        for _ in 0..5 {
            let port = free_port().unwrap();
            servers.push(common::start_server(port).await.unwrap());
            ports.push(port);
        }
        OwnInstances {
            ports,
            servers: tokio::sync::Mutex::new(servers),
        }
    }
}

#[async_trait::async_trait]
impl HistoryStore for OwnInstances {
    /// The instances' URLs, separated by spaces.
    fn address(&self) -> String {
        let urls: Vec<String> = self
            .ports
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}/"))
            .collect();
        urls.join(" ")
    }

    fn endpoints(&self) -> Vec<std::net::SocketAddr> {
        self.ports
            .iter()
            .map(|p| std::net::SocketAddr::from(([127, 0, 0, 1], *p)))
            .collect()
    }

    fn address_via(&self, via: &[std::net::SocketAddr]) -> String {
        let urls: Vec<String> = via.iter().map(|a| format!("redis://{a}/")).collect();
        urls.join(" ")
    }

    fn can_restart(&self) -> bool {
        true
    }

    async fn restart(&self) -> Result<(), String> {
        let mut servers = self.servers.lock().await;
        for s in servers.iter_mut() {
            s.kill();
        }
        servers.clear();
        for port in &self.ports {
            servers.push(
                common::start_server(*port)
                    .await
                    .map_err(|e| e.to_string())?,
            );
        }
        Ok(())
    }
}

/// A worker's client of the instances at `urls` (separated by spaces).
async fn connect(urls: String) -> Result<LockClient, lockcore::LockError> {
    let urls: Vec<String> = urls.split(' ').map(str::to_owned).collect();
    let backend = RedlockBackend::builder(urls)
        .instance_timeout(common::INSTANCE_TIMEOUT)
        .connect_timeout(common::CONNECT_TIMEOUT)
        .build()
        .await?;
    Ok(LockClient::new(backend))
}

conformance_tests::history_test!(
    history,
    workload: Workload::new(Duration::from_secs(1)),
    connect: connect,
    store: OwnInstances::start,
);

// Read-write locks only: Redlock declares no semaphores (a plain majority is not safe for a
// capacity of two or more: docs/redlock.md).
conformance_tests::history_test!(
    history_read_write,
    workload: Workload::new(Duration::from_secs(1)).mode(Mode::ReadWrite),
    connect: connect,
    store: OwnInstances::start,
);
