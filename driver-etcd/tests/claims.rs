//! Shared claims and semaphore permits on the real etcd, through the `LockBackend`
//! operations themselves, on one member (`DISTLOCK_TEST_ETCD_URL`) and the three-member
//! cluster (`DISTLOCK_TEST_ETCD_CLUSTER_URL`): readers share, writers exclude, FIFO order
//! across modes, semaphores and capacity mismatches, waiters woken only when they fit.

#[macro_use]
mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{random_namespace, url_from_env, TTL};
use distlock_etcd::etcd_client::{Client, GetOptions};
use distlock_etcd::{EtcdBackend, EtcdConfig};
use lockcore::driver::{
    AcquireOutcome, ClaimRequest, Contention, ExtendOutcome, LockBackendExt, SetOutcome,
};
use lockcore::{
    Claim, ClaimMode, FencingToken, LockBackend, LockClient, LockError, LockKey, Owner,
    ReleaseOutcome,
};

fn config(var: &str) -> EtcdConfig {
    EtcdConfig::parse(&url_from_env(var))
        .unwrap()
        .with_namespace(&random_namespace())
        .unwrap()
}

fn bounded<F: std::future::Future<Output = ()>>(limit: Duration, body: F) {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            tokio::time::timeout(limit, body).await.expect("timed out");
        });
}

fn key() -> LockKey {
    LockKey::new("k").unwrap()
}

fn permits(k: u32, n: u32) -> Claim {
    Claim::permits(k, n).unwrap()
}

/// One contender: a backend of its own (as a separate process would have) and an owner.
struct Who {
    backend: Arc<EtcdBackend>,
    owner: Owner,
}

impl Who {
    fn new(cfg: &EtcdConfig, label: &str) -> Self {
        Who {
            backend: EtcdBackend::new(cfg.clone()).unwrap(),
            owner: Owner::new(label),
        }
    }

    async fn claim(&self, claim: Claim) -> Result<AcquireOutcome, LockError> {
        let k = key();
        self.backend
            .claim(&ClaimRequest::new(&k, &self.owner, TTL, claim))
            .await
    }

    async fn granted(&self, claim: Claim) -> FencingToken {
        match self.claim(claim).await.unwrap() {
            AcquireOutcome::Acquired(g) => g.token,
            AcquireOutcome::Held(_) => panic!("{} was refused {claim}", self.owner.label()),
        }
    }

    async fn refused(&self, claim: Claim) -> Contention {
        match self.claim(claim).await.unwrap() {
            AcquireOutcome::Held(c) => c,
            AcquireOutcome::Acquired(g) => panic!(
                "{} was granted {claim} (token {})",
                self.owner.label(),
                g.token
            ),
        }
    }

    /// A task waiting for a release after `refused`, answering when it woke.
    fn waiter(&self, refused: Contention) -> tokio::task::JoinHandle<Instant> {
        let backend = self.backend.clone();
        tokio::spawn(async move {
            backend
                .wait_released(&key(), &refused.hint, u64::MAX, Duration::from_secs(20))
                .await
                .unwrap();
            Instant::now()
        })
    }

    async fn release(&self) -> ReleaseOutcome {
        self.backend.release(&key(), &self.owner).await.unwrap()
    }

    async fn extend(&self) -> ExtendOutcome {
        self.backend.extend(&key(), &self.owner, TTL).await.unwrap()
    }
}

/// Contenders named by `labels`.
fn whos<const N: usize>(cfg: &EtcdConfig, labels: [&str; N]) -> [Who; N] {
    labels.map(|label| Who::new(cfg, label))
}

/// How many places `key`'s queue holds, waiting or not.
async fn places(cfg: &EtcdConfig) -> usize {
    let mut raw = Client::connect(cfg.endpoints.clone(), None).await.unwrap();
    let prefix = EtcdBackend::new(cfg.clone()).unwrap().etcd_key(&key());
    let r = raw
        .get(
            prefix,
            Some(GetOptions::new().with_prefix().with_count_only()),
        )
        .await
        .unwrap();
    usize::try_from(r.count()).unwrap()
}

