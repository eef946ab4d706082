//! Read-write locks over Redlock on five of the shared test masters: readers share, a
//! writer and readers exclude each other by majority, tokens rise across modes, a refused
//! claim leaves nothing behind, shared leases are extended, released, inspected and waited
//! for; semaphores and unfenced shared claims are refused with a clear error.

mod common;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::RedlockHarness;
use distlock_redlock::RedlockBackend;
use driver_redis::RedisBackend;
use lockcore::driver::{AcquireOutcome, Contention, ExtendOutcome, LockBackendExt};
use lockcore::{Claim, FencingToken, LockBackend, LockError, LockKey, Owner, ReleaseOutcome};

const LIMIT: Duration = Duration::from_secs(60);
const TTL: Duration = Duration::from_secs(10);

async fn bounded<F: Future<Output = ()>>(test: F) {
    tokio::time::timeout(LIMIT, test)
        .await
        .expect("the test did not finish in time");
}

fn key(k: &str) -> LockKey {
    LockKey::new(k).unwrap()
}

async fn granted(b: &RedlockBackend, k: &LockKey, o: &Owner, c: Claim) -> FencingToken {
    match b.try_claim(k, o, TTL, c).await.unwrap() {
        AcquireOutcome::Acquired(g) => g.token,
        other => panic!("{c} by {} was refused: {other:?}", o.label()),
    }
}

async fn refused(b: &RedlockBackend, k: &LockKey, o: &Owner, c: Claim) -> Contention {
    match b.try_claim(k, o, TTL, c).await.unwrap() {
        AcquireOutcome::Held(h) => h,
        other => panic!("{c} by {} was granted: {other:?}", o.label()),
    }
}

/// The single-instance backends of the harness's instances, under its prefix.
async fn singles(h: &RedlockHarness) -> Vec<Arc<RedisBackend>> {
    let mut out = Vec::new();
    for url in &h.urls {
        out.push(
            RedisBackend::builder(url)
                .prefix(&h.prefix)
                .build()
                .await
                .unwrap(),
        );
    }
    out
}

/// Readers share; a writer is refused while they hold and they while it holds; tokens
/// rise in grant order across modes; a re-claim keeps its token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_share_and_exclude_a_writer() {
    bounded(async {
        let h = RedlockHarness::new(5);
        let b = h.builder().build().await.unwrap();
        let k = key("rw");
        let (r1, r2, w) = (Owner::new("r1"), Owner::new("r2"), Owner::new("w"));
        let t1 = granted(&b, &k, &r1, Claim::shared()).await;
        let t2 = granted(&b, &k, &r2, Claim::shared()).await;
        assert!(t2 > t1);
        assert_eq!(granted(&b, &k, &r1, Claim::shared()).await, t1);
        let held = refused(&b, &k, &w, Claim::exclusive()).await;
        assert!(held.remaining_ttl.is_some());
        assert!(matches!(
            b.try_acquire(&k, &w, TTL).await.unwrap(),
            AcquireOutcome::Held(_)
        ));
        assert_eq!(b.release(&k, &r1).await.unwrap(), ReleaseOutcome::Released);
        assert_eq!(b.release(&k, &r2).await.unwrap(), ReleaseOutcome::Released);
        let tw = granted(&b, &k, &w, Claim::exclusive()).await;
        assert!(tw > t2);
        let r3 = Owner::new("r3");
        refused(&b, &k, &r3, Claim::shared()).await;
        b.release(&k, &w).await.unwrap();
        let t3 = granted(&b, &k, &r3, Claim::shared()).await;
        assert!(t3 > tw);
        b.release(&k, &r3).await.unwrap();
    })
    .await;
}

