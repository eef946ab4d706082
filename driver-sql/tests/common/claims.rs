//! Shared claims (read-write locks, semaphores) through the backend trait, on two backends
//! of one database: what every database's test file runs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockcore::driver::{
    AcquireOutcome, ClaimRequest, Contention, ExtendOutcome, LockBackendExt, SetOutcome,
};
use lockcore::{
    Claim, ClaimMode, FencingToken, LockBackend, LockError, LockKey, Owner, ReleaseOutcome,
};

use super::key;

const LONG: Duration = Duration::from_secs(20);

fn granted(o: AcquireOutcome) -> FencingToken {
    match o {
        AcquireOutcome::Acquired(g) => g.token,
        AcquireOutcome::Held(c) => panic!("expected a grant, got contention {c:?}"),
    }
}

fn refused(o: AcquireOutcome) -> Contention {
    match o {
        AcquireOutcome::Held(c) => c,
        AcquireOutcome::Acquired(g) => panic!("expected contention, got a grant {g:?}"),
    }
}

async fn claim(
    b: &dyn LockBackend,
    k: &LockKey,
    o: &Owner,
    ttl: Duration,
    c: Claim,
) -> AcquireOutcome {
    b.try_claim(k, o, ttl, c).await.unwrap()
}

async fn released(b: &dyn LockBackend, k: &LockKey, o: &Owner) {
    assert_eq!(b.release(k, o).await.unwrap(), ReleaseOutcome::Released);
}

/// Readers share, a writer waits for every reader and excludes them, tokens increase in
/// grant order across modes, same-owner claims get their token again, holders lists
/// the leases in grant order without owner tokens.
pub async fn readers_and_writers(a: Arc<dyn LockBackend>, b: Arc<dyn LockBackend>) {
    let k = key("rw");
    let (r1, r2, w) = (
        Owner::new("reader-1"),
        Owner::new("reader-2"),
        Owner::new("writer"),
    );
    let t0 = granted(claim(&*a, &k, &w, LONG, Claim::exclusive()).await);
    // A reader behind a writer is refused, with the writer's TTL.
    let c = refused(claim(&*b, &k, &r1, LONG, Claim::shared()).await);
    assert!(
        c.remaining_ttl.is_some_and(|r| r > Duration::from_secs(15)),
        "{c:?}"
    );
    b.abandon(&k, &r1).await.unwrap();
    released(&*a, &k, &w).await;

    let t1 = granted(claim(&*a, &k, &r1, LONG, Claim::shared()).await);
    let t2 = granted(claim(&*b, &k, &r2, Duration::from_secs(10), Claim::shared()).await);
    assert!(t0 < t1 && t1 < t2, "{t0} {t1} {t2}");
    // Same owner again, whatever it asks: the same token, never shortened.
    assert_eq!(
        granted(claim(&*b, &k, &r1, Duration::from_millis(1), Claim::shared()).await),
        t1
    );
    assert_eq!(
        granted(
            b.try_acquire(&k, &r2, Duration::from_millis(1))
                .await
                .unwrap()
        ),
        t2
    );
    let all = b.holders(&k).await.unwrap();
    let shown: Vec<_> = all
        .iter()
        .map(|i| (i.holder.as_str(), i.token, i.claim))
        .collect();
    assert_eq!(
        shown,
        [
            ("reader-1", t1, Claim::shared()),
            ("reader-2", t2, Claim::shared())
        ]
    );
    assert!(
        all[0].remaining_ttl.unwrap() > Duration::from_secs(15),
        "{all:?}"
    );
    assert!(
        all[1].remaining_ttl.unwrap() > Duration::from_secs(8),
        "{all:?}"
    );
    let text = format!("{all:?}");
    for o in [&r1, &r2] {
        let hex: String = o
            .token()
            .as_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert!(!text.contains(&hex), "owner token shown: {text}");
    }
    let newest = a.inspect(&k).await.unwrap().expect("held");
    assert_eq!((newest.holder.as_str(), newest.token), ("reader-2", t2));
    assert_eq!(newest.claim.mode(), ClaimMode::Shared);

    // A writer waits for every reader: the soonest reader's TTL, both ways of asking.
    let c = refused(a.try_acquire(&k, &w, LONG).await.unwrap());
    let left = c.remaining_ttl.expect("a reader's TTL");
    assert!(
        left <= Duration::from_secs(10) && left > Duration::from_secs(8),
        "{left:?}"
    );
    refused(claim(&*b, &k, &w, LONG, Claim::exclusive()).await);
    released(&*b, &k, &r1).await;
    assert_eq!(a.release(&k, &r1).await.unwrap(), ReleaseOutcome::NotHeld);
    refused(a.try_acquire(&k, &w, LONG).await.unwrap());
    released(&*a, &k, &r2).await;
    let t3 = granted(a.try_acquire(&k, &w, LONG).await.unwrap());
    assert!(t3 > t2);
    let info = b.holders(&k).await.unwrap();
    assert_eq!(info.len(), 1);
    assert_eq!(
        (info[0].holder.as_str(), info[0].claim),
        ("writer", Claim::exclusive())
    );
    // The writer's own shared claim: its lock again.
    assert_eq!(granted(claim(&*b, &k, &w, LONG, Claim::shared()).await), t3);
    refused(claim(&*b, &k, &r1, LONG, Claim::shared()).await);
    b.abandon(&k, &r1).await.unwrap();
    released(&*b, &k, &w).await;
    assert!(a.holders(&k).await.unwrap().is_empty());
    assert!(a.inspect(&k).await.unwrap().is_none());
}