/// Readers share, a writer waits for them, a reader arriving behind a waiting writer waits
/// for it (FIFO: no writer starvation), and the holders are listed in grant order.
fn readers_share_writers_exclude(var: &str) {
    bounded(Duration::from_secs(60), async {
        let cfg = config(var);
        let [r1, r2, r3] = whos(&cfg, ["r1", "r2", "r3"]);
        let w = Who::new(&cfg, "w");
        let t1 = r1.granted(Claim::shared()).await;
        let t2 = r2.granted(Claim::shared()).await;
        assert!(t2 > t1);
        let all = r1.backend.holders(&key()).await.unwrap();
        let seen: Vec<_> = all.iter().map(|i| (i.holder.as_str(), i.token)).collect();
        assert_eq!(seen, [("r1", t1), ("r2", t2)]);
        assert!(all.iter().all(|i| i.claim == Claim::shared()
            && i.remaining_ttl
                .is_some_and(|t| t <= TTL + Duration::from_secs(1))));
        let newest = r1.backend.inspect(&key()).await.unwrap().unwrap();
        assert_eq!((newest.holder.as_str(), newest.token), ("r2", t2));

        let c = w.refused(Claim::exclusive()).await;
        assert!(c
            .remaining_ttl
            .is_some_and(|t| t <= TTL + Duration::from_secs(1)));
        r3.refused(Claim::shared()).await; // behind the writer
        assert_eq!(
            r3.extend().await,
            ExtendOutcome::NotHeld,
            "a waiting share is not held"
        );
        assert_eq!(r1.release().await, ReleaseOutcome::Released);
        w.refused(Claim::exclusive()).await;
        assert_eq!(r2.release().await, ReleaseOutcome::Released);
        let tw = w.granted(Claim::exclusive()).await;
        assert!(tw > t2);
        r3.refused(Claim::shared()).await;
        let only = w.backend.holders(&key()).await.unwrap();
        assert_eq!(only.len(), 1);
        assert_eq!(only[0].claim.mode(), ClaimMode::Exclusive);
        assert_eq!(w.release().await, ReleaseOutcome::Released);
        let t3 = r3.granted(Claim::shared()).await;
        // r3's token is its place's revision: it queued before w was granted, but after w
        // queued, so it still comes after w's.
        assert!(t3 > tw);
        assert_eq!(r3.release().await, ReleaseOutcome::Released);
        assert!(r3.backend.holders(&key()).await.unwrap().is_empty());
        assert!(r3.backend.inspect(&key()).await.unwrap().is_none());
        assert_eq!(places(&cfg).await, 0);
    });
}

/// The same owner claiming again gets the same lease and token, whatever it asks; extend
/// keeps the token; release and extend find a share like an exclusive hold.
fn same_owner_same_lease(var: &str) {
    bounded(Duration::from_secs(60), async {
        let cfg = config(var);
        let r = Who::new(&cfg, "r");
        let t = r.granted(Claim::shared()).await;
        assert_eq!(r.granted(Claim::shared()).await, t);
        assert_eq!(r.granted(Claim::exclusive()).await, t, "the share answers");
        match r.extend().await {
            ExtendOutcome::Extended(g) => assert_eq!(g.token, t),
            ExtendOutcome::NotHeld => panic!("a held share could not be extended"),
        }
        assert_eq!(places(&cfg).await, 1);
        assert_eq!(r.release().await, ReleaseOutcome::Released);
        assert_eq!(r.release().await, ReleaseOutcome::NotHeld);
        assert_eq!(r.extend().await, ExtendOutcome::NotHeld);
    });
}

/// Queue order across modes: W1 holds; R1, W2, R2 queue in that order. Each release lets
/// in exactly those the queue allows, and tokens rise in grant order.
fn fifo_order_across_modes(var: &str) {
    bounded(Duration::from_secs(60), async {
        let cfg = config(var);
        let [w1, r1, w2, r2] = whos(&cfg, ["w1", "r1", "w2", "r2"]);
        let tw1 = w1.granted(Claim::exclusive()).await;
        r1.refused(Claim::shared()).await;
        w2.refused(Claim::exclusive()).await;
        r2.refused(Claim::shared()).await;
        w1.release().await;
        let tr1 = r1.granted(Claim::shared()).await;
        w2.refused(Claim::exclusive()).await;
        r2.refused(Claim::shared()).await; // behind w2, although r1 reads
        r1.release().await;
        let tw2 = w2.granted(Claim::exclusive()).await;
        r2.refused(Claim::shared()).await;
        w2.release().await;
        let tr2 = r2.granted(Claim::shared()).await;
        assert!(
            tw1 < tr1 && tr1 < tw2 && tw2 < tr2,
            "{tw1} {tr1} {tw2} {tr2}"
        );
        r2.release().await;
    });
}

