//! The history checker (`conformance_tests::history`) on redis: worker processes lock one
//! key on a redis-server of the test's own while a nemesis pauses a holder past its lease,
//! kills one, and restarts the server (which loses every key: tokens must keep rising
//! through the fence key's clock floor, and holders overlap only around the restart).

mod common;

use std::time::Duration;

use conformance_tests::history::{HistoryStore, Mode, Workload};
use conformance_tests::process::{free_port, ServerProcess};
use distlock_redis::RedisBackend;
use lockcore::LockClient;

/// A redis-server of the test's own, restartable on its port.
struct OwnRedis {
    port: u16,
    server: tokio::sync::Mutex<Option<ServerProcess>>,
}

impl OwnRedis {
    async fn start() -> OwnRedis {
        let port = free_port().unwrap();
        let server = common::start_server(port, &[]).await.unwrap();
        OwnRedis {
            port,
            server: tokio::sync::Mutex::new(Some(server)),
        }
    }
}

#[async_trait::async_trait]
impl HistoryStore for OwnRedis {
    fn address(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    fn can_restart(&self) -> bool {
        true
    }

    fn endpoints(&self) -> Vec<std::net::SocketAddr> {
        vec![([127, 0, 0, 1], self.port).into()]
    }

    fn address_via(&self, via: &[std::net::SocketAddr]) -> String {
        format!("redis://{}/", via[0])
    }

    async fn restart(&self) -> Result<(), String> {
        let mut server = self.server.lock().await;
        if let Some(mut s) = server.take() {
            s.kill();
        }
        *server = Some(
            common::start_server(self.port, &[])
                .await
                .map_err(|e| e.to_string())?,
        );
        Ok(())
    }
}

conformance_tests::history_test!(
    history,
    workload: Workload::new(Duration::from_millis(500)).rounds(2),
    connect: connect,
    store: OwnRedis::start,
);

/// A worker's client of the server at `url`.
async fn connect(url: String) -> Result<LockClient, lockcore::LockError> {
    let backend = RedisBackend::builder(&url)
        .connect_timeout(common::TIMEOUT)
        .response_timeout(common::TIMEOUT)
        .build()
        .await?;
    Ok(LockClient::new(backend))
}

conformance_tests::history_test!(
    history_read_write,
    workload: Workload::new(Duration::from_millis(500)).mode(Mode::ReadWrite),
    connect: connect,
    store: OwnRedis::start,
);

conformance_tests::history_test!(
    history_semaphore,
    workload: Workload::new(Duration::from_millis(500)).mode(Mode::Semaphore(2)),
    connect: connect,
    store: OwnRedis::start,
);
