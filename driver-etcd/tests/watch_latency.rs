//! How soon etcd reports a delete to a watch, by how the watch was opened: etcd-client
//! alone, no driver code. Ignored (a measurement, not a check of ours); run with
//!
//! ```text
//! cargo test --release -p driver-etcd --test watch_latency -- --ignored --nocapture
//! ```
//!
//! Each round writes the watched key, then another key (anything written in between: on a
//! busy store, another lock's transaction), opens a watch on the watched key, waits for
//! etcd to confirm it, deletes the key and times the delete's event from the delete's
//! answer. The watch starts either at the revision after the first write (what a waiter
//! that saw the key at that revision asks for) or at the store's current revision.
//!
//! The second test does the same through the driver: the first hand-off on a key between
//! two backends (as two processes), the release made before the waiter opens its watch.
//!
//! A watch whose start revision is not above the store's current revision is "unsynced"
//! in etcd (`mvcc/watchable_store.go`): it gets events only from a background loop that
//! runs every 100 ms, so its first event comes 0–100 ms late. One opened at the current
//! revision is "synced" and gets each event as the write is applied.

mod common;

use std::time::{Duration, Instant};

use driver_etcd::etcd_client::{Client, EventType, WatchOptions};
use driver_etcd::{EtcdBackend, EtcdConfig};
use lockcore::{AcquireOutcome, LockBackend, LockKey, Owner, ReleaseOutcome};

const ROUNDS: usize = 40;

async fn client() -> Client {
    let url = common::url_from_env("DISTLOCK_TEST_ETCD_URL");
    let cfg = driver_etcd::EtcdConfig::parse(&url).expect("a valid URL");
    let endpoint = cfg.endpoints.first().cloned().expect("an endpoint");
    Client::connect([endpoint], None)
        .await
        .expect("etcd answers")
}

/// One round: the delay from the delete's answer to its event on the watch.
async fn round(c: &mut Client, key: &str, other: &str, from_past: bool) -> Duration {
    let put = c.put(key, "held", None).await.expect("put");
    let seen = put.header().expect("a header").revision();
    // Something else is written before the watch is opened.
    c.put(other, "x", None).await.expect("put");
    let options = if from_past {
        WatchOptions::new().with_start_revision(seen + 1)
    } else {
        WatchOptions::new()
    };
    let mut stream = c.watch(key, Some(options)).await.expect("watch");
    loop {
        let r = stream
            .message()
            .await
            .expect("watch answers")
            .expect("open");
        if r.created() {
            break;
        }
    }
    c.delete(key, None).await.expect("delete");
    let deleted = Instant::now();
    loop {
        let r = stream
            .message()
            .await
            .expect("watch answers")
            .expect("open");
        if r.events()
            .iter()
            .any(|e| e.event_type() == EventType::Delete)
        {
            return deleted.elapsed();
        }
    }
}

fn summary(name: &str, mut d: Vec<Duration>) {
    d.sort();
    let at = |q: f64| d[((d.len() - 1) as f64 * q).round() as usize];
    println!(
        "{name}: {} rounds, p50 {:?}, p90 {:?}, max {:?}",
        d.len(),
        at(0.5),
        at(0.9),
        at(1.0)
    );
}

#[tokio::test]
#[ignore = "a measurement; run with --ignored --nocapture"]
async fn delete_event_delay_by_start_revision() {
    let mut c = client().await;
    let ns = common::random_namespace();
    let (key, other) = (format!("{ns}k"), format!("{ns}other"));
    let mut past = Vec::new();
    let mut now = Vec::new();
    for _ in 0..ROUNDS {
        past.push(round(&mut c, &key, &other, true).await);
        now.push(round(&mut c, &key, &other, false).await);
    }
    summary("watch from the revision seen + 1", past);
    summary("watch from the current revision ", now);
}

#[tokio::test]
#[ignore = "a measurement; run with --ignored --nocapture"]
async fn first_handoff_on_a_key_between_backends() {
    let url = common::url_from_env("DISTLOCK_TEST_ETCD_URL");
    let cfg = EtcdConfig::parse(&url)
        .expect("a valid URL")
        .with_namespace(&common::random_namespace())
        .expect("a valid namespace");
    let a = EtcdBackend::new(cfg.clone()).expect("a backend");
    let b = EtcdBackend::new(cfg).expect("a backend");
    let ttl = Duration::from_secs(10);
    let mut took = Vec::new();
    for round in 0..ROUNDS {
        // A key of its own per round: no watch of an earlier round serves it.
        let key = LockKey::new(format!("k{round}")).expect("a valid key");
        let (holder, waiter) = (Owner::new("a"), Owner::new("b"));
        let got = a.try_acquire(&key, &holder, ttl).await.expect("acquire");
        assert!(matches!(got, AcquireOutcome::Acquired(_)));
        let AcquireOutcome::Held(held) = b.try_acquire(&key, &waiter, ttl).await.expect("try")
        else {
            panic!("the key is held");
        };
        // Released after the waiter saw it held, before it waits: the waiter's watch
        // starts after a write.
        let released = a.release(&key, &holder).await.expect("release");
        assert_eq!(released, ReleaseOutcome::Released);
        let started = Instant::now();
        b.wait_released(&key, &held.hint, ttl).await.expect("wait");
        let got = b.try_acquire(&key, &waiter, ttl).await.expect("acquire");
        assert!(matches!(got, AcquireOutcome::Acquired(_)));
        took.push(started.elapsed());
        b.release(&key, &waiter).await.expect("release");
    }
    summary("wait + acquire after the release", took);
    a.shutdown().await;
    b.shutdown().await;
}
