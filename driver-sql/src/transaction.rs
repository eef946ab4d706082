//! A lock inside the caller's transaction: taken on the application's own sqlx
//! transaction, held until that transaction commits or rolls back, with nothing to renew
//! or release (see `docs/sql.md`, "Locks inside a transaction").
//!
//! What holds the key is the database's own lock, owned by the transaction, so it ends
//! with it whatever happens to the process:
//!
//! * PostgreSQL: the key's gate, a transaction-scoped advisory lock
//!   (`pg_try_advisory_xact_lock`) that every claim of the key also takes, shared, for its
//!   own statement (`store/postgres/gate.sql`);
//! * MySQL/MariaDB: the key's row, locked `FOR UPDATE` by the transaction, which every claim
//!   of the key must lock to decide;
//! * SQLite: the key's row written by the transaction, which so holds the database's
//!   write lock.
//!
//! Each grant moves the key's fence on, so the token it answers is above every earlier
//! holder's, and every later holder's token is above it.

use std::future::Future;
use std::time::Duration;

use lockcore::{FencingToken, LockError, LockKey, Owner};
use tokio::time::Instant;

use crate::db::{Db, Ints};
use crate::store::{Bound, Call, Values};

/// How long a wait for a key that another transaction holds naps at most before it looks
/// again: a transaction's end announces nothing when it rolls back (PostgreSQL announces
/// a commit). PostgreSQL's claim function answers its refusal with the same figure
/// (`store/postgres/claim.sql`).
pub(crate) const TRANSACTION_POLL: Duration = Duration::from_millis(50);

/// How long the reservation of a transaction refused by a lease lives (MySQL, SQLite):
/// the key's next turn is the transaction's, so no lease is granted between its look and
/// its lock. Short, because a transaction that took the key ends the reservation in its
/// own writes, which a rollback takes back: ordinary claims then wait for it to lapse.
pub(crate) const TRANSACTION_MARK: Duration = Duration::from_millis(100);

/// How much longer than it has a transaction says it waited when it marks a key as its next
/// turn: its reservation then goes before those of lease claims waiting (which record how
/// long they waited), so one is granted to none of them between the transaction's look and
/// its lock. Lease claims wait for a waiting transaction; transactions take turns by the
/// order they marked.
#[cfg(any(feature = "mysql", feature = "sqlite"))]
pub(crate) const TRANSACTION_PRECEDENCE: Duration = Duration::from_secs(3600);

/// The label of a transaction's owner: the owner of the reservation a waiting transaction
/// keeps in the store (MySQL, SQLite), and the holder `holders` shows for a transaction's
/// hold (PostgreSQL).
pub(crate) const LABEL: &str = "(transaction)";

/// A lock held by a database transaction: the key and its fencing token. It ends when the
/// transaction ends, commit or rollback; there is nothing to renew or release.
///
/// Bind [`token`](Self::token) in the transaction's own writes (`… WHERE fence <= $token`)
/// so that a write of an older holder is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransactionLock {
    key: LockKey,
    token: FencingToken,
}

impl TransactionLock {
    /// The key held.
    pub fn key(&self) -> &LockKey {
        &self.key
    }

    /// The fencing token of this hold: above every earlier holder's of the key, and below
    /// every later one's.
    pub fn token(&self) -> FencingToken {
        self.token
    }
}

/// One attempt to take a key inside a transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// Taken, with this fence.
    Taken(i64),
    /// Held: by a lease for this long still, or by a transaction (`None`).
    Held(Option<Duration>),
}

/// What a backend does to take a key inside a transaction of connection type `Conn`.
pub(crate) trait TakeInTransaction: Sync {
    /// A connection in a transaction.
    type Conn: Send;

    /// One attempt by the transaction's `owner`, which has waited `waited` so far: the key
    /// taken for the transaction, or held. A refused attempt leaves the transaction as it
    /// found it; one refused by a lease may leave a reservation for `owner` in the store,
    /// which [`give_up`] ends.
    ///
    /// [`give_up`]: TakeInTransaction::give_up
    fn attempt<'a>(
        &'a self,
        conn: &'a mut Self::Conn,
        key: &'a LockKey,
        owner: &'a Owner,
        waited: Duration,
    ) -> impl Future<Output = Result<Attempt, LockError>> + Send + 'a;

    /// The wait of `owner` for `key` ended without it: drop what the store keeps for it.
    fn give_up<'a>(
        &'a self,
        key: &'a LockKey,
        owner: &'a Owner,
    ) -> impl Future<Output = Result<(), LockError>> + Send + 'a;

    /// Waits until `key`, held by a lease, is probably free or `nap` passes.
    fn nap<'a>(
        &'a self,
        key: &'a LockKey,
        nap: Duration,
    ) -> impl Future<Output = Result<(), LockError>> + Send + 'a;
}

