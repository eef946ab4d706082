//! The redis backend with fencing switched off (`?fencing=false`): the whole conformance
//! suite, its token scenarios ignored for the stated reason, and what "no tokens" means on
//! the server: every token 0, no fence key, the plain `SET NX PX` grant with the same-owner
//! re-grant of its fallback script, and shared claims refused with a clear error.

mod common;

use std::time::Duration;

use common::{bounded, key, raw, shared_url, RedisHarness};
use distlock_redis::__redlock as support;
use distlock_redis::redis::AsyncCommands;
use distlock_redis::RedisBackend;
use lockcore::driver::{AcquireOutcome, FencingGuarantee, LockBackendExt};
use lockcore::{Claim, FencingToken, LockBackend, LockClient, LockError, Owner, ReleaseOutcome};

conformance_tests::suite!(
    in_tree conformance,
    capabilities: distlock_redis::UNFENCED_CAPABILITIES,
    faults: true,
    fencing: false,
    harness: || async { RedisHarness::unfenced() },
);

const TTL: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread")]
async fn tokens_are_zero_and_no_fence_key_is_written() {
    bounded(async {
        let h = RedisHarness::unfenced();
        let b = h.backend().await.unwrap();
        assert_eq!(b.capabilities().fencing, FencingGuarantee::None);
        assert!(!b.capabilities().shared && !b.capabilities().semaphores);
        let k = key("unfenced-token");
        let (a, c) = (Owner::new("a"), Owner::new("c"));
        let AcquireOutcome::Acquired(g) = b.try_acquire(&k, &a, TTL).await.unwrap() else {
            panic!("a free key was refused");
        };
        assert_eq!(g.token, FencingToken(0));
        let names = support::names(&h.prefix, &k);
        let mut conn = raw(&shared_url()).await;
        let fence: bool = conn.exists(names.fence()).await.unwrap();
        assert!(!fence, "an unfenced grant wrote the fence key");
        let value: String = conn.get(&names.lock).await.unwrap();
        assert!(
            value.starts_with(&a.token().to_hex()),
            "the lock holds {value:?}"
        );
        // Another owner is refused with the holder's remaining TTL.
        let AcquireOutcome::Held(held) = b.try_acquire(&k, &c, TTL).await.unwrap() else {
            panic!("a held key was granted to another owner");
        };
        let remaining = held.remaining_ttl.expect("the holder's TTL");
        assert!(
            remaining > TTL / 2 && remaining <= TTL,
            "remaining {remaining:?}"
        );
        // The holder asking again (an answer lost and the request sent again) is granted
        // the same lease, its expiry never shortened.
        let AcquireOutcome::Acquired(again) =
            b.try_acquire(&k, &a, Duration::from_secs(1)).await.unwrap()
        else {
            panic!("the holder's repeated acquire was refused");
        };
        assert_eq!(again.token, FencingToken(0));
        let pttl: i64 = conn.pttl(&names.lock).await.unwrap();
        assert!(
            pttl > 20_000,
            "the re-grant shortened the lease to {pttl} ms"
        );
        assert_eq!(b.release(&k, &c).await.unwrap(), ReleaseOutcome::NotHeld);
        assert_eq!(b.release(&k, &a).await.unwrap(), ReleaseOutcome::Released);
        let left: bool = conn.exists(&names.lock).await.unwrap();
        assert!(!left, "the release left the lock key");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn shared_claims_are_refused_with_a_clear_error() {
    bounded(async {
        let h = RedisHarness::unfenced();
        let b = h.backend().await.unwrap();
        let k = key("unfenced-shared");
        let err = b
            .try_claim(&k, &Owner::new("r"), TTL, Claim::shared())
            .await
            .unwrap_err();
        assert!(matches!(err, LockError::Config { .. }), "{err:?}");
        assert!(err.to_string().contains("fencing=false"), "{err}");
        let locks = LockClient::new(b);
        let err = locks
            .lock("unfenced-shared")
            .shared()
            .try_acquire()
            .await
            .unwrap_err();
        assert!(matches!(err, LockError::Config { .. }), "{err:?}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_fencing_option_is_checked() {
    bounded(async {
        for (option, fenced) in [("fencing=true", true), ("fencing=false", false)] {
            let url = common::with_option(&shared_url(), option);
            let b = RedisBackend::builder(url).build().await.unwrap();
            let declared = b.capabilities().fencing != FencingGuarantee::None;
            assert_eq!(declared, fenced, "{option}");
        }
        // The builder overrides the URL.
        let url = common::with_option(&shared_url(), "fencing=false");
        let b = RedisBackend::builder(url)
            .fencing(true)
            .build()
            .await
            .unwrap();
        assert_eq!(b.capabilities().fencing, FencingGuarantee::ClockAssisted);
        let url = common::with_option(&shared_url(), "fencing=maybe");
        let err = RedisBackend::builder(url).build().await.unwrap_err();
        assert!(matches!(err, LockError::Config { .. }), "{err:?}");
        assert!(err.to_string().contains("fencing"), "{err}");
    })
    .await;
}
