//! The lock operations over one lock table, written once for every dialect: which statement
//! each operation runs with which values, and what its answer means.

#[cfg(any(feature = "mysql", feature = "sqlite"))]
use std::future::Future;
#[cfg(any(feature = "mysql", feature = "sqlite"))]
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use lockcore::{
    AcquireOutcome, Claim, Contention, ExtendOutcome, Grant, LockError, LockKey, Owner,
    ReleaseOutcome,
};

use crate::db::{Db, Execute, Scalar, State, StateRow};
use crate::dialect::{DbOf, Dialect, Outcomes, Upsert};
use crate::gc::GcTimer;
use crate::leased::Leased;
#[cfg(any(feature = "mysql", feature = "sqlite"))]
use crate::poll::{KeyState, Probe};
use crate::run::Run;
use crate::statements::{Call, Param, Statements, Value};
use crate::units::{micros, token, ttl_micros};

/// A lock table: its statements, where they run, and the garbage collector's timer.
#[derive(Debug)]
pub(crate) struct Store<D: Dialect> {
    pub(crate) run: D::Run,
    pub(crate) sql: Statements,
    gc: GcTimer,
    /// The owners this store granted shared leases to, by key.
    pub(crate) leased: Leased,
}

impl<D: Dialect> Store<D> {
    pub(crate) fn new(run: D::Run, sql: Statements, gc_grace: Duration) -> Self {
        Store {
            run,
            sql,
            gc: GcTimer::new(gc_grace),
            leased: Leased::default(),
        }
    }

    /// The live lock on `key`: label, fence, remaining microseconds, shared capacity (see
    /// [`State`]).
    pub(crate) async fn state(&self, key: &LockKey) -> Result<Option<State>, LockError> {
        let values = [Value::Bytes(key.as_bytes())];
        let call = Call {
            statement: &self.sql.state,
            values: &values,
        };
        let row = self.run.run(StateRow, call).await?;
        row.map(|row| DbOf::<D>::decode_state(&row))
            .transpose()
            .map_err(|e| self.run.error(e))
    }

    pub(crate) async fn acquire(
        &self,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<AcquireOutcome, LockError> {
        let values = [
            Value::Bytes(key.as_bytes()),
            Value::Bytes(owner.token().as_bytes().as_slice()),
            Value::Text(owner.label()),
            Value::Int(ttl_micros(ttl)),
        ];
        let call = Call {
            statement: &self.sql.acquire,
            values: &values,
        };
        let granted = |fence| Ok(AcquireOutcome::Acquired(Grant::new(token(fence), ttl)));
        let held = |remaining| Ok(AcquireOutcome::Held(Contention::new(remaining)));
        match D::OUTCOMES {
            Outcomes::Returning => {
                if let Some(fence) = self.run.run(Scalar, call).await? {
                    return granted(fence);
                }
                // Held by another exclusive holder: today's answer. Anything else (held by
                // leases, held back by a reservation, a capacity to check, or released
                // meanwhile) is the claim transaction's to decide.
                match self.state(key).await? {
                    Some((_, _, remaining, 0)) => held(Some(micros(remaining))),
                    _ => self.claim(key, owner, ttl, Claim::exclusive()).await,
                }
            }
            Outcomes::InResult { acquire, .. } => {
                let done = self.run.run(Execute, call).await?;
                match acquire(&done) {
                    Upsert::Granted(fence) => granted(fence),
                    Upsert::Held(remaining) => held(Some(micros(remaining))),
                    Upsert::Claim => self.claim(key, owner, ttl, Claim::exclusive()).await,
                }
            }
        }
    }

    pub(crate) async fn extend(
        &self,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<ExtendOutcome, LockError> {
        if self.leased.contains(key, owner) {
            let outcome = self.extend_lease(key, owner, ttl).await?;
            if outcome != ExtendOutcome::NotHeld {
                return Ok(outcome);
            }
            self.leased.remove(key, owner);
        }
        let values = D::EXTEND_PARAMS.map(|param| match param {
            Param::Key => Value::Bytes(key.as_bytes()),
            Param::Owner => Value::Bytes(owner.token().as_bytes().as_slice()),
            Param::Ttl => Value::Int(ttl_micros(ttl)),
        });
        let call = Call {
            statement: &self.sql.extend,
            values: &values,
        };
        let fence = match D::OUTCOMES {
            Outcomes::Returning => self.run.run(Scalar, call).await?,
            Outcomes::InResult { extend, .. } => extend(&self.run.run(Execute, call).await?),
        };
        match fence {
            Some(fence) => Ok(ExtendOutcome::Extended(Grant::new(token(fence), ttl))),
            // Not the owner's exclusive lock: perhaps its lease.
            None => self.extend_lease(key, owner, ttl).await,
        }
    }

    /// Releases the owner's lock; the first release, then one a minute at most, also starts
    /// a garbage collection in the background.
    pub(crate) async fn release(
        self: &Arc<Self>,
        key: &LockKey,
        owner: &Owner,
    ) -> Result<ReleaseOutcome, LockError> {
        let values = [
            Value::Bytes(key.as_bytes()),
            Value::Bytes(owner.token().as_bytes().as_slice()),
        ];
        // A lease this store granted goes straight to the leases table; anything else
        // tries the owner's exclusive lock first, then its lease.
        let leased = self.leased.contains(key, owner);
        let mut outcome = if leased {
            self.release_lease(key, owner).await?
        } else {
            ReleaseOutcome::NotHeld
        };
        if outcome == ReleaseOutcome::NotHeld {
            outcome = self.changed(&self.sql.release, &values).await?;
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

    /// Runs a release statement: released when it changed a row.
    async fn changed(
        &self,
        statement: &Arc<str>,
        values: &[Value<'_>],
    ) -> Result<ReleaseOutcome, LockError> {
        let call = Call { statement, values };
        let done = self.run.run(Execute, call).await?;
        Ok(if DbOf::<D>::rows_affected(&done) == 0 {
            ReleaseOutcome::NotHeld
        } else {
            ReleaseOutcome::Released
        })
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
            for (what, call) in [("lock rows", rows), ("expired leases", leases)] {
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

/// The poller's view of a key (MySQL, SQLite).
#[cfg(any(feature = "mysql", feature = "sqlite"))]
impl<D: Dialect> Probe for Store<D> {
    fn probe<'a>(
        &'a self,
        key: &'a LockKey,
    ) -> Pin<Box<dyn Future<Output = Result<KeyState, LockError>> + Send + 'a>> {
        Box::pin(async move {
            Ok(match self.state(key).await? {
                None => KeyState::Free,
                Some((_, fence, remaining, capacity)) => KeyState::Held {
                    fence,
                    remaining: micros(remaining),
                    shared: capacity != 0,
                },
            })
        })
    }
}
