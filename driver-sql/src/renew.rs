//! Renewal: batches of exclusive holds in one or two statements each, and the shared
//! leases this backend granted (see [`Leased`](crate::backend::lock::Leased)), renewed one by one.
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
//!   ([`Batches`](crate::backend::lock::Batches)), and a batch allowed less runs in a transaction that sets its own
//!   (`SET LOCAL`); a backend over an application's pool, whose sessions it does not
//!   know, always does.
//!
//! A batch the server ended answers an error for its holds, which the watchdog retries
//! soon, and its connection is free at once.

use std::time::Duration;

use lockcore::driver::{ExtendOutcome, Grant, Renewal};
use lockcore::LockError;
use sqlx::Connection;

use crate::backend::lock::Store;
use crate::db::{Db, Execute, IntRows, Ints};
use crate::dialect::{BatchLimit, DbOf, Dialect};
use crate::run::{Leased as _, Run};
use crate::store::{sql, BatchRenewal, Call, Value};
use crate::units::{token, ttl_micros};

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
    /// Renews many holds: the exclusive ones in one or two statements per batch
    /// ([`Statements::extend_many`](crate::store::Statements::extend_many)), each
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

#[cfg(test)]
mod tests {
    use super::*;
    use lockcore::{LockKey, Owner};

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
