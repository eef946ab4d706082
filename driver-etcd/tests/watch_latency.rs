//! How soon etcd reports a delete to a watch, by how the watch was opened: etcd-client
//! alone, no driver code. Ignored (a measurement, not a check of ours); run with
//!
//! ```text
//! cargo test --release -p distlock-etcd --test watch_latency -- --ignored --nocapture
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
//! The third splits the hand-offs of a steady queue into their parts and prints the
//! slowest: a wake-up that comes late is the watch, a last attempt that takes long is the
//! store's disk.
//!
//! A watch whose start revision is not above the store's current revision is "unsynced"
//! in etcd (`mvcc/watchable_store.go`): it gets events only from a background loop that
//! runs every 100 ms, so its first event comes 0–100 ms late. One opened at the current
//! revision is "synced" and gets each event as the write is applied.

mod common;

use std::time::{Duration, Instant};

use distlock_etcd::etcd_client::{Client, EventType, WatchOptions};
use distlock_etcd::{EtcdBackend, EtcdConfig};
use lockcore::driver::{AcquireOutcome, LockBackendExt};
use lockcore::{LockBackend, LockKey, Owner, ReleaseOutcome};

const ROUNDS: usize = 40;

async fn client() -> Client {
    let url = common::url_from_env("DISTLOCK_TEST_ETCD_URL");
    let cfg = distlock_etcd::EtcdConfig::parse(&url).expect("a valid URL");
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
        b.wait_released(&key, &held.hint, u64::MAX, ttl)
            .await
            .expect("wait");
        let got = b.try_acquire(&key, &waiter, ttl).await.expect("acquire");
        assert!(matches!(got, AcquireOutcome::Acquired(_)));
        took.push(started.elapsed());
        b.release(&key, &waiter).await.expect("release");
    }
    summary("wait + acquire after the release", took);
    a.shutdown().await;
    b.shutdown().await;
}

/// Where a hand-off's time goes in a steady queue: 8 tasks over 2 backends take turns on
/// one key (zero hold) for `DISTLOCK_HANDOFF_SECS` seconds (default 20); every hand-off is
/// split into the
/// release, the wake-up (release answered → the waiter's wait ends) and the waiter's last
/// attempt, and the slowest are printed with their parts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement; run with --ignored --nocapture"]
async fn steady_handoff_parts() {
    use std::sync::{Arc, Mutex};
    let url = common::url_from_env("DISTLOCK_TEST_ETCD_URL");
    let cfg = EtcdConfig::parse(&url)
        .expect("a valid URL")
        .with_namespace(&common::random_namespace())
        .expect("a valid namespace");
    let backends: Vec<Arc<EtcdBackend>> = (0..2)
        .map(|_| EtcdBackend::new(cfg.clone()).expect("a backend"))
        .collect();
    let secs: u64 = std::env::var("DISTLOCK_HANDOFF_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let base = Instant::now();
    let end = base + Duration::from_secs(secs);
    // (granted, release sent, release answered, woken, last attempt sent, tries, task)
    type Turn = (
        Duration,
        Duration,
        Duration,
        Option<Duration>,
        Duration,
        u32,
        usize,
    );
    let turns: Arc<Mutex<Vec<Turn>>> = Arc::default();
    let key = LockKey::new("handoff").expect("a valid key");
    let ttl = Duration::from_secs(10);
    let mut tasks = Vec::new();
    for task in 0..8 {
        let b = backends[task % 2].clone();
        let (turns, key) = (turns.clone(), key.clone());
        tasks.push(tokio::spawn(async move {
            while Instant::now() < end {
                let owner = Owner::new("t");
                let (mut tries, mut woken) = (0u32, None);
                let (granted, last) = loop {
                    tries += 1;
                    let sent = base.elapsed();
                    match b.try_acquire(&key, &owner, ttl).await.expect("try") {
                        AcquireOutcome::Acquired(_) => break (base.elapsed(), sent),
                        AcquireOutcome::Held(h) => {
                            b.wait_released(&key, &h.hint, u64::MAX, ttl)
                                .await
                                .expect("wait");
                            woken = Some(base.elapsed());
                        }
                    }
                };
                let rel_sent = base.elapsed();
                b.release(&key, &owner).await.expect("release");
                let rel_done = base.elapsed();
                turns
                    .lock()
                    .unwrap()
                    .push((granted, rel_sent, rel_done, woken, last, tries, task));
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    let mut turns = std::mem::take(&mut *turns.lock().unwrap());
    turns.sort_by_key(|t| t.0);
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let mut gaps: Vec<(f64, String)> = turns
        .windows(2)
        .map(|w| {
            let (prev, next) = (&w[0], &w[1]);
            let gap = ms(next.0.saturating_sub(prev.2));
            let parts = format!(
                "gap {gap:7.2} ms: release {:6.2} ms, woken {:>8} after it, last try sent {:7.2} ms after, took {:6.2} ms, {} tries, task {}→{}",
                ms(prev.2 - prev.1),
                next.3.map_or("-".into(), |w| format!("{:.2}", ms(w) - ms(prev.2))),
                ms(next.4) - ms(prev.2),
                ms(next.0 - next.4),
                next.5,
                prev.6,
                next.6,
            );
            (gap, parts)
        })
        .collect();
    let n = gaps.len();
    gaps.sort_by(|a, b| a.0.total_cmp(&b.0));
    let q = |p: f64| gaps[((n - 1) as f64 * p).round() as usize].0;
    println!(
        "{} hand-offs: gap p50 {:.2} ms, p99 {:.2}, p99.9 {:.2}, max {:.2}",
        n,
        q(0.5),
        q(0.99),
        q(0.999),
        q(1.0)
    );
    for (_, parts) in gaps.iter().rev().take(15) {
        println!("{parts}");
    }
    for b in backends {
        b.shutdown().await;
    }
}
