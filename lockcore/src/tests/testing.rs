//! The public test store: each fault does what its documentation says, on tokio's paused
//! clock, in well under a second of wall time.

use std::time::Duration;

use crate::memory::MemoryBackend;
use crate::testing::{Ops, TestStore};
use crate::*;

const TTL: Duration = Duration::from_secs(30);

/// Tokio's clock, which the store and lockcore follow.
fn clock() -> tokio::time::Instant {
    tokio::time::Instant::now()
}

/// Runs `test` and checks that it took less than a second of wall time, however long it
/// took on the paused clock. A test stuck with nothing to wake it ends at the paused
/// clock's next timer: the hour this gives it.
async fn quickly<F: std::future::Future<Output = ()>>(test: F) {
    let wall = std::time::Instant::now();
    tokio::time::timeout(Duration::from_secs(3600), test)
        .await
        .expect("the test got stuck");
    assert!(
        wall.elapsed() < Duration::from_secs(1),
        "took {:?} of wall time: something sleeps on the real clock",
        wall.elapsed()
    );
}

/// A hold the store dropped fires `lost()` at the next renewal, a third of the TTL on.
#[tokio::test(start_paused = true)]
async fn a_lost_hold_fires_lost_at_its_next_renewal() {
    quickly(async {
        let store = TestStore::new();
        let locks = LockClient::new(store.clone());
        let guard = locks.lock("job").ttl(TTL).acquire().await.unwrap();
        let taken = clock();
        assert!(store.lose(&guard).await.unwrap());
        assert!(!store.lose(&guard).await.unwrap(), "lost twice");
        guard.lost().await;
        let after = taken.elapsed();
        assert!(
            after >= TTL / 3 - Duration::from_secs(1) && after <= TTL / 3 + Duration::from_secs(1),
            "lost() fired {after:?} after the loss, not at the renewal"
        );
        assert_eq!(store.ops().renewals, 1);
        assert!(matches!(guard.release().await, Ok(ReleaseOutcome::NotHeld)));
    })
    .await;
}

/// Losing one hold of a shared key leaves the other holders theirs.
#[tokio::test(start_paused = true)]
async fn losing_one_reader_leaves_the_others() {
    quickly(async {
        let store = TestStore::new();
        let locks = LockClient::new(store.clone());
        let first = locks.lock("doc").shared().ttl(TTL).acquire().await.unwrap();
        let second = locks.lock("doc").shared().ttl(TTL).acquire().await.unwrap();
        assert!(store.lose(&first).await.unwrap());
        first.lost().await;
        tokio::time::sleep(TTL).await;
        assert!(!second.is_lost(), "the other reader lost its hold too");
        let key = LockKey::new("doc").unwrap();
        let holders = store.inner().holders(&key).await.unwrap();
        assert_eq!(holders.len(), 1, "{holders:?}");
        assert_eq!(holders[0].token, second.token());
    })
    .await;
}

/// The watchdog keeps a lease through many TTLs of the paused clock, renewing every third
/// of it; the lease never runs out in between.
#[tokio::test(start_paused = true)]
async fn renewals_keep_a_lease_through_many_ttls() {
    quickly(async {
        let store = TestStore::new();
        let locks = LockClient::new(store.clone());
        let guard = locks.lock("job").ttl(TTL).acquire().await.unwrap();
        let other = LockClient::new(store.clone());
        tokio::time::sleep(TTL * 10).await;
        assert!(!guard.is_lost());
        assert!(guard.valid_until() > clock().into_std());
        assert!(other.lock("job").try_acquire().await.unwrap().is_none());
        let renewals = store.ops().renewals;
        assert!(
            (29..=33).contains(&renewals),
            "{renewals} renewals in ten TTLs: {:?}",
            store.ops()
        );
        assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
        tokio::time::sleep(TTL).await;
        assert_eq!(store.ops().renewals, renewals, "renewed after the release");
    })
    .await;
}

/// Renewals that keep failing warn at once and lose the lock shortly before the lease
/// ends, not earlier and not after.
#[tokio::test(start_paused = true)]
async fn failing_renewals_lose_the_lock_just_before_the_lease_ends() {
    quickly(async {
        let store = TestStore::new();
        let locks = LockClient::new(store.clone());
        let guard = locks.lock("job").ttl(TTL).acquire().await.unwrap();
        let taken = clock();
        store.fail_renewals(usize::MAX);
        guard.renewal_failing().await;
        let warned = taken.elapsed();
        assert!(
            warned <= TTL / 3 + Duration::from_secs(1),
            "warned at {warned:?}"
        );
        assert!(!guard.is_lost());
        guard.lost().await;
        let lost = taken.elapsed();
        assert!(
            lost >= TTL * 9 / 10 && lost < TTL,
            "lost at {lost:?} of a {TTL:?} lease"
        );
        assert!(store.ops().renewals > 3, "the failures were retried");
    })
    .await;
}

