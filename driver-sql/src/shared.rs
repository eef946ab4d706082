//! Shared claims over the leases table, written once for every dialect: each operation one
//! transaction that first locks the key's row in the lock table (so claims, releases and
//! renewals of one key take turns), then reads, decides ([`decide`]) and writes.
//!
//! The exclusive lock keeps its one-statement path (`store.rs`): while leases live, the
//! key's row is held by a marker owner until the latest lease expires, so the exclusive
//! statement sees the key held without reading the leases table.

use std::time::{Duration, Instant};

use lockcore::driver::{AcquireOutcome, Contention, ExtendOutcome, Grant, WaitHint};
use lockcore::{Claim, LockError, LockInfo, LockKey, Owner, ReleaseOutcome};
use sqlx::Connection;

use crate::db::{Db, IntRows, Labelled};
use crate::decide::{decide, Decision, LeaseSeen, Refusal, RowSeen};
use crate::dialect::{DbOf, Dialect};
use crate::run::{Conn, Leased, Run};
use crate::statements::{Bound, Call, Step, Value, P};
use crate::store::Store;
use crate::units::{micros, token, ttl_micros};

/// What the claim statements bind.
pub(crate) struct Values<'a> {
    key: &'a [u8],
    owner: &'a [u8],
    label: &'a str,
    weight: i64,
    pub(crate) token: i64,
    ttl: i64,
    capacity: i64,
}

impl<'a> Values<'a> {
    pub(crate) fn new(key: &'a LockKey, owner: &'a Owner) -> Self {
        Values {
            owner: owner.token().as_bytes().as_slice(),
            label: owner.label(),
            ..Values::key(key)
        }
    }

    /// The values of a statement that binds only the key.
    pub(crate) fn key(key: &'a LockKey) -> Self {
        Values {
            key: key.as_bytes(),
            owner: &[],
            label: "",
            weight: 0,
            token: 0,
            ttl: 0,
            capacity: 0,
        }
    }

    pub(crate) fn claim(mut self, ttl: Duration, claim: &Claim) -> Self {
        self.ttl = ttl_micros(ttl);
        self.weight = i64::try_from(claim.weight()).unwrap_or(i64::MAX);
        self.capacity = i64::try_from(claim.capacity()).unwrap_or(i64::MAX);
        self
    }

    pub(crate) fn bind(&self, params: &[P]) -> Vec<Value<'a>> {
        params
            .iter()
            .map(|p| match p {
                P::Key => Value::Bytes(self.key),
                P::Owner => Value::Bytes(self.owner),
                P::Label => Value::Text(self.label),
                P::Weight => Value::Int(self.weight),
                P::Token => Value::Int(self.token),
                P::Ttl => Value::Int(self.ttl),
                P::Capacity => Value::Int(self.capacity),
                // A shared claim's reservation arrives now (see `Store::mark`).
                P::Waited => Value::Int(0),
            })
            .collect()
    }
}

/// Runs `bound` with `values` on `conn`: its rows of integers.
pub(crate) async fn ints<DB: Db>(
    conn: &mut Conn<DB>,
    bound: &Bound,
    values: &Values<'_>,
) -> Result<Vec<Vec<i64>>, sqlx::Error> {
    let values = values.bind(bound.params);
    DB::ints(
        conn,
        Call {
            statement: &bound.sql,
            values: &values,
        },
    )
    .await
}

/// Runs `step`'s statements in order, stopping after a first one that changed nothing:
/// whether the first changed a row.
pub(crate) async fn step<DB: Db>(
    conn: &mut Conn<DB>,
    step: &Step,
    values: &Values<'_>,
) -> Result<bool, sqlx::Error> {
    for (i, bound) in step.iter().enumerate() {
        let bound_values = values.bind(bound.params);
        let call = Call {
            statement: &bound.sql,
            values: &bound_values,
        };
        let done = DB::execute(conn, call).await?;
        if i == 0 && DB::rows_affected(&done) == 0 {
            return Ok(false);
        }
    }
    Ok(true)
}