/// Release and extend find a lease whatever its mode; extend never shortens nor creates.
pub async fn leases_release_and_extend(a: Arc<dyn LockBackend>, b: Arc<dyn LockBackend>) {
    let k = key("lease-ops");
    let (r, other) = (Owner::new("reader"), Owner::new("other"));
    let t = granted(claim(&*a, &k, &r, Duration::from_secs(5), Claim::shared()).await);
    granted(claim(&*a, &k, &other, Duration::from_secs(5), Claim::shared()).await);
    match b.extend(&k, &r, LONG).await.unwrap() {
        ExtendOutcome::Extended(g) => assert_eq!(g.token, t),
        e => panic!("{e:?}"),
    }
    match b.extend(&k, &r, Duration::from_millis(5)).await.unwrap() {
        ExtendOutcome::Extended(g) => assert_eq!(g.token, t),
        e => panic!("{e:?}"),
    }
    let mine = |all: Vec<lockcore::LockInfo>| {
        all.into_iter()
            .find(|i| i.token == t)
            .and_then(|i| i.remaining_ttl)
    };
    let left = mine(a.holders(&k).await.unwrap()).expect("still held");
    assert!(left > Duration::from_secs(15), "{left:?}");
    let stranger = Owner::new("stranger");
    assert_eq!(
        b.extend(&k, &stranger, LONG).await.unwrap(),
        ExtendOutcome::NotHeld
    );
    assert_eq!(
        b.release(&k, &stranger).await.unwrap(),
        ReleaseOutcome::NotHeld
    );
    released(&*b, &k, &r).await;
    assert_eq!(b.release(&k, &r).await.unwrap(), ReleaseOutcome::NotHeld);
    assert_eq!(
        b.extend(&k, &r, LONG).await.unwrap(),
        ExtendOutcome::NotHeld
    );
    assert_eq!(a.holders(&k).await.unwrap().len(), 1);
    released(&*a, &k, &other).await;
    assert_eq!(
        a.extend(&k, &other, LONG).await.unwrap(),
        ExtendOutcome::NotHeld
    );
    // force_release frees every lease.
    granted(claim(&*a, &k, &r, LONG, Claim::shared()).await);
    granted(claim(&*a, &k, &other, LONG, Claim::shared()).await);
    assert_eq!(b.force_release(&k).await.unwrap(), ReleaseOutcome::Released);
    assert!(b.holders(&k).await.unwrap().is_empty());
    assert_eq!(a.release(&k, &r).await.unwrap(), ReleaseOutcome::NotHeld);
    granted(a.try_acquire(&k, &stranger, LONG).await.unwrap());
    released(&*a, &k, &stranger).await;
}