/// A few failed renewals, or a renewal slower than its time limit, are ridden out.
#[tokio::test(start_paused = true)]
async fn a_few_failed_or_slow_renewals_do_not_lose_the_lock() {
    quickly(async {
        let store = TestStore::new();
        let locks = LockClient::new(store.clone());
        let guard = locks.lock("job").ttl(TTL).acquire().await.unwrap();
        store.fail_renewals(2);
        tokio::time::sleep(TTL * 2).await;
        assert!(!guard.is_lost());
        assert_eq!(*guard.renewal_health().borrow(), RenewalHealth::Renewing);

        // Half a TTL late: the watchdog gives up on it after a quarter of the TTL, which
        // counts as a failure, and tries again.
        store.delay_renewals(1, TTL / 2);
        tokio::time::timeout(TTL, guard.renewal_failing())
            .await
            .expect("the late renewal was not given up on");
        let mut health = guard.renewal_health();
        tokio::time::timeout(TTL, health.wait_for(|h| *h == RenewalHealth::Renewing))
            .await
            .expect("the next renewal did not go through")
            .unwrap();
        assert!(!guard.is_lost());
        guard.release().await.unwrap();
    })
    .await;
}

/// An expired key is free for another client at once, with a higher token; the deposed
/// holder learns it at its next renewal, and its stale token is refused.
#[tokio::test(start_paused = true)]
async fn an_expired_lease_frees_the_key_for_a_higher_token() {
    quickly(async {
        let store = TestStore::new();
        let (a, b) = (
            LockClient::new(store.clone()),
            LockClient::new(store.clone()),
        );
        let ledger = FencedResource::new(0);
        let first = a.lock("ledger").ttl(TTL).acquire().await.unwrap();
        ledger.write(first.token(), |v| *v += 1).unwrap();
        assert!(store.expire("ledger").await.unwrap());
        assert!(
            !store.expire("ledger").await.unwrap(),
            "nothing left to expire"
        );
        let second = b.lock("ledger").try_acquire().await.unwrap().expect("free");
        assert!(second.token() > first.token());
        ledger.write(second.token(), |v| *v += 10).unwrap();
        assert!(ledger.write(first.token(), |v| *v += 100).is_err());
        first.lost().await;
        assert_eq!(ledger.read(), 11);
        assert!(matches!(
            store.expire("bad\0key").await,
            Err(LockError::InvalidKey { .. })
        ));
        assert_eq!(store.ops().force_releases, 2);
    })
    .await;
}

/// A stopped store refuses everything, applies nothing and costs no compensation; a hold
/// through the outage is lost when its lease would end; started again, it serves.
#[tokio::test(start_paused = true)]
async fn a_stopped_store_refuses_and_then_serves_again() {
    quickly(async {
        let store = TestStore::new();
        let locks = LockClient::new(store.clone());
        let held = locks.lock("held").ttl(TTL).acquire().await.unwrap();
        store.stop();
        let err = locks.lock("free").try_acquire().await.unwrap_err();
        assert!(
            matches!(err, LockError::Unavailable { .. }) && err.is_retryable(),
            "{err:?}"
        );
        held.lost().await;
        store.start();
        // Lost shortly before the store's lease ends, as promised: still held there.
        assert!(locks.lock("held").try_acquire().await.unwrap().is_none());
        tokio::time::sleep(TTL / 10).await;
        assert!(
            locks.lock("free").try_acquire().await.unwrap().is_some(),
            "the refused attempt was applied, or the store did not come back"
        );
        assert!(locks.lock("held").try_acquire().await.unwrap().is_some());
        assert_eq!(store.ops().releases, 0);
    })
    .await;
}

