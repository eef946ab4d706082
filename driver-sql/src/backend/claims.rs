//! Shared claims over the leases table, written once for every dialect. A claim, a lease's
//! release and its renewal are each one call into the database, which decides there (each
//! dialect's claim routine or statement is the rule's one copy); abandoning a reservation
//! and freeing a key are short transactions.
//!
//! The exclusive lock keeps its one-statement path (`backend/lock.rs`): while leases live, the
//! key's row is held by a marker owner until the latest lease expires, so the exclusive
//! statement sees the key held without reading the leases table.

use std::time::{Duration, Instant};

use lockcore::driver::{
    AcquireOutcome, ClaimRequest, Contention, ExtendOutcome, Grant, SetOutcome, WaitHint,
};
use lockcore::{Claim, LockError, LockInfo, LockKey, Owner, ReleaseOutcome};
use sqlx::Connection;

use crate::backend::lock::Store;
use crate::db::{Db, IntRows};
use crate::dialect::{DbOf, Dialect};
use crate::error::shape;
use crate::run::{Conn, Leased, Run};
use crate::store::{Bound, Call, Values};
use crate::units::{micros, token, ttl_micros};

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
        let decision = (self.call(&self.sql.claims.claim, &values).await?)
            .and_then(|row| Decision::from_call(&row))
            .ok_or_else(|| self.run.error(shape("claim")))?;
        let granted = |fence| Ok(AcquireOutcome::Acquired(Grant::new(token(fence), ttl)));
        match decision {
            Decision::Mismatch(stored) => Err(LockError::capacity_mismatch(key, stored, &claim)),
            Decision::Lease(fence) => {
                self.leased.insert(key, owner);
                granted(fence)
            }
            Decision::Whole(fence) => granted(fence),
            Decision::Refuse(refusal) => Ok(AcquireOutcome::Held(contention(&refusal))),
        }
    }

    /// Takes every claim of a set in one atomic step (see
    /// [`LockBackend::claim_all`](lockcore::LockBackend::claim_all)), each key decided by
    /// the claim rule in the set's order, nothing of the set left (its reservation neither)
    /// after the first key refused. Where the dialect decides a whole set in one call
    /// ([`ClaimStatements::claim_set`](crate::store::ClaimStatements::claim_set)), that
    /// call: one round trip, where a transaction of the client's takes one per key and two
    /// more (lockbench `keys3`, docs/performance.md). A set whose requests differ in owner, TTL or claim (lockcore sends none) is
    /// `None` there: taken key by key. Elsewhere (SQLite) one transaction of the client's.
    pub(crate) async fn claim_all(
        &self,
        requests: &[ClaimRequest<'_>],
    ) -> Result<Option<SetOutcome>, LockError> {
        if let Some(batches) = &self.batches {
            batches.run.warm();
        }
        let decided = match (&self.sql.claims.claim_set, requests.first()) {
            (Some(_), Some(first)) if !requests.iter().all(|r| same_claim(r, first)) => {
                return Ok(None)
            }
            (Some(set), Some(first)) => {
                let keys = crate::store::pack_keys(requests.iter().map(|r| r.key));
                let values = Values::set(first.key, first.owner, &keys)
                    .claim(first.ttl, &first.claim)
                    .bind(&set.params);
                let call = Call {
                    statement: &set.sql,
                    values: &values,
                };
                let rows = self.run.run(IntRows, call).await?;
                rows.iter().map(|row| Decision::from_call(row)).collect()
            }
            _ => self.decide_in_transaction(requests).await?,
        };
        let mut grants = Vec::with_capacity(requests.len());
        let mut leases = Vec::new();
        for (index, (request, decision)) in requests.iter().zip(decided).enumerate() {
            let fence = match decision {
                Some(Decision::Whole(fence)) => fence,
                Some(Decision::Lease(fence)) => {
                    leases.push(request);
                    fence
                }
                Some(Decision::Refuse(refusal)) => {
                    let contention = contention(&refusal);
                    return Ok(Some(SetOutcome::Held { index, contention }));
                }
                Some(Decision::Mismatch(stored)) => {
                    return Err(LockError::capacity_mismatch(
                        request.key,
                        stored,
                        &request.claim,
                    ))
                }
                None => return Err(self.run.error(shape("claim"))),
            };
            grants.push(Grant::new(token(fence), request.ttl));
        }
        if grants.len() != requests.len() {
            // Fewer answers than keys, every one a grant: not an answer of a set's call.
            return Err(self.run.error(shape("set claim")));
        }
        for request in leases {
            self.leased.insert(request.key, request.owner);
        }
        Ok(Some(SetOutcome::Acquired(grants)))
    }

    /// The decisions of a set's claims (see [`decide_all`](Self::decide_all)), in one
    /// transaction of the client's (each key's claim call, a rollback at the first one
    /// refused), run again when the database rolled it back for a
    /// conflict or SQLite's file stayed busy.
    async fn decide_in_transaction(
        &self,
        requests: &[ClaimRequest<'_>],
    ) -> Result<Vec<Option<Decision>>, LockError> {
        let mut backoff = <D::Run as Run>::TX_RETRY.backoff();
        loop {
            let mut lease = self.run.lease().await?;
            let result = self.decide_all(lease.conn(), requests).await;
            lease.settle(&result);
            match result {
                Ok(decided) => return Ok(decided),
                Err(e) if <D::Run as Run>::retryable(&e) => {
                    match backoff.next_pause(Instant::now()) {
                        Some(pause) => tokio::time::sleep(pause).await,
                        None => return Err(self.run.error(e)),
                    }
                }
                Err(e) => return Err(self.run.error(e)),
            }
        }
    }

    /// The transaction of [`claim_all`](Self::claim_all) on `conn`: each request's decision
    /// (`None` for an answer of another shape), up to the first that is not a grant,
    /// committed only if every one is.
    async fn decide_all(
        &self,
        conn: &mut Conn<DbOf<D>>,
        requests: &[ClaimRequest<'_>],
    ) -> Result<Vec<Option<Decision>>, sqlx::Error> {
        let begin = sqlx::SqlStr::from_static(<D::Run as Run>::BEGIN);
        let mut tx = conn.begin_with(begin).await?;
        let bound = &self.sql.claims.claim;
        let mut decided = Vec::with_capacity(requests.len());
        for request in requests {
            let values = Values::new(request.key, request.owner).claim(request.ttl, &request.claim);
            let values = values.bind(&bound.params);
            let call = Call {
                statement: &bound.sql,
                values: &values,
            };
            let rows = DbOf::<D>::ints(&mut tx, call).await?;
            let decision = rows.first().and_then(|row| Decision::from_call(row));
            let granted = matches!(decision, Some(Decision::Whole(_) | Decision::Lease(_)));
            decided.push(decision);
            if !granted {
                tx.rollback().await?;
                return Ok(decided);
            }
        }
        tx.commit().await?;
        Ok(decided)
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
        let Some(peek) = &self.sql.claims.peek else {
            return Ok(false);
        };
        // No row: nothing reserved.
        Ok(match self.call(peek, &Values::key(key)).await?.as_deref() {
            None => false,
            Some(&[reserved, fence]) => reserved == 1 && revision.is_none_or(|rev| rev == fence),
            Some(_) => return Err(self.run.error(shape("lock row"))),
        })
    }

    /// Releases the owner's lease (the exclusive release found no lock of the owner's).
    pub(crate) async fn release_lease(
        &self,
        key: &LockKey,
        owner: &Owner,
    ) -> Result<ReleaseOutcome, LockError> {
        let values = Values::new(key, owner);
        match self
            .call(&self.sql.claims.release, &values)
            .await?
            .as_deref()
        {
            Some([1]) => Ok(ReleaseOutcome::Released),
            None | Some([0]) => Ok(ReleaseOutcome::NotHeld),
            Some(_) => Err(self.run.error(shape("lease release"))),
        }
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
        let fence = match self
            .call(&self.sql.claims.extend, &values)
            .await?
            .as_deref()
        {
            None | Some([-1]) => None,
            Some(&[fence]) if fence >= 0 => Some(fence),
            Some(_) => return Err(self.run.error(shape("lease renewal"))),
        };
        Ok(match fence {
            Some(fence) => ExtendOutcome::Extended(Grant::new(token(fence), ttl)),
            None => ExtendOutcome::NotHeld,
        })
    }

    /// Removes the owner's reservation: whether there was one.
    pub(crate) async fn abandon(&self, key: &LockKey, owner: &Owner) -> Result<bool, LockError> {
        self.changed(&self.sql.claims.abandon, &Values::new(key, owner))
            .await
    }

    /// Frees the key, every lease and the reservation: the statements of
    /// [`force_release`](crate::store::Statements::force_release) in one transaction, run
    /// again when the database rolled it back for a conflict (or SQLite's file stayed busy).
    pub(crate) async fn force_release(&self, key: &LockKey) -> Result<ReleaseOutcome, LockError> {
        let values = Values::key(key);
        let mut backoff = <D::Run as Run>::TX_RETRY.backoff();
        loop {
            let mut lease = self.run.lease().await?;
            let result = async {
                let begin = sqlx::SqlStr::from_static(<D::Run as Run>::BEGIN);
                let mut tx = lease.conn().begin_with(begin).await?;
                let freed = freed::<DbOf<D>>(&mut tx, &self.sql.force_release, &values).await?;
                tx.commit().await?;
                Ok(freed)
            }
            .await;
            lease.settle(&result);
            match result {
                Ok(true) => return Ok(ReleaseOutcome::Released),
                Ok(false) => return Ok(ReleaseOutcome::NotHeld),
                Err(e) if <D::Run as Run>::retryable(&e) => {
                    match backoff.next_pause(Instant::now()) {
                        Some(pause) => tokio::time::sleep(pause).await,
                        None => return Err(self.run.error(e)),
                    }
                }
                Err(e) => return Err(self.run.error(e)),
            }
        }
    }

    /// Every live lease of `key`, in grant order.
    pub(crate) async fn holders(&self, key: &LockKey) -> Result<Vec<LockInfo>, LockError> {
        let Some((label, fence, remaining, capacity)) = self.state(key).await? else {
            return self.transaction_hold(key).await;
        };
        if capacity == 0 {
            return Ok(vec![LockInfo::new(
                label,
                token(fence),
                Some(micros(remaining)),
            )]);
        }
        let rows = self
            .labelled(&self.sql.claims.shown, &Values::key(key))
            .await?;
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

    /// A transaction's hold of `key`, where the database shows one (PostgreSQL): its
    /// token, with no remaining TTL, as it lasts until the transaction ends.
    async fn transaction_hold(&self, key: &LockKey) -> Result<Vec<LockInfo>, LockError> {
        let Some(held) = &self.sql.transaction_hold else {
            return Ok(Vec::new());
        };
        match self.call(held, &Values::key(key)).await?.as_deref() {
            None => Ok(Vec::new()),
            Some(&[fence]) => Ok(vec![LockInfo::new(
                crate::transaction::LABEL,
                token(fence),
                None,
            )]),
            Some(_) => Err(self.run.error(shape("transaction hold"))),
        }
    }
}

/// Whether `request` claims what `first` claims, for the same owner and TTL: the two can
/// go in one set's call, which binds those once.
fn same_claim(request: &ClaimRequest<'_>, first: &ClaimRequest<'_>) -> bool {
    request.owner == first.owner && request.ttl == first.ttl && request.claim == first.claim
}

/// Runs `statements` in order on `conn`, stopping after a first one that changed nothing:
/// whether the first changed a row.
async fn freed<DB: Db>(
    conn: &mut Conn<DB>,
    statements: &[Bound],
    values: &Values<'_>,
) -> Result<bool, sqlx::Error> {
    for (i, bound) in statements.iter().enumerate() {
        let bound_values = values.bind(&bound.params);
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

/// What a claim call decided and wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    /// The key is held as another kind (capacity stored, in the error).
    Mismatch(u64),
    /// The owner holds the whole key with this token: granted, or its hold renewed (same
    /// token, expiry pushed out). PostgreSQL and MySQL/MariaDB answer the same for a free
    /// key's one lease they wrote into the key's row (inline): its owner holds it as it
    /// holds an exclusive lock, and releases and renews it by the exclusive statements.
    Whole(i64),
    /// The owner holds a lease on the key with this token: granted, or renewed.
    Lease(i64),
    /// Refused.
    Refuse(Refusal),
}

/// A refused claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Refusal {
    /// Microseconds until the soonest lease that blocks the claim expires (the
    /// reservation's, when only a reservation blocks it).
    pub(crate) remaining: Option<i64>,
    /// Only another owner's reservation stands in the way (the leases would let it in).
    pub(crate) by_reservation: bool,
    /// The key's fence as seen: a release of a lease bumps it, so a waiter can tell that
    /// something was released before it subscribed.
    pub(crate) revision: i64,
    /// The store keeps a reservation for the claiming owner once this refusal is written:
    /// recorded or refreshed by it. (A reservation of the owner's that a refusal leaves
    /// alone is a long wait's mark, behind an exclusive holder, which the client knows of
    /// itself; the exclusive statement answers those refusals.)
    pub(crate) kept: bool,
}

/// What a claim call ([`ClaimStatements::claim`](crate::store::ClaimStatements::claim))
/// answers in its first column: the [`Decision`] it made and wrote.
pub(crate) mod kind {
    /// The key is held as another kind; the fence column carries the stored capacity.
    pub(crate) const MISMATCH: i64 = 0;
    pub(crate) const RENEW_ROW: i64 = 1;
    pub(crate) const RENEW_LEASE: i64 = 2;
    pub(crate) const GRANT_EXCLUSIVE: i64 = 3;
    pub(crate) const GRANT_LEASE: i64 = 4;
    /// Refused: remaining µs (-1 for none), by reservation (0/1, or [`KEPT`]) and the
    /// revision follow.
    pub(crate) const REFUSE: i64 = 5;
    /// A refusal's by-reservation column when the call recorded or refreshed the
    /// claimant's reservation.
    pub(crate) const KEPT: i64 = 2;
}

impl Decision {
    /// A claim call's answer `[kind, fence, remaining, by_reservation, revision]`;
    /// `None` for a row of another shape.
    pub(crate) fn from_call(cols: &[i64]) -> Option<Self> {
        let &[k, fence, remaining, by_reservation, revision] = cols else {
            return None;
        };
        Some(match k {
            kind::MISMATCH => Decision::Mismatch(u64::try_from(fence).ok()?),
            kind::RENEW_ROW | kind::GRANT_EXCLUSIVE => Decision::Whole(fence),
            kind::RENEW_LEASE | kind::GRANT_LEASE => Decision::Lease(fence),
            kind::REFUSE => Decision::Refuse(Refusal {
                remaining: (remaining >= 0).then_some(remaining),
                by_reservation: by_reservation == 1,
                revision,
                kept: by_reservation == kind::KEPT,
            }),
            _ => return None,
        })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_answers_every_decision() {
        use kind::*;
        assert_eq!(
            Decision::from_call(&[MISMATCH, 8, -1, 0, 3]),
            Some(Decision::Mismatch(8))
        );
        assert_eq!(Decision::from_call(&[MISMATCH, -8, -1, 0, 3]), None);
        assert_eq!(
            Decision::from_call(&[RENEW_ROW, 5, 0, 0, 5]),
            Some(Decision::Whole(5))
        );
        assert_eq!(
            Decision::from_call(&[RENEW_LEASE, 6, 0, 0, 6]),
            Some(Decision::Lease(6))
        );
        assert_eq!(
            Decision::from_call(&[GRANT_EXCLUSIVE, 7, 0, 0, 6]),
            Some(Decision::Whole(7))
        );
        assert_eq!(
            Decision::from_call(&[GRANT_LEASE, 9, 0, 0, 8]),
            Some(Decision::Lease(9))
        );
        let refused = |remaining, by_reservation| {
            Some(Decision::Refuse(Refusal {
                remaining,
                by_reservation,
                revision: 4,
                kept: false,
            }))
        };
        assert_eq!(
            Decision::from_call(&[REFUSE, 0, 900, 0, 4]),
            refused(Some(900), false)
        );
        assert_eq!(
            Decision::from_call(&[REFUSE, 0, -1, 1, 4]),
            refused(None, true)
        );
        assert_eq!(
            Decision::from_call(&[REFUSE, 0, 0, 0, 4]),
            refused(Some(0), false)
        );
        let Some(Decision::Refuse(kept)) = Decision::from_call(&[REFUSE, 0, 5, KEPT, 4]) else {
            panic!("a refusal that keeps a reservation");
        };
        assert!(kept.kept && !kept.by_reservation, "{kept:?}");
        assert_eq!(Decision::from_call(&[6, 0, 0, 0, 4]), None);
        assert_eq!(Decision::from_call(&[GRANT_LEASE, 9, 0, 0]), None);
    }
}
