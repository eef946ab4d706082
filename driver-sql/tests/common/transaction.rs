//! Locks inside the caller's transaction (`lock_in`, `try_lock_in`), the same scenarios on
//! each database: the lock ends with the transaction and excludes every other holder, its
//! token fences the transaction's own writes.

use std::time::{Duration, Instant};

use async_trait::async_trait;
use distlock_sql::TransactionLock;
use lockcore::{FencingToken, LockClient, LockError};

/// One database's side of the scenarios: a backend on a fresh table, transactions on its
/// pool, and a table of accounts written with a fence column.
#[async_trait]
pub trait TxDb: Send + Sync + Sized + 'static {
    /// A transaction on the backend's pool.
    type Tx: Send;
    /// Whether a transaction holding a key keeps ordinary claims of every key from being
    /// decided (SQLite: the file's write lock), so that they fail `Unavailable` once their
    /// busy timeout passes, instead of answering the key held.
    const LOCKS_THE_STORE: bool = false;
    /// Whether `holders` shows a transaction's hold (PostgreSQL, whose transaction holds
    /// the key's gate, which other sessions can probe), or the key as free (MySQL: only a
    /// locking read could see the row locked, and not the token the transaction wrote;
    /// SQLite: only the transaction sees the row it wrote).
    const SHOWS_HOLD: bool = false;

    /// A backend on a fresh lock table, and a fresh accounts table with accounts 1 and 2
    /// holding 100 each, fence 0.
    async fn start() -> Self;
    /// An ordinary client of the same lock table, through a backend of its own.
    async fn client(&self) -> LockClient;
    async fn begin(&self) -> Self::Tx;
    async fn lock_in(
        &self,
        tx: &mut Self::Tx,
        key: &str,
        wait: Duration,
    ) -> Result<TransactionLock, LockError>;
    async fn try_lock_in(
        &self,
        tx: &mut Self::Tx,
        key: &str,
    ) -> Result<Option<TransactionLock>, LockError>;
    async fn commit(tx: Self::Tx);
    async fn rollback(tx: Self::Tx);
    /// Adds `delta` to `account`'s balance in `tx` unless a later token wrote it:
    /// `UPDATE … SET balance = balance + delta, fence = token WHERE id = account AND fence <= token`.
    /// Whether a row was written.
    async fn fenced_add(
        &self,
        tx: &mut Self::Tx,
        account: i64,
        delta: i64,
        token: FencingToken,
    ) -> bool;
    /// `account`'s balance, committed.
    async fn balance(&self, account: i64) -> i64;
    /// A statement of the caller's own, to show the transaction is usable.
    async fn usable(&self, tx: &mut Self::Tx) -> bool;
}

/// A fresh key.
fn key(name: &str) -> String {
    super::key(name).as_str().to_owned()
}

/// Whether an ordinary client's one attempt takes `key` (and gives it back). A held key
/// answers `None`, or, on SQLite, whose whole database a transaction holding a key keeps
/// locked, `Unavailable` once its busy timeout passes.
async fn acquired<D: TxDb>(client: &LockClient, key: &str) -> bool {
    match client.lock(key).try_acquire().await {
        Ok(Some(guard)) => {
            guard.release().await.unwrap();
            true
        }
        Ok(None) => false,
        Err(LockError::Unavailable { .. }) if D::LOCKS_THE_STORE => false,
        Err(e) => panic!("{e:?}"),
    }
}

/// What `client` sees of `lock`'s key while the transaction holds it: the hold, exclusive,
/// with the transaction's token and no remaining TTL where the database shows it
/// ([`TxDb::SHOWS_HOLD`]), else nothing.
async fn shows_hold<D: TxDb>(client: &LockClient, lock: &TransactionLock) {
    let shown = client.inspect_all(lock.key().as_str()).await.unwrap();
    if D::SHOWS_HOLD {
        let [hold] = shown.as_slice() else {
            panic!("one hold expected: {shown:?}");
        };
        assert_eq!(
            (hold.token, hold.remaining_ttl, hold.claim),
            (lock.token(), None, lockcore::Claim::exclusive()),
            "{hold:?}"
        );
    } else {
        assert!(shown.is_empty(), "{shown:?}");
    }
}

/// Moves 10 from account 1 to account 2 under the lock on `key` in `tx`.
async fn transfer<D: TxDb>(db: &D, tx: &mut D::Tx, key: &str) -> TransactionLock {
    let lock = db.lock_in(tx, key, Duration::from_secs(5)).await.unwrap();
    assert_eq!(lock.key().as_str(), key);
    assert!(db.fenced_add(tx, 1, -10, lock.token()).await);
    assert!(db.fenced_add(tx, 2, 10, lock.token()).await);
    lock
}