/// A paused store applies requests and holds their answers: an acquire dropped while its
/// grant is held back leaves nothing held once the answer comes.
#[tokio::test(start_paused = true)]
async fn an_acquire_dropped_while_its_answer_is_held_leaves_nothing() {
    quickly(async {
        let store = TestStore::new();
        let locks = LockClient::new(store.clone());
        store.pause();
        let acquiring = tokio::spawn({
            let locks = locks.clone();
            async move { locks.lock("k").ttl(TTL).acquire().await }
        });
        tokio::time::timeout(Duration::from_secs(5), store.answers_held(1))
            .await
            .expect("the claim's answer was held");
        let key = LockKey::new("k").unwrap();
        assert_eq!(
            store.inner().holders(&key).await.unwrap().len(),
            1,
            "the paused store applied the claim"
        );
        acquiring.abort();
        assert!(acquiring.await.unwrap_err().is_cancelled());
        store.resume();
        assert!(locks.shutdown().await);
        let other = LockClient::new(store.clone());
        let holders = store.inner().holders(&key).await.unwrap();
        assert!(holders.is_empty(), "{holders:?} {:?}", store.ops());
        assert!(other.lock("k").try_acquire().await.unwrap().is_some());
        assert_eq!(store.ops().releases, 1, "the grant was released once");
    })
    .await;
}

/// A wait deadline runs on the paused clock.
#[tokio::test(start_paused = true)]
async fn a_wait_deadline_follows_the_paused_clock() {
    quickly(async {
        let store = TestStore::new();
        let (a, b) = (
            LockClient::new(store.clone()),
            LockClient::new(store.clone()),
        );
        let _held = a.lock("k").ttl(TTL).acquire().await.unwrap();
        let started = clock();
        let wait = Duration::from_secs(120);
        let err = b.lock("k").wait(wait).acquire().await.unwrap_err();
        assert!(matches!(err, LockError::Timeout { .. }), "{err:?}");
        assert!(started.elapsed() >= wait);
    })
    .await;
}

/// Every kind of operation is counted, once per request.
#[tokio::test]
async fn each_operation_is_counted() {
    let store = TestStore::new();
    let (a, b) = (
        LockClient::new(store.clone()),
        LockClient::new(store.clone()),
    );
    let held = a.lock("k").acquire().await.unwrap();
    held.extend().await.unwrap();
    assert!(b.inspect("k").await.unwrap().is_some());
    assert!(b.lock("k").try_acquire().await.unwrap().is_none());
    assert!(b
        .lock("k")
        .wait(Duration::from_millis(1))
        .acquire()
        .await
        .is_err());
    held.release().await.unwrap();
    store.expire("k").await.unwrap();
    let ops = store.ops();
    assert!(ops.claims >= 3, "{ops:?}");
    assert_eq!(
        (ops.releases, ops.renewals, ops.renew_requests, ops.holders),
        (1, 1, 1, 1),
        "{ops:?}"
    );
    assert_eq!(ops.force_releases, 1);
    assert_eq!((ops.waits, ops.abandons), (1, 1), "{ops:?}");
    assert_ne!(ops, Ops::default());
}

/// A wrapped backend keeps its clock and gets the faults.
#[tokio::test]
async fn a_wrapped_backend_keeps_its_clock_and_gets_the_faults() {
    let memory = MemoryBackend::new();
    let store = TestStore::wrap(memory.clone());
    assert_eq!(store.capabilities(), memory.capabilities());
    assert_eq!(TestStore::new().capabilities().clock, ClockSource::Tokio);
    let locks = LockClient::new(store.clone());
    store.stop();
    assert!(locks.lock("k").try_acquire().await.is_err());
    store.start();
    let guard = locks.lock("k").acquire().await.unwrap();
    assert_eq!(memory.held_count(), 1);
    assert!(store.lose(&guard).await.unwrap());
    assert_eq!(memory.held_count(), 0);
}

/// A store on the monotonic clock (a plain memory store, any networked store) ignores a
/// paused tokio clock: while the test's clock stands still, its lock is renewed every
/// third of the TTL of real time, as without the pause (not at every turn of the watchdog,
/// as it would be if its renewals were timed on one clock and its lease on the other).
#[tokio::test(start_paused = true)]
async fn a_store_on_the_monotonic_clock_ignores_a_paused_tokio_clock() {
    let store = TestStore::wrap(MemoryBackend::new());
    assert_eq!(store.capabilities().clock, ClockSource::Local);
    let locks = LockClient::new(store.clone());
    let ttl = Duration::from_millis(300);
    let guard = locks.lock("k").ttl(ttl).acquire().await.unwrap();
    // Real time passes; tokio's paused clock does not.
    tokio::task::spawn_blocking(move || std::thread::sleep(ttl * 2))
        .await
        .unwrap();
    let renewals = store.ops().renewals;
    assert!(
        (2..=12).contains(&renewals),
        "{renewals} renewals in two TTLs of real time"
    );
    assert!(!guard.is_lost());
    assert!(guard.valid_until() > std::time::Instant::now());
    guard.release().await.unwrap();
}
