//! Faults of a ZooKeeper ensemble: a session that expires while it holds, a client cut off
//! past its session timeout (through the suite's TCP proxy, on the shared three-server
//! ensemble of `DISTLOCK_TEST_ZK_CLUSTER_URL`), and a killed leader (on an ensemble of the
//! test's own).

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::{random_root, test_config, url_from_env, wait_ready, Server, SESSION, TTL};
use conformance_tests::process::{free_port, ScratchDir};
use conformance_tests::{FaultLink, TcpProxy};
use distlock_zookeeper::ZkBackend;
use lockcore::{FencedResource, LockClient};

/// The first server of the shared ensemble.
fn first_member() -> SocketAddr {
    let ports = url_from_env("DISTLOCK_TEST_ZK_CLUSTER_PORTS");
    let port = ports
        .split_whitespace()
        .next()
        .unwrap()
        .parse::<u16>()
        .unwrap();
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// A client of the shared ensemble's first server through a proxy of its own, and a
/// client of the whole ensemble, under one root.
async fn proxied_and_direct() -> (TcpProxy, LockClient, LockClient) {
    let root = random_root();
    let proxy = TcpProxy::start(first_member()).await.unwrap();
    let cut_off = LockClient::new(ZkBackend::new(test_config(
        &proxy.addr().to_string(),
        &root,
    )));
    let all = url_from_env("DISTLOCK_TEST_ZK_CLUSTER_URL");
    let hosts = all.trim_start_matches("zk://");
    let other = LockClient::new(ZkBackend::new(test_config(hosts, &root)));
    (proxy, cut_off, other)
}

/// A holder whose session expires while it holds (its link held past the session
/// timeout, then let through): another client takes the key once the servers expired the
/// session, with a higher token; the holder's `lost()` fires; when its link comes back its
/// renewals say `NotHeld`, and its next acquisition opens a new session and takes a token
/// above the other holder's.
#[tokio::test(flavor = "multi_thread")]
async fn session_expiry_while_holding() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let (proxy, a, b) = proxied_and_direct().await;
        let held = a.lock("expiring").ttl(TTL).acquire().await.unwrap();
        proxy.pause().await;
        let paused = Instant::now();
        let taken = b
            .lock("expiring")
            .ttl(TTL)
            .wait(SESSION * 4)
            .acquire()
            .await
            .unwrap();
        let waited = paused.elapsed();
        assert!(
            waited >= SESSION - Duration::from_millis(500),
            "taken over after {waited:?}, before the session ({SESSION:?}) could expire"
        );
        assert!(
            taken.token() > held.token(),
            "{} <= {}",
            taken.token(),
            held.token()
        );
        tokio::time::timeout(TTL * 2, held.lost())
            .await
            .expect("lost() did not fire");
        proxy.resume().await;
        assert!(
            held.extend().await.is_err(),
            "the expired hold was extended"
        );
        let taken_token = taken.token();
        taken.release().await.unwrap();
        let again = a
            .lock("expiring")
            .ttl(TTL)
            .wait(SESSION * 2)
            .acquire()
            .await
            .unwrap();
        assert!(
            again.token() > taken_token,
            "{} <= {taken_token}",
            again.token()
        );
        again.release().await.unwrap();
    })
    .await
    .expect("the test did not finish in 60 s");
}

/// A holder cut off from the ensemble past its session timeout and never let back: its
/// `renewal_failing()` fires, then its `lost()` by its lease's end, another client holds the key within a few seconds of
/// the session's expiry, and a fenced write with the cut-off holder's token is refused.
#[tokio::test(flavor = "multi_thread")]
async fn partitioned_past_session_timeout() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let (proxy, a, b) = proxied_and_direct().await;
        let resource = FencedResource::new(0u32);
        let held = a.lock("partitioned").ttl(TTL).acquire().await.unwrap();
        resource.write(held.token(), |v| *v = 1).unwrap();
        proxy.pause().await;
        let cut = Instant::now();
        // Disconnected, its renewals fail before the lease ends: `renewal_failing()` first,
        // then `lost()`.
        tokio::time::timeout(TTL, held.renewal_failing())
            .await
            .expect("renewal_failing() did not fire while the holder was cut off");
        assert!(
            !held.is_lost(),
            "lost before its renewals were seen failing"
        );
        tokio::time::timeout(TTL * 2, held.lost())
            .await
            .expect("lost() did not fire");
        let taken = b
            .lock("partitioned")
            .ttl(TTL)
            .wait(SESSION * 4)
            .acquire()
            .await
            .unwrap();
        assert!(
            cut.elapsed() < SESSION * 2,
            "the key stayed held {:?} after its holder was cut off",
            cut.elapsed()
        );
        resource.write(taken.token(), |v| *v = 2).unwrap();
        assert!(
            resource.write(held.token(), |v| *v = 99).is_err(),
            "a stale write was accepted"
        );
        assert_eq!(resource.read(), 2);
        taken.release().await.unwrap();
        drop(held);
        drop(proxy);
    })
    .await
    .expect("the test did not finish in 60 s");
}

