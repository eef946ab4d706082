//! Bounded fairness on a real redis-server, through the backend trait: a request that says
//! it has waited long ([`lockcore::starving_for`]) marks a held key as its next turn, an
//! earlier arrival takes the mark over, a free marked key goes to its mark's owner or an
//! earlier arrival only, and a mark whose waiter vanished lapses after its short life.

mod common;

use std::time::Duration;

use common::{bounded, key, RedisHarness};
use driver_redis::RedisBackend;
use lockcore::{attempt_after_waiting, AcquireOutcome, LockBackend, LockKey, Owner};

const TTL: Duration = Duration::from_secs(30);

async fn attempt(
    b: &RedisBackend,
    k: &LockKey,
    o: &Owner,
    ttl: Duration,
    waited: Option<Duration>,
) -> bool {
    let sent = b.try_acquire(k, o, ttl);
    let outcome = match waited {
        Some(waited) => attempt_after_waiting(waited, sent).await,
        None => sent.await,
    };
    matches!(outcome.unwrap(), AcquireOutcome::Acquired(_))
}

#[tokio::test]
async fn the_earliest_long_wait_goes_first() {
    bounded(async {
        let h = RedisHarness::new();
        let b = h.backend().await.unwrap();
        let k = key("earliest");
        let (holder, later, earlier, barging) = (
            Owner::new("holder"),
            Owner::new("later"),
            Owner::new("earlier"),
            Owner::new("barging"),
        );
        let ms = Duration::from_millis;
        assert!(attempt(&b, &k, &holder, TTL, None).await);
        // A young refusal leaves no mark.
        assert!(!attempt(&b, &k, &barging, TTL, None).await);
        assert!(!attempt(&b, &k, &later, TTL, Some(ms(30))).await);
        assert!(!attempt(&b, &k, &earlier, TTL, Some(ms(5_000))).await);
        b.release(&k, &holder).await.unwrap();
        assert!(
            !attempt(&b, &k, &barging, TTL, None).await,
            "a fresh request took a marked key"
        );
        assert!(
            !attempt(&b, &k, &later, TTL, Some(ms(40))).await,
            "a later arrival kept its mark"
        );
        assert!(attempt(&b, &k, &earlier, TTL, Some(ms(5_010))).await);
        b.release(&k, &earlier).await.unwrap();
        // The mark went with the grant; the later arrival was refused by a mark, not a
        // holder, and left none.
        assert!(attempt(&b, &k, &barging, TTL, None).await);
    })
    .await;
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
async fn a_mark_lives_a_moment_unless_renewed_and_goes_with_abandon() {
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
        let k = key("abandoned");
        assert!(attempt(&b, &k, &holder, TTL, None).await);
        assert!(!attempt(&b, &k, &vanished, TTL, long).await);
        b.release(&k, &holder).await.unwrap();
        b.abandon(&k, &vanished).await.unwrap();
        assert!(
            attempt(&b, &k, &next, TTL, None).await,
            "an abandoned mark kept the key"
        );
    })
    .await;
}

#[tokio::test]
async fn a_later_arrival_leaves_an_earlier_mark() {
    bounded(async {
        let h = RedisHarness::new();
        let b = h.backend().await.unwrap();
        let k = key("later");
        let (holder, earlier, later) = (
            Owner::new("holder"),
            Owner::new("earlier"),
            Owner::new("later"),
        );
        let ms = Duration::from_millis;
        assert!(attempt(&b, &k, &holder, TTL, None).await);
        assert!(!attempt(&b, &k, &earlier, TTL, Some(ms(5_000))).await);
        assert!(!attempt(&b, &k, &later, TTL, Some(ms(30))).await);
        b.release(&k, &holder).await.unwrap();
        assert!(
            !attempt(&b, &k, &later, TTL, Some(ms(40))).await,
            "a later arrival took an earlier one's mark"
        );
        assert!(attempt(&b, &k, &earlier, TTL, Some(ms(5_010))).await);
    })
    .await;
}