/// A row statement's answer.
fn row_seen(rows: Vec<Vec<i64>>) -> Result<Option<RowSeen>, sqlx::Error> {
    rows.first()
        .map(|cols| RowSeen::read(cols).ok_or_else(|| shape("lock row")))
        .transpose()
}

pub(crate) fn shape(what: &str) -> sqlx::Error {
    sqlx::Error::Protocol(format!(
        "the {what} statement answered with an unexpected row"
    ))
}

/// Runs `$body` (an expression using `$conn`, the transaction's connection) in a
/// transaction of `$store`, committed when it succeeds, run again when the database rolled
/// it back for a conflict (or SQLite's file stayed busy).
macro_rules! transaction {
    ($store:expr, |$conn:ident| $body:expr) => {{
        let store = $store;
        let mut backoff = <D::Run as Run>::TX_RETRY.backoff();
        loop {
            let mut lease = store.run.lease().await?;
            let result: Result<_, sqlx::Error> = async {
                let mut tx = lease
                    .conn()
                    .begin_with(sqlx::SqlStr::from_static(<D::Run as Run>::BEGIN))
                    .await?;
                let answer = {
                    let $conn: &mut Conn<DbOf<D>> = &mut tx;
                    $body.await?
                };
                tx.commit().await?;
                Ok(answer)
            }
            .await;
            lease.settle(&result);
            match result {
                Ok(answer) => break Ok(answer),
                Err(e) if <D::Run as Run>::retryable(&e) => {
                    match backoff.next_pause(Instant::now()) {
                        Some(pause) => tokio::time::sleep(pause).await,
                        None => break Err(store.run.error(e)),
                    }
                }
                Err(e) => break Err(store.run.error(e)),
            }
        }
    }};
}

impl<D: Dialect> Store<D> {
    /// Takes `claim` (see [`LockBackend::claim`](lockcore::LockBackend::claim)).
    pub(crate) async fn claim(
        &self,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
        claim: Claim,
    ) -> Result<AcquireOutcome, LockError> {
        let values = Values::new(key, owner).claim(ttl, &claim);
        let decision = match self.call(&self.sql.claims.calls.claim, &values).await? {
            Some(row) => Decision::from_call(&row).ok_or_else(|| self.run.error(shape("claim")))?,
            None => transaction!(self, |conn| self.claim_in(conn, key, owner, ttl, &claim))?,
        };
        let granted = |fence| Ok(AcquireOutcome::Acquired(Grant::new(token(fence), ttl)));
        match decision {
            Decision::Mismatch(stored) => Err(LockError::capacity_mismatch(key, stored, &claim)),
            Decision::RenewLease(fence) | Decision::GrantLease(fence) => {
                self.leased.insert(key, owner);
                granted(fence)
            }
            Decision::RenewRow(fence) | Decision::GrantExclusive(fence) => granted(fence),
            Decision::Refuse(refusal) => Ok(AcquireOutcome::Held(contention(&refusal))),
        }
    }

    /// Runs the one-call path `bound` of the dialect, if it has one: the row it answered,
    /// `None` to take the transaction path.
    pub(crate) async fn call(
        &self,
        bound: &Option<Bound>,
        values: &Values<'_>,
    ) -> Result<Option<Vec<i64>>, LockError> {
        let Some(bound) = bound else {
            return Ok(None);
        };
        let values = values.bind(bound.params);
        let call = Call {
            statement: &bound.sql,
            values: &values,
        };
        Ok(self.run.run(IntRows, call).await?.into_iter().next())
    }

