//! The lock operations over one lock table, written once for every dialect: which statement
//! each operation runs with which values, and what its answer means.

use std::collections::HashSet;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use lockcore::driver::{AcquireOutcome, Contention, Grant};
use lockcore::{Claim, LockError, LockKey, Owner, ReleaseOutcome};

use crate::db::{Db, Execute, IntRows, Ints, Labelled};
use crate::dialect::{DbOf, Dialect, Upsert};
use crate::gc::GcTimer;
use crate::run::Run;
use crate::store::{Bound, Call, Statements, Value, Values};
use crate::units::{micros, token, ttl_micros};

/// The state statement's answer: label, fence, remaining microseconds (until the soonest
/// lease expires, for a key held by shared leases), and the capacity of a key held by
/// shared leases (0 for an exclusive holder).
pub(crate) type State = (String, i64, i64, i64);

/// A lock table: its statements, where they run, and the garbage collector's timer.
#[derive(Debug)]
pub(crate) struct Store<D: Dialect> {
    pub(crate) run: D::Run,
    pub(crate) sql: Statements,
    gc: GcTimer,
    /// The owners this store granted shared leases to, by key.
    pub(crate) leased: Leased,
    /// Where batch renewals run, if not on [`run`](Self::run) (see [`Batches`]).
    pub(crate) batches: Option<Batches<D::Run>>,
}

/// Connections for batch renewals alone, whose sessions carry a time limit of their own
/// (PostgreSQL: `statement_timeout` in their connect options): a batch allowed at least
/// that long runs as it is, in one round trip, and no other statement (a claim waiting
/// for a row, the garbage collector, the migration) is held to it.
#[derive(Debug)]
pub(crate) struct Batches<R> {
    pub(crate) run: R,
    /// The limit every statement of these sessions runs under.
    pub(crate) limit: Duration,
}

/// The backend remembers which (key, owner) pairs it granted a shared lease to
/// ([`Leased`]), so a release or a renewal of a lease goes straight to the leases table
/// instead of first paying the exclusive statement's miss. Only a hint: both paths are
/// owner-checked and each falls back to the other, so a pair missing here (a lease granted
/// by another process, or forgotten) or one left behind costs a round trip, never
/// correctness.
///
/// How many pairs the hint remembers before it starts over: a hold whose lease was lost and
/// never released would otherwise stay forever. 8 bytes each.
const MAX_PAIRS: usize = 1 << 20;

/// The pairs, as hashes of key and owner token.
#[derive(Debug, Default)]
pub(crate) struct Leased {
    hasher: RandomState,
    set: Mutex<HashSet<u64>>,
}

impl Leased {
    fn hash(&self, key: &LockKey, owner: &Owner) -> u64 {
        (self.hasher).hash_one((key.as_bytes(), owner.token().as_bytes()))
    }

    fn set(&self) -> MutexGuard<'_, HashSet<u64>> {
        // The set is a hint: a panic elsewhere while it was locked leaves it usable.
        self.set.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The owner was granted (or re-granted) a lease on `key`.
    pub(crate) fn insert(&self, key: &LockKey, owner: &Owner) {
        let hash = self.hash(key, owner);
        let mut set = self.set();
        if set.len() >= MAX_PAIRS {
            set.clear();
        }
        set.insert(hash);
    }

    /// Whether the owner was granted a lease on `key` that it has not released.
    pub(crate) fn contains(&self, key: &LockKey, owner: &Owner) -> bool {
        let set = self.set();
        // Most backends never grant a lease: no hashing for their renewals and releases.
        !set.is_empty() && set.contains(&self.hash(key, owner))
    }

    /// The owner's lease on `key` is gone (released, or found lost).
    pub(crate) fn remove(&self, key: &LockKey, owner: &Owner) {
        let hash = self.hash(key, owner);
        self.set().remove(&hash);
    }
}

impl<D: Dialect> Store<D> {
    pub(crate) fn new(run: D::Run, sql: Statements, gc_grace: Duration) -> Self {
        Store {
            run,
            sql,
            gc: GcTimer::new(gc_grace),
            leased: Leased::default(),
            batches: None,
        }
    }

