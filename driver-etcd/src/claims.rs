//! Shared claims and semaphore permits in the FIFO layout: the read-write variant of the
//! queue recipe, with weights.
//!
//! A claim's place carries its weight and capacity in its value (see `claim_value`). A
//! place holds when the weights of every key created before it — holding or waiting — plus
//! its own fit the capacity: an exclusive place (weight = capacity) only when it is first,
//! a reader behind readers at once, a reader behind a writer only once the writer has
//! gone. Counting the waiting keys too is what makes it fair: a writer queued behind
//! readers is never overtaken by a later reader, so no reservation is needed (the
//! reservations of the other stores are for stores without a queue). And since the keys
//! before a place can only leave (revisions only grow), a place that holds keeps holding
//! until it goes.
//!
//! A waiting claim watches the queue's deletions and counts off the keys before it, so it
//! is woken only once they left room for it — not at every release. Its watch reports its
//! own key's deletion too, so room seen before any such deletion means the place held at
//! that revision: the next attempt is granted without a transaction (`Places::take_room`).

use std::sync::Arc;
use std::time::Instant;

use etcd_client::{Compare, CompareOp, KeyValue, SortOrder, Txn, TxnOp};
use futures_util::future::join_all;
use lockcore::driver::{AcquireOutcome, Contention, WaitHint};
use lockcore::{
    Claim, ClaimMode, FencingToken, LockError, LockInfo, LockKey, Owner, ReleaseOutcome,
};

use crate::backend::EtcdBackend;
use crate::capabilities::NAME;
use crate::encoding::{claim_of, claim_value, label_of, lock_key};
use crate::leases::remaining_ttl;
use crate::places::{Blockers, Place};
use crate::store::{header_revision, nth_all, token_of};
use crate::store::{holders, place_txn, queue_range, Entered};

/// How many of the keys blocking a claim are asked for their remaining TTL: the first only.
/// The answer only bounds lockcore's blind wait (the waiter's watch reports every deletion,
/// expiries included), and each lookup is a request on the path of every refusal: with
/// four, a semaphore's waiters re-queuing after each release slowed the releases down.
const TTL_LOOKUPS: usize = 1;

/// The queue transaction of a shared or permit claim: put the owner's key bound to `lease`
/// if it is absent (`[put, queue]`), else read it (`[own key, queue]`); the queue is every
/// key in queue order (only those before the place when its revision `rev` is known).
fn claim_txn(own: &[u8], prefix: &[u8], value: &[u8], lease: i64, rev: Option<i64>) -> Txn {
    let all = queue_range(SortOrder::Ascend, 0);
    let before = match rev {
        Some(rev) => all.clone().with_max_create_revision(rev - 1),
        None => all.clone(),
    };
    place_txn(
        own,
        value,
        lease,
        [TxnOp::get(prefix.to_vec(), Some(all))],
        [TxnOp::get(prefix.to_vec(), Some(before))],
    )
}

impl EtcdBackend {
    /// Takes `claim` in `key`'s queue (any claim; the exclusive ones go through
    /// `try_acquire`, which waits on its predecessor alone).
    pub(crate) async fn try_claim(
        &self,
        key: &LockKey,
        owner: &Owner,
        secs: i64,
        claim: Claim,
    ) -> Result<AcquireOutcome, LockError> {
        let now = Instant::now();
        let room = self
            .places
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take_room(key, owner.token(), secs, now);
        if let Some((rev, lease)) = room {
            // Our watch saw the place hold (see `wait_for_room`): granted as a transaction
            // seeing it would have granted it, without one.
            let token = FencingToken(u64::try_from(rev).unwrap_or(0));
            return Ok(AcquireOutcome::Acquired(lease.grant(token, now)));
        }
        // A place of the owner's answers, whatever this request asks (the rule below
        // serves an exclusive place too: it fits only when it is first).
        let claim = self.place(key, owner.token()).map_or(claim, |p| p.claim);
        let prefix = lock_key(&self.namespace, key);
        let value = claim_value(owner, &claim);
        for _ in 0..4 {
            let Some(entered) = self
                .enter_queue(key, owner, secs, claim, |own, id, rev| {
                    claim_txn(own, &prefix, &value, id, rev)
                })
                .await?
            else {
                continue;
            };
            let queue = nth_all(&entered.resp, 1);
            let earlier: Vec<&KeyValue> = queue
                .iter()
                .filter(|kv| kv.create_revision() < entered.rev)
                .collect();
            if entered.created {
                let other = earlier
                    .iter()
                    .map(|kv| claim_of(kv.value()))
                    .find(|c| !c.same_capacity(&entered.claim));
                if let Some(other) = other {
                    return Err(self
                        .refuse_mismatch(key, owner, &entered, other.capacity(), &claim)
                        .await);
                }
            }
            return self.decide_claim(key, entered, &earlier).await;
        }
        Err(LockError::unavailable(
            NAME,
            "leases kept expiring before the claim could be queued for",
        ))
    }

