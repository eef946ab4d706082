//! Shared claims on a real redis-server, through the backend trait: read-write locks,
//! semaphores, capacity mismatches, fencing across modes, reservations (writers are not
//! starved), release, extend and inspection of shared leases, expiry, hostile keys, and
//! waiting for a shared lease's release.

mod common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{bounded, key, raw, RedisHarness};
use distlock_redis::__redlock as support;
use distlock_redis::redis::AsyncCommands;
use distlock_redis::RedisBackend;
use lockcore::driver::{
    AcquireOutcome, ClaimRequest, Contention, ExtendOutcome, LockBackendExt, SetOutcome, WaitHint,
    READ_WRITE_CAPACITY,
};
use lockcore::{
    Claim, ClaimMode, FencingToken, LockBackend, LockError, LockKey, Owner, ReleaseOutcome,
};

/// A TTL no test outlives.
const LONG: Duration = Duration::from_secs(30);

fn sem(k: u32, n: u32) -> Claim {
    Claim::permits(k, n).unwrap()
}

async fn claim(
    b: &RedisBackend,
    k: &LockKey,
    o: &Owner,
    ttl: Duration,
    c: Claim,
) -> AcquireOutcome {
    b.try_claim(k, o, ttl, c).await.unwrap()
}

async fn granted(
    b: &RedisBackend,
    k: &LockKey,
    o: &Owner,
    ttl: Duration,
    c: Claim,
) -> FencingToken {
    match claim(b, k, o, ttl, c).await {
        AcquireOutcome::Acquired(g) => g.token,
        other => panic!("{c} on {k} by {} was refused: {other:?}", o.label()),
    }
}

async fn refused(b: &RedisBackend, k: &LockKey, o: &Owner, ttl: Duration, c: Claim) -> Contention {
    match claim(b, k, o, ttl, c).await {
        AcquireOutcome::Held(h) => h,
        other => panic!("{c} on {k} by {} was granted: {other:?}", o.label()),
    }
}

async fn release(b: &RedisBackend, k: &LockKey, o: &Owner) -> ReleaseOutcome {
    b.release(k, o).await.unwrap()
}

/// Readers share a key; each gets its own, larger token; a writer is refused while any
/// reader holds it (with the soonest reader's remaining TTL) and readers are refused while
/// the writer holds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_share_and_exclude_a_writer() {
    bounded(async {
        let h = RedisHarness::new();
        let b = h.backend().await.unwrap();
        let k = key("rw");
        let (r1, r2, w) = (Owner::new("r1"), Owner::new("r2"), Owner::new("w"));
        let t1 = granted(&b, &k, &r1, Duration::from_secs(5), Claim::shared()).await;
        let t2 = granted(&b, &k, &r2, LONG, Claim::shared()).await;
        assert!(t2 > t1);

        let held = refused(&b, &k, &w, LONG, Claim::exclusive()).await;
        let left = held.remaining_ttl.expect("the soonest reader's TTL");
        assert!(
            left <= Duration::from_secs(5) && left > Duration::from_secs(4),
            "{left:?}"
        );
        assert!(
            held.hint.revision().is_some(),
            "a refusal by leases carries its stamp"
        );
        // The writer's own request, through try_acquire, is the same claim.
        assert!(matches!(
            b.try_acquire(&k, &w, LONG).await.unwrap(),
            AcquireOutcome::Held(_)
        ));

        assert_eq!(release(&b, &k, &r1).await, ReleaseOutcome::Released);
        assert_eq!(release(&b, &k, &r1).await, ReleaseOutcome::NotHeld);
        refused(&b, &k, &w, LONG, Claim::exclusive()).await;
        assert_eq!(release(&b, &k, &r2).await, ReleaseOutcome::Released);
        let tw = granted(&b, &k, &w, LONG, Claim::exclusive()).await;
        assert!(tw > t2);

        let r3 = Owner::new("r3");
        let held = refused(&b, &k, &r3, LONG, Claim::shared()).await;
        assert!(held.remaining_ttl.unwrap() > Duration::from_secs(29));
        assert_eq!(release(&b, &k, &w).await, ReleaseOutcome::Released);
        let t3 = granted(&b, &k, &r3, LONG, Claim::shared()).await;
        assert!(t3 > tw);
        assert_eq!(release(&b, &k, &r3).await, ReleaseOutcome::Released);
    })
    .await;
}

