//! Marks for long waits in the plain layout ([`Fairness::Bounded`], for requests whose
//! [`ClaimRequest::waited`] says they waited long): the next turn of a lock kept for the
//! request that has waited longest, so a process that releases and asks again at once
//! cannot starve the other processes' waiters.
//!
//! A mark is one key beside the lock's ([`mark_key`]), holding the request's arrival and
//! its owner token ([`mark_value`]):
//!
//! * every acquiring transaction also compares the mark: the key is created only while no
//!   mark exists, or when the transaction names the mark it saw (by mod revision) and its
//!   request may pass it: the mark is its own (the grant deletes it), or it arrived
//!   earlier (the mark stays for its owner);
//! * a request refused by another owner's hold marks the key when it says how long it has
//!   waited and no mark of an earlier arrival lives (its own mark keeps its earliest
//!   arrival);
//! * marks live on a short lease of the backend's ([`MarkLease`]), never kept alive: a
//!   mark lapses 1–2 s after its waiter last asked, so a waiter that vanished keeps others
//!   out of a free key no longer than that; [`abandon`](lockcore::LockBackend::abandon)
//!   removes it at once.
//!
//! etcd has no clock a transaction can read, so the arrival is the client's wall clock less
//! the wait. Two machines' clocks only decide which of two long waiters goes first, never
//! exclusion or how long a mark lives (the lease's end is the leader's).
//!
//! [`Fairness::Bounded`]: lockcore::driver::Fairness::Bounded
//! [`ClaimRequest::waited`]: lockcore::driver::ClaimRequest::waited

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use etcd_client::{Compare, CompareOp, KeyValue, PutOptions, Txn, TxnOp};
use lockcore::driver::{Contention, WaitHint, STARVING_MARK_TTL};
use lockcore::{LockError, LockKey, Owner};

use super::leases::{random_lease_id, ttl_secs};
use super::EtcdBackend;
use crate::encoding::{mark_key, mark_value, read_mark};

/// How long a refused request waits behind another owner's mark on a free lock before it
/// looks again, if no release wakes it first: the mark's owner normally takes the lock
/// within a hand-off; this bounds the stall when it vanished instead.
pub(super) const BEHIND_MARK_RECHECK: Duration = Duration::from_millis(200);

/// A mark is written on a lease with at least this much left, so it outlives the
/// [`STARVING_MARK_TTL`]` / 2` between its waiter's renewals.
const MARK_LEASE_LEFT: Duration = Duration::from_secs(1);

/// The lease this backend puts marks on: granted for [`STARVING_MARK_TTL`] (etcd applies
/// its minimum, 2 s by default), never kept alive, replaced once less than
/// [`MARK_LEASE_LEFT`] is left. One grant serves every mark written meanwhile.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MarkLease {
    id: i64,
    until: Instant,
}

/// How an acquiring transaction treats the lock's mark.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum MarkRule {
    /// Only while the lock has no mark.
    Unmarked,
    /// Past the mark seen at this mod revision: its own (`consume`: the grant deletes it)
    /// or a later arrival's (it stays).
    Past { revision: i64, consume: bool },
}

impl MarkRule {
    /// The transaction's compare on the mark key.
    pub(super) fn compare(self, mark: &[u8]) -> Compare {
        match self {
            MarkRule::Unmarked => Compare::create_revision(mark.to_vec(), CompareOp::Equal, 0),
            MarkRule::Past { revision, .. } => {
                Compare::mod_revision(mark.to_vec(), CompareOp::Equal, revision)
            }
        }
    }

    /// What the grant does to the mark besides creating the lock's key.
    pub(super) fn on_grant(self, mark: &[u8]) -> Option<TxnOp> {
        match self {
            MarkRule::Past { consume: true, .. } => Some(TxnOp::delete(mark.to_vec(), None)),
            _ => None,
        }
    }
}

/// When a request that has waited `waited` arrived, on this client's wall clock (µs).
pub(super) fn arrival(waited: Duration) -> u64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(now.saturating_sub(waited).as_micros()).unwrap_or(u64::MAX)
}

/// What a request arriving at `arrival` (`None`: one that did not say) may do on a free
/// lock whose mark is `mark`: pass it (the rule for the next transaction), or wait.
pub(super) fn past_mark(mark: &KeyValue, owner: &Owner, arrival: Option<u64>) -> Option<MarkRule> {
    let revision = mark.mod_revision();
    match read_mark(mark.value(), owner.token()) {
        Some((_, true)) => Some(MarkRule::Past {
            revision,
            consume: true,
        }),
        Some((theirs, false)) => arrival
            .filter(|mine| *mine < theirs)
            .map(|_| MarkRule::Past {
                revision,
                consume: false,
            }),
        // Not written by this driver (or without a lease, so it would never lapse): it
        // marks nobody's turn, and the grant removes it.
        None => Some(MarkRule::Past {
            revision,
            consume: true,
        }),
    }
    .or_else(|| {
        (mark.lease() == 0).then_some(MarkRule::Past {
            revision,
            consume: true,
        })
    })
}