/// A rollback ends the lock and takes the writes back; a commit ends it and keeps them.
pub async fn ends_with_the_transaction<D: TxDb>() {
    let db = D::start().await;
    let other = db.client().await;
    let k = key("ends");

    let mut tx = db.begin().await;
    let lock = transfer(&db, &mut tx, &k).await;
    shows_hold::<D>(&other, &lock).await;
    assert!(!acquired::<D>(&other, &k).await, "held");
    D::rollback(tx).await;
    assert_eq!((db.balance(1).await, db.balance(2).await), (100, 100));
    assert_eq!(other.inspect_all(&k).await.unwrap(), vec![], "free");
    let guard = other.lock(&k).try_acquire().await.unwrap();
    guard
        .expect("free after the rollback")
        .release()
        .await
        .unwrap();

    let mut tx = db.begin().await;
    let lock = transfer(&db, &mut tx, &k).await;
    shows_hold::<D>(&other, &lock).await;
    assert!(!acquired::<D>(&other, &k).await, "held");
    D::commit(tx).await;
    assert_eq!((db.balance(1).await, db.balance(2).await), (90, 110));
    assert_eq!(other.inspect_all(&k).await.unwrap(), vec![], "free");
    let guard = other.lock(&k).try_acquire().await.unwrap();
    guard
        .expect("free after the commit")
        .release()
        .await
        .unwrap();
}

/// Two transactions exclude each other; the second's wait ends at its deadline, and it
/// takes the key once the first ends.
pub async fn transactions_exclude_each_other<D: TxDb>() {
    let db = D::start().await;
    let k = key("two");
    let mut first = db.begin().await;
    let mut second = db.begin().await;
    let held = db
        .lock_in(&mut first, &k, Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(db.try_lock_in(&mut second, &k).await.unwrap(), None);
    let started = Instant::now();
    let wait = Duration::from_millis(300);
    match db.lock_in(&mut second, &k, wait).await {
        Err(LockError::Timeout { waited, .. }) => assert!(waited >= wait, "{waited:?}"),
        other => panic!("expected a timeout, got {other:?}"),
    }
    let took = started.elapsed();
    assert!(
        took >= wait && took < wait + Duration::from_secs(2),
        "{took:?}"
    );
    assert!(
        db.usable(&mut second).await,
        "a refused wait leaves the transaction usable"
    );

    // The second waits while the first ends.
    let waiter = async {
        let lock = db.lock_in(&mut second, &k, Duration::from_secs(10)).await;
        (lock, Instant::now())
    };
    let ender = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        D::commit(first).await;
        Instant::now()
    };
    let ((lock, taken), ended) = tokio::join!(waiter, ender);
    let lock = lock.unwrap();
    assert!(taken >= ended, "taken before the first transaction ended");
    assert!(
        taken - ended < Duration::from_secs(2),
        "{:?}",
        taken - ended
    );
    assert!(lock.token() > held.token(), "{lock:?} after {held:?}");
    D::rollback(second).await;
}

/// A lease holder's token, then the transaction's, then the next lease holder's rise; a
/// write with the older token is refused.
pub async fn tokens_rise_and_fence<D: TxDb>() {
    let db = D::start().await;
    let other = db.client().await;
    let k = key("tokens");
    let before = other.lock(&k).try_acquire().await.unwrap().unwrap();
    let old = before.token();
    before.release().await.unwrap();

    let mut tx = db.begin().await;
    let lock = transfer(&db, &mut tx, &k).await;
    assert!(lock.token() > old, "{lock:?} after {old:?}");
    // A paused older holder's write, in the same transaction's view: refused.
    assert!(!db.fenced_add(&mut tx, 1, -1000, old).await);
    D::commit(tx).await;
    assert_eq!(db.balance(1).await, 90);

    let after = other.lock(&k).try_acquire().await.unwrap().unwrap();
    assert!(after.token() > lock.token(), "{after:?} after {lock:?}");
    after.release().await.unwrap();
    let mut tx = db.begin().await;
    assert!(!db.fenced_add(&mut tx, 2, 1000, old).await, "a stale token");
    D::rollback(tx).await;
}

