//! Many keys at once, each test on a member of its own, counted by the member's metrics:
//!
//! * a burst of acquire attempts is answered, and the backend grants a bounded number of
//!   leases for it (each refused attempt's place is abandoned, and its lease comes back as
//!   a spare for the next attempt) instead of one per attempt, and leaves no place behind.
//!   Unbounded, 10,000 tasks asking at once for 10,000 held keys sent 10,000 lease grants
//!   and as many transactions, and the member answered none within the call timeout;
//! * waiters on many keys share one watch stream (a stream per key cost 29 KB each), every
//!   waiter is woken by its key's release, and the watches are cancelled once nobody waits.

mod common;

use std::time::{Duration, Instant};

use common::{members, wait_ready, TempDir};
use distlock_etcd::{EtcdBackend, EtcdConfig};
use lockcore::driver::{AcquireOutcome, LockBackendExt};
use lockcore::{LockClient, LockKey, Owner};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Held keys, each asked for at once by a task of another backend.
const KEYS: usize = 400;

/// The most acquire attempts one backend has in flight (`ATTEMPTS_IN_FLIGHT`). A refused
/// attempt's place keeps its lease until lockcore abandons it, after the attempt has given
/// its turn to the next one, and an abandoned place's lease is kept as a spare (up to 64,
/// more are revoked): leases live in three groups of at most this many each.
const IN_FLIGHT: u64 = 64;

/// One figure of the member's metrics endpoint.
async fn metric(port: u16, name: &str) -> u64 {
    let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    conn.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    let mut body = String::new();
    conn.read_to_string(&mut body).await.unwrap();
    body.lines()
        .filter_map(|l| l.strip_prefix(name))
        .find_map(|rest| rest.strip_prefix(' '))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("the member reports no {name}"))
}

/// The member's count of granted leases.
async fn leases_granted(port: u16) -> u64 {
    metric(port, "etcd_debugging_lease_granted_total").await
}

/// A member of its own, ready.
async fn member(tag: &str) -> (TempDir, common::Member, EtcdConfig) {
    let dir = TempDir::new(tag);
    let mut member = members(1, &dir).pop().unwrap();
    member.start().await.unwrap();
    let cfg = EtcdConfig::new([format!("127.0.0.1:{}", member.client_port)]);
    wait_ready(&cfg, Duration::from_secs(10)).await.unwrap();
    (dir, member, cfg)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_attempts_on_held_keys_grants_a_bounded_number_of_leases() {
    let (_dir, mut member, cfg) = member("etcd-burst").await;
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
    let waiting = LockClient::new(EtcdBackend::new(cfg.clone()).unwrap());
    let tasks: Vec<_> = keys
        .iter()
        .cloned()
        .map(|key| {
            let waiting = waiting.clone();
            tokio::spawn(async move { waiting.lock(key.as_str()).ttl(ttl).try_acquire().await })
        })
        .collect();
    for task in tasks {
        match tokio::time::timeout(Duration::from_secs(60), task)
            .await
            .expect("the burst was not answered within 60 s")
            .unwrap()
        {
            Ok(None) => {}
            other => panic!("an attempt on a held key answered {other:?}"),
        }
    }
    // Nothing of the refused attempts is left queued: one place per held key.
    let mut raw = distlock_etcd::etcd_client::Client::connect(cfg.endpoints.clone(), None)
        .await
        .unwrap();
    let all = distlock_etcd::etcd_client::GetOptions::new()
        .with_prefix()
        .with_count_only();
    let places = raw
        .get(cfg.namespace.clone(), Some(all))
        .await
        .unwrap()
        .count();
    assert_eq!(places, KEYS as i64, "refused attempts left places queued");
    let granted = leases_granted(member.client_port).await - before;
    assert!(
        granted <= 3 * IN_FLIGHT,
        "{KEYS} attempts at once granted {granted} leases (at most {IN_FLIGHT} may be in flight, \
         as many refused ones being abandoned, as many kept as spares)"
    );
    member.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_on_many_keys_share_one_watch_stream_and_each_is_woken() {
    const WAITED: u64 = 200;
    let (_dir, mut member, cfg) = member("etcd-watches").await;
    let port = member.client_port;
    let ttl = Duration::from_secs(30);
    let keys: Vec<String> = (0..WAITED).map(|i| format!("watched-{i}")).collect();
    let holder = LockClient::new(EtcdBackend::new(cfg.clone()).unwrap());
    let mut guards = Vec::new();
    for key in &keys {
        guards.push(holder.lock(key.as_str()).ttl(ttl).acquire().await.unwrap());
    }
    let waiting = LockClient::new(EtcdBackend::new(cfg).unwrap());
    let tasks: Vec<_> = keys
        .iter()
        .cloned()
        .map(|key| {
            let waiting = waiting.clone();
            tokio::spawn(async move {
                let guard = waiting
                    .lock(key)
                    .ttl(ttl)
                    .wait(Duration::from_secs(60))
                    .acquire()
                    .await?;
                guard.release().await
            })
        })
        .collect();
    // Every key watched (the member's own count), then: on how many streams.
    let started = Instant::now();
    while metric(port, "etcd_debugging_mvcc_watcher_total").await < WAITED {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the {WAITED} keys were not all watched within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let streams = metric(port, "etcd_debugging_mvcc_watch_stream_total").await;
    assert_eq!(
        streams, 1,
        "{WAITED} watched keys took {streams} watch streams"
    );
    for guard in guards {
        guard.release().await.unwrap();
    }
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .expect("a waiter was not woken by its key's release")
            .unwrap()
            .unwrap();
    }
    // Nobody waits any more: the watches are cancelled (after their linger).
    let started = Instant::now();
    while metric(port, "etcd_debugging_mvcc_watcher_total").await > 0 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the watches were never cancelled after their waiters left"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    member.kill();
}