    /// Runs batch renewals on `batches` (see [`Batches`]).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn batches(mut self, batches: Batches<D::Run>) -> Self {
        self.batches = Some(batches);
        self
    }

    /// The live lock on `key`: label, fence, remaining microseconds, shared capacity (see
    /// [`State`]).
    pub(crate) async fn state(&self, key: &LockKey) -> Result<Option<State>, LockError> {
        let rows = self.labelled(&self.sql.state, &Values::key(key)).await?;
        match rows.into_iter().next() {
            None => Ok(None),
            Some((label, ints)) => match ints.as_slice() {
                &[fence, remaining, capacity] => Ok(Some((label, fence, remaining, capacity))),
                _ => Err(self.run.error(crate::error::shape("state"))),
            },
        }
    }

    pub(crate) async fn acquire(
        &self,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<AcquireOutcome, LockError> {
        // A hold taken now is renewed within a third of its TTL: the batch renewals'
        // session is opened before then, not by the first renewal, which may wait only a
        // quarter of the TTL.
        if let Some(batches) = &self.batches {
            batches.run.warm();
        }
        let mut values = Values::new(key, owner);
        values.ttl = ttl_micros(ttl);
        let granted = |fence| Ok(AcquireOutcome::Acquired(Grant::new(token(fence), ttl)));
        let held = |remaining| Ok(AcquireOutcome::Held(Contention::new(remaining)));
        if let Some(read) = D::UPSERT {
            let bound = values.bind(&self.sql.acquire.params);
            let call = Call {
                statement: &self.sql.acquire.sql,
                values: &bound,
            };
            let done = self.run.run(Execute, call).await?;
            return match read(&done) {
                Upsert::Granted(fence) => granted(fence),
                Upsert::Held(remaining) => held(Some(micros(remaining))),
                Upsert::Claim => self.claim(key, owner, ttl, Claim::exclusive()).await,
            };
        }
        if let Some(&[fence, ..]) = self.call(&self.sql.acquire, &values).await?.as_deref() {
            return granted(fence);
        }
        // Held by another exclusive holder: today's answer. Anything else (held by leases,
        // held back by a reservation, a capacity to check, or released meanwhile) is the
        // claim call's to decide.
        match self.state(key).await? {
            Some((_, _, remaining, 0)) => held(Some(micros(remaining))),
            _ => self.claim(key, owner, ttl, Claim::exclusive()).await,
        }
    }

    /// Marks `key` as the next turn of `owner`, whose request has waited `waited` (see
    /// [`Statements::mark`]): the mark lives `ttl`, or
    /// [`lockcore::driver::STARVING_MARK_TTL`] if shorter, unless renewed.
    pub(crate) async fn mark(
        &self,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
        waited: Duration,
    ) -> Result<(), LockError> {
        let mut values = Values::new(key, owner);
        values.ttl = ttl_micros(ttl.min(lockcore::driver::STARVING_MARK_TTL));
        values.waited = ttl_micros(waited);
        self.changed(&self.sql.mark, &values).await?;
        Ok(())
    }

    /// Releases the owner's lock; the first release, then one a minute at most, also starts
    /// a garbage collection in the background.
    pub(crate) async fn release(
        self: &Arc<Self>,
        key: &LockKey,
        owner: &Owner,
    ) -> Result<ReleaseOutcome, LockError> {
        // A lease this store granted goes straight to the leases table; anything else
        // tries the owner's exclusive lock first, then its lease.
        let leased = self.leased.contains(key, owner);
        let values = Values::new(key, owner);
        let mut outcome = if leased {
            self.release_lease(key, owner).await?
        } else {
            ReleaseOutcome::NotHeld
        };
        if outcome == ReleaseOutcome::NotHeld && self.changed(&self.sql.release, &values).await? {
            outcome = ReleaseOutcome::Released;
        }
        if outcome == ReleaseOutcome::NotHeld && !leased {
            // Not the owner's exclusive lock: perhaps its lease.
            outcome = self.release_lease(key, owner).await?;
        }
        // Only a pair the hint holds needs forgetting: the exclusive path pays no hash twice.
        if leased {
            self.leased.remove(key, owner);
        }
        self.collect_garbage();
        Ok(outcome)
    }

    /// Runs `bound` with `values`: the first row it answered.
    pub(crate) async fn call(
        &self,
        bound: &Bound,
        values: &Values<'_>,
    ) -> Result<Option<Vec<i64>>, LockError> {
        let values = values.bind(&bound.params);
        let call = Call {
            statement: &bound.sql,
            values: &values,
        };
        Ok(self.run.run(IntRows, call).await?.into_iter().next())
    }

    /// Runs `bound`, which only reads, with `values`: every row, a label and integers.
    pub(crate) async fn labelled(
        &self,
        bound: &Bound,
        values: &Values<'_>,
    ) -> Result<Vec<(String, Ints)>, LockError> {
        let values = values.bind(&bound.params);
        let call = Call {
            statement: &bound.sql,
            values: &values,
        };
        self.run.run(Labelled, call).await
    }

    /// Runs `bound` with `values`: whether it changed a row.
    pub(crate) async fn changed(
        &self,
        bound: &Bound,
        values: &Values<'_>,
    ) -> Result<bool, LockError> {
        let values = values.bind(&bound.params);
        let call = Call {
            statement: &bound.sql,
            values: &values,
        };
        let done = self.run.run(Execute, call).await?;
        Ok(DbOf::<D>::rows_affected(&done) > 0)
    }

    fn collect_garbage(self: &Arc<Self>) {
        if !self.gc.due() {
            return;
        }
        let store = self.clone();
        tokio::spawn(async move {
            let values = [Value::Int(store.gc.grace_micros())];
            let rows = Call {
                statement: &store.sql.gc,
                values: &values,
            };
            let leases = Call {
                statement: &store.sql.claims.gc,
                values: &[],
            };
            let calls = [("lock rows", rows), ("expired leases", leases)];
            for (what, call) in calls {
                match store.run.collect(D::GC, call).await {
                    Ok(rows) => tracing::debug!(rows, "{} {what} collected", D::NAME),
                    Err(e) => {
                        tracing::debug!(error = %lockcore::ErrorChain(&*e), "{} lock garbage collection failed", D::NAME)
                    }
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_pairs_until_removed() {
        let leased = Leased::default();
        let (a, b) = (LockKey::new("a").unwrap(), LockKey::new("b").unwrap());
        let (me, you) = (Owner::new("me"), Owner::new("you"));
        leased.insert(&a, &me);
        assert!(leased.contains(&a, &me));
        assert!(!leased.contains(&b, &me));
        assert!(!leased.contains(&a, &you));
        leased.remove(&a, &me);
        assert!(!leased.contains(&a, &me));
    }
}