/// Tokens strictly increase in grant order across exclusive locks, readers and semaphore
/// permits on one key, and a re-grant to the same owner keeps its token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_increase_across_modes() {
    bounded(async {
        let h = RedisHarness::new();
        let b = h.backend().await.unwrap();
        let k = key("modes");
        let mut last = FencingToken(0);
        for round in 0..3 {
            let w = Owner::new(format!("w{round}"));
            let t = granted(&b, &k, &w, LONG, Claim::exclusive()).await;
            assert!(t > last);
            last = t;
            release(&b, &k, &w).await;
            let readers: Vec<Owner> = (0..3)
                .map(|i| Owner::new(format!("r{round}.{i}")))
                .collect();
            for r in &readers {
                let t = granted(&b, &k, r, LONG, Claim::shared()).await;
                assert!(t > last);
                last = t;
                assert_eq!(
                    granted(&b, &k, r, LONG, Claim::shared()).await,
                    t,
                    "re-grant"
                );
            }
            for r in &readers {
                release(&b, &k, r).await;
            }
            let p = Owner::new(format!("p{round}"));
            let t = granted(&b, &k, &p, LONG, sem(2, 3)).await;
            assert!(t > last);
            last = t;
            release(&b, &k, &p).await;
        }
    })
    .await;
}

/// A semaphore of n grants at most n permits: weights add up, a claim that does not fit is
/// refused, and released permits come back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_counts_permits() {
    bounded(async {
        let h = RedisHarness::new();
        let b = h.backend().await.unwrap();
        let k = key("sem");
        let owners: Vec<Owner> = (0..4).map(|i| Owner::new(format!("o{i}"))).collect();
        granted(&b, &k, &owners[0], LONG, sem(1, 3)).await;
        granted(&b, &k, &owners[1], LONG, sem(1, 3)).await;
        let c = refused(&b, &k, &owners[2], LONG, sem(2, 3)).await;
        assert_eq!(c.hint.reservation(), Some(true), "{c:?}");
        // The refused 2-permit claim reserved its room: a 1-permit claim of another owner
        // now waits behind it, and keeps none.
        let c = refused(&b, &k, &owners[3], LONG, sem(1, 3)).await;
        assert_eq!(c.hint.reservation(), Some(false), "{c:?}");
        release(&b, &k, &owners[0]).await;
        granted(&b, &k, &owners[2], LONG, sem(2, 3)).await;
        refused(&b, &k, &owners[3], LONG, sem(1, 3)).await;
        release(&b, &k, &owners[1]).await;
        granted(&b, &k, &owners[3], LONG, sem(1, 3)).await;
        let all = b.holders(&k).await.unwrap();
        let weights: u64 = all.iter().map(|l| l.claim.weight()).sum();
        assert_eq!(weights, 3, "{all:?}");
        assert!(all.iter().all(|l| l.claim.mode() == ClaimMode::Permits));
        for o in &owners {
            release(&b, &k, o).await;
        }
        assert!(b.holders(&k).await.unwrap().is_empty());
    })
    .await;
}

