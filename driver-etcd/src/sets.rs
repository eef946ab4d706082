//! A set of claims in one etcd transaction ([`LockBackend::claim_all`]): every key's place
//! is put by one transaction, or none is.
//!
//! * **The rule is a single claim's.** A place created now comes after every key in its
//!   queue, so it holds exactly when the weights of all of them leave room for it: for an
//!   exclusive claim, when the queue is empty. The transaction compares, for each key, that
//!   its queue holds no key created after a revision `at` at which the client saw the claim
//!   fit (`create_revision < at + 1` over the queue's prefix). Keys only ever leave a queue
//!   before them, so what fitted at `at` still fits. The first try guesses `at = 0`: every
//!   queue empty, the common case, one transaction. Its failure branch reads every queue;
//!   the client decides each key from that read, in order, and either answers the first key
//!   that does not fit (nothing written) or, when all fit (readers behind readers, a queue
//!   emptied meanwhile), sends the transaction again guarded at the read's revision.
//! * **A lease per place.** Each place is bound to a lease of its own, taken from the spares
//!   or granted alongside the transaction, as a single claim's place is: a release puts its
//!   place's lease back as a spare (and shutdown revokes spares), and a renewal moves each
//!   place onto the shared lease and spares its old one. One lease under several places
//!   would let the first of those reach the others: a spare reused or revoked with keys of
//!   the set still on it. All of them exist before the transaction (or are granted with
//!   their IDs alongside it), so the transaction is the one step that binds them.
//! * **A refused set writes nothing.** Its leases go back as spares, its reserved slots are
//!   given up, and the refusal names the first key that did not fit with what a single claim
//!   of it reports: the first blocker's remaining TTL, and a hint at the read's revision. No
//!   place of ours is in that queue, so the wait watches the queue for a deletion after that
//!   revision (`wait_for_deletion`): the set has no place in line, and so no FIFO position.
//! * **A try whose answer was lost** left the owner's places holding: the next try finds
//!   them in its read and keeps them (compared by create revision, not put again), so they
//!   are granted again with their tokens. A refusal removes them with the rest of the set.

use std::time::Instant;

use etcd_client::{Compare, CompareOp, KeyValue, PutOptions, Txn, TxnOp, TxnResponse};
use lockcore::driver::{ClaimRequest, Contention, Grant, SetOutcome, WaitHint};
use lockcore::{Claim, FencingToken, LockError, LockKey, Owner};

use crate::backend::EtcdBackend;
use crate::capabilities::{CAPABILITIES, NAME};
use crate::encoding::{claim_of, claim_value, held_by};
use crate::leases::{ttl_secs, LeaseState, MAX_TXN_OPS};
use crate::places::Place;
use crate::store::{
    delete_if_created_at, fits_at, header_revision, nth_all, queue_range, used_before,
};

/// The transactions a set is given: each retry follows a lease found gone, a queue that
/// changed between the read and the transaction guarded by it, or a stale place cleared.
const TRIES: usize = 8;

/// One key of a set: its queue and the owner's place in it.
struct Member<'r> {
    key: &'r LockKey,
    /// What the request asks (a capacity mismatch names it).
    asked: Claim,
    /// The queue's prefix.
    prefix: Vec<u8>,
    /// The place reserved for the owner, its etcd key and the value it carries.
    place: Place,
    own: Vec<u8>,
    value: Vec<u8>,
    /// The owner had this place before the set: a refusal leaves it as it was.
    before: bool,
}

/// What the next transaction does with a key.
#[derive(Clone, Copy, Debug)]
enum Plan {
    /// Puts the place, if the queue holds no key created after the guard revision.
    Put,
    /// Keeps the owner's place created at `rev` on lease `lease`: it holds while it is
    /// there (an earlier try's, whose answer was lost).
    Keep { rev: i64, lease: i64 },
}

