//! Several keys at once: all or nothing, one token per key, no deadlock between sets. Every
//! test runs on both paths: the set in one request of the store, and key by key.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::testing::TestStore;
use crate::*;

const TTL: Duration = Duration::from_secs(30);

async fn is_free(locks: &LockClient, key: &str) -> bool {
    locks.inspect(key).await.unwrap().is_none()
}

/// How the store takes a set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
    /// In one request ([`LockBackend::claim_all`]), as the memory store does.
    OneRequest,
    /// Key by key, as for a store without that operation.
    OneByOne,
}

impl Path {
    /// A test store, and the backend the test's clients use on this path.
    fn store(self) -> (Arc<TestStore>, Arc<dyn LockBackend>) {
        let store = TestStore::new();
        let backend: Arc<dyn LockBackend> = match self {
            Path::OneRequest => store.clone(),
            Path::OneByOne => Arc::new(OneByOne(store.clone())),
        };
        (store, backend)
    }
}

/// A store that takes no set in one request: every operation but `claim_all` passed on.
#[derive(Debug)]
struct OneByOne(Arc<TestStore>);

#[async_trait::async_trait]
impl LockBackend for OneByOne {
    fn name(&self) -> &'static str {
        self.0.name()
    }
    fn capabilities(&self) -> Capabilities {
        self.0.capabilities()
    }
    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<AcquireOutcome, LockError> {
        self.0.claim(request).await
    }
    async fn release(&self, key: &LockKey, owner: &Owner) -> Result<ReleaseOutcome, LockError> {
        self.0.release(key, owner).await
    }
    async fn renew(
        &self,
        renewals: &[Renewal<'_>],
    ) -> Result<Vec<Result<ExtendOutcome, LockError>>, LockError> {
        self.0.renew(renewals).await
    }
    async fn holders(&self, key: &LockKey) -> Result<Vec<LockInfo>, LockError> {
        self.0.holders(key).await
    }
    async fn wait_released(
        &self,
        key: &LockKey,
        hint: &WaitHint,
        place: u64,
        max_wait: Duration,
    ) -> Result<(), LockError> {
        self.0.wait_released(key, hint, place, max_wait).await
    }
    async fn abandon(&self, key: &LockKey, owner: &Owner) -> Result<(), LockError> {
        self.0.abandon(key, owner).await
    }
    async fn force_release(&self, key: &LockKey) -> Result<ReleaseOutcome, LockError> {
        self.0.force_release(key).await
    }
    fn notifier(&self) -> Option<&crate::driver::ReleaseNotifier> {
        self.0.notifier()
    }
}

/// Each test below, once per path.
macro_rules! on_both_paths {
    ($(#[$runtime:meta] $test:ident;)*) => {
        mod one_request {
            $(#[$runtime] async fn $test() { super::$test(super::Path::OneRequest).await })*
        }
        mod one_by_one {
            $(#[$runtime] async fn $test() { super::$test(super::Path::OneByOne).await })*
        }
    };
}

on_both_paths! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)] sets_exclude_each_other_under_contention;
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)] opposite_orders_never_deadlock;
    #[tokio::test] each_key_has_its_own_rising_token;
    #[tokio::test(start_paused = true)] a_timeout_leaves_nothing_held;
    #[tokio::test] try_acquire_takes_all_or_none;
    #[tokio::test(start_paused = true)] a_dropped_acquire_leaves_no_key_held;
    #[tokio::test(start_paused = true)] a_dropped_acquire_in_flight_leaves_no_key_held;
    #[tokio::test(start_paused = true)] one_lost_key_fires_lost_for_the_set;
    #[tokio::test] a_duplicate_invalid_or_empty_set_is_refused_first;
    #[tokio::test] an_owner_re_enters_the_keys_it_holds;
    #[tokio::test] shared_sets_share;
}