/// An ordinary holder keeps a transaction out until it releases, and a transaction keeps
/// an ordinary client out until it ends.
pub async fn leases_and_transactions_exclude_each_other<D: TxDb>() {
    let db = D::start().await;
    let other = db.client().await;
    let k = key("mixed");

    // Refused by a lease, a transaction keeps nothing in the key's way.
    let guard = other.lock(&k).try_acquire().await.unwrap().unwrap();
    let mut tx = db.begin().await;
    assert_eq!(db.try_lock_in(&mut tx, &k).await.unwrap(), None);
    let wait = Duration::from_millis(200);
    assert!(matches!(
        db.lock_in(&mut tx, &k, wait).await,
        Err(LockError::Timeout { .. })
    ));
    guard.release().await.unwrap();
    let again = other.lock(&k).try_acquire().await.unwrap();
    again
        .expect("nothing left by the refused transaction")
        .release()
        .await
        .unwrap();
    let guard = other.lock(&k).try_acquire().await.unwrap().unwrap();
    // A release wakes the transaction's wait.
    let (lock, released) = tokio::join!(db.lock_in(&mut tx, &k, Duration::from_secs(10)), async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let token = guard.token();
        guard.release().await.unwrap();
        (Instant::now(), token)
    });
    let lock = lock.unwrap();
    assert!(lock.token() > released.1);
    assert!(released.0.elapsed() < Duration::from_secs(2));

    // The transaction holds: an ordinary client is kept out, whatever it claims, and gets
    // it after the end.
    assert!(!matches!(other.lock(&k).try_acquire().await, Ok(Some(_))));
    assert!(!matches!(
        other.lock(&k).shared().try_acquire().await,
        Ok(Some(_))
    ));
    assert!(!matches!(
        other.semaphore(&k, 3).try_acquire().await,
        Ok(Some(_))
    ));
    let waiting = other.lock(&k).wait(Duration::from_secs(10)).acquire();
    let ending = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        D::rollback(tx).await;
        Instant::now()
    };
    let (guard, ended) = tokio::join!(waiting, ending);
    let guard = guard.unwrap();
    assert!(
        ended.elapsed() < Duration::from_secs(3),
        "{:?}",
        ended.elapsed()
    );
    assert!(guard.token() > lock.token());
    guard.release().await.unwrap();
}

/// A lease client that waits without a deadline, longer than the store's limit for a
/// row's lock (MySQL's 1 s on the backend's sessions) and long enough that its attempts
/// mark the key as its next turn, keeps waiting while a transaction holds the key, and
/// takes it once the transaction ends.
pub async fn lease_waiter_outlasts_the_transaction<D: TxDb>() {
    let db = D::start().await;
    let other = db.client().await;
    let k = key("outlasted");
    let mut tx = db.begin().await;
    let lock = db
        .lock_in(&mut tx, &k, Duration::from_secs(5))
        .await
        .unwrap();
    // No deadline, so a failure is answered at once rather than retried until one passes;
    // except on SQLite, where a transaction holding a key keeps the whole file's write lock,
    // and a claim meeting it fails `Unavailable` (retried within a deadline, as documented).
    let lock_of_other = other.lock(&k);
    let lock_of_other = if D::LOCKS_THE_STORE {
        lock_of_other.wait(Duration::from_secs(20))
    } else {
        lock_of_other
    };
    let waiting = tokio::time::timeout(Duration::from_secs(20), lock_of_other.acquire());
    let ending = async {
        // The transaction's own work: longer than two of MySQL's row-lock waits.
        tokio::time::sleep(Duration::from_millis(2500)).await;
        D::commit(tx).await;
        Instant::now()
    };
    let (guard, ended) = tokio::join!(waiting, ending);
    let guard = guard
        .expect("waited 20 s")
        .expect("the waiter outlasts the transaction");
    assert!(
        ended.elapsed() < Duration::from_secs(3),
        "taken {:?} after the commit",
        ended.elapsed()
    );
    assert!(guard.token() > lock.token());
    guard.release().await.unwrap();
}

/// A wait dropped while it waits leaves the transaction usable, holding nothing.
pub async fn dropped_wait_holds_nothing<D: TxDb>() {
    let db = D::start().await;
    let k = key("dropped");
    let mut first = db.begin().await;
    db.lock_in(&mut first, &k, Duration::from_secs(1))
        .await
        .unwrap();
    let mut second = db.begin().await;
    let gave_up = tokio::time::timeout(
        Duration::from_millis(300),
        db.lock_in(&mut second, &k, Duration::from_secs(30)),
    )
    .await;
    assert!(gave_up.is_err(), "the wait was dropped");
    assert!(db.usable(&mut second).await);
    D::rollback(first).await;
    // The second holds nothing: a third transaction takes the key while it lives.
    let mut third = db.begin().await;
    assert!(db.try_lock_in(&mut third, &k).await.unwrap().is_some());
    assert!(db.usable(&mut second).await);
    D::rollback(third).await;
    D::rollback(second).await;
}