/// One attempt to take `key` inside the transaction of `conn`: `Ok(None)` when held.
pub(crate) async fn try_lock_in<B: TakeInTransaction>(
    backend: &B,
    conn: &mut B::Conn,
    key: &str,
) -> Result<Option<TransactionLock>, LockError> {
    let key = LockKey::new(key)?;
    let owner = Owner::new(LABEL);
    match backend.attempt(conn, &key, &owner, Duration::ZERO).await? {
        Attempt::Taken(fence) => Ok(Some(taken(key, fence))),
        Attempt::Held(lease) => {
            give_up(backend, &key, &owner, lease.is_some()).await;
            Ok(None)
        }
    }
}

/// Takes `key` inside the transaction of `conn`, attempting until one attempt takes it or
/// `wait` passes ([`LockError::Timeout`]). An attempt in flight when `wait` passes is
/// answered.
pub(crate) async fn lock_in<B: TakeInTransaction>(
    backend: &B,
    conn: &mut B::Conn,
    key: &str,
    wait: Duration,
) -> Result<TransactionLock, LockError> {
    let key = LockKey::new(key)?;
    let owner = Owner::new(LABEL);
    let started = Instant::now();
    let mut marked = false;
    loop {
        let attempt = backend.attempt(conn, &key, &owner, started.elapsed());
        let held = match attempt.await? {
            Attempt::Taken(fence) => return Ok(taken(key, fence)),
            Attempt::Held(remaining) => remaining,
        };
        marked |= held.is_some();
        let waited = started.elapsed();
        if waited >= wait {
            give_up(backend, &key, &owner, marked).await;
            return Err(LockError::Timeout { key, waited });
        }
        let left = wait - waited;
        match held {
            // A lease's holder may release it sooner: the wait then ends at once. A
            // reservation the attempt made lives TRANSACTION_MARK: renewed in time.
            Some(lease) => {
                // (At least a millisecond, not to spin on a lease about to end; never past
                // the deadline, which may be nearer.)
                let nap = lease.clamp(Duration::from_millis(1), TRANSACTION_MARK / 2);
                backend.nap(&key, nap.min(left)).await?
            }
            // A transaction's end is announced only by a commit on PostgreSQL, and the
            // key looks free to a wait for a release meanwhile: look again after a pause.
            None => tokio::time::sleep(TRANSACTION_POLL.min(left)).await,
        }
    }
}

/// What the backend's own look found before a transaction's attempt (MySQL, SQLite).
#[cfg(any(feature = "mysql", feature = "sqlite"))]
pub(crate) enum Look {
    /// The key's row is free, or reserved for the transaction's owner.
    Free,
    /// The key has no row.
    Missing,
    /// Held by a lease or another owner's reservation: the attempt's answer.
    Held(Attempt),
}

/// Runs the dialect's `look` statement (`[1, µs]` held, `[0, _]` free, no row when the key
/// has none) for the transaction's `owner`, which has waited `waited`. A held key becomes
/// the transaction's next turn, so no lease is granted between a later look that finds it
/// free and the lock (see [`TRANSACTION_PRECEDENCE`]).
#[cfg(any(feature = "mysql", feature = "sqlite"))]
pub(crate) async fn look<D: crate::dialect::Dialect>(
    store: &crate::backend::lock::Store<D>,
    look: &Bound,
    key: &LockKey,
    owner: &Owner,
    waited: Duration,
) -> Result<Look, LockError> {
    use crate::run::Run;
    match store.call(look, &Values::new(key, owner)).await?.as_deref() {
        Some(&[1, remaining]) => {
            let waited = waited + TRANSACTION_PRECEDENCE;
            store.mark(key, owner, TRANSACTION_MARK, waited).await?;
            let lease = crate::units::micros(remaining);
            Ok(Look::Held(Attempt::Held(Some(lease))))
        }
        Some(&[0, _]) => Ok(Look::Free),
        Some(_) => Err(store.run.error(crate::error::shape("look"))),
        None => Ok(Look::Missing),
    }
}

/// The error of a transaction that locked or wrote `key`'s row after a lease took it since
/// the look (MySQL, SQLite): it keeps what it took until it ends.
#[cfg(any(feature = "mysql", feature = "sqlite"))]
pub(crate) fn taken_meanwhile(backend: &'static str, key: &LockKey) -> LockError {
    LockError::backend(
        backend,
        format!(
            "the lock {:?} was taken by another holder while this transaction took its row, \
             which the transaction now keeps until it ends, in that holder's way: roll the \
             transaction back and try again",
            key.as_str()
        ),
    )
}