/// Concurrent transfers between overlapping pairs of accounts, each a read-modify-write
/// with an await in between: no update is lost, so no two sets ever held a key together.
async fn sets_exclude_each_other_under_contention(path: Path) {
    let (_store, backend) = path.store();
    let accounts: Arc<Vec<AtomicU64>> = Arc::new((0..4).map(|_| AtomicU64::new(0)).collect());
    let mut tasks = Vec::new();
    for client in 0..8 {
        let (locks, accounts) = (LockClient::new(backend.clone()), accounts.clone());
        tasks.push(tokio::spawn(async move {
            for round in 0..25 {
                // Pairs and triples, in both orders.
                let picked: Vec<usize> = match (client + round) % 4 {
                    0 => vec![0, 1],
                    1 => vec![1, 0, 2],
                    2 => vec![3, 2],
                    _ => vec![2, 1],
                };
                let keys: Vec<String> = picked.iter().map(|i| format!("acct:{i}")).collect();
                let set = locks.lock_all(keys).acquire().await.unwrap();
                let before: Vec<u64> = picked
                    .iter()
                    .map(|&i| accounts[i].load(Ordering::SeqCst))
                    .collect();
                tokio::task::yield_now().await;
                for (&i, v) in picked.iter().zip(before) {
                    accounts[i].store(v + 1, Ordering::SeqCst);
                }
                set.release().await.unwrap();
            }
        }));
    }
    tokio::time::timeout(
        Duration::from_secs(30),
        futures_util::future::join_all(tasks),
    )
    .await
    .expect("the sets finished");
    let total: u64 = accounts.iter().map(|a| a.load(Ordering::SeqCst)).sum();
    // Every round touches 2 or 3 accounts: (2 + 3 + 2 + 2) per 4 rounds, 8 clients × 25 rounds.
    assert_eq!(total, 8 * 25 / 4 * 9, "updates were lost");
}

/// Two sets of the same keys given in opposite orders, each held while the other waits,
/// always complete: the keys are taken in one order whatever the caller's.
async fn opposite_orders_never_deadlock(path: Path) {
    let (_store, backend) = path.store();
    let run = |keys: [&'static str; 3]| {
        let locks = LockClient::new(backend.clone());
        tokio::spawn(async move {
            for _ in 0..50 {
                let set = locks
                    .lock_all(keys)
                    .ttl(TTL)
                    .wait(Duration::from_secs(5))
                    .acquire()
                    .await
                    .unwrap();
                tokio::task::yield_now().await;
                set.release().await.unwrap();
            }
        })
    };
    let a = run(["x", "y", "z"]);
    let b = run(["z", "y", "x"]);
    tokio::time::timeout(Duration::from_secs(20), async {
        a.await.unwrap();
        b.await.unwrap();
    })
    .await
    .expect("two opposite-order sets deadlocked");
}

/// Each key of a set has its own token, higher than its previous holder's, whichever
/// order the keys were given in.
async fn each_key_has_its_own_rising_token(path: Path) {
    let locks = LockClient::new(path.store().1);
    let single = locks.lock("b").acquire().await.unwrap();
    let b_before = single.token();
    single.release().await.unwrap();
    let set = locks.lock_all(["b", "a"]).acquire().await.unwrap();
    let keys: Vec<&str> = set.tokens().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["a", "b"], "the set's order is the keys' order");
    assert!(set.token("b").unwrap() > b_before);
    assert_eq!(set.token("c"), None);
    let first = (set.token("a").unwrap(), set.token("b").unwrap());
    assert_eq!(set.release().await.unwrap(), ReleaseOutcome::Released);
    let again = locks.lock_all(["a", "b"]).acquire().await.unwrap();
    assert!(again.token("a").unwrap() > first.0);
    assert!(again.token("b").unwrap() > first.1);
    again.extend().await.unwrap();
    again.release().await.unwrap();
}

/// A key held by another owner: the set times out naming it, after waiting the set's
/// deadline (not a deadline per key), and the keys it had taken are free again when the
/// error comes back.
async fn a_timeout_leaves_nothing_held(path: Path) {
    let (store, backend) = path.store();
    let (locks, other) = (
        LockClient::new(backend.clone()),
        LockClient::new(backend.clone()),
    );
    // "a" comes free after 6 s; "m" stays held.
    let _expiring = other
        .lock("a")
        .ttl(Duration::from_secs(6))
        .watchdog(false)
        .acquire()
        .await
        .unwrap();
    let busy = other.lock("m").ttl(TTL).acquire().await.unwrap();
    let wait = Duration::from_secs(10);
    let started = tokio::time::Instant::now();
    let err = locks
        .lock_all(["z", "a", "m"])
        .ttl(TTL)
        .wait(wait)
        .acquire()
        .await
        .unwrap_err();
    let took = started.elapsed();
    match &err {
        LockError::Timeout { key, waited } => {
            assert_eq!(key.as_str(), "m");
            assert!(*waited >= wait, "{waited:?}");
        }
        other => panic!("{other:?}"),
    }
    assert!(
        took >= wait && took < wait + Duration::from_secs(1),
        "the set waited {took:?} for a {wait:?} deadline"
    );
    let a = LockKey::new("a").unwrap();
    assert!(
        store.inner().holders(&a).await.unwrap().is_empty(),
        "the key taken before the held one was still held when the error came"
    );
    assert!(is_free(&other, "z").await);
    let releases = match path {
        // Nothing of the set was ever held.
        Path::OneRequest => 0,
        Path::OneByOne => 1,
    };
    assert_eq!(store.ops().releases, releases, "a released, z never taken");
    busy.release().await.unwrap();
}