/// Many clients racing for a semaphore of 3 never have more than 3 permits out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_never_above_its_capacity_under_contention() {
    bounded(async {
        let h = RedisHarness::new();
        let k = key("busy");
        let out = Arc::new(AtomicUsize::new(0));
        let peak = Arc::new(AtomicUsize::new(0));
        let granted_total = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for client in 0..4 {
            let b = h.backend().await.unwrap();
            for task in 0..4 {
                let (b, k, out, peak, total) = (
                    b.clone(),
                    k.clone(),
                    out.clone(),
                    peak.clone(),
                    granted_total.clone(),
                );
                tasks.push(tokio::spawn(async move {
                    let deadline = Instant::now() + Duration::from_secs(3);
                    while Instant::now() < deadline {
                        let o = Owner::new(format!("c{client}t{task}"));
                        match b.try_claim(&k, &o, LONG, sem(1, 3)).await.unwrap() {
                            AcquireOutcome::Acquired(_) => {
                                let now = out.fetch_add(1, Ordering::SeqCst) + 1;
                                peak.fetch_max(now, Ordering::SeqCst);
                                total.fetch_add(1, Ordering::SeqCst);
                                tokio::time::sleep(Duration::from_millis(3)).await;
                                out.fetch_sub(1, Ordering::SeqCst);
                                assert_eq!(
                                    b.release(&k, &o).await.unwrap(),
                                    ReleaseOutcome::Released
                                );
                            }
                            AcquireOutcome::Held(_) => {
                                b.abandon(&k, &o).await.unwrap();
                                tokio::time::sleep(Duration::from_millis(1)).await;
                            }
                        }
                    }
                }));
            }
        }
        for t in tasks {
            t.await.unwrap();
        }
        let peak = peak.load(Ordering::SeqCst);
        assert!(peak <= 3, "{peak} permits out at once");
        assert!(granted_total.load(Ordering::SeqCst) > 10);
    })
    .await;
}

/// A claim with another capacity than the key's is refused with an error naming both, from
/// try_claim and from try_acquire, and never redefines the key; a free key takes any.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capacity_mismatch_names_both_and_redefines_nothing() {
    bounded(async {
        let h = RedisHarness::new();
        let b = h.backend().await.unwrap();
        let k = key("cap");
        let (a, x) = (Owner::new("a"), Owner::new("x"));
        granted(&b, &k, &a, LONG, sem(1, 8)).await;
        let text = |e: LockError| {
            assert!(matches!(e, LockError::Config { .. }), "{e:?}");
            e.to_string()
        };
        let e = b.try_claim(&k, &x, LONG, sem(1, 4)).await.unwrap_err();
        let t = text(e);
        assert!(
            t.contains("semaphore of 8") && t.contains("semaphore of 4"),
            "{t}"
        );
        let t = text(
            b.try_claim(&k, &x, LONG, Claim::shared())
                .await
                .unwrap_err(),
        );
        assert!(t.contains("semaphore of 8") && t.contains("shared"), "{t}");
        let t = text(b.try_acquire(&k, &x, LONG).await.unwrap_err());
        assert!(
            t.contains("semaphore of 8") && t.contains("exclusive"),
            "{t}"
        );
        // Even the holder cannot change the key's kind.
        text(b.try_claim(&k, &a, LONG, sem(1, 4)).await.unwrap_err());
        granted(&b, &k, &x, LONG, sem(7, 8)).await;
        release(&b, &k, &a).await;
        release(&b, &k, &x).await;

        // Free again: an exclusive lock takes it, and a semaphore is then refused.
        granted(&b, &k, &a, LONG, Claim::exclusive()).await;
        let t = text(b.try_claim(&k, &x, LONG, sem(2, 4)).await.unwrap_err());
        assert!(
            t.contains("exclusive or read-write") && t.contains("semaphore of 4"),
            "{t}"
        );
        release(&b, &k, &a).await;
        granted(&b, &k, &x, LONG, sem(2, 4)).await;
        release(&b, &k, &x).await;
    })
    .await;
}