/// A semaphore of 3 never gives out more than 3 permits; a claim with another capacity
/// (another semaphore, an exclusive lock, a reader) is refused and leaves no place; once
/// the key is free, any capacity takes it.
fn semaphore_and_capacity_mismatch(var: &str) {
    bounded(Duration::from_secs(60), async {
        let cfg = config(var);
        let [a, b, c] = whos(&cfg, ["a", "b", "c"]);
        let other = Who::new(&cfg, "other");
        let ta = a.granted(permits(2, 3)).await;
        let tb = b.granted(permits(1, 3)).await;
        c.refused(permits(1, 3)).await;
        for asked in [permits(1, 4), Claim::exclusive(), Claim::shared()] {
            let err = other.claim(asked).await.unwrap_err();
            assert!(
                matches!(err, LockError::Config { .. })
                    && err.to_string().contains("semaphore of 3"),
                "{asked}: {err}"
            );
        }
        let err = other
            .backend
            .try_acquire(&key(), &other.owner, TTL)
            .await
            .unwrap_err();
        assert!(matches!(err, LockError::Config { .. }), "{err}");
        assert_eq!(places(&cfg).await, 3, "a refused claim leaves no place");
        let all = a.backend.holders(&key()).await.unwrap();
        let shown: Vec<_> = all.iter().map(|i| (i.token, i.claim)).collect();
        assert_eq!(shown, [(ta, permits(2, 3)), (tb, permits(1, 3))]);
        assert_eq!(a.release().await, ReleaseOutcome::Released);
        let tc = c.granted(permits(1, 3)).await;
        assert!(tc > tb);
        b.release().await;
        c.release().await;
        // Free again: a semaphore of 4 defines it now, and an exclusive lock is refused.
        other.granted(permits(4, 4)).await;
        let err = a.claim(Claim::exclusive()).await.unwrap_err();
        assert!(err.to_string().contains("semaphore of 4"), "{err}");
        other.release().await;
        a.granted(Claim::exclusive()).await;
        a.release().await;
    });
}

/// A waiting claim is woken only when the keys before it leave room: with two 1-permit
/// holders of a semaphore of 2, a 2-permit waiter sleeps through the first release and
/// wakes at the second; a reader behind a writer wakes at the writer's release.
fn woken_only_when_it_fits(var: &str) {
    bounded(Duration::from_secs(60), async {
        let cfg = config(var);
        let [a, b, c] = whos(&cfg, ["a", "b", "c"]);
        a.granted(permits(1, 2)).await;
        b.granted(permits(1, 2)).await;
        let waiter = c.waiter(c.refused(permits(2, 2)).await);
        tokio::time::sleep(Duration::from_millis(200)).await;
        a.release().await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(
            !waiter.is_finished(),
            "woken by a release that left no room"
        );
        let released = Instant::now();
        b.release().await;
        let woke = waiter.await.unwrap();
        assert!(
            woke.saturating_duration_since(released) < Duration::from_secs(1),
            "woken {:?} after the release",
            woke.saturating_duration_since(released)
        );
        c.granted(permits(2, 2)).await;
        c.release().await;

        let (w, r) = (Who::new(&cfg, "w"), Who::new(&cfg, "r"));
        w.granted(Claim::exclusive()).await;
        let waiter = r.waiter(r.refused(Claim::shared()).await);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let released = Instant::now();
        w.release().await;
        let woke = waiter.await.unwrap();
        assert!(woke.saturating_duration_since(released) < Duration::from_secs(1));
        r.granted(Claim::shared()).await;
        r.release().await;
    });
}

