//! Bounded fairness on each database (the default layout), beyond the conformance
//! scenario `long_wait_marks_next_turn` (which every suite runs): a mark lives the
//! waiter's TTL when that is shorter than lockcore's 1 s.
#![allow(dead_code)] // Not every test binary sharing `common` uses it.

use std::sync::Arc;
use std::time::Duration;

use lockcore::driver::{AcquireOutcome, ClaimRequest};
use lockcore::{LockBackend, LockKey, Owner};

use super::key;

const TTL: Duration = Duration::from_secs(30);

async fn attempt(
    b: &dyn LockBackend,
    k: &LockKey,
    o: &Owner,
    ttl: Duration,
    waited: Option<Duration>,
) -> bool {
    let request = ClaimRequest::exclusive(k, o, ttl);
    let request = match waited {
        Some(waited) => request.waited(waited),
        None => request,
    };
    matches!(
        b.claim(&request).await.unwrap(),
        AcquireOutcome::Acquired(_)
    )
}

/// A mark lives the waiter's TTL when shorter than lockcore's 1 s.
pub async fn a_mark_lives_the_ttl_when_shorter(b: Arc<dyn LockBackend>) {
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
}

/// The tests above against the backend `$pair` makes (`(keep, backend, _)`).
#[allow(unused_macros)] // Not every test binary sharing `common` uses it.
macro_rules! marks_tests {
    ($pair:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_mark_lives_the_ttl_when_shorter() {
            let (_keep, a, _) = $pair.await;
            common::marks::a_mark_lives_the_ttl_when_shorter(a).await;
        }
    };
}
#[allow(unused_imports)]
pub(crate) use marks_tests;