    /// Grants the place `entered` if the keys before it leave room for it; otherwise
    /// records what it waits for and answers "held".
    async fn decide_claim(
        &self,
        key: &LockKey,
        entered: Entered,
        earlier: &[&KeyValue],
    ) -> Result<AcquireOutcome, LockError> {
        let weights: Vec<u64> = earlier
            .iter()
            .map(|kv| claim_of(kv.value()).weight())
            .collect();
        let used = weights.iter().fold(0u64, |s, w| s.saturating_add(*w));
        let place = Place {
            rev: entered.rev,
            claim: entered.claim,
            lease: Some(entered.lease),
            waits_for: None,
            room: false,
            ..entered.place
        };
        if entered.claim.fits(used, 0) {
            self.set_place(
                key,
                Place {
                    held: true,
                    blockers: None,
                    ..place
                },
            );
            let token = FencingToken(u64::try_from(entered.rev).unwrap_or(0));
            return Ok(AcquireOutcome::Acquired(
                entered.lease.grant(token, entered.started),
            ));
        }
        let blockers = Blockers {
            keys: earlier
                .iter()
                .zip(weights)
                .map(|(kv, w)| (kv.key().to_vec(), w))
                .collect(),
            seen: header_revision(&entered.resp),
        };
        self.set_place(
            key,
            Place {
                held: false,
                blockers: Some(Arc::new(blockers)),
                ..place
            },
        );
        let remaining = self.blockers_remaining(earlier, &entered.claim).await?;
        // The hint names our place (its revision); wait_released finds what it waits for.
        Ok(AcquireOutcome::Held(
            Contention::new(remaining).with_hint(WaitHint::at_revision(entered.rev)),
        ))
    }

    /// The end of the lease of the first key that blocks `claim` (for a reader, the first
    /// writer before it; else the first key before it): how long lockcore may wait without
    /// a wake-up.
    async fn blockers_remaining(
        &self,
        earlier: &[&KeyValue],
        claim: &Claim,
    ) -> Result<Option<std::time::Duration>, LockError> {
        let blocking = earlier
            .iter()
            .filter(|kv| claim.mode() != ClaimMode::Shared || claim_of(kv.value()).is_exclusive())
            .filter(|kv| kv.lease() != 0)
            .take(TTL_LOOKUPS);
        let left = join_all(blocking.map(|kv| self.leases.holder_remaining(kv.lease()))).await;
        let mut soonest = None;
        for l in left {
            if let Some(l) = l? {
                soonest = Some(soonest.map_or(l, |s: std::time::Duration| s.min(l)));
            }
        }
        Ok(soonest)
    }

    /// Every place of `key`'s queue that holds, in queue order (tokens ascending).
    pub(crate) async fn queue_holders(&self, key: &LockKey) -> Result<Vec<LockInfo>, LockError> {
        let queue = self.read_queue(key, 0).await?;
        let holders = holders(&queue);
        let ttls = join_all(holders.iter().map(|kv| async move {
            match kv.lease() {
                0 => Ok(Some(None)),
                lease => Ok::<_, LockError>(
                    self.leases
                        .time_to_live(lease)
                        .await?
                        .map(|(left, granted)| Some(remaining_ttl(left, granted))),
                ),
            }
        }))
        .await;
        let mut out = Vec::with_capacity(holders.len());
        for (kv, ttl) in holders.into_iter().zip(ttls) {
            // `None`: expired since the read, and gone with its lease.
            if let Some(remaining) = ttl? {
                out.push(
                    LockInfo::new(label_of(kv.value()), token_of(kv), remaining)
                        .with_claim(claim_of(kv.value())),
                );
            }
        }
        Ok(out)
    }

    /// Breaks every hold on `key` (the exclusive holder, or every share that holds): one
    /// transaction deletes them if they are still the same incarnations, then their leases
    /// are revoked so their renewals fail at once. Waiting places stay queued.
    pub(crate) async fn break_holders(&self, key: &LockKey) -> Result<ReleaseOutcome, LockError> {
        for _ in 0..8 {
            let queue = self.read_queue(key, 0).await?;
            let holders = holders(&queue);
            if holders.is_empty() {
                return Ok(ReleaseOutcome::NotHeld);
            }
            let same: Vec<Compare> = holders
                .iter()
                .map(|kv| {
                    Compare::create_revision(
                        kv.key().to_vec(),
                        CompareOp::Equal,
                        kv.create_revision(),
                    )
                })
                .collect();
            let delete: Vec<TxnOp> = holders
                .iter()
                .map(|kv| TxnOp::delete(kv.key().to_vec(), None))
                .collect();
            let txn = Txn::new().when(same).and_then(delete);
            if self.txn("force release", txn).await?.succeeded() {
                for kv in holders.iter().filter(|kv| kv.lease() != 0) {
                    // A lease that still carries keys (a client's shared renewal lease)
                    // keeps them.
                    let _ = self.leases.revoke_if_unused(kv.lease()).await;
                }
                return Ok(ReleaseOutcome::Released);
            }
        }
        Err(LockError::unavailable(
            NAME,
            "the lock kept changing hands during force_release",
        ))
    }
}