/// A waiting share whose own watch saw room made is granted without another transaction,
/// but only if the same watch showed its place still there: a waiter whose lease is
/// revoked just before the release that would have let it in is told "held" and queues
/// again, behind the waiter that was behind it, which is granted.
fn watch_grant_needs_own_place(var: &str) {
    bounded(Duration::from_secs(60), async {
        let cfg = config(var);
        let [a, b, c] = whos(&cfg, ["a", "b", "c"]);
        let held = a.granted(permits(1, 1)).await;
        let b_waits = b.waiter(b.refused(permits(1, 1)).await);
        let c_waits = c.waiter(c.refused(permits(1, 1)).await);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut raw = Client::connect(cfg.endpoints.clone(), None).await.unwrap();
        let prefix = a.backend.etcd_key(&key());
        let queue = raw
            .get(
                prefix,
                Some(GetOptions::new().with_prefix().with_sort(
                    distlock_etcd::etcd_client::SortTarget::Create,
                    distlock_etcd::etcd_client::SortOrder::Ascend,
                )),
            )
            .await
            .unwrap();
        assert_eq!(queue.kvs().len(), 3);
        let b_first_rev = queue.kvs()[1].create_revision();
        raw.lease_revoke(queue.kvs()[1].lease()).await.unwrap();
        assert_eq!(a.release().await, ReleaseOutcome::Released);
        b_waits.await.unwrap();
        c_waits.await.unwrap();
        let c_token = c.granted(permits(1, 1)).await;
        assert!(c_token > held);
        let refused = b.refused(permits(1, 1)).await;
        let b_waits = b.waiter(refused);
        assert_eq!(c.release().await, ReleaseOutcome::Released);
        b_waits.await.unwrap();
        let b_token = b.granted(permits(1, 1)).await;
        assert!(b_token > c_token, "the revoked waiter kept its place");
        assert_ne!(b_token, FencingToken(b_first_rev as u64));
        assert_eq!(b.release().await, ReleaseOutcome::Released);
    });
}

/// The permits of a holder that never releases come back when its lease expires.
fn dead_holders_permits_come_back(var: &str) {
    bounded(Duration::from_secs(60), async {
        let cfg = config(var);
        let (dead, b) = (Who::new(&cfg, "dead"), Who::new(&cfg, "b"));
        dead.granted(permits(1, 1)).await;
        let started = Instant::now();
        loop {
            match b.claim(permits(1, 1)).await.unwrap() {
                AcquireOutcome::Acquired(_) => break,
                AcquireOutcome::Held(c) => {
                    assert!(started.elapsed() < TTL * 3, "the permit never came back");
                    b.backend
                        .wait_released(&key(), &c.hint, u64::MAX, TTL)
                        .await
                        .unwrap();
                }
            }
        }
        assert!(started.elapsed() >= TTL - Duration::from_millis(1100));
        b.release().await;
    });
}

/// A claim that gave up (abandon) or was compensated (release) leaves no place behind;
/// force_release frees every share at once.
fn abandon_release_and_force(var: &str) {
    bounded(Duration::from_secs(60), async {
        let cfg = config(var);
        let [r1, r2, w, r3] = whos(&cfg, ["r1", "r2", "w", "r3"]);
        r1.granted(Claim::shared()).await;
        r2.granted(Claim::shared()).await;
        w.refused(Claim::exclusive()).await;
        r3.refused(Claim::shared()).await;
        assert_eq!(places(&cfg).await, 4);
        r3.backend.abandon(&key(), &r3.owner).await.unwrap();
        assert_eq!(places(&cfg).await, 3);
        assert_eq!(r3.release().await, ReleaseOutcome::NotHeld);
        assert_eq!(
            w.backend.force_release(&key()).await.unwrap(),
            ReleaseOutcome::Released
        );
        assert_eq!(r1.extend().await, ExtendOutcome::NotHeld);
        assert_eq!(r2.release().await, ReleaseOutcome::NotHeld);
        w.granted(Claim::exclusive()).await;
        r3.refused(Claim::shared()).await;
        assert_eq!(
            r3.release().await,
            ReleaseOutcome::NotHeld,
            "a queued place was not held"
        );
        assert_eq!(places(&cfg).await, 1);
        w.release().await;
    });
}