/// The refusal of a request kept out of a free lock by another owner's mark.
pub(super) fn behind_mark(revision: i64) -> Contention {
    Contention::new(Some(BEHIND_MARK_RECHECK))
        .with_hint(WaitHint::at_revision(revision).behind_reservation())
}

impl EtcdBackend {
    /// After `owner`'s request, which arrived at `arrival`, was refused by another owner's
    /// hold: marks the lock as its next turn unless a mark of an earlier arrival lives
    /// (`seen`: the mark the refusing transaction read). Best effort: a mark changed
    /// meanwhile wins, and a failure only costs the turn.
    pub(super) async fn mark_turn(
        &self,
        lock_key: &[u8],
        seen: Option<&KeyValue>,
        owner: &Owner,
        arrival: u64,
        ttl: Duration,
    ) {
        let mark = mark_key(lock_key);
        let (compare, arrival) = match seen {
            None => (MarkRule::Unmarked.compare(&mark), arrival),
            Some(kv) => {
                let at = MarkRule::Past {
                    revision: kv.mod_revision(),
                    consume: false,
                }
                .compare(&mark);
                match read_mark(kv.value(), owner.token()) {
                    // Ours: renewed, keeping its earliest arrival.
                    Some((ours, true)) => (at, ours.min(arrival)),
                    Some((theirs, false)) if arrival >= theirs => return,
                    _ => (at, arrival),
                }
            }
        };
        let result = async {
            let lease = self.mark_lease(ttl).await?;
            let txn = Txn::new().when([compare]).and_then([TxnOp::put(
                mark.clone(),
                mark_value(arrival, owner.token()),
                Some(PutOptions::new().with_lease(lease)),
            )]);
            self.txn("mark", txn).await
        }
        .await;
        if let Err(e) = result {
            // A lease that lapsed under us is granted afresh next time.
            self.forget_mark_lease();
            tracing::debug!(error = %lockcore::ErrorChain(&e), "etcd: marking a long wait failed");
        }
    }

    /// Removes `owner`'s mark on `key`, if it has one, and wakes a waiter of this backend
    /// held back by it.
    pub(super) async fn plain_abandon(
        &self,
        key: &LockKey,
        owner: &Owner,
    ) -> Result<(), LockError> {
        let k = self.etcd_key(key);
        let mark = mark_key(&k);
        let (kv, _) = self.get(&mark).await?;
        let Some(kv) =
            kv.filter(|kv| matches!(read_mark(kv.value(), owner.token()), Some((_, true))))
        else {
            return Ok(());
        };
        let txn = Txn::new()
            .when([MarkRule::Past {
                revision: kv.mod_revision(),
                consume: true,
            }
            .compare(&mark)])
            .and_then([TxnOp::delete(mark, None)]);
        let resp = self.txn("abandon", txn).await?;
        if resp.succeeded() {
            self.watches
                .released(key, &k, super::requests::header_revision(&resp));
        }
        Ok(())
    }

    /// The lease to put a mark on: the current one while it has [`MARK_LEASE_LEFT`] left,
    /// else a fresh one for `min(ttl, STARVING_MARK_TTL)`.
    async fn mark_lease(&self, ttl: Duration) -> Result<i64, LockError> {
        let now = Instant::now();
        if let Some(l) = *self.mark_lease.lock().unwrap_or_else(|e| e.into_inner()) {
            if l.until > now + MARK_LEASE_LEFT {
                return Ok(l.id);
            }
        }
        let id = random_lease_id();
        let applied = self
            .leases
            .grant(id, ttl_secs(ttl.min(STARVING_MARK_TTL)))
            .await?;
        let until = now + Duration::from_secs(u64::try_from(applied).unwrap_or(0));
        *self.mark_lease.lock().unwrap_or_else(|e| e.into_inner()) = Some(MarkLease { id, until });
        Ok(id)
    }

    fn forget_mark_lease(&self) {
        *self.mark_lease.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrival_counts_back_from_now() {
        let a = arrival(Duration::from_secs(10));
        let b = arrival(Duration::ZERO);
        let gap = b - a;
        assert!(
            (10_000_000..11_000_000).contains(&gap),
            "arrivals 10 s apart differ by {gap} µs"
        );
        assert_eq!(arrival(Duration::MAX), 0);
    }
}