/// Exclusion is by majority: a writer holding three of five instances (planted there
/// directly) keeps a reader out, and the reader's refused attempt leaves nothing on the
/// other two; a writer on two of five does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_majority_decides_and_a_refusal_leaves_nothing() {
    bounded(async {
        let h = RedlockHarness::new(5);
        let b = h.builder().build().await.unwrap();
        let singles = singles(&h).await;
        let k = key("majority");
        let (w, r) = (Owner::new("planted writer"), Owner::new("reader"));
        for s in &singles[..3] {
            assert!(matches!(
                s.try_acquire(&k, &w, TTL).await.unwrap(),
                AcquireOutcome::Acquired(_)
            ));
        }
        refused(&b, &k, &r, Claim::shared()).await;
        b.abandon(&k, &r).await.unwrap();
        for s in &singles[3..] {
            assert!(
                s.holders(&k).await.unwrap().is_empty(),
                "a refused claim was left behind"
            );
        }
        singles[2].release(&k, &w).await.unwrap();
        granted(&b, &k, &r, Claim::shared()).await;
        let all = b.holders(&k).await.unwrap();
        assert_eq!(all.len(), 1, "{all:?}");
        assert_eq!(all[0].holder, "reader");
        b.release(&k, &r).await.unwrap();
        for s in &singles[..2] {
            s.release(&k, &w).await.unwrap();
        }
    })
    .await;
}

/// Shared leases are extended and released by their owner only, and inspected without
/// owner tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_leases_extend_release_and_inspect() {
    bounded(async {
        let h = RedlockHarness::new(5);
        let b = h.builder().build().await.unwrap();
        let k = key("leases");
        let (a, x) = (Owner::new("reader a"), Owner::new("reader x"));
        let ta = granted(&b, &k, &a, Claim::shared()).await;
        let tx = granted(&b, &k, &x, Claim::shared()).await;
        match b.extend(&k, &a, TTL * 2).await.unwrap() {
            ExtendOutcome::Extended(g) => assert_eq!(g.token, ta),
            other => panic!("{other:?}"),
        }
        let stranger = Owner::new("stranger");
        assert_eq!(
            b.extend(&k, &stranger, TTL).await.unwrap(),
            ExtendOutcome::NotHeld
        );
        assert_eq!(
            b.release(&k, &stranger).await.unwrap(),
            ReleaseOutcome::NotHeld
        );
        let all = b.holders(&k).await.unwrap();
        assert_eq!(
            all.iter().map(|l| l.token).collect::<Vec<_>>(),
            vec![ta, tx]
        );
        assert!(all.iter().all(|l| l.claim == Claim::shared()));
        assert!(all[0].remaining_ttl.unwrap() > TTL);
        let shown = format!("{all:?}");
        assert!(!shown.contains(&a.token().to_hex()) && !shown.contains(&x.token().to_hex()));
        let newest = b.inspect(&k).await.unwrap().unwrap();
        assert_eq!(newest.token, tx);
        assert_eq!(b.release(&k, &a).await.unwrap(), ReleaseOutcome::Released);
        assert_eq!(
            b.extend(&k, &a, TTL).await.unwrap(),
            ExtendOutcome::NotHeld,
            "extend never creates a lease"
        );
        assert_eq!(b.release(&k, &x).await.unwrap(), ReleaseOutcome::Released);
        assert!(b.holders(&k).await.unwrap().is_empty());
        assert_eq!(b.inspect(&k).await.unwrap(), None);
    })
    .await;
}

/// A writer refused by readers reserves the key on the instances: new readers wait behind
/// it until it gets in or gives up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_writer_holds_back_new_readers() {
    bounded(async {
        let h = RedlockHarness::new(5);
        let b = h.builder().build().await.unwrap();
        let k = key("starve");
        let (r1, r2, w) = (Owner::new("r1"), Owner::new("r2"), Owner::new("w"));
        granted(&b, &k, &r1, Claim::shared()).await;
        refused(&b, &k, &w, Claim::exclusive()).await;
        refused(&b, &k, &r2, Claim::shared()).await;
        b.abandon(&k, &r2).await.unwrap();
        b.release(&k, &r1).await.unwrap();
        granted(&b, &k, &w, Claim::exclusive()).await;
        b.release(&k, &w).await.unwrap();

        granted(&b, &k, &r1, Claim::shared()).await;
        refused(&b, &k, &w, Claim::exclusive()).await;
        b.abandon(&k, &w).await.unwrap();
        granted(&b, &k, &r2, Claim::shared()).await;
        b.release(&k, &r1).await.unwrap();
        b.release(&k, &r2).await.unwrap();
    })
    .await;
}

