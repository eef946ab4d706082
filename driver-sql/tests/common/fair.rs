//! The queue of a fair backend (`distlock_fair=true`), checked the same way on each
//! database with two backends on one table, as two processes would have: a free key goes
//! to the first live place only; a place given up hands the key on at once, a granted one
//! leaves the queue, a silent one lapses after its TTL and not before; a refused waiter is
//! told to come back before its place lapses; and what the fair backend refuses.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lockcore::{
    AcquireOutcome, Claim, Contention, Fairness, FencingToken, LockBackend, LockError, LockKey,
    Owner, ReleaseOutcome,
};

use super::key;

const LONG: Duration = Duration::from_secs(30);

async fn granted(b: &dyn LockBackend, k: &LockKey, owner: &Owner, ttl: Duration) -> FencingToken {
    match b.try_acquire(k, owner, ttl).await.unwrap() {
        AcquireOutcome::Acquired(g) => g.token,
        AcquireOutcome::Held(c) => panic!("{} was refused: {c:?}", owner.label()),
    }
}

async fn refused(b: &dyn LockBackend, k: &LockKey, owner: &Owner, ttl: Duration) -> Contention {
    match b.try_acquire(k, owner, ttl).await.unwrap() {
        AcquireOutcome::Held(c) => c,
        AcquireOutcome::Acquired(g) => panic!("{} was granted {:?}", owner.label(), g.token),
    }
}

async fn release(b: &dyn LockBackend, k: &LockKey, owner: &Owner) {
    assert_eq!(b.release(k, owner).await.unwrap(), ReleaseOutcome::Released);
}

/// Declares FIFO fairness, and refuses shared claims with a clear error.
pub async fn declares_fifo_and_refuses_claims(a: Arc<dyn LockBackend>) {
    let caps = a.capabilities();
    assert_eq!(caps.fairness, Fairness::Fifo);
    assert!(!caps.shared && !caps.semaphores, "{caps:?}");
    let err = a
        .try_claim(&key("fair-shared"), &Owner::new("r"), LONG, Claim::shared())
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Config { .. }), "{err}");
}

/// A released key goes to the waiter that queued first, not to a newcomer; once that
/// waiter gives up, the newcomer gets it at once; a granted waiter leaves the queue.
pub async fn the_first_place_gets_the_key(a: Arc<dyn LockBackend>, b: Arc<dyn LockBackend>) {
    let k = key("fair-first");
    let (holder, first, second, late) = (
        Owner::new("holder"),
        Owner::new("first"),
        Owner::new("second"),
        Owner::new("late"),
    );
    let held = granted(&*a, &k, &holder, LONG).await;
    refused(&*b, &k, &first, LONG).await;
    refused(&*a, &k, &second, LONG).await;
    release(&*a, &k, &holder).await;
    // The holder asks again at once: the waiters are ahead of it.
    let c = refused(&*a, &k, &holder, LONG).await;
    assert!(
        c.hint.is_behind_reservation(),
        "a free key kept for the queue's first place is a wait behind it: {c:?}"
    );
    refused(&*a, &k, &second, LONG).await;
    let t1 = granted(&*b, &k, &first, LONG).await;
    assert!(t1 > held);
    release(&*b, &k, &first).await;
    // `first` left the queue when granted; `second` is next, ahead of the holder.
    refused(&*b, &k, &holder, LONG).await;
    b.abandon(&k, &second).await.unwrap();
    // `second` gave up: the holder, queued behind it, is first now; `late` is not.
    refused(&*a, &k, &late, LONG).await;
    let t2 = granted(&*a, &k, &holder, LONG).await;
    assert!(t2 > t1);
    release(&*a, &k, &holder).await;
    b.abandon(&k, &late).await.unwrap();
    // Every place is gone: anyone gets the free key.
    granted(&*b, &k, &Owner::new("anyone"), LONG).await;
}

/// A waiter that queued and went silent blocks the key until its place lapses (its TTL
/// after its last attempt, by the database's clock), and no longer.
pub async fn a_silent_place_lapses_after_its_ttl(a: Arc<dyn LockBackend>, b: Arc<dyn LockBackend>) {
    let k = key("fair-lapse");
    let place_ttl = Duration::from_millis(600);
    let (holder, silent, next) = (
        Owner::new("holder"),
        Owner::new("silent"),
        Owner::new("next"),
    );
    granted(&*a, &k, &holder, LONG).await;
    let asked = Instant::now();
    refused(&*b, &k, &silent, place_ttl).await;
    release(&*a, &k, &holder).await;
    let got = loop {
        match a.try_acquire(&k, &next, LONG).await.unwrap() {
            AcquireOutcome::Acquired(_) => break asked.elapsed(),
            AcquireOutcome::Held(_) => {
                assert!(
                    asked.elapsed() < Duration::from_secs(5),
                    "the silent waiter's place never lapsed"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    assert!(
        got >= place_ttl - Duration::from_millis(10),
        "the key went past the queue's first place {got:?} after it queued, before its TTL of {place_ttl:?}"
    );
}

/// A refused waiter is told to come back within half its TTL, however long the holder's
/// lease, so its place does not lapse while it waits.
pub async fn a_waiter_comes_back_before_its_place_lapses(
    a: Arc<dyn LockBackend>,
    b: Arc<dyn LockBackend>,
) {
    let k = key("fair-renew");
    let ttl = Duration::from_secs(2);
    granted(&*a, &k, &Owner::new("holder"), LONG).await;
    let c = refused(&*b, &k, &Owner::new("waiter"), ttl).await;
    let back = c.remaining_ttl.expect("a refusal names when to come back");
    assert!(
        back <= ttl / 2,
        "told to come back after {back:?}, TTL {ttl:?}"
    );
}

/// The checks above as tests of one database: `$pair` is an async expression giving two
/// fair backends on one fresh table (and whatever must live as long as they do).
#[allow(unused_macros)] // Not every test binary sharing `common` uses it.
macro_rules! fair_tests {
    ($pair:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn declares_fifo_and_refuses_claims() {
            let (_keep, a, _) = $pair.await;
            common::fair::declares_fifo_and_refuses_claims(a).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn the_first_place_gets_the_key() {
            let (_keep, a, b) = $pair.await;
            common::fair::the_first_place_gets_the_key(a, b).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn a_silent_place_lapses_after_its_ttl() {
            let (_keep, a, b) = $pair.await;
            common::fair::a_silent_place_lapses_after_its_ttl(a, b).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn a_waiter_comes_back_before_its_place_lapses() {
            let (_keep, a, b) = $pair.await;
            common::fair::a_waiter_comes_back_before_its_place_lapses(a, b).await;
        }
    };
}
#[allow(unused_imports)]
pub(crate) use fair_tests;