/// A claim of another capacity is refused with the error naming both, from try_claim and
/// try_acquire; a free key takes any capacity.
pub async fn capacity_mismatch(a: Arc<dyn LockBackend>, b: Arc<dyn LockBackend>) {
    let k = key("mismatch");
    let (x, y) = (Owner::new("x"), Owner::new("y"));
    let eight = Claim::permits(1, 8).unwrap();
    granted(claim(&*a, &k, &x, LONG, eight).await);
    let text = |e: LockError| {
        assert!(matches!(e, LockError::Config { .. }), "{e:?}");
        e.to_string()
    };
    let four = Claim::permits(1, 4).unwrap();
    let e = text(b.try_claim(&k, &y, LONG, four).await.unwrap_err());
    assert!(
        e.contains("semaphore of 8") && e.contains("semaphore of 4"),
        "{e}"
    );
    let e = text(b.try_acquire(&k, &y, LONG).await.unwrap_err());
    assert!(
        e.contains("semaphore of 8") && e.contains("exclusive lock"),
        "{e}"
    );
    let e = text(
        b.try_claim(&k, &y, LONG, Claim::shared())
            .await
            .unwrap_err(),
    );
    assert!(e.contains("semaphore of 8") && e.contains("shared"), "{e}");
    released(&*a, &k, &x).await;
    // Free: a semaphore of 4 takes it now, and an exclusive lock is then the mismatch.
    granted(claim(&*b, &k, &y, LONG, four).await);
    let e = text(a.try_acquire(&k, &x, LONG).await.unwrap_err());
    assert!(e.contains("semaphore of 4"), "{e}");
    // Its holder too: another kind of claim is refused, not its permits renewed (the
    // permits are the key's one lease, inline in its row on PostgreSQL and MySQL).
    let e = text(b.try_acquire(&k, &y, LONG).await.unwrap_err());
    assert!(e.contains("semaphore of 4"), "{e}");
    let e = text(a.try_claim(&k, &y, LONG, eight).await.unwrap_err());
    assert!(e.contains("semaphore of 4"), "{e}");
    released(&*b, &k, &y).await;
    granted(a.try_acquire(&k, &x, LONG).await.unwrap());
    let e = text(b.try_claim(&k, &y, LONG, four).await.unwrap_err());
    assert!(e.contains("exclusive or read-write"), "{e}");
    released(&*a, &k, &x).await;
}

/// A refused heavy claim reserves: lighter claims of others are held back, its owner is
/// not; abandon removes the reservation; an abandoned waiter's reservation expires.
pub async fn reservations(a: Arc<dyn LockBackend>, b: Arc<dyn LockBackend>) {
    let k = key("reserve");
    let (r1, r2, w, w2) = (
        Owner::new("r1"),
        Owner::new("r2"),
        Owner::new("writer"),
        Owner::new("writer-2"),
    );
    granted(claim(&*a, &k, &r1, LONG, Claim::shared()).await);
    // The writer is refused and reserves (the refusal says so, for the client to take it
    // back if it gives up); a later reader is held back by the reservation, and keeps none.
    let c = refused(b.try_acquire(&k, &w, LONG).await.unwrap());
    assert_eq!(c.hint.reservation(), Some(true), "the writer's: {c:?}");
    let c = refused(claim(&*a, &k, &r2, LONG, Claim::shared()).await);
    assert!(
        c.hint.is_behind_reservation() && c.hint.retry_delay().is_none(),
        "held back by the reservation: {c:?}"
    );
    assert_eq!(c.hint.reservation(), Some(false), "{c:?}");
    // Another writer does not take the reservation over, nor the key once free.
    let c = refused(b.try_acquire(&k, &w2, LONG).await.unwrap());
    assert_eq!(c.hint.reservation(), Some(false), "{c:?}");
    released(&*a, &k, &r1).await;
    refused(b.try_acquire(&k, &w2, LONG).await.unwrap());
    refused(claim(&*a, &k, &r2, LONG, Claim::shared()).await);
    // The reserving writer gets it, which clears its reservation.
    granted(b.try_acquire(&k, &w, LONG).await.unwrap());
    released(&*b, &k, &w).await;
    granted(claim(&*a, &k, &r2, LONG, Claim::shared()).await);

    // Abandoned: the reservation goes at once.
    refused(b.try_acquire(&k, &w, LONG).await.unwrap());
    refused(claim(&*a, &k, &r1, LONG, Claim::shared()).await);
    b.abandon(&k, &w).await.unwrap();
    granted(claim(&*a, &k, &r1, LONG, Claim::shared()).await);

    // Expired: a vanished writer's reservation lasts its TTL only.
    refused(
        b.try_acquire(&k, &w2, Duration::from_millis(300))
            .await
            .unwrap(),
    );
    let r3 = Owner::new("r3");
    refused(claim(&*a, &k, &r3, LONG, Claim::shared()).await);
    tokio::time::sleep(Duration::from_millis(400)).await;
    granted(claim(&*a, &k, &r3, LONG, Claim::shared()).await);
    assert_eq!(b.force_release(&k).await.unwrap(), ReleaseOutcome::Released);

    // A semaphore: a 3-permit claim behind 1-permit ones reserves its permits.
    let s = key("reserve-sem");
    let one = Claim::permits(1, 4).unwrap();
    let three = Claim::permits(3, 4).unwrap();
    granted(claim(&*a, &s, &r1, LONG, one).await);
    granted(claim(&*a, &s, &r2, LONG, one).await);
    let c = refused(claim(&*b, &s, &w, LONG, three).await);
    assert_eq!(c.hint.reservation(), Some(true), "{c:?}");
    // Refused again: its reservation is still kept (refreshed).
    let c = refused(claim(&*b, &s, &w, LONG, three).await);
    assert_eq!(c.hint.reservation(), Some(true), "{c:?}");
    // 2 used + 1 asked + 3 reserved > 4.
    let c = refused(claim(&*a, &s, &r3, LONG, one).await);
    assert_eq!(c.hint.reservation(), Some(false), "{c:?}");
    released(&*a, &s, &r1).await;
    granted(claim(&*b, &s, &w, LONG, three).await);
    assert_eq!(b.force_release(&s).await.unwrap(), ReleaseOutcome::Released);
}