    async fn claim_in(
        &self,
        conn: &mut Conn<DbOf<D>>,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
        claim: &Claim,
    ) -> Result<Decision, sqlx::Error> {
        let sql = &self.sql.claims;
        let mut values = Values::new(key, owner).claim(ttl, claim);
        let row = self.locked_row(conn, &values).await?;
        let leases = if row.live && row.shared {
            self.leases_in(conn, &values).await?
        } else {
            Vec::new()
        };
        let decision = decide(&row, &leases, claim);
        let write = match decision {
            Decision::Mismatch(_) => None,
            Decision::RenewRow(_) => Some(&sql.renew_row),
            Decision::RenewLease(_) => Some(&sql.renew_lease),
            Decision::GrantExclusive(token) => {
                values.token = token;
                Some(&sql.grant_exclusive)
            }
            Decision::GrantLease(token) => {
                values.token = token;
                Some(&sql.grant_lease)
            }
            Decision::Refuse(Refusal { reserve, .. }) => reserve.then_some(&sql.reserve),
        };
        if let Some(write) = write {
            step::<DbOf<D>>(conn, write, &values).await?;
        }
        Ok(decision)
    }

    /// Locks the key's row, creating it (free) when missing: the row as the claim
    /// transaction sees it.
    pub(crate) async fn locked_row(
        &self,
        conn: &mut Conn<DbOf<D>>,
        values: &Values<'_>,
    ) -> Result<RowSeen, sqlx::Error> {
        let sql = &self.sql.claims;
        let mut row = row_seen(ints::<DbOf<D>>(conn, &sql.row, values).await?)?;
        if row.is_none() {
            if let Some(create) = &sql.create {
                ints::<DbOf<D>>(conn, create, values).await?;
                row = row_seen(ints::<DbOf<D>>(conn, &sql.row, values).await?)?;
            }
        }
        row.ok_or_else(|| shape("claim row"))
    }

    /// The key's live leases (read under the row's lock).
    async fn leases_in(
        &self,
        conn: &mut Conn<DbOf<D>>,
        values: &Values<'_>,
    ) -> Result<Vec<LeaseSeen>, sqlx::Error> {
        ints::<DbOf<D>>(conn, &self.sql.claims.leases, values)
            .await?
            .iter()
            .map(|cols| LeaseSeen::read(cols).ok_or_else(|| shape("leases")))
            .collect()
    }

    /// Whether a wait behind a reservation that found `key` free of leases should go on:
    /// a reservation lives and the key's fence is still `revision` (the owner has not been
    /// granted and released it meanwhile). One read, outside any transaction.
    #[cfg(feature = "postgres")]
    pub(crate) async fn still_reserved(
        &self,
        key: &LockKey,
        revision: Option<i64>,
    ) -> Result<bool, LockError> {
        let Some(row) = self.call(&self.sql.claims.peek, &Values::key(key)).await? else {
            // No row (or no statement to tell): nothing reserved.
            return Ok(false);
        };
        let row = RowSeen::read(&row).ok_or_else(|| self.run.error(shape("lock row")))?;
        Ok(row.res_live && revision.map_or(true, |rev| rev == row.fence))
    }

    /// Releases the owner's lease (the exclusive release found no lock of the owner's).
    pub(crate) async fn release_lease(
        &self,
        key: &LockKey,
        owner: &Owner,
    ) -> Result<ReleaseOutcome, LockError> {
        let values = Values::new(key, owner);
        if let Some(row) = self.call(&self.sql.claims.calls.release, &values).await? {
            return match row.as_slice() {
                [1] => Ok(ReleaseOutcome::Released),
                [0] => Ok(ReleaseOutcome::NotHeld),
                _ => Err(self.run.error(shape("lease release"))),
            };
        }
        let released = transaction!(self, |conn| async {
            let row = row_seen(ints::<DbOf<D>>(conn, &self.sql.claims.row_locked, &values).await?)?;
            if !row.is_some_and(|r| r.live && r.shared) {
                return Ok(false);
            }
            step::<DbOf<D>>(conn, &self.sql.claims.release_lease, &values).await
        })?;
        Ok(if released {
            ReleaseOutcome::Released
        } else {
            ReleaseOutcome::NotHeld
        })
    }