/// Drops what the store keeps for `owner`'s wait for `key`, if an attempt found the key
/// held by a lease (the only refusal that may leave a reservation). It lapses on its own
/// within [`TRANSACTION_MARK`] anyway: a failure is only logged.
async fn give_up<B: TakeInTransaction>(backend: &B, key: &LockKey, owner: &Owner, marked: bool) {
    if !marked {
        return;
    }
    if let Err(e) = backend.give_up(key, owner).await {
        tracing::debug!(key = %key, error = %lockcore::ErrorChain(&e), "a transaction's wait left its reservation to lapse");
    }
}

/// Runs `bound` with `values` on the caller's connection `conn`: its rows of integers.
pub(crate) async fn ints<DB: Db>(
    conn: &mut DB::Connection,
    bound: &Bound,
    values: &Values<'_>,
) -> Result<Vec<Ints>, sqlx::Error> {
    let bound_values = values.bind(&bound.params);
    let call = Call {
        statement: &bound.sql,
        values: &bound_values,
    };
    DB::ints(conn, call).await
}

/// Runs `bound` with `values` on the caller's connection `conn`: its result.
#[cfg_attr(not(feature = "mysql"), allow(dead_code))]
pub(crate) async fn execute<DB: Db>(
    conn: &mut DB::Connection,
    bound: &Bound,
    values: &Values<'_>,
) -> Result<DB::QueryResult, sqlx::Error> {
    let bound_values = values.bind(&bound.params);
    let call = Call {
        statement: &bound.sql,
        values: &bound_values,
    };
    DB::execute(conn, call).await
}

fn taken(key: LockKey, fence: i64) -> TransactionLock {
    let token = crate::units::token(fence);
    TransactionLock { key, token }
}

/// Implements `lock_in` and `try_lock_in` for `$backend`, whose transactions are
/// `sqlx::Transaction<'_, $db>`; `$example` is the documentation's example.
macro_rules! transaction_locks {
    ($backend:ty, $db:ty, $example:literal) => {
        impl $backend {
            /// Takes `key` inside the transaction `tx`, waiting at most `wait`: the lock is
            /// held until `tx` commits or rolls back, and there is nothing to renew or
            /// release. It excludes every other holder of the key, lease or transaction,
            /// as theirs exclude it. Exclusive only: read-write locks and semaphores are
            /// not offered inside a transaction (see `docs/sql.md`).
            ///
            /// The token is above every earlier holder's: bind it in the transaction's
            /// writes (`UPDATE … SET fence = $token … WHERE fence <= $token`).
            ///
            /// # Cancel safety
            ///
            /// Dropping the future while it waits between attempts leaves `tx` as it was,
            /// usable, holding nothing. Dropping it while an attempt is in flight (one
            /// or two round trips) leaves `tx` usable, but the attempt may have taken the
            /// key: then `tx` holds it until it ends, as it holds every lock it took.
            /// Roll `tx` back if that matters.
            ///
            /// # Errors
            ///
            /// [`LockError::InvalidKey`](lockcore::LockError::InvalidKey) for a bad key;
            /// [`LockError::Timeout`](lockcore::LockError::Timeout) when `wait` passes
            /// with the key held; [`LockError::Unavailable`](lockcore::LockError::Unavailable)
            /// or [`LockError::Backend`](lockcore::LockError::Backend) when a statement
            /// fails (the transaction may then be unusable: roll it back). On MySQL and
            /// SQLite, a key taken by another holder between this attempt's check and its
            /// lock is a `Backend` error that says to roll back and try again: the
            /// transaction then keeps a lock in the key's way.
            ///
            /// # Examples
            ///
            #[doc = $example]
            pub async fn lock_in(
                &self,
                tx: &mut sqlx::Transaction<'_, $db>,
                key: &str,
                wait: std::time::Duration,
            ) -> Result<$crate::TransactionLock, lockcore::LockError> {
                $crate::transaction::lock_in(self, &mut **tx, key, wait).await
            }

            /// One attempt to take `key` inside the transaction `tx`: `Ok(None)` when it
            /// is held. As [`lock_in`](Self::lock_in) otherwise.
            ///
            /// # Cancel safety
            ///
            /// As [`lock_in`](Self::lock_in)'s attempts.
            ///
            /// # Errors
            ///
            /// As [`lock_in`](Self::lock_in), but never `Timeout`.
            pub async fn try_lock_in(
                &self,
                tx: &mut sqlx::Transaction<'_, $db>,
                key: &str,
            ) -> Result<Option<$crate::TransactionLock>, lockcore::LockError> {
                $crate::transaction::try_lock_in(self, &mut **tx, key).await
            }
        }
    };
}
pub(crate) use transaction_locks;