/// Expired leases never count: a dead holder's permits come back after its TTL.
pub async fn expired_leases_do_not_count(a: Arc<dyn LockBackend>, b: Arc<dyn LockBackend>) {
    let k = key("expired");
    let two = Claim::permits(2, 2).unwrap();
    let (dead, next) = (Owner::new("dead"), Owner::new("next"));
    let t1 = granted(claim(&*a, &k, &dead, Duration::from_millis(150), two).await);
    let c = refused(claim(&*b, &k, &next, LONG, Claim::permits(1, 2).unwrap()).await);
    assert!(
        c.remaining_ttl
            .is_some_and(|r| r <= Duration::from_millis(150)),
        "{c:?}"
    );
    b.abandon(&k, &next).await.unwrap();
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert!(a.holders(&k).await.unwrap().is_empty());
    let t2 = granted(claim(&*b, &k, &next, LONG, two).await);
    assert!(t2 > t1);
    assert_eq!(a.release(&k, &dead).await.unwrap(), ReleaseOutcome::NotHeld);
    assert_eq!(
        a.extend(&k, &dead, LONG).await.unwrap(),
        ExtendOutcome::NotHeld
    );
    // An exclusive lock takes the key once the last lease expired.
    released(&*b, &k, &next).await;
    let r = Owner::new("reader");
    granted(claim(&*a, &k, &r, Duration::from_millis(100), Claim::shared()).await);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t3 = granted(b.try_acquire(&k, &next, LONG).await.unwrap());
    assert!(t3 > t2);
    released(&*b, &k, &next).await;
}