/// A writer refused by readers reserves the key: new readers are refused until it got in
/// (its own grant clears the reservation), or abandoned, or the reservation expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_writer_holds_back_new_readers() {
    bounded(async {
        let h = RedisHarness::new();
        let b = h.backend().await.unwrap();
        let k = key("starve");
        let (r1, r2, w, w2) = (
            Owner::new("r1"),
            Owner::new("r2"),
            Owner::new("w"),
            Owner::new("w2"),
        );
        granted(&b, &k, &r1, LONG, Claim::shared()).await;
        // Each refusal says whether it kept a reservation for its owner (for the client to
        // take back if it gives up): the writer's yes, the others' behind it no.
        let c = refused(&b, &k, &w, LONG, Claim::exclusive()).await;
        assert_eq!(c.hint.reservation(), Some(true), "{c:?}");
        let c = refused(&b, &k, &r2, LONG, Claim::shared()).await;
        assert_eq!(c.hint.reservation(), Some(false), "{c:?}");
        // A second writer neither fits nor replaces the first one's reservation.
        let c = refused(&b, &k, &w2, LONG, Claim::exclusive()).await;
        assert_eq!(c.hint.reservation(), Some(false), "{c:?}");
        release(&b, &k, &r1).await;
        refused(&b, &k, &r2, LONG, Claim::shared()).await;
        refused(&b, &k, &w2, LONG, Claim::exclusive()).await;
        granted(&b, &k, &w, LONG, Claim::exclusive()).await;
        release(&b, &k, &w).await;
        granted(&b, &k, &r2, LONG, Claim::shared()).await;
        release(&b, &k, &r2).await;

        // Abandoned: the reservation goes at once.
        granted(&b, &k, &r1, LONG, Claim::shared()).await;
        refused(&b, &k, &w, LONG, Claim::exclusive()).await;
        refused(&b, &k, &r2, LONG, Claim::shared()).await;
        b.abandon(&k, &w).await.unwrap();
        granted(&b, &k, &r2, LONG, Claim::shared()).await;
        release(&b, &k, &r2).await;

        // Vanished: the reservation expires with the writer's TTL.
        refused(&b, &k, &w, Duration::from_millis(200), Claim::exclusive()).await;
        let held = refused(&b, &k, &r2, LONG, Claim::shared()).await;
        assert!(held.remaining_ttl.is_some());
        tokio::time::sleep(Duration::from_millis(300)).await;
        granted(&b, &k, &r2, LONG, Claim::shared()).await;
        release(&b, &k, &r2).await;
        release(&b, &k, &r1).await;
        // A writer behind another writer reserves nothing: the exclusive path is as it was.
        granted(&b, &k, &w, LONG, Claim::exclusive()).await;
        refused(&b, &k, &w2, LONG, Claim::exclusive()).await;
        release(&b, &k, &w).await;
        granted(&b, &k, &r1, LONG, Claim::shared()).await;
        release(&b, &k, &r1).await;
        let mut r = raw(&h.url).await;
        let names = support::names(&h.prefix, &k);
        let left: usize = r.exists(&[names.leases(), names.claims()]).await.unwrap();
        assert_eq!(left, 0, "an idle key leaves nothing behind");
    })
    .await;
}

