//! The history checker (`conformance_tests::history`) on etcd: worker processes lock one
//! key on an etcd member of the test's own while a nemesis pauses a holder past its lease,
//! kills one, and restarts the member (SIGKILL, then the same data directory: etcd is
//! durable, so the holder's key and lease survive; tokens are create revisions).

mod common;

use std::time::Duration;

use common::{members, wait_ready, Member, TempDir, TTL};
use conformance_tests::history::{HistoryStore, Mode, Workload};
use distlock_etcd::{EtcdBackend, EtcdConfig};
use lockcore::LockClient;

/// An etcd member of the test's own, restartable on its data directory.
struct OwnMember {
    member: tokio::sync::Mutex<Member>,
    addr: String,
    _dir: TempDir,
}

impl OwnMember {
    async fn start() -> OwnMember {
        let dir = TempDir::new("etcd-history");
        let mut member = members(1, &dir).pop().unwrap();
        member.start().await.unwrap();
        let addr = member.client_addr().to_string();
        wait_ready(&EtcdConfig::new([addr.clone()]), Duration::from_secs(10))
            .await
            .unwrap();
        OwnMember {
            member: tokio::sync::Mutex::new(member),
            addr,
            _dir: dir,
        }
    }
}

#[async_trait::async_trait]
impl HistoryStore for OwnMember {
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
        let mut member = self.member.lock().await;
        member.kill();
        member.start().await.map_err(|e| e.to_string())?;
        wait_ready(
            &EtcdConfig::new([self.addr.clone()]),
            Duration::from_secs(10),
        )
        .await
    }
}

/// A client of the member at `addr`, each call bounded well under the TTL.
async fn connect(addr: String) -> Result<LockClient, lockcore::LockError> {
    let cfg = EtcdConfig::new([addr]).with_timeout(Duration::from_millis(700));
    Ok(LockClient::new(EtcdBackend::new(cfg)?))
}

conformance_tests::history_test!(
    history,
    workload: Workload::new(TTL),
    connect: connect,
    store: OwnMember::start,
);

conformance_tests::history_test!(
    history_read_write,
    workload: Workload::new(TTL).mode(Mode::ReadWrite),
    connect: connect,
    store: OwnMember::start,
);

conformance_tests::history_test!(
    history_semaphore,
    workload: Workload::new(TTL).mode(Mode::Semaphore(2)),
    connect: connect,
    store: OwnMember::start,
);