/// Many clients on a semaphore of `n`: never more than `n` permits out at once, and every
/// claimant gets through (waiting with `wait_released`).
pub async fn semaphore_never_exceeds(backends: Vec<Arc<dyn LockBackend>>, n: u32, tasks: usize) {
    let k = key("sem");
    let out = Arc::new(AtomicU64::new(0));
    let most = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut handles = Vec::new();
    for i in 0..tasks {
        let b = backends[i % backends.len()].clone();
        let (k, out, most) = (k.clone(), out.clone(), most.clone());
        let permits = 1 + (i as u32 % 2).min(n - 1);
        let c = Claim::permits(permits, n).unwrap();
        handles.push(tokio::spawn(async move {
            let owner = Owner::new(format!("task-{i}"));
            for _ in 0..3 {
                loop {
                    assert!(Instant::now() < deadline, "task {i} starved");
                    match b
                        .try_claim(&k, &owner, Duration::from_secs(10), c)
                        .await
                        .unwrap()
                    {
                        AcquireOutcome::Acquired(_) => break,
                        AcquireOutcome::Held(h) => {
                            if let Some(pause) = h.hint.retry_delay() {
                                tokio::time::sleep(pause).await;
                            } else {
                                b.wait_released(&k, &h.hint, u64::MAX, Duration::from_millis(200))
                                    .await
                                    .unwrap();
                            }
                        }
                    }
                }
                let now = out.fetch_add(u64::from(permits), Ordering::SeqCst) + u64::from(permits);
                most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(3)).await;
                out.fetch_sub(u64::from(permits), Ordering::SeqCst);
                assert_eq!(
                    b.release(&k, &owner).await.unwrap(),
                    ReleaseOutcome::Released
                );
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    let most = most.load(Ordering::SeqCst);
    assert!(most <= u64::from(n), "{most} permits out of {n}");
    assert!(most >= 2, "the semaphore never shared: {most}");
}

/// A waiter refused by a shared key returns at once when a lease was released before it
/// began waiting (its hint's revision is behind), and is woken by a release while waiting.
pub async fn waiters_see_lease_releases(a: Arc<dyn LockBackend>, b: Arc<dyn LockBackend>) {
    let k = key("wake");
    let one = Claim::permits(1, 2).unwrap();
    let (h1, h2, w) = (Owner::new("h1"), Owner::new("h2"), Owner::new("waiter"));
    granted(claim(&*a, &k, &h1, LONG, one).await);
    granted(claim(&*a, &k, &h2, LONG, one).await);
    let c = refused(claim(&*b, &k, &w, LONG, one).await);
    assert!(c.hint.revision().is_some(), "{c:?}");
    released(&*a, &k, &h1).await;
    let started = Instant::now();
    b.wait_released(&k, &c.hint, u64::MAX, Duration::from_secs(10))
        .await
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    granted(claim(&*b, &k, &w, LONG, one).await);
    // Full again: a waiter on the other backend is woken by a release.
    let late = Owner::new("late");
    let c = refused(claim(&*b, &k, &late, LONG, one).await);
    let waiter = {
        let (b, k, hint) = (b.clone(), k.clone(), c.hint.clone());
        tokio::spawn(async move {
            let started = Instant::now();
            b.wait_released(&k, &hint, u64::MAX, Duration::from_secs(15))
                .await
                .unwrap();
            started.elapsed()
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    released(&*a, &k, &h2).await;
    let waited = waiter.await.unwrap();
    assert!(waited < Duration::from_secs(3), "{waited:?}");
    granted(claim(&*b, &k, &late, LONG, one).await);
    assert_eq!(a.force_release(&k).await.unwrap(), ReleaseOutcome::Released);
}

/// A set in one request (`claim_all`), on every SQL database: all granted with a token
/// each, or refused naming the held key with nothing of the set left (the keys before it
/// free, no reservation of the claimant's keeping readers out).
pub async fn sets_in_one_transaction(a: Arc<dyn LockBackend>, b: Arc<dyn LockBackend>) {
    let mut keys = [key("set-1"), key("set-2"), key("set-3")];
    keys.sort();
    let (first, middle, last) = (&keys[0], &keys[1], &keys[2]);
    let (o, other) = (Owner::new("set"), Owner::new("other"));
    let exclusive = |o| {
        let claims = keys
            .iter()
            .map(move |k| ClaimRequest::exclusive(k, o, LONG));
        claims.collect::<Vec<_>>()
    };
    let Some(answer) = a.claim_all(&exclusive(&o)).await.unwrap() else {
        panic!("{} takes no set in one request", a.name());
    };
    let SetOutcome::Acquired(grants) = answer else {
        panic!("a free set was refused: {answer:?}");
    };
    assert_eq!(grants.len(), 3);
    for (k, g) in keys.iter().zip(&grants) {
        assert_eq!(b.inspect(k).await.unwrap().map(|i| i.token), Some(g.token));
    }
    // The same owner again: the same tokens.
    let again = a.claim_all(&exclusive(&o)).await.unwrap();
    assert_eq!(again, Some(SetOutcome::Acquired(grants.clone())));
    for k in &keys {
        released(&*a, k, &o).await;
    }

    // The middle key held by another: refused at it, and the first key not left held.
    let held = granted(claim(&*b, middle, &other, LONG, Claim::exclusive()).await);
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
    released(&*b, middle, &other).await;

    // Behind a reader, a refused exclusive set keeps no writer's reservation: another
    // reader still gets in.
    let reader = Owner::new("reader");
    granted(claim(&*b, middle, &reader, LONG, Claim::shared()).await);
    let answer = a.claim_all(&exclusive(&o)).await.unwrap();
    assert!(
        matches!(answer, Some(SetOutcome::Held { index: 1, .. })),
        "{answer:?}"
    );
    let late = Owner::new("late reader");
    granted(claim(&*b, middle, &late, LONG, Claim::shared()).await);
    assert!(b.holders(first).await.unwrap().is_empty());

    // A shared set next to those readers: granted as leases, released as leases.
    let shared: Vec<_> = keys
        .iter()
        .map(|k| ClaimRequest::new(k, &o, LONG, Claim::shared()))
        .collect();
    let answer = a.claim_all(&shared).await.unwrap();
    assert!(
        matches!(&answer, Some(SetOutcome::Acquired(g)) if g.len() == 3),
        "{answer:?}"
    );
    assert_eq!(b.holders(middle).await.unwrap().len(), 3);
    for k in &keys {
        released(&*a, k, &o).await;
    }
    released(&*b, middle, &reader).await;
    released(&*b, middle, &late).await;
}

/// One test per shared-claim scenario, each within a minute, on the two backends (and
/// whatever must live as long as they do) that `$two` resolves to.
#[macro_export]
macro_rules! claim_tests {
    ($two:expr) => {
        mod shared_claims {
            use super::*;

            async fn within(check: impl std::future::Future<Output = ()>) {
                tokio::time::timeout(std::time::Duration::from_secs(60), check)
                    .await
                    .unwrap()
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn readers_and_writers() {
                let (a, b, _keep) = $two.await;
                within(common::claims::readers_and_writers(a, b)).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn leases_release_and_extend() {
                let (a, b, _keep) = $two.await;
                within(common::claims::leases_release_and_extend(a, b)).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn capacity_mismatch() {
                let (a, b, _keep) = $two.await;
                within(common::claims::capacity_mismatch(a, b)).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn reservations() {
                let (a, b, _keep) = $two.await;
                within(common::claims::reservations(a, b)).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn expired_leases_do_not_count() {
                let (a, b, _keep) = $two.await;
                within(common::claims::expired_leases_do_not_count(a, b)).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn semaphore_never_exceeds() {
                let (a, b, _keep) = $two.await;
                within(common::claims::semaphore_never_exceeds(vec![a, b], 3, 12)).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn sets_in_one_transaction() {
                let (a, b, _keep) = $two.await;
                within(common::claims::sets_in_one_transaction(a, b)).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn waiters_see_lease_releases() {
                let (a, b, _keep) = $two.await;
                within(common::claims::waiters_see_lease_releases(a, b)).await;
            }
        }
    };
}

/// A key whose last lease was inline in its row, then taken by an exclusive grant that left
/// the lease columns as they were (`old_grant`: such a grant, by hand, for a holder labelled
/// "old writer", as the exclusive statement leaves the columns): the row is that
/// holder's exclusive lock, never taken for a lease, so readers stay out.
pub async fn stale_inline_lease_is_no_lease<F, Fut>(b: Arc<dyn LockBackend>, old_grant: F)
where
    F: FnOnce(LockKey) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let k = key("stale-inline");
    let r = Owner::new("reader");
    let t = granted(claim(&*b, &k, &r, LONG, Claim::shared()).await);
    released(&*b, &k, &r).await;
    old_grant(k.clone()).await;
    let c = refused(claim(&*b, &k, &Owner::new("late"), LONG, Claim::shared()).await);
    assert!(
        c.remaining_ttl.is_some_and(|r| r > Duration::from_secs(5)),
        "{c:?}"
    );
    let shown = b.holders(&k).await.unwrap();
    assert_eq!(shown.len(), 1, "{shown:?}");
    assert_eq!(shown[0].holder, "old writer");
    assert!(
        shown[0].claim.is_exclusive() && shown[0].token > t,
        "{shown:?}"
    );
}
