//! The redis backend's fair layout (`?fair=true`): the whole conformance suite with its FIFO
//! scenario, and the queue's own rules on a real server: a place that is not renewed lapses
//! after its TTL (a dead waiter blocks nobody for longer), a place given up or force-freed
//! hands the lock on at once, and what the layout refuses.

mod common;

use std::time::{Duration, Instant};

use common::{bounded, key, raw, shared_url, RedisHarness};
use driver_redis::__redlock as support;
use driver_redis::redis::AsyncCommands;
use driver_redis::RedisBackend;
use lockcore::driver::{AcquireOutcome, Fairness, LockBackendExt};
use lockcore::{Claim, LockBackend, LockClient, LockError, Owner, ReleaseOutcome};

conformance_tests::suite!(
    in_tree conformance,
    capabilities: driver_redis::FAIR_CAPABILITIES,
    faults: true,
    fair: true,
    harness: || async { RedisHarness::fair() },
);

const LONG: Duration = Duration::from_secs(30);

/// Queues `owner` on `k` with one refused attempt, as a waiter that then goes silent.
async fn queue(b: &RedisBackend, k: &lockcore::LockKey, owner: &Owner, ttl: Duration) {
    match b.try_acquire(k, owner, ttl).await.unwrap() {
        AcquireOutcome::Held(_) => {}
        AcquireOutcome::Acquired(_) => panic!("a held key was granted to a waiter"),
    }
}