/// A shared lease is extended (never shortened, never created) and released by its owner
/// only; a re-claim by its owner keeps its token and never shortens it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_leases_extend_and_release() {
    bounded(async {
        let h = RedisHarness::new();
        let b = h.backend().await.unwrap();
        let k = key("renew");
        let (a, x) = (Owner::new("a"), Owner::new("x"));
        let t = granted(&b, &k, &a, Duration::from_secs(10), Claim::shared()).await;
        granted(&b, &k, &x, LONG, Claim::shared()).await;
        let remaining = |all: Vec<lockcore::LockInfo>, label: &str| {
            all.into_iter()
                .find(|l| l.holder == label)
                .and_then(|l| l.remaining_ttl)
                .unwrap()
        };
        match b.extend(&k, &a, Duration::from_secs(20)).await.unwrap() {
            ExtendOutcome::Extended(g) => assert_eq!(g.token, t),
            other => panic!("{other:?}"),
        }
        let left = remaining(b.holders(&k).await.unwrap(), "a");
        assert!(left > Duration::from_secs(19), "{left:?}");
        // Shorter requests keep the longer expiry.
        assert!(matches!(
            b.extend(&k, &a, Duration::from_secs(1)).await.unwrap(),
            ExtendOutcome::Extended(_)
        ));
        assert_eq!(
            granted(&b, &k, &a, Duration::from_secs(1), Claim::shared()).await,
            t
        );
        let left = remaining(b.holders(&k).await.unwrap(), "a");
        assert!(left > Duration::from_secs(19), "{left:?}");

        let stranger = Owner::new("stranger");
        assert_eq!(
            b.extend(&k, &stranger, LONG).await.unwrap(),
            ExtendOutcome::NotHeld
        );
        assert_eq!(release(&b, &k, &stranger).await, ReleaseOutcome::NotHeld);
        assert_eq!(b.holders(&k).await.unwrap().len(), 2);
        assert_eq!(release(&b, &k, &a).await, ReleaseOutcome::Released);
        assert_eq!(
            b.extend(&k, &a, LONG).await.unwrap(),
            ExtendOutcome::NotHeld,
            "extend never creates a lease"
        );
        assert_eq!(b.holders(&k).await.unwrap().len(), 1);
        assert_eq!(release(&b, &k, &x).await, ReleaseOutcome::Released);
        assert_eq!(b.inspect(&k).await.unwrap(), None);
    })
    .await;
}

/// inspect shows the exclusive holder or the newest lease, holders every live lease in
/// grant order with its claim, and neither shows an owner token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspection_lists_leases_without_owner_tokens() {
    bounded(async {
        let h = RedisHarness::new();
        let b = h.backend().await.unwrap();
        let k = key("look");
        let owners: Vec<Owner> = (0..3).map(|i| Owner::new(format!("reader {i}"))).collect();
        let mut tokens = Vec::new();
        for o in &owners {
            tokens.push(granted(&b, &k, o, LONG, Claim::shared()).await);
        }
        let all = b.holders(&k).await.unwrap();
        assert_eq!(all.iter().map(|l| l.token).collect::<Vec<_>>(), tokens);
        for (l, o) in all.iter().zip(&owners) {
            assert_eq!(l.holder, o.label());
            assert_eq!(l.claim, Claim::shared());
            assert!(l.remaining_ttl.unwrap() > Duration::from_secs(29));
        }
        let newest = b.inspect(&k).await.unwrap().unwrap();
        assert_eq!((newest.token, newest.claim), (tokens[2], Claim::shared()));
        let shown = format!("{all:?} {newest:?}");
        for o in &owners {
            assert!(!shown.contains(&o.token().to_hex()), "{shown}");
        }
        for o in &owners {
            release(&b, &k, o).await;
        }
        let w = Owner::new("writer");
        let t = granted(&b, &k, &w, LONG, Claim::exclusive()).await;
        let all = b.holders(&k).await.unwrap();
        assert_eq!(all.len(), 1);
        assert_eq!(
            (all[0].token, all[0].claim, all[0].holder.as_str()),
            (t, Claim::exclusive(), "writer")
        );
        assert_eq!(all[0].claim.capacity(), READ_WRITE_CAPACITY);
        release(&b, &k, &w).await;
        assert!(b.holders(&k).await.unwrap().is_empty());
    })
    .await;
}

