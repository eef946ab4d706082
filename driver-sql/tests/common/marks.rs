//! Bounded fairness on each database (the default layout): a request that says it has
//! waited long ([`lockcore::starving_for`]) marks a held key as its next turn, an earlier
//! arrival takes a later one's mark over, a marked key goes to nobody else, and a mark
//! lapses after its short life or goes with `abandon`.
#![allow(dead_code)] // Not every test binary sharing `common` uses it.

use std::sync::Arc;
use std::time::Duration;

use lockcore::{attempt_after_waiting, AcquireOutcome, LockBackend, LockKey, Owner};

use super::key;

const TTL: Duration = Duration::from_secs(30);

async fn attempt(
    b: &dyn LockBackend,
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

/// A young refusal leaves no mark; a long wait's mark keeps the key from a fresh request
/// and from a later arrival; an earlier arrival takes it over and is served.
pub async fn the_earliest_long_wait_goes_first(b: Arc<dyn LockBackend>) {
    let b = &*b;
    let k = key("earliest");
    let ms = Duration::from_millis;
    let (holder, later, earlier, barging) = (
        Owner::new("holder"),
        Owner::new("later"),
        Owner::new("earlier"),
        Owner::new("barging"),
    );
    assert!(attempt(b, &k, &holder, TTL, None).await);
    assert!(!attempt(b, &k, &barging, TTL, None).await);
    assert!(!attempt(b, &k, &later, TTL, Some(ms(30))).await);
    b.release(&k, &holder).await.unwrap();
    assert!(
        !attempt(b, &k, &barging, TTL, None).await,
        "a fresh request took a marked key"
    );
    assert!(
        !attempt(b, &k, &holder, TTL, None).await,
        "the releasing owner took a marked key"
    );
    // The earlier arrival goes first; the later one's mark is gone with the take-over.
    assert!(attempt(b, &k, &earlier, TTL, Some(ms(5_000))).await);
    b.release(&k, &earlier).await.unwrap();
    assert!(
        attempt(b, &k, &later, TTL, Some(ms(40))).await,
        "the later arrival did not get its turn"
    );
    b.release(&k, &later).await.unwrap();
    assert!(
        attempt(b, &k, &barging, TTL, None).await,
        "a mark outlived its owner's grant"
    );
}

/// A later arrival never takes over an earlier one's mark.
pub async fn a_later_arrival_leaves_an_earlier_mark(b: Arc<dyn LockBackend>) {
    let b = &*b;
    let k = key("later");
    let ms = Duration::from_millis;
    let (holder, earlier, later) = (
        Owner::new("holder"),
        Owner::new("earlier"),
        Owner::new("later"),
    );
    assert!(attempt(b, &k, &holder, TTL, None).await);
    assert!(!attempt(b, &k, &earlier, TTL, Some(ms(5_000))).await);
    assert!(!attempt(b, &k, &later, TTL, Some(ms(30))).await);
    b.release(&k, &holder).await.unwrap();
    assert!(
        !attempt(b, &k, &later, TTL, Some(ms(40))).await,
        "a later arrival took an earlier one's mark"
    );
    assert!(attempt(b, &k, &earlier, TTL, Some(ms(5_010))).await);
}

/// A mark lives the waiter's TTL when shorter than lockcore's 1 s, and goes with
/// `abandon`.
pub async fn a_mark_lapses_or_goes_with_abandon(b: Arc<dyn LockBackend>) {
    let b = &*b;
    let long = Some(Duration::from_millis(30));
    let short = Duration::from_millis(400);
    let (holder, vanished, next) = (
        Owner::new("holder"),
        Owner::new("vanished"),
        Owner::new("next"),
    );
    let k = key("lapses");
    assert!(attempt(b, &k, &holder, TTL, None).await);
    assert!(!attempt(b, &k, &vanished, short, long).await);
    b.release(&k, &holder).await.unwrap();
    assert!(!attempt(b, &k, &next, TTL, None).await);
    tokio::time::sleep(short + Duration::from_millis(100)).await;
    assert!(
        attempt(b, &k, &next, TTL, None).await,
        "the mark outlived its life"
    );
    let k = key("abandoned");
    assert!(attempt(b, &k, &holder, TTL, None).await);
    assert!(!attempt(b, &k, &vanished, TTL, long).await);
    b.release(&k, &holder).await.unwrap();
    b.abandon(&k, &vanished).await.unwrap();
    assert!(
        attempt(b, &k, &next, TTL, None).await,
        "an abandoned mark kept the key"
    );
}

/// The tests above against the backend `$pair` makes (`(keep, backend, _)`).
#[allow(unused_macros)] // Not every test binary sharing `common` uses it.
macro_rules! marks_tests {
    ($pair:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn the_earliest_long_wait_goes_first() {
            let (_keep, a, _) = $pair.await;
            common::marks::the_earliest_long_wait_goes_first(a).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_later_arrival_leaves_an_earlier_mark() {
            let (_keep, a, _) = $pair.await;
            common::marks::a_later_arrival_leaves_an_earlier_mark(a).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_mark_lapses_or_goes_with_abandon() {
            let (_keep, a, _) = $pair.await;
            common::marks::a_mark_lapses_or_goes_with_abandon(a).await;
        }
    };
}
#[allow(unused_imports)]
pub(crate) use marks_tests;
