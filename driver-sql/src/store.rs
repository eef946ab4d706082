//! The lock operations over one lock table, written once for every dialect: which statement
//! each operation runs with which values, and what its answer means.
//!
//! Batch renewals run under a time limit the server enforces. The watchdog gives a batch a
//! quarter of its shortest TTL and then gives up on it; a statement still running on the
//! server keeps its connection busy after that, and sqlx's ping of the connection handed
//! back waits for it. A batch planned as a nested loop over the whole table (PostgreSQL
//! statistics taken while every row had expired: 20 s per batch) so got every pool
//! connection stuck, and every hold was lost. So the server ends a batch itself at half the
//! watchdog's allowance ([`time_limit`]), whatever its plan:
//!
//! * MariaDB: `SET STATEMENT max_statement_time = … FOR` before each statement, in a
//!   comment only MariaDB runs (`/*M!…*/`; MySQL limits no `UPDATE`, and reads a comment);
//! * PostgreSQL: the batch connections' sessions carry a `statement_timeout` of their own
//!   ([`Batches`]), and a batch allowed less runs in a transaction that sets its own
//!   (`SET LOCAL`); a backend over an application's pool, whose sessions it does not
//!   know, always does.
//!
//! A batch the server ended answers an error for its holds, which the watchdog retries
//! soon, and its connection is free at once.

#[cfg(any(feature = "mysql", feature = "sqlite"))]
use std::future::Future;
#[cfg(any(feature = "mysql", feature = "sqlite"))]
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use lockcore::driver::{AcquireOutcome, Contention, ExtendOutcome, Grant, Renewal};
use lockcore::{Claim, LockError, LockKey, Owner, ReleaseOutcome};
use sqlx::Connection;

use crate::db::{Db, Execute, IntRows, Ints, Scalar, State, StateRow};
use crate::dialect::{BatchLimit, DbOf, Dialect, Outcomes, Upsert};
use crate::gc::GcTimer;
use crate::leased::Leased;
#[cfg(any(feature = "mysql", feature = "sqlite"))]
use crate::poll::{KeyState, Probe};
use crate::run::{Leased as _, Run};
use crate::statements::{sql, BatchRenewal, Call, Statements, Value, P};
use crate::units::{micros, token, ttl_micros};

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

/// The least time a batch renewal may run on the server. A batch takes well under a
/// millisecond on an idle server and tens of milliseconds on a loaded one: a limit of
/// 1 ms (a renewal of a 5 ms lease) ended healthy renewals on MariaDB ("max_statement_time
/// exceeded") while `scripts/test.sh` and two builds shared two cores. The limit is there
/// against plans that take seconds.
const MIN_TIME_LIMIT: Duration = Duration::from_millis(100);