/// An expired lease never counts: its permits come back without a release, and its owner
/// can no longer release or extend it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_leases_do_not_count() {
    bounded(async {
        let h = RedisHarness::new();
        let b = h.backend().await.unwrap();
        let k = key("expiry");
        let (dead, next) = (Owner::new("dead"), Owner::new("next"));
        granted(&b, &k, &dead, Duration::from_millis(150), sem(2, 2)).await;
        refused(&b, &k, &next, LONG, sem(1, 2)).await;
        b.abandon(&k, &next).await.unwrap();
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert!(b.holders(&k).await.unwrap().is_empty());
        assert_eq!(b.inspect(&k).await.unwrap(), None);
        granted(&b, &k, &next, LONG, sem(2, 2)).await;
        assert_eq!(release(&b, &k, &dead).await, ReleaseOutcome::NotHeld);
        assert_eq!(
            b.extend(&k, &dead, LONG).await.unwrap(),
            ExtendOutcome::NotHeld
        );
        // A dead reader does not keep a writer out either.
        release(&b, &k, &next).await;
        granted(&b, &k, &dead, Duration::from_millis(150), Claim::shared()).await;
        tokio::time::sleep(Duration::from_millis(250)).await;
        granted(&b, &k, &next, LONG, Claim::exclusive()).await;
        release(&b, &k, &next).await;
    })
    .await;
}

/// force_release removes every lease and the reservation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_clears_leases_and_reservation() {
    bounded(async {
        let h = RedisHarness::new();
        let b = h.backend().await.unwrap();
        let k = key("break");
        let (r1, w, r2) = (Owner::new("r1"), Owner::new("w"), Owner::new("r2"));
        granted(&b, &k, &r1, LONG, Claim::shared()).await;
        refused(&b, &k, &w, LONG, Claim::exclusive()).await;
        assert_eq!(b.force_release(&k).await.unwrap(), ReleaseOutcome::Released);
        assert_eq!(b.force_release(&k).await.unwrap(), ReleaseOutcome::NotHeld);
        granted(&b, &k, &r2, LONG, Claim::shared()).await;
        assert_eq!(release(&b, &k, &r1).await, ReleaseOutcome::NotHeld);
        release(&b, &k, &r2).await;
    })
    .await;
}

/// A waiter refused by shared leases is woken by their release, from another client, and
/// does not sleep through a release that came between its refusal and its wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_see_shared_releases() {
    bounded(async {
        let h = RedisHarness::new();
        let (b, other) = (h.backend().await.unwrap(), h.backend().await.unwrap());
        let k = key("wake");
        let (r, w) = (Owner::new("r"), Owner::new("w"));

        // Released by another client while we wait: the release publishes.
        granted(&other, &k, &r, LONG, Claim::shared()).await;
        let held = refused(&b, &k, &w, LONG, Claim::exclusive()).await;
        let releaser = {
            let (other, k, r) = (other.clone(), k.clone(), r.clone());
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(200)).await;
                other.release(&k, &r).await.unwrap()
            })
        };
        let started = Instant::now();
        b.wait_released(&k, &held.hint, u64::MAX, Duration::from_secs(10))
            .await
            .unwrap();
        let waited = started.elapsed();
        assert_eq!(releaser.await.unwrap(), ReleaseOutcome::Released);
        assert!(waited < Duration::from_secs(3), "{waited:?}");
        granted(&b, &k, &w, LONG, Claim::exclusive()).await;
        release(&b, &k, &w).await;

        // Released between the refusal and the wait: the stamp changed, no sleep.
        granted(&other, &k, &r, LONG, Claim::shared()).await;
        let r2 = Owner::new("r2");
        granted(&other, &k, &r2, LONG, Claim::shared()).await;
        let held = refused(&b, &k, &w, LONG, Claim::exclusive()).await;
        assert_eq!(release(&other, &k, &r).await, ReleaseOutcome::Released);
        let started = Instant::now();
        b.wait_released(&k, &held.hint, u64::MAX, Duration::from_secs(10))
            .await
            .unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );

        // Nothing changed: the wait lasts until the bound.
        let held = refused(&b, &k, &w, LONG, Claim::exclusive()).await;
        let started = Instant::now();
        b.wait_released(&k, &held.hint, u64::MAX, Duration::from_millis(300))
            .await
            .unwrap();
        assert!(
            started.elapsed() >= Duration::from_millis(250),
            "{:?}",
            started.elapsed()
        );
        release(&other, &k, &r2).await;
        b.abandon(&k, &w).await.unwrap();

        // A reader held back only by a writer's reservation is woken when the writer gets
        // in (and waits on the writer's lock after that).
        granted(&other, &k, &r, LONG, Claim::shared()).await;
        refused(&b, &k, &w, LONG, Claim::exclusive()).await;
        let r3 = Owner::new("r3");
        release(&other, &k, &r).await;
        let held = refused(&other, &k, &r3, LONG, Claim::shared()).await;
        let writer = {
            let (b, k, w) = (b.clone(), k.clone(), w.clone());
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(200)).await;
                b.try_acquire(&k, &w, LONG).await.unwrap()
            })
        };
        let started = Instant::now();
        other
            .wait_released(&k, &held.hint, u64::MAX, Duration::from_secs(10))
            .await
            .unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
        assert!(matches!(writer.await.unwrap(), AcquireOutcome::Acquired(_)));
        release(&b, &k, &w).await;

        // Nothing left at all: at once.
        let started = Instant::now();
        b.wait_released(
            &k,
            &WaitHint::at_revision(1),
            u64::MAX,
            Duration::from_secs(10),
        )
        .await
        .unwrap();
        assert!(started.elapsed() < Duration::from_secs(1));
    })
    .await;
}

