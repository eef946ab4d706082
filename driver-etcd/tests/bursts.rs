//! A burst of acquire attempts on a member of its own: every attempt is answered, and the
//! backend grants a bounded number of leases for them (the refused attempts' leases come
//! back as spares for the next ones) instead of one per attempt. Unbounded, 10,000 tasks
//! asking at once for 10,000 held keys sent 10,000 lease grants and as many transactions,
//! and the member answered none within the call timeout.

mod common;

use std::time::Duration;

use common::{members, wait_ready, TempDir};
use driver_etcd::{EtcdBackend, EtcdConfig};
use lockcore::{AcquireOutcome, LockBackend, LockKey, Owner};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Held keys, each asked for at once by a task of another backend.
const KEYS: usize = 400;

/// The most acquire attempts one backend has in flight (`ATTEMPTS_IN_FLIGHT`), each of
/// which may need a lease of its own.
const IN_FLIGHT: u64 = 64;

/// The member's count of granted leases, from its metrics endpoint.
async fn leases_granted(port: u16) -> u64 {
    let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    conn.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    let mut body = String::new();
    conn.read_to_string(&mut body).await.unwrap();
    body.lines()
        .find_map(|l| l.strip_prefix("etcd_debugging_lease_granted_total "))
        .and_then(|n| n.trim().parse().ok())
        .expect("the member reports etcd_debugging_lease_granted_total")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_attempts_on_held_keys_grants_a_bounded_number_of_leases() {
    let dir = TempDir::new("etcd-burst");
    let mut member = members(1, &dir).pop().unwrap();
    member.start().await.unwrap();
    let cfg = EtcdConfig::new([format!("127.0.0.1:{}", member.client_port)]);
    wait_ready(&cfg, Duration::from_secs(10)).await.unwrap();
    let ttl = Duration::from_secs(30);
    let keys: Vec<LockKey> = (0..KEYS)
        .map(|i| LockKey::new(format!("burst-{i}")).unwrap())
        .collect();
    let holder = EtcdBackend::new(cfg.clone()).unwrap();
    let owner = Owner::new("holder");
    for key in &keys {
        assert!(matches!(
            holder.try_acquire(key, &owner, ttl).await.unwrap(),
            AcquireOutcome::Acquired(_)
        ));
    }
    let before = leases_granted(member.client_port).await;
    let waiting = EtcdBackend::new(cfg).unwrap();
    let tasks: Vec<_> = keys
        .iter()
        .cloned()
        .map(|key| {
            let waiting = waiting.clone();
            tokio::spawn(async move {
                let owner = Owner::new("waiter");
                waiting.try_acquire(&key, &owner, ttl).await
            })
        })
        .collect();
    for task in tasks {
        match tokio::time::timeout(Duration::from_secs(60), task)
            .await
            .expect("the burst was not answered within 60 s")
            .unwrap()
        {
            Ok(AcquireOutcome::Held(_)) => {}
            other => panic!("an attempt on a held key answered {other:?}"),
        }
    }
    let granted = leases_granted(member.client_port).await - before;
    assert!(
        granted <= IN_FLIGHT,
        "{KEYS} attempts at once granted {granted} leases (at most {IN_FLIGHT} may be in flight)"
    );
    member.kill();
}