/// `try_acquire` takes all or none, and sends nothing for a key after the held one.
async fn try_acquire_takes_all_or_none(path: Path) {
    let (store, backend) = path.store();
    let (locks, other) = (
        LockClient::new(backend.clone()),
        LockClient::new(backend.clone()),
    );
    let busy = other.lock("b").acquire().await.unwrap();
    assert!(locks
        .lock_all(["c", "b", "a"])
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    assert!(is_free(&other, "a").await);
    assert!(is_free(&other, "c").await);
    let (claims, set_claims) = match path {
        Path::OneRequest => (1, 1),
        // Busy, a, b: nothing sent for c.
        Path::OneByOne => (3, 0),
    };
    let ops = store.ops();
    assert_eq!((ops.claims, ops.set_claims), (claims, set_claims));
    busy.release().await.unwrap();
    let all = locks.lock_all(["c", "b", "a"]).try_acquire().await.unwrap();
    assert_eq!(all.expect("all free").guards().len(), 3);
}

/// A set whose acquisition is dropped while it waits for a held key leaves nothing held.
async fn a_dropped_acquire_leaves_no_key_held(path: Path) {
    let (store, backend) = path.store();
    let (locks, other) = (
        LockClient::new(backend.clone()),
        LockClient::new(backend.clone()),
    );
    let busy = other.lock("b").ttl(TTL).acquire().await.unwrap();
    let acquiring = tokio::spawn({
        let locks = locks.clone();
        async move { locks.lock_all(["a", "b"]).ttl(TTL).acquire().await }
    });
    // It waits for "b" (key by key, holding "a").
    while store.ops().waits == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    acquiring.abort();
    assert!(acquiring.await.unwrap_err().is_cancelled());
    assert!(locks.shutdown().await);
    assert!(
        is_free(&other, "a").await,
        "the dropped set left a key held"
    );
    busy.release().await.unwrap();
}

/// A set whose acquisition is dropped while the store applies its attempt (answer held
/// back) leaves nothing held once the answer comes: the attempt is settled in the
/// background.
async fn a_dropped_acquire_in_flight_leaves_no_key_held(path: Path) {
    let (store, backend) = path.store();
    let (locks, other) = (
        LockClient::new(backend.clone()),
        LockClient::new(backend.clone()),
    );
    store.pause();
    let acquiring = tokio::spawn({
        let locks = locks.clone();
        async move { locks.lock_all(["a", "b", "c"]).ttl(TTL).acquire().await }
    });
    store.answers_held(1).await;
    let a = LockKey::new("a").unwrap();
    assert!(
        !store.inner().holders(&a).await.unwrap().is_empty(),
        "the attempt was applied"
    );
    acquiring.abort();
    assert!(acquiring.await.unwrap_err().is_cancelled());
    store.resume();
    assert!(locks.shutdown().await);
    for key in ["a", "b", "c"] {
        assert!(
            is_free(&other, key).await,
            "the dropped set left {key} held"
        );
    }
}

/// Any key of the set lost fires the set's `lost()`, and stops `with_lock` work naming it.
async fn one_lost_key_fires_lost_for_the_set(path: Path) {
    let (store, backend) = path.store();
    let locks = LockClient::new(backend.clone());
    let set = locks
        .lock_all(["a", "b", "c"])
        .ttl(TTL)
        .acquire()
        .await
        .unwrap();
    assert!(!set.is_lost());
    store.lose(&set.guards()[1]).await.unwrap();
    tokio::time::timeout(TTL, set.lost())
        .await
        .expect("lost() fired");
    assert!(set.is_lost());
    assert_eq!(set.release().await.unwrap(), ReleaseOutcome::NotHeld);

    let store2 = store.clone();
    let err = locks
        .lock_all(["a", "b", "c"])
        .ttl(TTL)
        .with_lock(|handles| async move {
            store2.lose(&handles[2]).await.unwrap();
            std::future::pending::<()>().await
        })
        .await
        .unwrap_err();
    assert!(
        matches!(&err, LockError::Lost { key } if key.as_str() == "c"),
        "{err:?}"
    );
    assert!(locks.shutdown().await);
    let other = LockClient::new(backend.clone());
    assert!(is_free(&other, "a").await && is_free(&other, "b").await);
}

/// Bad sets are refused before anything is sent.
async fn a_duplicate_invalid_or_empty_set_is_refused_first(path: Path) {
    let (store, backend) = path.store();
    let locks = LockClient::new(backend.clone());
    let twice = locks.lock_all(["a", "b", "a"]).acquire().await.unwrap_err();
    assert!(
        matches!(&twice, LockError::Config { message } if message.contains("\"a\" twice")),
        "{twice:?}"
    );
    let bad = locks
        .lock_all(["a", "b\0"])
        .try_acquire()
        .await
        .unwrap_err();
    assert!(matches!(bad, LockError::InvalidKey { .. }), "{bad:?}");
    let none = locks
        .lock_all(Vec::<String>::new())
        .acquire()
        .await
        .unwrap_err();
    assert!(matches!(none, LockError::Config { .. }), "{none:?}");
    let ttl = locks
        .lock_all(["a"])
        .ttl(Duration::ZERO)
        .acquire()
        .await
        .unwrap_err();
    assert!(matches!(ttl, LockError::InvalidTtl { .. }), "{ttl:?}");
    assert_eq!((store.ops().claims, store.ops().set_claims), (0, 0));
}

/// A set by an owner that already holds one of its keys re-enters that key.
async fn an_owner_re_enters_the_keys_it_holds(path: Path) {
    let locks = LockClient::new(path.store().1);
    let owner = locks.new_owner();
    let held = locks
        .lock("a")
        .owner(owner.clone())
        .acquire()
        .await
        .unwrap();
    let set = locks
        .lock_all(["a", "b"])
        .owner(owner)
        .acquire()
        .await
        .unwrap();
    assert_eq!(set.token("a"), Some(held.token()));
    assert_eq!(
        set.release().await.unwrap(),
        ReleaseOutcome::StillHeld { holds: 1 }
    );
    assert!(is_free(&locks, "b").await);
    assert!(!is_free(&locks, "a").await);
    held.release().await.unwrap();
}

/// Shared sets share with each other and exclude a writer.
async fn shared_sets_share(path: Path) {
    let locks = LockClient::new(path.store().1);
    let r1 = locks.lock_all(["a", "b"]).shared().acquire().await.unwrap();
    let r2 = locks
        .lock_all(["b", "a"])
        .shared()
        .try_acquire()
        .await
        .unwrap();
    assert!(r2.is_some(), "readers share");
    assert!(locks.lock_all(["b"]).try_acquire().await.unwrap().is_none());
    assert!(r1
        .guards()
        .iter()
        .all(|g| g.claim().mode() == ClaimMode::Shared));
}

/// The set is valid until its earliest key is: a key renewed later does not move it.
#[tokio::test(start_paused = true)]
async fn the_set_is_valid_until_its_earliest_key() {
    let store = TestStore::new();
    let locks = LockClient::new(store.clone());
    let set = locks
        .lock_all(["a", "b"])
        .ttl(TTL)
        .watchdog(false)
        .acquire()
        .await
        .unwrap();
    let first = set.valid_until();
    assert_eq!(
        Some(first),
        set.guards().iter().map(|g| g.valid_until()).min()
    );
    tokio::time::advance(Duration::from_secs(1)).await;
    let b = &set.guards()[1];
    b.extend().await.unwrap();
    assert!(b.valid_until() > first, "the renewal moved b on");
    assert_eq!(set.valid_until(), set.guards()[0].valid_until());
    assert_eq!(
        set.valid_until(),
        first,
        "a, not renewed, still ends the set"
    );
    set.extend().await.unwrap();
    assert!(
        set.valid_until() > first,
        "renewing every key moves the set on"
    );
    set.release().await.unwrap();
}