/// The set's transaction: for each key, the compare of its plan; on success every place
/// put, bound to `leases` in order; on failure every queue read, in queue order.
fn set_txn(members: &[Member<'_>], plans: &[Plan], at: i64, leases: &[i64]) -> Txn {
    let mut when = Vec::with_capacity(members.len());
    let mut puts = Vec::with_capacity(leases.len());
    let mut leases = leases.iter();
    for (m, plan) in members.iter().zip(plans) {
        match *plan {
            Plan::Put => {
                // No key created after `at`: at `at` the claim fitted, and keys only leave.
                when.push(
                    Compare::create_revision(m.prefix.clone(), CompareOp::Less, at + 1)
                        .with_prefix(),
                );
                if let Some(&lease) = leases.next() {
                    let lease = PutOptions::new().with_lease(lease);
                    puts.push(TxnOp::put(m.own.clone(), m.value.clone(), Some(lease)));
                }
            }
            Plan::Keep { rev, .. } => {
                when.push(Compare::create_revision(
                    m.own.clone(),
                    CompareOp::Equal,
                    rev,
                ));
            }
        }
    }
    let reads: Vec<TxnOp> = members
        .iter()
        .map(|m| TxnOp::get(m.prefix.clone(), Some(queue_range())))
        .collect();
    Txn::new().when(when).and_then(puts).or_else(reads)
}

/// What one read of the set's queues decided.
enum Judged {
    /// Every key fits: the plans for the next transaction.
    Fits(Vec<Plan>),
    /// A slot of ours holds a place this backend gave up (its delete failed): cleared,
    /// the set looks again.
    Cleared,
    /// The key of `index` does not fit, with the keys before the place it would take.
    Refused {
        index: usize,
        earlier: Vec<KeyValue>,
    },
    /// The key of `index` is stored with another capacity (a config error).
    Mismatch { index: usize, stored: u64 },
}

impl EtcdBackend {
    /// Takes `requests` in one transaction (see the module docs); `None` for a set this
    /// cannot do: more keys than one transaction takes ([`MAX_TXN_OPS`]), a key named twice,
    /// or requests of different owners or TTLs (lockcore sends none of these).
    pub(crate) async fn claim_set(
        &self,
        requests: &[ClaimRequest<'_>],
    ) -> Result<Option<SetOutcome>, LockError> {
        let Some(first) = requests.first() else {
            return Ok(None);
        };
        let owner = first.owner;
        let mut keys: Vec<&LockKey> = requests.iter().map(|r| r.key).collect();
        keys.sort();
        keys.dedup();
        let alike = requests
            .iter()
            .all(|r| r.owner.token() == owner.token() && r.ttl == first.ttl);
        if requests.len() > MAX_TXN_OPS || keys.len() != requests.len() || !alike {
            return Ok(None);
        }
        let secs = ttl_secs(CAPABILITIES.effective_ttl(first.ttl)?);
        let members: Vec<Member<'_>> = requests.iter().map(|r| self.member(r)).collect();
        let mut plans = vec![Plan::Put; members.len()];
        let mut at = 0;
        for _ in 0..TRIES {
            let fresh = plans.iter().filter(|p| matches!(p, Plan::Put)).count();
            let started = Instant::now();
            let txn = |ids: &[i64]| set_txn(&members, &plans, at, ids);
            let Some((leases, resp)) = self.leases.with_leases(secs, fresh, txn).await? else {
                // A lease was gone, and what the set bound to it with it: look again.
                (plans, at) = (vec![Plan::Put; members.len()], 0);
                continue;
            };
            if resp.succeeded() {
                if let Some(grants) = self
                    .set_granted(&members, &plans, leases, &resp, owner, started)
                    .await?
                {
                    return Ok(Some(SetOutcome::Acquired(grants)));
                }
                (plans, at) = (vec![Plan::Put; members.len()], 0);
                continue;
            }
            for lease in leases {
                self.leases.put_spare(lease);
            }
            at = header_revision(&resp);
            match self.judge_set(&members, &resp, owner).await? {
                Judged::Fits(next) => plans = next,
                Judged::Cleared => (plans, at) = (vec![Plan::Put; members.len()], 0),
                Judged::Refused { index, earlier } => {
                    self.leave_set(&members, &resp, owner).await?;
                    let m = &members[index];
                    let earlier: Vec<&KeyValue> = earlier.iter().collect();
                    let remaining = self.blockers_remaining(&earlier, &m.place.claim).await?;
                    // No place of ours in that queue: the wait watches it for a deletion
                    // after the revision this read saw (`wait_for_deletion`).
                    let contention =
                        Contention::new(remaining).with_hint(WaitHint::at_revision(at));
                    return Ok(Some(SetOutcome::Held { index, contention }));
                }
                Judged::Mismatch { index, stored } => {
                    self.leave_set(&members, &resp, owner).await?;
                    let m = &members[index];
                    return Err(LockError::capacity_mismatch(m.key, stored, &m.asked));
                }
            }
        }
        Err(LockError::unavailable(
            NAME,
            "the set's queues kept changing before one transaction could take them",
        ))
    }

    /// The owner's place in the queue of `request`'s key, reserved before anything is
    /// sent (a retry, a release or an abandon finds the same key).
    fn member<'r>(&self, request: &'r ClaimRequest<'_>) -> Member<'r> {
        let (key, owner) = (request.key, request.owner);
        let mut places = self.places();
        let before = places.get(key, owner.token()).is_some();
        // A place of the owner's answers, whatever this request asks.
        let place = places.reserve(key, owner.token(), request.claim);
        drop(places);
        Member {
            key,
            asked: request.claim,
            prefix: self.etcd_key(key),
            own: self.place_key(key, &place),
            value: claim_value(owner, &place.claim),
            place,
            before,
        }
    }

    /// Decides each key from the queues a failed set transaction read, in the set's order:
    /// the first key that does not fit (or is stored with another capacity) decides; a
    /// stale place in one of our slots is cleared first.
    async fn judge_set(
        &self,
        members: &[Member<'_>],
        resp: &TxnResponse,
        owner: &Owner,
    ) -> Result<Judged, LockError> {
        let mut plans = Vec::with_capacity(members.len());
        let mut stale = Vec::new();
        for (index, m) in members.iter().enumerate() {
            let queue = nth_all(resp, index);
            match queue.iter().find(|kv| kv.key() == m.own.as_slice()) {
                Some(kv) if held_by(kv.value(), owner.token()) => {
                    let rev = kv.create_revision();
                    if !fits_at(&queue, rev, &claim_of(kv.value())) {
                        let earlier = queue.iter().filter(|kv| kv.create_revision() < rev);
                        let earlier = earlier.cloned().collect();
                        return Ok(Judged::Refused { index, earlier });
                    }
                    plans.push(Plan::Keep {
                        rev,
                        lease: kv.lease(),
                    });
                }
                Some(kv) => {
                    stale.push((index, kv.create_revision()));
                    plans.push(Plan::Put);
                }
                None => {
                    let other = queue
                        .iter()
                        .map(|kv| claim_of(kv.value()))
                        .find(|c| !c.same_capacity(&m.place.claim));
                    if let Some(other) = other {
                        let stored = other.capacity();
                        return Ok(Judged::Mismatch { index, stored });
                    }
                    if !m.place.claim.fits(used_before(&queue, i64::MAX), 0) {
                        return Ok(Judged::Refused {
                            index,
                            earlier: queue,
                        });
                    }
                    plans.push(Plan::Put);
                }
            }
        }
        if stale.is_empty() {
            return Ok(Judged::Fits(plans));
        }
        for (index, rev) in stale {
            self.txn(
                "clear place",
                delete_if_created_at(&members[index].own, rev),
            )
            .await?;
        }
        Ok(Judged::Cleared)
    }

    /// Makes the grants of a set transaction that succeeded, and records each place as
    /// held; `None` if a kept place's lease turned out gone (look again).
    async fn set_granted(
        &self,
        members: &[Member<'_>],
        plans: &[Plan],
        leases: Vec<LeaseState>,
        resp: &TxnResponse,
        owner: &Owner,
        started: Instant,
    ) -> Result<Option<Vec<Grant>>, LockError> {
        let put_at = header_revision(resp);
        let mut leases = leases.into_iter();
        let mut grants = Vec::with_capacity(members.len());
        for (m, plan) in members.iter().zip(plans) {
            let (rev, lease) = match *plan {
                Plan::Put => match leases.next() {
                    // Every place of one transaction is created at its revision.
                    Some(lease) => (put_at, lease),
                    None => {
                        return Err(LockError::backend(
                            NAME,
                            "a set transaction put a place without a lease",
                        ))
                    }
                },
                Plan::Keep { rev, lease } => {
                    let known = self.place(m.key, owner.token()).and_then(|p| p.lease);
                    match self.adopt_lease(lease, known).await? {
                        Some(lease) => (rev, lease),
                        None => return Ok(None),
                    }
                }
            };
            let place = Place {
                rev,
                lease: Some(lease),
                held: true,
                blockers: None,
                room: false,
                ..m.place.clone()
            };
            self.places().set(m.key, place);
            let token = FencingToken(u64::try_from(rev).unwrap_or(0));
            grants.push(lease.grant(token, started));
        }
        Ok(Some(grants))
    }

    /// Leaves nothing of a refused set: the owner's places an earlier try left (seen in
    /// `resp`, the read of the set's queues) are deleted, and the slots reserved for the set
    /// given up. A place the owner had before the set stays as it was.
    ///
    /// # Errors
    ///
    /// The store's error if a delete could not be sent: lockcore then releases the set's
    /// keys by owner, which finds the reserved slots.
    async fn leave_set(
        &self,
        members: &[Member<'_>],
        resp: &TxnResponse,
        owner: &Owner,
    ) -> Result<(), LockError> {
        for (index, m) in members.iter().enumerate().filter(|(_, m)| !m.before) {
            let queue = nth_all(resp, index);
            let ours = queue
                .iter()
                .find(|kv| kv.key() == m.own.as_slice() && held_by(kv.value(), owner.token()));
            if let Some(kv) = ours {
                let txn = delete_if_created_at(&m.own, kv.create_revision());
                self.txn("leave set", txn).await?;
            }
            let mut places = self.places();
            if places
                .get(m.key, owner.token())
                .is_some_and(|p| p.slot == m.place.slot)
            {
                places.take(m.key, owner.token());
            }
        }
        Ok(())
    }
}
