//! The watchdog: many holds, lost runtimes.

use std::time::{Duration, Instant};

use crate::memory::MemoryBackend;
use crate::LockClient;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_schedule_keeps_many_holds_of_different_ttls() {
    let store = MemoryBackend::new();
    let client = LockClient::new(store.clone());
    let mut guards = Vec::new();
    for i in 0..60u64 {
        let ttl = Duration::from_millis(150 + 5 * i);
        guards.push(
            client
                .lock(format!("k{i}"))
                .ttl(ttl)
                .acquire()
                .await
                .unwrap(),
        );
    }
    // Several TTLs: without renewals every one of them would have expired.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(store.held_count(), 60);
    assert!(guards.iter().all(|g| !g.is_lost()));
    assert!(guards.iter().all(|g| g.valid_until() > Instant::now()));
    for g in guards {
        assert_eq!(g.release().await.unwrap(), crate::ReleaseOutcome::Released);
    }
    assert_eq!(store.held_count(), 0);
}

#[test]
fn lost_fires_even_when_the_acquiring_runtime_is_gone() {
    let store = MemoryBackend::new();
    let first = tokio::runtime::Runtime::new().unwrap();
    let guard = first.block_on(async {
        let client = LockClient::new(store.clone());
        client
            .lock("k")
            .ttl(Duration::from_millis(300))
            .acquire()
            .await
            .unwrap()
    });
    // No runtime is left to renew the lease: the hold must be reported lost before it
    // ends, not silently expire.
    drop(first);
    let second = tokio::runtime::Runtime::new().unwrap();
    let started = Instant::now();
    second.block_on(async {
        tokio::time::timeout(Duration::from_secs(5), guard.lost())
            .await
            .expect("lost() never fired");
    });
    assert!(started.elapsed() < Duration::from_millis(600));
    drop(guard);
}