/// Hostile key names keep their shared leases apart, each under its own hash tag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_keys_keep_their_leases_apart() {
    bounded(async {
        let h = RedisHarness::new();
        let b = h.backend().await.unwrap();
        let hostile = [
            "job",
            "job}:leases",
            "job:leases",
            "job}:claims",
            "{job}",
            "}",
            "%7D",
            "*",
            "'\"",
            "a b ",
            "ключ🔒",
        ];
        let owners: Vec<Owner> = hostile
            .iter()
            .map(|k| Owner::new(format!("holder of {k}")))
            .collect();
        for (i, (k, o)) in hostile.iter().zip(&owners).enumerate() {
            granted(&b, &key(k), o, LONG, sem(1, i as u32 + 1)).await;
        }
        let mut r = raw(&h.url).await;
        let stored: Vec<String> = r.keys(format!("{}*", h.prefix)).await.unwrap();
        let tails: HashSet<&str> = stored
            .iter()
            .map(|n| {
                let rest = n.strip_prefix(&h.prefix).unwrap();
                &rest[rest.find('}').unwrap() + 1..]
            })
            .collect();
        assert_eq!(
            tails,
            HashSet::from([":fence", ":leases", ":claims"]),
            "{stored:?}"
        );
        assert_eq!(stored.len(), hostile.len() * 3);
        for (i, (k, o)) in hostile.iter().zip(&owners).enumerate() {
            let all = b.holders(&key(k)).await.unwrap();
            assert_eq!(all.len(), 1, "{k}: {all:?}");
            assert_eq!(all[0].holder, o.label());
            assert_eq!(all[0].claim, sem(1, i as u32 + 1));
        }
        for (i, (k, o)) in hostile.iter().zip(&owners).enumerate() {
            assert_eq!(release(&b, &key(k), o).await, ReleaseOutcome::Released);
            for later in &hostile[i + 1..] {
                assert_eq!(b.holders(&key(later)).await.unwrap().len(), 1);
            }
        }
    })
    .await;
}