/// Waits until `k`'s queue holds at least `n` places (a waiter of another task queued):
/// no event marks it, so the queue is read every 5 ms, for at most 10 s.
async fn places_at_least(h: &RedisHarness, k: &lockcore::LockKey, n: usize) {
    let names = support::names(&h.prefix, k);
    let mut conn = raw(&shared_url()).await;
    let started = Instant::now();
    while conn.zcard::<_, usize>(names.queue()).await.unwrap() < n {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the waiter never queued"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_layout_declares_fifo_and_refuses_what_it_lacks() {
    bounded(async {
        let h = RedisHarness::fair();
        let b = h.backend().await.unwrap();
        assert_eq!(b.capabilities().fairness, Fairness::Fifo);
        let owner = Owner::new("r");
        let err = b
            .try_claim(&key("fair-shared"), &owner, LONG, Claim::shared())
            .await
            .unwrap_err();
        assert!(matches!(err, LockError::Config { .. }), "{err:?}");
        assert!(err.to_string().contains("fair=true"), "{err}");
        let err = RedisBackend::builder(format!("{}?fair=true&fencing=false", shared_url()))
            .build()
            .await
            .unwrap_err();
        assert!(matches!(err, LockError::Config { .. }), "{err:?}");
        assert!(err.to_string().contains("fair=true"), "{err}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_silent_waiters_place_lapses_after_its_ttl_and_not_before() {
    bounded(async {
        let h = RedisHarness::fair();
        let b = h.backend().await.unwrap();
        let k = key("fair-lapse");
        let (holder, silent, next) = (Owner::new("h"), Owner::new("s"), Owner::new("n"));
        assert!(matches!(
            b.try_acquire(&k, &holder, LONG).await.unwrap(),
            AcquireOutcome::Acquired(_)
        ));
        let place = Duration::from_millis(600);
        queue(&b, &k, &silent, place).await;
        let queued = Instant::now();
        queue(&b, &k, &next, LONG).await;
        assert_eq!(
            b.release(&k, &holder).await.unwrap(),
            ReleaseOutcome::Released
        );
        // The silent waiter is first: the lock is free, but not for the next one.
        assert!(
            matches!(
                b.try_acquire(&k, &next, LONG).await.unwrap(),
                AcquireOutcome::Held(_)
            ),
            "the second place was granted while the first place lived"
        );
        // Its place runs out after its TTL: then the next one gets the lock.
        loop {
            if let AcquireOutcome::Acquired(_) = b.try_acquire(&k, &next, LONG).await.unwrap() {
                break;
            }
            assert!(
                queued.elapsed() < place * 5,
                "the silent place never lapsed"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            queued.elapsed() >= place - Duration::from_millis(50),
            "granted {:?} after the first place was taken, before its {place:?} ran out",
            queued.elapsed()
        );
        // The lapsed place is gone: the silent waiter is refused as a newcomer, and queued
        // behind nobody else.
        assert_eq!(
            b.release(&k, &next).await.unwrap(),
            ReleaseOutcome::Released
        );
        let names = support::names(&h.prefix, &k);
        let mut conn = raw(&shared_url()).await;
        let left: Vec<String> = conn.zrange(names.queue(), 0, -1).await.unwrap();
        assert!(
            left.is_empty(),
            "places left after every waiter was served or lapsed: {left:?}"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_first_place_given_up_wakes_the_next_waiter_at_once() {
    bounded(async {
        let h = RedisHarness::fair();
        let b = h.backend().await.unwrap();
        let k = key("fair-abandon");
        let (holder, first) = (Owner::new("h"), Owner::new("f"));
        assert!(matches!(
            b.try_acquire(&k, &holder, LONG).await.unwrap(),
            AcquireOutcome::Acquired(_)
        ));
        // A first place that would last 30 s, then a waiter of a client of its own.
        queue(&b, &k, &first, LONG).await;
        let waiting = LockClient::new(h.backend().await.unwrap());
        let task = {
            let k = k.clone();
            tokio::spawn(async move {
                let guard = waiting
                    .lock(k.as_str())
                    .ttl(LONG)
                    .wait(LONG)
                    .acquire()
                    .await;
                (guard.map(|g| g.token()), Instant::now())
            })
        };
        // Once the waiter is queued (second place), free the lock: the first place is
        // announced, and nobody is there to take it.
        places_at_least(&h, &k, 2).await;
        assert_eq!(
            b.release(&k, &holder).await.unwrap(),
            ReleaseOutcome::Released
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            !task.is_finished(),
            "the second place was served before the first"
        );
        let abandoned = Instant::now();
        b.abandon(&k, &first).await.unwrap();
        let (token, served) = tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("the waiter was not woken when the first place was given up")
            .unwrap();
        assert!(token.is_ok(), "{token:?}");
        let took = served.duration_since(abandoned);
        assert!(
            took < Duration::from_secs(2),
            "the waiter took {took:?} after the first place was given up"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_force_release_hands_the_lock_to_the_first_waiter() {
    bounded(async {
        let h = RedisHarness::fair();
        let b = h.backend().await.unwrap();
        let k = key("fair-force");
        let holder = Owner::new("h");
        assert!(matches!(
            b.try_acquire(&k, &holder, LONG).await.unwrap(),
            AcquireOutcome::Acquired(_)
        ));
        let waiting = LockClient::new(h.backend().await.unwrap());
        let task = {
            let k = k.clone();
            tokio::spawn(async move {
                waiting
                    .lock(k.as_str())
                    .ttl(LONG)
                    .wait(LONG)
                    .acquire()
                    .await
                    .map(|g| g.token())
            })
        };
        places_at_least(&h, &k, 1).await;
        let forced = Instant::now();
        assert_eq!(b.force_release(&k).await.unwrap(), ReleaseOutcome::Released);
        let token = tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("the waiter was not woken by the force-release")
            .unwrap();
        assert!(token.is_ok(), "{token:?}");
        assert!(
            forced.elapsed() < Duration::from_secs(2),
            "the waiter took {:?} after the force-release",
            forced.elapsed()
        );
        assert_eq!(
            b.release(&k, &holder).await.unwrap(),
            ReleaseOutcome::NotHeld
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_waiter_with_a_short_ttl_keeps_its_place_behind_a_long_holder() {
    bounded(async {
        let h = RedisHarness::fair();
        let b = h.backend().await.unwrap();
        let k = key("fair-renew-place");
        let (holder, later) = (Owner::new("h"), Owner::new("l"));
        assert!(matches!(
            b.try_acquire(&k, &holder, LONG).await.unwrap(),
            AcquireOutcome::Acquired(_)
        ));
        // A waiter whose place lasts 300 ms from each attempt, waiting for a holder of 30 s.
        let short = Duration::from_millis(300);
        let waiting = LockClient::new(h.backend().await.unwrap());
        let task = {
            let k = k.clone();
            tokio::spawn(async move {
                let token = waiting
                    .lock(k.as_str())
                    .ttl(short)
                    .wait(LONG)
                    .acquire()
                    .await
                    .map(|g| g.token());
                (token, Instant::now())
            })
        };
        places_at_least(&h, &k, 1).await;
        // A later waiter that goes silent with a long place.
        queue(&b, &k, &later, LONG).await;
        // Five of the short place's lifetimes: it lives only if the waiter renews it.
        tokio::time::sleep(short * 5).await;
        let released = Instant::now();
        assert_eq!(
            b.release(&k, &holder).await.unwrap(),
            ReleaseOutcome::Released
        );
        let (token, served) = tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("the first waiter lost its place to the later one")
            .unwrap();
        assert!(token.is_ok(), "{token:?}");
        let took = served.duration_since(released);
        assert!(
            took < Duration::from_secs(2),
            "the first waiter was served {took:?} after the release: its place had lapsed"
        );
    })
    .await;
}