    /// Renews the owner's lease (the exclusive extend found no lock of the owner's).
    pub(crate) async fn extend_lease(
        &self,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<ExtendOutcome, LockError> {
        let mut values = Values::new(key, owner);
        values.ttl = ttl_micros(ttl);
        let called = match self.call(&self.sql.claims.calls.extend, &values).await? {
            Some(row) => match row.as_slice() {
                [fence] => Some((*fence >= 0).then_some(*fence)),
                _ => return Err(self.run.error(shape("lease renewal"))),
            },
            None => None,
        };
        let fence = match called {
            Some(fence) => fence,
            None => self.extend_lease_in_transaction(&values).await?,
        };
        Ok(match fence {
            Some(fence) => ExtendOutcome::Extended(Grant::new(token(fence), ttl)),
            None => ExtendOutcome::NotHeld,
        })
    }

    /// Renews the owner's lease in a transaction: its token, or `None` if it holds none.
    async fn extend_lease_in_transaction(
        &self,
        values: &Values<'_>,
    ) -> Result<Option<i64>, LockError> {
        transaction!(self, |conn| async {
            let row = row_seen(ints::<DbOf<D>>(conn, &self.sql.claims.row_locked, values).await?)?;
            if !row.is_some_and(|r| r.live && r.shared) {
                return Ok(None);
            }
            let Some(own) = self
                .leases_in(conn, values)
                .await?
                .into_iter()
                .find(|l| l.mine)
            else {
                return Ok(None);
            };
            step::<DbOf<D>>(conn, &self.sql.claims.renew_lease, values).await?;
            Ok::<_, sqlx::Error>(Some(own.fence))
        })
    }

    /// Removes the owner's reservation: whether there was one.
    pub(crate) async fn abandon(&self, key: &LockKey, owner: &Owner) -> Result<bool, LockError> {
        let values = Values::new(key, owner);
        transaction!(self, |conn| step::<DbOf<D>>(
            conn,
            &self.sql.claims.abandon,
            &values
        ))
    }

    /// Frees the key, every lease and the reservation.
    pub(crate) async fn force_release(&self, key: &LockKey) -> Result<ReleaseOutcome, LockError> {
        let values = Values::key(key);
        let freed = transaction!(self, |conn| step::<DbOf<D>>(
            conn,
            &self.sql.force_release,
            &values
        ))?;
        Ok(if freed {
            ReleaseOutcome::Released
        } else {
            ReleaseOutcome::NotHeld
        })
    }

    /// Every live lease of `key`, in grant order.
    pub(crate) async fn holders(&self, key: &LockKey) -> Result<Vec<LockInfo>, LockError> {
        let Some((label, fence, remaining, capacity)) = self.state(key).await? else {
            return Ok(Vec::new());
        };
        if capacity == 0 {
            return Ok(vec![LockInfo::new(
                label,
                token(fence),
                Some(micros(remaining)),
            )]);
        }
        let bound = &self.sql.claims.shown;
        let values = Values::key(key).bind(bound.params);
        let call = Call {
            statement: &bound.sql,
            values: &values,
        };
        let rows = self.run.run(Labelled, call).await?;
        rows.into_iter()
            .map(|(label, cols)| {
                let &[fence, weight, capacity, remaining] = cols.as_slice() else {
                    return Err(self.run.error(shape("shown leases")));
                };
                let claim = u64::try_from(weight)
                    .ok()
                    .zip(u64::try_from(capacity).ok())
                    .and_then(|(w, c)| Claim::from_parts(w, c))
                    .ok_or_else(|| {
                        LockError::backend(
                            D::NAME,
                            format!(
                                "a lease of {key:?} is stored with weight {weight} of capacity \
                                 {capacity}, which no claim takes"
                            ),
                        )
                    })?;
                Ok(LockInfo::new(label, token(fence), Some(micros(remaining))).with_claim(claim))
            })
            .collect()
    }
}

/// A refusal as the client sees it: the soonest blocking lease's TTL, and what to wait
/// from.
pub(crate) fn contention(refusal: &Refusal) -> Contention {
    let mut hint = WaitHint::at_revision(refusal.revision);
    if refusal.by_reservation {
        // Its owner is about to take the key (or gives up, or the reservation lapses at
        // `remaining`): wait for that change, not for the key to be free.
        hint = hint.behind_reservation();
    }
    Contention::new(refusal.remaining.map(micros)).with_hint(hint.with_reservation(refusal.kept))
}