/// A release by an owner without a lease removes the reservation it left (a refused
/// attempt whose answer was lost, compensated by a release), and still says NotHeld.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compensating_release_removes_the_reservation() {
    bounded(async {
        let h = RedisHarness::new();
        let b = h.backend().await.unwrap();
        let k = key("compensate");
        let (w, r, next) = (Owner::new("w"), Owner::new("r"), Owner::new("next"));
        granted(&b, &k, &w, LONG, Claim::exclusive()).await;
        refused(&b, &k, &r, LONG, Claim::shared()).await;
        assert_eq!(release(&b, &k, &w).await, ReleaseOutcome::Released);
        // The reader's reservation keeps another writer out ...
        refused(&b, &k, &next, LONG, Claim::exclusive()).await;
        // ... until the reader's release compensates its attempt.
        assert_eq!(release(&b, &k, &r).await, ReleaseOutcome::NotHeld);
        granted(&b, &k, &next, LONG, Claim::exclusive()).await;
        release(&b, &k, &next).await;
    })
    .await;
}

/// A set of exclusive locks in one script (`claim_all`): all granted with a token each
/// (the same tokens again for the same owner), or refused naming the held key with nothing
/// of the set left: the locks granted before it deleted, no writer's reservation keeping
/// readers out. Shared sets go key by key (`None`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sets_in_one_script() {
    bounded(async {
        let h = RedisHarness::new();
        let (a, b) = (h.backend().await.unwrap(), h.backend().await.unwrap());
        let keys = [key("set-1"), key("set-2"), key("set-3")];
        let (first, middle, last) = (&keys[0], &keys[1], &keys[2]);
        let (o, other) = (Owner::new("set"), Owner::new("other"));
        let exclusive = |o| {
            let claims = keys
                .iter()
                .map(move |k| ClaimRequest::exclusive(k, o, LONG));
            claims.collect::<Vec<_>>()
        };
        let Some(SetOutcome::Acquired(grants)) = a.claim_all(&exclusive(&o)).await.unwrap() else {
            panic!("a free set was not granted in one script");
        };
        assert_eq!(grants.len(), 3);
        for (k, g) in keys.iter().zip(&grants) {
            assert_eq!(b.inspect(k).await.unwrap().map(|i| i.token), Some(g.token));
        }
        let again = a.claim_all(&exclusive(&o)).await.unwrap();
        assert_eq!(again, Some(SetOutcome::Acquired(grants.clone())));
        for k in &keys {
            assert_eq!(a.release(k, &o).await.unwrap(), ReleaseOutcome::Released);
        }

        let held = granted(&b, middle, &other, LONG, Claim::exclusive()).await;
        match a.claim_all(&exclusive(&o)).await.unwrap() {
            Some(SetOutcome::Held {
                index: 1,
                contention,
            }) => {
                assert!(
                    contention.remaining_ttl.is_some_and(|t| t <= LONG),
                    "{contention:?}"
                );
            }
            answer => panic!("expected the middle key held: {answer:?}"),
        }
        assert!(
            b.holders(first).await.unwrap().is_empty(),
            "the refused set left its first key held"
        );
        assert!(b.holders(last).await.unwrap().is_empty());
        assert_eq!(
            b.inspect(middle).await.unwrap().map(|i| i.token),
            Some(held)
        );
        assert_eq!(
            b.release(middle, &other).await.unwrap(),
            ReleaseOutcome::Released
        );

        // Behind a reader, the refused set keeps no writer's reservation.
        let reader = Owner::new("reader");
        granted(&b, middle, &reader, LONG, Claim::shared()).await;
        let answer = a.claim_all(&exclusive(&o)).await.unwrap();
        assert!(
            matches!(answer, Some(SetOutcome::Held { index: 1, .. })),
            "{answer:?}"
        );
        granted(
            &b,
            middle,
            &Owner::new("late reader"),
            LONG,
            Claim::shared(),
        )
        .await;
        assert!(b.holders(first).await.unwrap().is_empty());

        let shared: Vec<_> = keys
            .iter()
            .map(|k| ClaimRequest::new(k, &o, LONG, Claim::shared()))
            .collect();
        assert_eq!(
            a.claim_all(&shared).await.unwrap(),
            None,
            "shared sets go key by key"
        );
    })
    .await;
}
