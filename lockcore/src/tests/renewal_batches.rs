//! Renewals in batches: holds that fall due together go to the store in one
//! `extend_many` request, and each keeps its own outcome.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::testing::Faulty;
use crate::watchdog::align;
use crate::{LockClient, RenewalHealth};

/// `n` holds (keys `k0`, `k1`, …) taken one after another.
async fn take(client: &LockClient, n: usize, ttl: Duration) -> Vec<crate::LockGuard> {
    let mut guards = Vec::with_capacity(n);
    for i in 0..n {
        guards.push(
            client
                .lock(format!("k{i}"))
                .ttl(ttl)
                .acquire()
                .await
                .unwrap(),
        );
    }
    guards
}

fn batches(store: &Faulty) -> Vec<usize> {
    store
        .batches
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
}

/// Rounding down to the grid never moves a renewal later, moves it earlier by less than an
/// eighth of the interval, and gives moments close together one time.
#[test]
fn the_grid_rounds_renewals_down_by_less_than_an_eighth() {
    let interval = Duration::from_secs(10);
    let start = Instant::now() + Duration::from_secs(1);
    let mut seen = std::collections::HashSet::new();
    for ms in 0..5000u64 {
        let at = start + Duration::from_millis(ms);
        let aligned = align(at, interval);
        assert!(aligned <= at);
        assert!(at - aligned < interval / 8, "{:?}", at - aligned);
        seen.insert(aligned);
    }
    // 1024 ms steps (the largest power of two below 1250 ms): 5 s fall on at most 6 points.
    assert!(seen.len() <= 6, "{} grid points in 5 s", seen.len());
    // A power-of-two grid: a coarser interval's points are points of the finer one.
    let coarse = align(start, interval * 2);
    assert_eq!(align(coarse, interval), coarse);
    // Tiny intervals still get a grid of 1 ms.
    let tiny = align(start, Duration::from_micros(300));
    assert!(start - tiny < Duration::from_millis(1));
}

/// Holds taken together are renewed together: a few requests per round, not one per hold,
/// and every hold stays held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holds_due_together_are_renewed_in_few_batches() {
    let store = Faulty::new();
    let client = LockClient::new(store.clone());
    let ttl = Duration::from_millis(600);
    let guards = take(&client, 300, ttl).await;
    // Two renewal rounds at least (every ttl / 3); no event marks them, so look every
    // 20 ms, for at most 10 s.
    let waiting = Instant::now();
    while batches(&store).iter().sum::<usize>() < 600 {
        assert!(
            waiting.elapsed() < Duration::from_secs(10),
            "{:?}",
            batches(&store)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(guards.iter().all(|g| !g.is_lost()));
    let sizes = batches(&store);
    let renewed: usize = sizes.iter().sum();
    // 300 holds taken within a few ms span at most a few 16 ms grid cells; once renewed
    // together they stay together.
    assert!(
        sizes.len() * 20 <= renewed,
        "{} batches for {renewed} renewals: {sizes:?}",
        sizes.len()
    );
    for g in guards {
        g.release().await.unwrap();
    }
}

/// One hold of a batch freed behind its holder's back is lost alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_lost_hold_leaves_the_rest_of_its_batch_held() {
    let store = Faulty::new();
    let client = LockClient::new(store.clone());
    let ttl = Duration::from_millis(600);
    let guards = take(&client, 8, ttl).await;
    use crate::LockBackend;
    store
        .inner
        .force_release(&crate::LockKey::new("k3").unwrap())
        .await
        .unwrap();
    tokio::time::timeout(ttl, guards[3].lost())
        .await
        .expect("the freed hold was not reported lost");
    tokio::time::sleep(ttl).await;
    assert!(
        batches(&store).iter().any(|&n| n > 1),
        "{:?}",
        batches(&store)
    );
    for (i, g) in guards.iter().enumerate() {
        assert_eq!(g.is_lost(), i == 3, "hold {i}");
    }
    assert_eq!(store.inner.held_count(), 7);
}

/// A batch answered with the wrong number of outcomes is a failed renewal of every hold in
/// it (none is taken as renewed or lost on a guess), retried as failures are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_answering_the_wrong_count_fails_every_hold_in_it() {
    let store = Faulty::new();
    let client = LockClient::new(store.clone());
    let ttl = Duration::from_millis(900);
    let a = client.lock("a").ttl(ttl).acquire().await.unwrap();
    let b = client.lock("b").ttl(ttl).acquire().await.unwrap();
    store.short_batches.store(true, Ordering::SeqCst);
    let mut health = a.handle().renewal_health();
    tokio::time::timeout(ttl, health.wait_for(RenewalHealth::is_failing))
        .await
        .expect("renewals never reported failing")
        .unwrap();
    let failing = health.borrow().clone();
    let RenewalHealth::Failing { last_error, .. } = failing else {
        unreachable!()
    };
    assert!(last_error.contains("outcomes to"), "{last_error}");
    store.short_batches.store(false, Ordering::SeqCst);
    tokio::time::sleep(ttl / 2).await;
    assert!(!a.is_lost() && !b.is_lost());
    a.release().await.unwrap();
    b.release().await.unwrap();
}
