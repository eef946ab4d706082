//! Renewals in batches: holds that fall due together go to the store in one
//! `extend_many` request, and each keeps its own outcome.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::tests::faulty::Faulty;
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

/// Many batches due together are renewed a few at a time ([`BATCHES_IN_FLIGHT`]), not all
/// at once: sent at once, 98 batches of a PostgreSQL backend queued ahead of the
/// acquisitions for the pool's connections. Every hold is still renewed.
///
/// [`BATCHES_IN_FLIGHT`]: crate::watchdog::BATCHES_IN_FLIGHT
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_due_together_are_renewed_a_few_at_a_time() {
    const HOLDS: usize = 10_000;
    let store = Faulty::new();
    store.batch_millis.store(50, Ordering::SeqCst);
    let client = LockClient::new(store.clone());
    // Renewed every 2 s on a grid of 128 ms: the holds, taken in well under that, fall due
    // in one or two groups of 5 or more batches of 1,024.
    let ttl = Duration::from_secs(6);
    let tasks: Vec<_> = (0..64)
        .map(|t| {
            let client = client.clone();
            tokio::spawn(async move {
                let mut guards = Vec::new();
                for i in (t..HOLDS).step_by(64) {
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
            })
        })
        .collect();
    let mut guards = Vec::with_capacity(HOLDS);
    for task in tasks {
        guards.extend(task.await.unwrap());
    }
    renewed_a_few_at_a_time(&store, HOLDS, Duration::from_secs(10)).await;
    assert!(guards.iter().all(|g| !g.is_lost()));
}

/// Waits until `holds` renewals were sent in batches (no event marks a round, so it looks
/// every 20 ms, for at most `limit`), then checks that no more than
/// [`BATCHES_IN_FLIGHT`](crate::watchdog::BATCHES_IN_FLIGHT) were in flight at once.
async fn renewed_a_few_at_a_time(store: &Faulty, holds: usize, limit: Duration) {
    let waiting = Instant::now();
    while batches(store).iter().sum::<usize>() < holds {
        assert!(waiting.elapsed() < limit, "{:?}", batches(store));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let most = store.most_batches_in_flight.load(Ordering::SeqCst);
    assert!(
        // BATCHES_IN_FLIGHT, written out: a larger constant is the bug this catches.
        (1..=4).contains(&most),
        "{most} batches in flight at once (sizes {:?})",
        batches(store)
    );
}

/// The bound holds across renewal rounds: a round that falls due while an earlier round's
/// batches are still in flight waits behind them (per round, two overlapping rounds sent
/// up to twice [`BATCHES_IN_FLIGHT`]).
///
/// [`BATCHES_IN_FLIGHT`]: crate::watchdog::BATCHES_IN_FLIGHT
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_rounds_share_the_bound() {
    const HALF: usize = 5 * 1024;
    let store = Faulty::new();
    // Each batch answers after 400 ms: a round of 5 batches runs for 800 ms.
    store.batch_millis.store(400, Ordering::SeqCst);
    let client = LockClient::new(store.clone());
    let ttl = Duration::from_secs(6);
    let take = |from: usize| {
        let tasks: Vec<_> = (0..64)
            .map(|t| {
                let client = client.clone();
                tokio::spawn(async move {
                    let mut guards = Vec::new();
                    for i in (from + t..from + HALF).step_by(64) {
                        let lock = client.lock(format!("k{i}")).ttl(ttl);
                        guards.push(lock.acquire().await.unwrap());
                    }
                    guards
                })
            })
            .collect::<Vec<_>>();
        async move {
            let mut guards = Vec::new();
            for task in tasks {
                guards.extend(task.await.unwrap());
            }
            guards
        }
    };
    let mut guards = take(0).await;
    // Two grid steps (128 ms) later: the second half falls due in a round of its own,
    // while the first half's round is still in flight. Spacing, not synchronisation.
    tokio::time::sleep(Duration::from_millis(300)).await;
    guards.extend(take(HALF).await);
    renewed_a_few_at_a_time(&store, 2 * HALF, Duration::from_secs(15)).await;
    assert!(guards.iter().all(|g| !g.is_lost()));
}

/// A batch of holds with different TTLs gives up on a store that does not answer within the
/// allowance of its *shortest* TTL: a hold of 400 ms cannot wait for an answer as long as
/// its 20 s neighbour could (it would be past its lease before it tried again).
#[tokio::test]
async fn a_batch_mixing_ttls_times_out_by_its_shortest() {
    let store = Faulty::new();
    let client = LockClient::new(store.clone());
    let short = Duration::from_millis(400);
    let guards = [
        client
            .lock("short")
            .ttl(short)
            .watchdog(false)
            .acquire()
            .await
            .unwrap(),
        client
            .lock("long")
            .ttl(Duration::from_secs(20))
            .watchdog(false)
            .acquire()
            .await
            .unwrap(),
    ];
    // Every batch answers after a second: longer than 400 ms / 4, shorter than 20 s / 4.
    store.batch_millis.store(1_000, Ordering::SeqCst);
    let schedule = crate::hold::schedule().unwrap();
    let started = Instant::now();
    crate::hold::renew_batch(schedule, guards.iter().map(|g| g.hold()).collect()).await;
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(600),
        "the batch waited {took:?}"
    );
    for guard in &guards {
        let RenewalHealth::Failing { last_error, .. } = guard.renewal_health().borrow().clone()
        else {
            panic!("{}: the timed-out renewal was not reported", guard.key());
        };
        assert!(last_error.contains("within 100ms"), "{last_error}");
    }
    store.batch_millis.store(0, Ordering::SeqCst);
    for guard in guards {
        guard.release().await.unwrap();
    }
}