/// A transaction and two ordinary clients contend for one key: never two holders at once.
/// A transaction's attempt that finds the key taken between its look and its lock (MySQL,
/// SQLite) fails asking for a rollback, which it gets.
pub async fn mixed_contention_never_overlaps<D: TxDb>() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let db = D::start().await;
    let k = key("contention");
    let inside = AtomicBool::new(false);
    let (by_tx, by_lease) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let raced = AtomicUsize::new(0);
    let until = Instant::now() + Duration::from_secs(3);
    let watcher = db.client().await;
    let transactions = async {
        while Instant::now() < until {
            let mut tx = db.begin().await;
            match db.lock_in(&mut tx, &k, Duration::from_secs(5)).await {
                Ok(lock) => {
                    assert!(!inside.swap(true, Ordering::SeqCst), "two holders");
                    // Nor does the store hold a live lease of the key: it shows this
                    // transaction's hold alone, or nothing.
                    shows_hold::<D>(&watcher, &lock).await;
                    tokio::task::yield_now().await;
                    let n = by_tx.fetch_add(1, Ordering::SeqCst);
                    inside.store(false, Ordering::SeqCst);
                    // Most transactions commit; some roll back.
                    if n % 4 != 3 {
                        D::commit(tx).await;
                        continue;
                    }
                }
                Err(LockError::Backend { .. }) => {
                    // Taken between the look and the lock: roll back.
                    raced.fetch_add(1, Ordering::SeqCst);
                }
                Err(e) => panic!("{e:?}"),
            }
            D::rollback(tx).await;
        }
    };
    let client = |c: LockClient| {
        let (inside, by_lease, k) = (&inside, &by_lease, k.clone());
        async move {
            while Instant::now() < until {
                let wait = Duration::from_secs(10);
                let guard = match c.lock(&k).wait(wait).acquire().await {
                    Ok(guard) => guard,
                    Err(LockError::Unavailable { .. }) if D::LOCKS_THE_STORE => continue,
                    Err(e) => panic!("{e:?}"),
                };
                assert!(!inside.swap(true, Ordering::SeqCst), "two holders");
                tokio::task::yield_now().await;
                by_lease.fetch_add(1, Ordering::SeqCst);
                inside.store(false, Ordering::SeqCst);
                guard.release().await.unwrap();
            }
        }
    };
    let (a, b) = (db.client().await, db.client().await);
    tokio::join!(transactions, client(a), client(b));
    let (by_tx, by_lease) = (by_tx.into_inner(), by_lease.into_inner());
    let raced = raced.into_inner();
    eprintln!("{by_tx} grants to transactions, {by_lease} to leases, {raced} raced");
    // A waiting transaction marks the key as its next turn: the race is the exception
    // (about one attempt in eight here; most attempts without the mark).
    assert!(raced <= by_tx, "{raced} races for {by_tx} grants");
    assert!(
        by_tx > 0 && by_lease > 0,
        "{by_tx} by transactions, {by_lease} by leases"
    );
}

/// Bad keys are refused before anything is sent.
pub async fn bad_keys<D: TxDb>() {
    let db = D::start().await;
    let mut tx = db.begin().await;
    for bad in ["", "a\0b", &"k".repeat(300)] {
        let refused = db.try_lock_in(&mut tx, bad).await;
        assert!(
            matches!(refused, Err(LockError::InvalidKey { .. })),
            "{refused:?}"
        );
    }
    assert!(db.usable(&mut tx).await);
    D::rollback(tx).await;
}

/// One test per scenario for the `TxDb` `$db`, each within a minute.
#[macro_export]
macro_rules! transaction_tests {
    ($db:ty) => {
        mod in_transaction {
            use super::*;
            use common::transaction as t;

            async fn within(check: impl std::future::Future<Output = ()>) {
                tokio::time::timeout(std::time::Duration::from_secs(60), check)
                    .await
                    .unwrap()
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn ends_with_the_transaction() {
                within(t::ends_with_the_transaction::<$db>()).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn transactions_exclude_each_other() {
                within(t::transactions_exclude_each_other::<$db>()).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn tokens_rise_and_fence() {
                within(t::tokens_rise_and_fence::<$db>()).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn leases_and_transactions_exclude_each_other() {
                within(t::leases_and_transactions_exclude_each_other::<$db>()).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn lease_waiter_outlasts_the_transaction() {
                within(t::lease_waiter_outlasts_the_transaction::<$db>()).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn dropped_wait_holds_nothing() {
                within(t::dropped_wait_holds_nothing::<$db>()).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn mixed_contention_never_overlaps() {
                within(t::mixed_contention_never_overlaps::<$db>()).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn bad_keys() {
                within(t::bad_keys::<$db>()).await;
            }
        }
    };
}