/// The limit a batch renewing `renewals` runs under on the server: half of what the
/// watchdog allows it ([`lockcore::driver::renewal_allowance`] of the shortest TTL), which
/// leaves the other half for the wait for a connection, the network and a second statement
/// (MySQL), rounded down to one significant digit of milliseconds (so that few statement
/// texts arise: MariaDB's carries it), and at least [`MIN_TIME_LIMIT`].
fn time_limit(renewals: &[Renewal<'_>]) -> Duration {
    let shortest = renewals.iter().map(|r| r.ttl).min().unwrap_or_default();
    let ms = u64::try_from((lockcore::driver::renewal_allowance(shortest) / 2).as_millis())
        .unwrap_or(u64::MAX)
        .max(MIN_TIME_LIMIT.as_millis() as u64);
    let unit = 10u64.pow(ms.ilog10());
    Duration::from_millis(ms / unit * unit)
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
        // A hold taken now is renewed within a third of its TTL: the batch renewals'
        // session is opened before then, not by the first renewal, which may wait only a
        // quarter of the TTL.
        if let Some(batches) = &self.batches {
            batches.run.warm();
        }
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
                // meanwhile) is the claim call's to decide.
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
        let lasts = ttl_micros(ttl.min(lockcore::driver::STARVING_MARK_TTL));
        let values: Vec<Value> = (self.sql.mark.params.iter())
            .map(|p| match p {
                P::Key => Value::Bytes(key.as_bytes()),
                P::Owner => Value::Bytes(owner.token().as_bytes().as_slice()),
                P::Ttl => Value::Int(lasts),
                _ => Value::Int(ttl_micros(waited)),
            })
            .collect();
        let call = Call {
            statement: &self.sql.mark.sql,
            values: &values,
        };
        self.run.run(Execute, call).await?;
        Ok(())
    }

    /// Renews many holds: the exclusive ones in one or two statements per batch
    /// ([`Statements::extend_many`](crate::statements::Statements::extend_many)), each
    /// ended by the server past its [`time_limit`]; shared leases, and holds the statement
    /// did not renew (lost, or a lease after all), one by one.
    pub(crate) async fn extend_many(
        &self,
        renewals: &[Renewal<'_>],
    ) -> Result<Vec<Result<ExtendOutcome, LockError>>, LockError> {
        if let Some(why) = self.run.moved() {
            // Renewed in a store nobody else reaches, a hold excludes nobody: lost.
            tracing::warn!(%why, holds = renewals.len(), "holds lost");
            return Ok(renewals
                .iter()
                .map(|_| Ok(ExtendOutcome::NotHeld))
                .collect());
        }
        let mut outcomes: Vec<Option<ExtendOutcome>> = vec![None; renewals.len()];
        let exclusive: Vec<usize> = (0..renewals.len())
            .filter(|&i| !self.leased.contains(renewals[i].key, renewals[i].owner))
            .collect();
        let limit = time_limit(renewals);
        for chunk in exclusive.chunks(lockcore::driver::RENEWAL_BATCH) {
            self.extend_rows(renewals, chunk, limit, &mut outcomes)
                .await?;
        }
        // The rest (usually none) one by one, all at once.
        let rest: Vec<usize> = (0..renewals.len())
            .filter(|&i| outcomes[i].is_none())
            .collect();
        let alone = rest.iter().map(|&i| async move {
            let renewal = &renewals[i];
            // Not the owner's exclusive lock: perhaps its lease.
            let outcome = self
                .extend_lease(renewal.key, renewal.owner, renewal.ttl)
                .await?;
            if outcome == ExtendOutcome::NotHeld {
                self.leased.remove(renewal.key, renewal.owner);
            }
            Ok(outcome)
        });
        let mut alone = futures_util::future::join_all(alone).await.into_iter();
        Ok(outcomes
            .into_iter()
            .map(|outcome| match outcome {
                Some(outcome) => Ok(outcome),
                None => alone.next().unwrap_or_else(|| {
                    Err(self
                        .run
                        .error(sqlx::Error::Protocol("a renewal went missing".into())))
                }),
            })
            .collect())
    }

    /// Runs the batch renewal over the renewals at `chunk` (indexes into `renewals`, at
    /// most [`lockcore::driver::RENEWAL_BATCH`]) under `limit`, recording each one it renewed in
    /// `outcomes`.
    async fn extend_rows(
        &self,
        renewals: &[Renewal<'_>],
        chunk: &[usize],
        limit: Duration,
        outcomes: &mut [Option<ExtendOutcome>],
    ) -> Result<(), LockError> {
        let rows = chunk.len().next_power_of_two();
        let Some(batch) = self.sql.extend_many.get(rows.trailing_zeros() as usize) else {
            return Err(self.run.error(sqlx::Error::Protocol(format!(
                "no batch renewal statement for {rows} rows"
            ))));
        };
        let mut values = Vec::with_capacity(4 * rows);
        for (n, &i) in chunk.iter().enumerate() {
            let renewal = &renewals[i];
            values.extend([
                Value::Int(n as i64 + 1),
                Value::Bytes(renewal.key.as_bytes()),
                Value::Bytes(renewal.owner.token().as_bytes().as_slice()),
                Value::Int(ttl_micros(renewal.ttl)),
            ]);
        }
        for _ in chunk.len()..rows {
            values.extend([
                Value::Int(0),
                Value::Bytes(b""),
                Value::Bytes(b""),
                Value::Int(0),
            ]);
        }
        let (run, session) = match &self.batches {
            Some(batches) => (&batches.run, Some(batches.limit)),
            None => (&self.run, None),
        };
        let answered = match D::BATCH_LIMIT {
            BatchLimit::Transaction(begin) if !matches!(session, Some(s) if s <= limit) => {
                in_transaction::<D>(run, begin(limit), batch, &values).await?
            }
            BatchLimit::Prefix(prefix) => {
                let prefix = prefix(limit);
                let limited = BatchRenewal {
                    update: (batch.update.as_ref()).map(|s| format!("{prefix}{s}").into()),
                    answer: format!("{prefix}{}", batch.answer).into(),
                };
                as_it_is(run, &limited, &values).await?
            }
            _ => as_it_is(run, batch, &values).await?,
        };
        for row in answered {
            let [n, fence] = row.as_slice() else {
                return Err(self.run.error(sqlx::Error::Protocol(
                    "a batch renewal answered a row of the wrong shape".into(),
                )));
            };
            let Some(&i) = usize::try_from(*n - 1).ok().and_then(|n| chunk.get(n)) else {
                return Err(self.run.error(sqlx::Error::Protocol(format!(
                    "a batch renewal answered row {n}, which it was not sent"
                ))));
            };
            outcomes[i] = Some(ExtendOutcome::Extended(Grant::new(
                token(*fence),
                renewals[i].ttl,
            )));
        }
        Ok(())
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

/// Runs `batch`'s statements on `run`, each a round trip of its own; the answer's rows.
async fn as_it_is<R: Run>(
    run: &R,
    batch: &BatchRenewal,
    values: &[Value<'_>],
) -> Result<Vec<Ints>, LockError> {
    if let Some(update) = &batch.update {
        let call = Call {
            statement: update,
            values,
        };
        run.renew(Execute, call).await?;
    }
    let call = Call {
        statement: &batch.answer,
        values,
    };
    run.renew(IntRows, call).await
}

/// Runs `batch`'s statements in a transaction of `run` opened by `begin`; the answer's
/// rows.
async fn in_transaction<D: Dialect>(
    run: &D::Run,
    begin: String,
    batch: &BatchRenewal,
    values: &[Value<'_>],
) -> Result<Vec<Ints>, LockError> {
    let mut lease = run.lease().await?;
    let result = async {
        let mut tx = lease.conn().begin_with(sql(&begin.into())).await?;
        if let Some(update) = &batch.update {
            let call = Call {
                statement: update,
                values,
            };
            DbOf::<D>::execute(&mut *tx, call).await?;
        }
        let call = Call {
            statement: &batch.answer,
            values,
        };
        let answered = DbOf::<D>::ints(&mut *tx, call).await?;
        tx.commit().await?;
        Ok(answered)
    }
    .await;
    lease.settle(&result);
    result.map_err(|e| run.error(e))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_is_half_the_watchdogs_allowance_rounded_down() {
        let key = LockKey::new("k").expect("a valid key");
        let owner = Owner::new("o");
        let limit = |ttls: &[u64]| {
            let renewals: Vec<Renewal<'_>> = (ttls.iter())
                .map(|&ms| Renewal::new(&key, &owner, Duration::from_millis(ms)))
                .collect();
            time_limit(&renewals).as_millis()
        };
        // An eighth of the shortest TTL, to one significant digit.
        assert_eq!(limit(&[30_000]), 3_000);
        assert_eq!(limit(&[60_000, 2_000, 10_000]), 200);
        assert_eq!(limit(&[15_000]), 1_000);
        // Never below the floor.
        assert_eq!(limit(&[2_000]), 200);
        assert_eq!(limit(&[1_000]), 100);
        assert_eq!(limit(&[100]), 100);
        assert_eq!(limit(&[1]), 100);
        assert_eq!(limit(&[]), 100);
    }
}