/// Many contenders (a backend each) mixing weights on a semaphore of 3 (a claim of all 3
/// being a writer): the permits out never exceed 3, and everyone gets through.
fn never_more_than_capacity(var: &str) {
    use std::sync::atomic::{AtomicU64, Ordering};
    bounded(Duration::from_secs(90), async {
        let cfg = config(var);
        let out = Arc::new(AtomicU64::new(0));
        let peak = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for i in 0..8u32 {
            let who = Who::new(&cfg, &format!("c{i}"));
            let (out, peak) = (out.clone(), peak.clone());
            tasks.push(tokio::spawn(async move {
                for round in 0..6u32 {
                    let claim = match (i + round) % 4 {
                        0 => permits(3, 3),
                        1 => permits(2, 3),
                        _ => permits(1, 3),
                    };
                    loop {
                        match who.claim(claim).await.unwrap() {
                            AcquireOutcome::Acquired(_) => break,
                            AcquireOutcome::Held(c) => who
                                .backend
                                .wait_released(&key(), &c.hint, u64::MAX, TTL * 4)
                                .await
                                .unwrap(),
                        }
                    }
                    let now = out.fetch_add(claim.weight(), Ordering::SeqCst) + claim.weight();
                    peak.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    out.fetch_sub(claim.weight(), Ordering::SeqCst);
                    assert_eq!(who.release().await, ReleaseOutcome::Released);
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let peak = peak.load(Ordering::SeqCst);
        assert!((1..=3).contains(&peak), "{peak} permits out at once");
        assert_eq!(places(&cfg).await, 0);
    });
}

/// Through the client: a writer waiting behind a reader is not overtaken by later readers;
/// its release lets every waiting reader in at once (clients of one backend included, each
/// waiter on its own watch), and they are listed in grant order.
fn client_writer_then_readers(var: &str) {
    bounded(Duration::from_secs(60), async {
        let cfg = config(var);
        let shared_backend = EtcdBackend::new(cfg.clone()).unwrap();
        let client = |own: bool| {
            if own {
                LockClient::new(EtcdBackend::new(cfg.clone()).unwrap())
            } else {
                LockClient::new(shared_backend.clone())
            }
        };
        let bound = Duration::from_secs(20);
        let c0 = client(true);
        let first = c0.lock("k").shared().ttl(TTL).acquire().await.unwrap();
        let writer = {
            let c = client(true);
            tokio::spawn(async move { c.lock("k").ttl(TTL).wait(bound).acquire().await })
        };
        let late = client(true);
        tokio::time::timeout(bound, async {
            while late
                .lock("k")
                .shared()
                .try_acquire()
                .await
                .unwrap()
                .is_some()
            {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("a later reader kept getting in while the writer waited");
        first.release().await.unwrap();
        let w = writer.await.unwrap().unwrap();
        assert_eq!(w.claim().mode(), ClaimMode::Exclusive);

        let mut readers = Vec::new();
        for i in 0..5 {
            let c = client(i % 2 == 0);
            readers.push(tokio::spawn(async move {
                c.lock("k")
                    .shared()
                    .ttl(TTL * 5)
                    .wait(bound)
                    .acquire()
                    .await
            }));
        }
        // Every reader has queued (a place each, behind the writer).
        tokio::time::timeout(bound, async {
            while places(&cfg).await < 6 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("the readers never queued");
        let released = Instant::now();
        w.release().await.unwrap();
        let mut guards = Vec::new();
        for r in readers {
            guards.push(r.await.unwrap().unwrap());
        }
        assert!(
            released.elapsed() < Duration::from_secs(1),
            "{:?}",
            released.elapsed()
        );
        let all = c0.inspect_all("k").await.unwrap();
        assert_eq!(all.len(), 5);
        assert!(all.windows(2).all(|p| p[0].token < p[1].token));
        for g in guards {
            g.release().await.unwrap();
        }
    });
}

/// Through the client: a writer that gives up waiting (its place abandoned) lets the
/// readers behind it in at once; a semaphore through the client lends at most its permits.
fn client_writer_gives_up_and_semaphore(var: &str) {
    bounded(Duration::from_secs(60), async {
        let cfg = config(var);
        let client = || LockClient::new(EtcdBackend::new(cfg.clone()).unwrap());
        let (c0, c1, c2) = (client(), client(), client());
        let reader = c0.lock("k").shared().ttl(TTL).acquire().await.unwrap();
        let err = c1
            .lock("k")
            .ttl(TTL)
            .wait(Duration::from_millis(300))
            .acquire()
            .await
            .unwrap_err();
        assert!(matches!(err, LockError::Timeout { .. }), "{err}");
        let started = Instant::now();
        let second = c2
            .lock("k")
            .shared()
            .ttl(TTL)
            .wait(Duration::from_secs(10))
            .acquire()
            .await
            .unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
        reader.release().await.unwrap();
        second.release().await.unwrap();

        let held = c0.semaphore("pool", 2).ttl(TTL).acquire().await.unwrap();
        let two = c1.semaphore("pool", 2).ttl(TTL).acquire().await.unwrap();
        assert!(c2
            .semaphore("pool", 2)
            .try_acquire()
            .await
            .unwrap()
            .is_none());
        let err = c2.semaphore("pool", 3).try_acquire().await.unwrap_err();
        assert!(err.to_string().contains("semaphore of 2"), "{err}");
        assert_eq!(held.claim().semaphore_permits(), Some(1));
        held.release().await.unwrap();
        let third = c2
            .semaphore("pool", 2)
            .ttl(TTL)
            .try_acquire()
            .await
            .unwrap();
        assert!(third.is_some());
        drop((two, third));
    });
}

/// A set in one transaction (`claim_all`). A free set is granted with every place created
/// by one transaction (one create revision, each key's token), each place on a lease of its
/// own: revoking the first key's lease once it is released (what shutdown does to a spare)
/// leaves the other keys held. The same owner again gets the same tokens. A set refused at
/// a held key names it with the holder's remaining TTL and leaves nothing: no key in any of
/// its queues but the holder's, no place keeping a later reader out; its wait sleeps until
/// the holder's release and wakes at it. A shared set fits next to readers; a semaphore set
/// on a read-write key is a capacity mismatch, and leaves nothing either.
fn sets_in_one_transaction(var: &str) {
    bounded(Duration::from_secs(60), async {
        let cfg = config(var);
        let (a, b) = (
            EtcdBackend::new(cfg.clone()).unwrap(),
            EtcdBackend::new(cfg.clone()).unwrap(),
        );
        let mut raw = Client::connect(cfg.endpoints.clone(), None).await.unwrap();
        let keys = ["set-1", "set-2", "set-3"].map(|k| LockKey::new(k).unwrap());
        let (o, other) = (Owner::new("set"), Owner::new("other"));
        let set = |claim: Claim| {
            let requests = keys.iter().map(|k| ClaimRequest::new(k, &o, TTL, claim));
            requests.collect::<Vec<_>>()
        };
        let granted = |answer: AcquireOutcome| match answer {
            AcquireOutcome::Acquired(g) => g.token,
            AcquireOutcome::Held(c) => panic!("refused: {c:?}"),
        };
        let mut queues = Vec::new();
        for k in &keys {
            let prefix = a.etcd_key(k);
            let queue = raw.get(prefix, Some(GetOptions::new().with_prefix()));
            queues.push(queue.await.unwrap().kvs().to_vec());
        }
        assert!(queues.iter().all(Vec::is_empty));

        let Some(SetOutcome::Acquired(grants)) =
            a.claim_all(&set(Claim::exclusive())).await.unwrap()
        else {
            panic!("a free set was not granted");
        };
        assert_eq!(grants.len(), 3);
        assert!(
            grants.iter().all(|g| g.token == grants[0].token),
            "the places were not created by one transaction: {grants:?}"
        );
        let mut leases = Vec::new();
        for (k, g) in keys.iter().zip(&grants) {
            assert_eq!(b.inspect(k).await.unwrap().map(|i| i.token), Some(g.token));
            let queue = raw.get(a.etcd_key(k), Some(GetOptions::new().with_prefix()));
            let queue = queue.await.unwrap();
            assert_eq!(queue.kvs().len(), 1, "{k}");
            leases.push(queue.kvs()[0].lease());
        }
        let mut distinct = leases.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(
            distinct.len(),
            3,
            "the places of a set share a lease: {leases:?}"
        );
        let again = a.claim_all(&set(Claim::exclusive())).await.unwrap();
        let Some(SetOutcome::Acquired(again)) = again else {
            panic!("the same owner was refused its own set: {again:?}");
        };
        let tokens = |g: &[lockcore::driver::Grant]| g.iter().map(|g| g.token).collect::<Vec<_>>();
        assert_eq!(tokens(&again), tokens(&grants));
        assert_eq!(
            a.release(&keys[0], &o).await.unwrap(),
            ReleaseOutcome::Released
        );
        raw.lease_revoke(leases[0]).await.unwrap();
        for k in &keys[1..] {
            assert!(
                b.inspect(k).await.unwrap().is_some(),
                "revoking the first key's lease freed {k}"
            );
            assert_eq!(a.release(k, &o).await.unwrap(), ReleaseOutcome::Released);
        }

        // Refused at the middle key: nothing of the set written.
        let held = b
            .claim(&ClaimRequest::exclusive(&keys[1], &other, TTL))
            .await;
        let held = granted(held.unwrap());
        let contention = match a.claim_all(&set(Claim::exclusive())).await.unwrap() {
            Some(SetOutcome::Held {
                index: 1,
                contention,
            }) => contention,
            answer => panic!("expected the middle key held: {answer:?}"),
        };
        assert!(
            contention
                .remaining_ttl
                .is_some_and(|t| t <= TTL + Duration::from_secs(1)),
            "{contention:?}"
        );
        for (i, k) in keys.iter().enumerate() {
            let queue = raw.get(a.etcd_key(k), Some(GetOptions::new().with_prefix()));
            let queue = queue.await.unwrap();
            let tokens: Vec<_> = queue.kvs().iter().map(|kv| kv.create_revision()).collect();
            let expected: Vec<i64> = if i == 1 {
                vec![held.0 as i64]
            } else {
                Vec::new()
            };
            assert_eq!(
                tokens, expected,
                "the refused set left a place in {k}'s queue"
            );
        }
        // Its wait: asleep while the holder holds, woken by its release.
        let waiter = {
            let (a, k, hint) = (a.clone(), keys[1].clone(), contention.hint.clone());
            tokio::spawn(async move {
                let max = Duration::from_secs(20);
                a.wait_released(&k, &hint, u64::MAX, max).await.unwrap();
                Instant::now()
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !waiter.is_finished(),
            "the refused set's wait ended before any release"
        );
        let released = Instant::now();
        assert_eq!(
            b.release(&keys[1], &other).await.unwrap(),
            ReleaseOutcome::Released
        );
        let woke = waiter.await.unwrap();
        assert!(
            woke.duration_since(released) < Duration::from_millis(500),
            "woken {:?} after the release",
            woke.duration_since(released)
        );

        // Behind a reader, the refused set keeps no writer's place: a later reader gets in.
        let reader = Owner::new("reader");
        granted(
            b.claim(&ClaimRequest::new(&keys[1], &reader, TTL, Claim::shared()))
                .await
                .unwrap(),
        );
        let answer = a.claim_all(&set(Claim::exclusive())).await.unwrap();
        assert!(
            matches!(answer, Some(SetOutcome::Held { index: 1, .. })),
            "{answer:?}"
        );
        let late = Owner::new("late reader");
        granted(
            b.claim(&ClaimRequest::new(&keys[1], &late, TTL, Claim::shared()))
                .await
                .unwrap(),
        );
        assert!(b.holders(&keys[0]).await.unwrap().is_empty());

        // A semaphore set on those readers' key: a capacity mismatch, nothing left.
        let err = a.claim_all(&set(permits(1, 2))).await.unwrap_err();
        assert!(err.to_string().contains("semaphore of 2"), "{err}");
        for k in [&keys[0], &keys[2]] {
            let queue = raw.get(a.etcd_key(k), Some(GetOptions::new().with_prefix()));
            assert_eq!(queue.await.unwrap().kvs().len(), 0, "{k}");
        }

        // A shared set next to the readers: granted by one transaction.
        let Some(SetOutcome::Acquired(shared)) = a.claim_all(&set(Claim::shared())).await.unwrap()
        else {
            panic!("a shared set next to readers was refused");
        };
        assert!(
            shared.iter().all(|g| g.token == shared[0].token),
            "{shared:?}"
        );
        assert_eq!(b.holders(&keys[1]).await.unwrap().len(), 3);
        for k in &keys {
            assert_eq!(a.release(k, &o).await.unwrap(), ReleaseOutcome::Released);
        }
        for who in [&reader, &late] {
            assert_eq!(
                b.release(&keys[1], who).await.unwrap(),
                ReleaseOutcome::Released
            );
        }
        for k in &keys {
            let queue = raw.get(a.etcd_key(k), Some(GetOptions::new().with_prefix()));
            assert_eq!(queue.await.unwrap().kvs().len(), 0, "{k}");
        }
    });
}

/// etcd takes up to 128 operations in one transaction (`--max-txn-ops`): a set of 128 keys
/// is one transaction (one create revision for all), a set of 129 is left to lockcore
/// (`None`), nothing of it written.
fn sets_up_to_the_transaction_limit(var: &str) {
    bounded(Duration::from_secs(60), async {
        let cfg = config(var);
        let a = EtcdBackend::new(cfg.clone()).unwrap();
        let o = Owner::new("wide set");
        let keys: Vec<LockKey> = (0..129)
            .map(|i| LockKey::new(format!("wide-{i:03}")).unwrap())
            .collect();
        let set = |n: usize| {
            let requests = keys[..n]
                .iter()
                .map(|k| ClaimRequest::exclusive(k, &o, TTL));
            requests.collect::<Vec<_>>()
        };
        assert_eq!(a.claim_all(&set(129)).await.unwrap(), None);
        let mut raw = Client::connect(cfg.endpoints.clone(), None).await.unwrap();
        let everything = GetOptions::new().with_prefix().with_count_only();
        let stored = raw.get(cfg.namespace.clone(), Some(everything.clone()));
        assert_eq!(
            stored.await.unwrap().count(),
            0,
            "the set of 129 wrote something"
        );
        let Some(SetOutcome::Acquired(grants)) = a.claim_all(&set(128)).await.unwrap() else {
            panic!("a free set of 128 keys was not granted");
        };
        assert_eq!(grants.len(), 128);
        assert!(grants.iter().all(|g| g.token == grants[0].token));
        for k in &keys[..128] {
            assert_eq!(a.release(k, &o).await.unwrap(), ReleaseOutcome::Released);
        }
    });
}

/// The cost of an uncontended cycle (claim + release) by mode, one member: exclusive and
/// shared, in alternating slices. A
/// measurement, not a check: `cargo test --release -p distlock-etcd --test claims --
/// --ignored --nocapture cycle_costs`.
#[test]
#[ignore = "a measurement: run with --ignored --nocapture"]
fn cycle_costs() {
    bounded(Duration::from_secs(120), async {
        let who = Who::new(&config("DISTLOCK_TEST_ETCD_URL"), "who");
        let sides: [(&str, &Who, Claim); 2] = [
            ("exclusive", &who, Claim::exclusive()),
            ("shared", &who, Claim::shared()),
        ];
        let mut spent = [Duration::ZERO; 2];
        let mut cycles = [0u32; 2];
        for round in 0..12 {
            for (i, (_, who, claim)) in sides.iter().enumerate() {
                let started = Instant::now();
                while started.elapsed() < Duration::from_millis(250) {
                    who.granted(*claim).await;
                    assert_eq!(who.release().await, ReleaseOutcome::Released);
                    if round > 0 {
                        cycles[i] += 1;
                    }
                }
                if round > 0 {
                    spent[i] += started.elapsed();
                }
            }
        }
        let per = |i: usize| spent[i].as_secs_f64() * 1e6 / f64::from(cycles[i]);
        for (i, (name, _, _)) in sides.iter().enumerate() {
            println!("{name}: {:.0} µs per cycle ({} cycles)", per(i), cycles[i]);
        }
        println!("shared / exclusive: {:.2}", per(1) / per(0));
    });
}

on_both!(
    readers_share_writers_exclude,
    same_owner_same_lease,
    fifo_order_across_modes,
    semaphore_and_capacity_mismatch,
    woken_only_when_it_fits,
    watch_grant_needs_own_place,
    dead_holders_permits_come_back,
    abandon_release_and_force,
    never_more_than_capacity,
    client_writer_then_readers,
    client_writer_gives_up_and_semaphore,
    sets_in_one_transaction,
    sets_up_to_the_transaction_limit,
);