/// Three servers of the test's own, started.
async fn own_ensemble(dir: &ScratchDir) -> Vec<Server> {
    let ports: Vec<(u16, u16, u16)> = (0..3)
        .map(|_| {
            (
                free_port().unwrap(),
                free_port().unwrap(),
                free_port().unwrap(),
            )
        })
        .collect();
    let lines: String = ports
        .iter()
        .enumerate()
        .map(|(i, (_, q, e))| format!("server.{}=127.0.0.1:{q}:{e}\n", i + 1))
        .collect();
    let mut servers = Vec::new();
    for (i, (c, _, _)) in ports.iter().enumerate() {
        let server = Server {
            client_port: *c,
            dir: dir.path().join(format!("s{}", i + 1)),
            process: None,
        };
        server.configure(Some(i + 1), &lines).unwrap();
        servers.push(server);
    }
    for server in &mut servers {
        server.start().await.unwrap();
    }
    let hosts = hosts_of(&servers);
    wait_ready(&hosts, Duration::from_secs(30)).await.unwrap();
    servers
}

fn hosts_of(servers: &[Server]) -> String {
    servers
        .iter()
        .map(|s| s.client_addr().to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// The index of the server that says it leads, once one does.
async fn leader(servers: &[Server], within: Duration) -> usize {
    let deadline = Instant::now() + within;
    loop {
        let found = servers
            .iter()
            .position(|s| s.process.is_some() && s.mode().as_deref() == Some("leader"));
        if let Some(i) = found {
            return i;
        }
        assert!(Instant::now() < deadline, "no leader within {within:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The leader killed (SIGKILL) under a held lock: the two others elect a new one, the
/// holder's client moves to a live server keeping its session, the hold is never lost,
/// and after its release another client takes the key with a higher token.
#[tokio::test(flavor = "multi_thread")]
async fn killed_leader_keeps_holds() {
    tokio::time::timeout(Duration::from_secs(90), async {
        let dir = ScratchDir::new("zk-ensemble").unwrap();
        let mut servers = own_ensemble(&dir).await;
        let hosts = hosts_of(&servers);
        let root = random_root();
        let session = Duration::from_secs(10);
        let cfg = test_config(&hosts, &root)
            .with_session_timeout(session)
            .with_connection_timeout(session * 2 / 5);
        let a = LockClient::new(ZkBackend::new(cfg.clone()));
        let b = LockClient::new(ZkBackend::new(cfg));
        let held = a.lock("leader").ttl(session).acquire().await.unwrap();
        let old = leader(&servers, Duration::from_secs(10)).await;
        servers[old].kill();
        let killed = Instant::now();
        let new = leader(&servers, Duration::from_secs(20)).await;
        eprintln!(
            "a new leader (server {}) after {:?}",
            new + 1,
            killed.elapsed()
        );
        assert_ne!(new, old);
        // A write through the new leader, then a renewal of the hold after it.
        let other = b
            .lock("elsewhere")
            .ttl(TTL)
            .wait(session)
            .acquire()
            .await
            .unwrap();
        other.release().await.unwrap();
        // The client reconnects to a live server on its own; each try is one renewal.
        let deadline = Instant::now() + session;
        while let Err(e) = held.extend().await {
            assert!(
                Instant::now() < deadline,
                "the hold was not renewed after the election: {e}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(!held.is_lost(), "the hold was lost across the election");
        let token = held.token();
        held.release().await.unwrap();
        let next = b
            .lock("leader")
            .ttl(TTL)
            .wait(session)
            .acquire()
            .await
            .unwrap();
        assert!(next.token() > token, "{} <= {token}", next.token());
        next.release().await.unwrap();
    })
    .await
    .expect("the test did not finish in 90 s");
}