/// A writer waiting for readers is woken by their release from another client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_writer_is_woken_by_the_readers_release() {
    bounded(async {
        let h = RedlockHarness::new(5);
        let (b, other) = (
            h.builder().build().await.unwrap(),
            h.builder().build().await.unwrap(),
        );
        let k = key("wake");
        let (r, w) = (Owner::new("r"), Owner::new("w"));
        granted(&other, &k, &r, Claim::shared()).await;
        let held = refused(&b, &k, &w, Claim::exclusive()).await;
        assert!(held.hint.revision().is_some());
        let releaser = {
            let (other, k, r) = (other.clone(), k.clone(), r.clone());
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                other.release(&k, &r).await.unwrap()
            })
        };
        let started = Instant::now();
        b.wait_released(&k, &held.hint, u64::MAX, Duration::from_secs(8))
            .await
            .unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(releaser.await.unwrap(), ReleaseOutcome::Released);
        granted(&b, &k, &w, Claim::exclusive()).await;
        b.release(&k, &w).await.unwrap();
    })
    .await;
}

/// Semaphores are refused (a plain majority would be unsafe for them), and so are shared
/// claims without fencing; a key held as a semaphore on the instances is a capacity
/// mismatch for a reader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphores_and_unfenced_claims_are_refused_clearly() {
    bounded(async {
        let h = RedlockHarness::new(5);
        let b = h.builder().build().await.unwrap();
        assert!(b.capabilities().shared && !b.capabilities().semaphores);
        let k = key("sem");
        let o = Owner::new("o");
        let e = b
            .try_claim(&k, &o, TTL, Claim::permits(1, 2).unwrap())
            .await
            .unwrap_err();
        assert!(
            matches!(e, LockError::Config { .. }) && e.to_string().contains("semaphores"),
            "{e}"
        );
        let unfenced = RedlockHarness::unfenced(5).builder().build().await.unwrap();
        assert!(!unfenced.capabilities().shared);
        let e = unfenced
            .try_claim(&k, &o, TTL, Claim::shared())
            .await
            .unwrap_err();
        assert!(matches!(e, LockError::Config { .. }), "{e}");

        let singles = singles(&h).await;
        let holder = Owner::new("semaphore holder");
        for s in &singles {
            assert!(matches!(
                s.try_claim(&k, &holder, TTL, Claim::permits(1, 4).unwrap())
                    .await
                    .unwrap(),
                AcquireOutcome::Acquired(_)
            ));
        }
        let e = b.try_claim(&k, &o, TTL, Claim::shared()).await.unwrap_err();
        let text = e.to_string();
        assert!(
            matches!(e, LockError::Config { .. }) && text.contains("semaphore of 4"),
            "{text}"
        );
        for s in &singles {
            s.release(&k, &holder).await.unwrap();
        }
    })
    .await;
}

/// A reader that gives up waiting behind a writer leaves no reservation that would keep
/// the next writer out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_gives_up_leaves_no_reservation() {
    bounded(async {
        let h = RedlockHarness::new(5);
        let (a, b) = (
            lockcore::LockClient::new(h.builder().build().await.unwrap()),
            lockcore::LockClient::new(h.builder().build().await.unwrap()),
        );
        let ttl = Duration::from_secs(1);
        let writer = a.lock("gives-up").ttl(ttl * 20).acquire().await.unwrap();
        let mut claim = Box::pin(
            b.lock("gives-up")
                .shared()
                .ttl(ttl * 60)
                .wait(ttl * 60)
                .acquire(),
        );
        tokio::select! {
            r = &mut claim => panic!("a reader got in past a writer: {:?}", r.map(|g| g.token())),
            _ = tokio::time::sleep(ttl) => {}
        }
        drop(claim);
        writer.release().await.unwrap();
        let next = lockcore::LockClient::new(h.builder().build().await.unwrap());
        let started = Instant::now();
        let g = next
            .lock("gives-up")
            .ttl(ttl * 10)
            .wait(ttl * 5)
            .acquire()
            .await
            .unwrap();
        assert!(started.elapsed() < ttl * 4, "{:?}", started.elapsed());
        g.release().await.unwrap();
    })
    .await;
}
