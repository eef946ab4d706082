//! The conformance suite against Redlock with fencing switched off (the plain `SET NX PX`
//! grant with the light script as its fallback), on three and on five instances. The
//! scenarios about tokens (`fencing_tokens_increase`, `stale_token_rejected`,
//! `paused_holder_write_rejected`) are ignored with that reason and the others skip their
//! token checks: without fencing every token is 0, which
//! `tokens_are_zero_and_regrant_keeps_the_lease` checks instead.

mod common;

use std::time::Duration;

use common::RedlockHarness;
use lockcore::driver::{AcquireOutcome, LockBackendExt};
use lockcore::{LockBackend, LockKey, Owner};

conformance_tests::suite!(
    in_tree three,
    capabilities: distlock_redlock::UNFENCED_CAPABILITIES,
    faults: true,
    fencing: false,
    harness: || async { RedlockHarness::unfenced(3) },
);

conformance_tests::suite!(
    in_tree five,
    capabilities: distlock_redlock::UNFENCED_CAPABILITIES,
    faults: true,
    fencing: false,
    harness: || async { RedlockHarness::unfenced(5) },
);

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
                lockcore::driver::FencingGuarantee::None,
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
            // An instance the first grant never reached, its request dropped once a
            // majority had granted, holds the second grant's 1 s copy; inspect hears every
            // instance, so it reports what the majority keeps.
            let left = info.remaining_ttl.expect("a remaining TTL");
            assert!(left > Duration::from_secs(10), "inspect reported {left:?}");
            // Each instance's own expiry: a majority keeps the 20 s lease.
            let lock =
                distlock_redlock::__driver_redis::__redlock::names(&harness.prefix, &key).lock;
            let mut kept = 0;
            for url in &harness.urls {
                let mut conn = distlock_redlock::redis::Client::open(url.as_str())
                    .unwrap()
                    .get_multiplexed_async_connection()
                    .await
                    .unwrap();
                let pttl: i64 = distlock_redlock::redis::cmd("PTTL")
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
                    // A refusal is decided by the first majority to answer, which may
                    // include the instance holding the second grant's 1 s copy.
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
