//! The conformance scenarios that do not test fencing tokens, against Redlock with fencing
//! switched off (the plain `SET NX PX` grant with the light script as its fallback), on
//! three and on five instances. The scenarios that check tokens (`fencing_tokens_increase`,
//! `stale_token_rejected`, `paused_holder_write_rejected`, and the token halves of
//! `mutual_exclusion` and `expiry_frees_lock`) do not apply: without fencing every token is
//! 0, which `tokens_are_zero_and_regrant_keeps_the_lease` checks instead;
//! `no_lost_updates_without_fencing` and `expiry_hands_over_without_fencing` keep the rest
//! of those two.

mod common;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::RedlockHarness;
use conformance_tests::scenarios;
use lockcore::{AcquireOutcome, LockBackend, LockClient, LockKey, Owner};

macro_rules! unfenced {
    ($module:ident, $instances:literal: $($scenario:ident),+ $(,)?) => {
        mod $module {
            use super::*;
            $(
                #[doc = concat!("Conformance scenario `", stringify!($scenario), "` without fencing.")]
                #[test]
                fn $scenario() {
                    conformance_tests::run(
                        stringify!($scenario),
                        || async { RedlockHarness::unfenced($instances) },
                        scenarios::$scenario,
                        true,
                        true,
                    );
                }
            )+
        }
    };
}

macro_rules! every_unfenced_scenario {
    ($module:ident, $instances:literal) => {
        unfenced!($module, $instances:
            try_acquire_reports_holder,
            release_by_stranger_is_not_held,
            late_release_keeps_new_holder,
            extend_keeps_and_fails_after_loss,
            reentrant_counts,
            waiter_acquires_after_release,
            contended_handoff_keeps_waking,
            wait_deadline_times_out,
            cancelled_acquire_leaves_nothing,
            watchdog_keeps_lock,
            lost_fires_when_renewal_impossible,
            dropped_guard_released,
            independent_keys,
            bad_input_rejected,
            hostile_keys_isolated,
            inspect_hides_owner_token,
            store_unavailable,
            many_keys,
        );
    };
}

every_unfenced_scenario!(three, 3);
every_unfenced_scenario!(five, 5);

/// Without fencing every grant's token is 0; a second grant to the same owner (a retried
/// request whose answer was lost) succeeds through the fallback script and never shortens
/// the lease, and another owner is refused with the holder's remaining TTL.
#[test]
fn tokens_are_zero_and_regrant_keeps_the_lease() {
    run(Duration::from_secs(30), async {
        {
            let harness = RedlockHarness::unfenced(5);
            let backend = harness.builder().build().await.unwrap();
            assert_eq!(
                backend.capabilities().fencing,
                lockcore::FencingGuarantee::None,
                "no tokens, so no fencing guarantee may be declared"
            );
            let key = LockKey::new("unfenced-regrant").unwrap();
            let owner = Owner::new("holder");
            let long = Duration::from_secs(20);
            match backend.try_acquire(&key, &owner, long).await.unwrap() {
                AcquireOutcome::Acquired(g) => assert_eq!(g.token.0, 0),
                other => panic!("{other:?}"),
            }
            // Same owner, shorter TTL: granted again, token 0, the 20 s lease kept.
            match backend
                .try_acquire(&key, &owner, Duration::from_secs(1))
                .await
                .unwrap()
            {
                AcquireOutcome::Acquired(g) => assert_eq!(g.token.0, 0),
                other => panic!("{other:?}"),
            }
            let info = backend.inspect(&key).await.unwrap().expect("held");
            assert_eq!(info.token.0, 0);
            // Each instance's own expiry: a majority keeps the 20 s lease. (An instance the
            // first grant never reached, its request dropped once a majority had granted,
            // holds the second grant's 1 s copy; inspect, which settles on the first
            // majority to answer, may then report 1 s.)
            let lock = driver_redlock::__driver_redis::__redlock::names(&harness.prefix, &key).lock;
            let mut kept = 0;
            for url in &harness.urls {
                let mut conn = driver_redlock::redis::Client::open(url.as_str())
                    .unwrap()
                    .get_multiplexed_async_connection()
                    .await
                    .unwrap();
                let pttl: i64 = driver_redlock::redis::cmd("PTTL")
                    .arg(&lock)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                assert!(pttl <= 20_000, "{pttl}");
                if pttl > 10_000 {
                    kept += 1;
                }
            }
            assert!(kept >= 3, "lease shortened: {kept} of 5 instances keep it");
            // Another owner: held, with the holder's remaining TTL.
            match backend
                .try_acquire(&key, &Owner::new("other"), long)
                .await
                .unwrap()
            {
                AcquireOutcome::Held(c) => {
                    // As for inspect above: the first majority to answer may include the
                    // instance holding the second grant's 1 s copy.
                    let left = c.remaining_ttl.expect("a remaining TTL");
                    assert!(
                        left > Duration::ZERO && left <= Duration::from_secs(20),
                        "{left:?}"
                    );
                }
                other => panic!("{other:?}"),
            }
            assert_eq!(
                backend.release(&key, &owner).await.unwrap(),
                lockcore::ReleaseOutcome::Released
            );
            assert!(backend.inspect(&key).await.unwrap().is_none());
        }
    });
}

