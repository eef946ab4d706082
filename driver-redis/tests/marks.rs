//! Bounded fairness on a real redis-server, beyond the conformance scenario
//! `long_wait_marks_next_turn` (which the suite runs): an earlier arrival served first
//! leaves the mark to its owner, and a mark lives the waiter's TTL when that is shorter
//! than lockcore's 1 s.

mod common;

use std::time::Duration;

use common::{bounded, key, RedisHarness};
use distlock_redis::RedisBackend;
use lockcore::driver::{AcquireOutcome, ClaimRequest};
use lockcore::{LockBackend, LockKey, Owner};

const TTL: Duration = Duration::from_secs(30);

async fn attempt(
    b: &RedisBackend,
    k: &LockKey,
    o: &Owner,
    ttl: Duration,
    waited: Option<Duration>,
) -> bool {
    let mut request = ClaimRequest::exclusive(k, o, ttl);
    if let Some(waited) = waited {
        request = request.waited(waited);
    }
    matches!(
        b.claim(&request).await.unwrap(),
        AcquireOutcome::Acquired(_)
    )
}

#[tokio::test]
async fn an_earlier_arrival_goes_before_a_mark_without_taking_it() {
    bounded(async {
        let h = RedisHarness::new();
        let b = h.backend().await.unwrap();
        let k = key("before-mark");
        let (holder, marked, earlier, barging) = (
            Owner::new("holder"),
            Owner::new("marked"),
            Owner::new("earlier"),
            Owner::new("barging"),
        );
        let ms = Duration::from_millis;
        assert!(attempt(&b, &k, &holder, TTL, None).await);
        assert!(!attempt(&b, &k, &marked, TTL, Some(ms(30))).await);
        b.release(&k, &holder).await.unwrap();
        assert!(attempt(&b, &k, &earlier, TTL, Some(ms(5_000))).await);
        b.release(&k, &earlier).await.unwrap();
        assert!(
            !attempt(&b, &k, &barging, TTL, None).await,
            "the mark went with another's grant"
        );
        assert!(attempt(&b, &k, &marked, TTL, Some(ms(40))).await);
    })
    .await;
}

#[tokio::test]
async fn a_mark_lives_the_ttl_when_shorter() {
    bounded(async {
        let h = RedisHarness::new();
        let b = h.backend().await.unwrap();
        let (holder, vanished, next) = (
            Owner::new("holder"),
            Owner::new("vanished"),
            Owner::new("next"),
        );
        let long = Some(Duration::from_millis(30));
        // The mark's life is the waiter's TTL when shorter than STARVING_MARK_TTL.
        let short = Duration::from_millis(300);
        let k = key("lapses");
        assert!(attempt(&b, &k, &holder, TTL, None).await);
        assert!(!attempt(&b, &k, &vanished, short, long).await);
        b.release(&k, &holder).await.unwrap();
        assert!(!attempt(&b, &k, &next, TTL, None).await);
        tokio::time::sleep(short + Duration::from_millis(50)).await;
        assert!(
            attempt(&b, &k, &next, TTL, None).await,
            "the mark outlived its life"
        );
    })
    .await;
}