fn run(limit: Duration, test: impl std::future::Future<Output = ()>) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async { tokio::time::timeout(limit, test).await.unwrap() });
}

async fn clients(harness: &RedlockHarness, n: usize) -> Vec<LockClient> {
    let mut clients = Vec::new();
    for _ in 0..n {
        clients.push(LockClient::new(harness.builder().build().await.unwrap()));
    }
    clients
}

/// `mutual_exclusion` without its token check: 16 tasks over 4 clients on 5 instances run a
/// read-modify-write with `.await`s between read and write; no hold overlaps another and
/// no update is lost.
#[test]
fn no_lost_updates_without_fencing() {
    run(Duration::from_secs(60), async {
        let harness = RedlockHarness::unfenced(5);
        let key = "unfenced-counter";
        let counter = Arc::new(AtomicU64::new(0));
        let inside = Arc::new(AtomicUsize::new(0));
        let overlaps = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for client in clients(&harness, 4).await {
            for _ in 0..4 {
                let client = client.clone();
                let (counter, inside, overlaps) =
                    (counter.clone(), inside.clone(), overlaps.clone());
                tasks.push(tokio::spawn(async move {
                    for _ in 0..10 {
                        let guard = client
                            .lock(key)
                            .ttl(Duration::from_secs(20))
                            .wait(Duration::from_secs(40))
                            .acquire()
                            .await
                            .unwrap();
                        if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                            overlaps.fetch_add(1, Ordering::SeqCst);
                        }
                        let v = counter.load(Ordering::SeqCst);
                        tokio::task::yield_now().await;
                        tokio::time::sleep(Duration::from_micros(200)).await;
                        counter.store(v + 1, Ordering::SeqCst);
                        inside.fetch_sub(1, Ordering::SeqCst);
                        guard.release().await.unwrap();
                    }
                }));
            }
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(overlaps.load(Ordering::SeqCst), 0, "overlapping holds");
        assert_eq!(counter.load(Ordering::SeqCst), 160, "lost updates");
    });
}

/// `expiry_frees_lock` without its token check: a holder that never renews loses the lock
/// at its TTL, not before, and another client then takes it over.
#[test]
fn expiry_hands_over_without_fencing() {
    run(Duration::from_secs(30), async {
        let harness = RedlockHarness::unfenced(5);
        let c = clients(&harness, 2).await;
        let ttl = Duration::from_secs(1);
        let acquired = Instant::now();
        let a = c[0]
            .lock("unfenced-expiring")
            .ttl(ttl)
            .watchdog(false)
            .acquire()
            .await
            .unwrap();
        assert!(c[1]
            .lock("unfenced-expiring")
            .ttl(ttl)
            .try_acquire()
            .await
            .unwrap()
            .is_none());
        let b = c[1]
            .lock("unfenced-expiring")
            .ttl(ttl * 10)
            .wait(ttl * 10)
            .acquire()
            .await
            .unwrap();
        let waited = acquired.elapsed();
        assert!(waited + ttl / 10 >= ttl, "taken over after {waited:?}");
        assert!(a.is_lost(), "the expired holder was not told");
        b.release().await.unwrap();
    });
}
