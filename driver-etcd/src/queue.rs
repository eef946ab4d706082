//! A lock's queue and the claims in it: etcd's concurrency recipe, the read-write variant
//! with weights, the grant always decided by what sees the contender's own key.
//!
//! Each contender puts a place of its own under the lock's prefix (`lock_key + hex(backend
//! id) + hex(slot)`), bound to its lease; the value carries the owner token (compared by
//! every operation), the claim's weight and capacity, and the label. A place holds when the
//! weights of every key created before it — holding or waiting — plus its own fit the
//! capacity: an exclusive place (weight = capacity) only when it is first, a reader behind
//! readers at once, a reader behind a writer only once the writer has gone. Counting the
//! waiting keys too is the arrival order: a writer queued behind readers is never overtaken
//! by a later reader, so no reservation is needed. Since the keys before a place can only
//! leave (revisions only grow), a place that holds keeps holding until it goes. Its token
//! is its create revision.
//!
//! A key with an empty value (what `etcdctl lock` and Go's `concurrency.Mutex` write) is an
//! exclusive place: the two exclude each other.
//!
//! A waiting place watches the queue's deletions and counts off the keys before it, so it
//! is woken only once they left room for it (see `wait`). Its watch reports its own key's
//! deletion too, so room seen before any such deletion means the place held at that
//! revision: the next attempt is granted without a transaction (`Places::take_room`).
//!
//! The safety rule (the bug Jepsen found in etcd's own lock in 2020): a contender holds only
//! when one transaction saw its own key present and holding, or its own watch showed room
//! made before any deletion of its key. A waiter whose key expired or was revoked while it
//! waited finds it absent in its next transaction, which queues it again at the back; it is
//! never told "acquired" on the strength of an earlier look at the queue.

use std::sync::Arc;
use std::time::Instant;

use etcd_client::{Compare, CompareOp, GetOptions, KeyValue, PutOptions, Txn, TxnOp, TxnResponse};
use futures_util::future::join_all;
use lockcore::driver::{AcquireOutcome, Contention, OwnerToken, WaitHint};
use lockcore::{Claim, ClaimMode, FencingToken, LockError, LockInfo, LockKey, Owner};

use crate::backend::EtcdBackend;
use crate::capabilities::NAME;
use crate::encoding::{backend_places, claim_of, claim_value, held_by, label_of, queue_key};
use crate::leases::LeaseState;
use crate::places::{Blockers, Place};
use crate::store::{
    delete_if_created_at, header_revision, holders, nth_all, nth_first, queue_range, token_of,
};

/// The queue transaction of a claim: if the owner's place `own` is absent, put it bound to
/// `lease` and read the queue (`[put, queue]`); else read the place and the queue before it
/// (`[place, queue]`, the whole queue while the place's revision `rev` is unknown). Either
/// way the queue comes in queue order.
fn claim_txn(own: &[u8], prefix: &[u8], value: &[u8], lease: i64, rev: Option<i64>) -> Txn {
    let all = queue_range();
    let before = match rev {
        Some(rev) => all.clone().with_max_create_revision(rev - 1),
        None => all.clone(),
    };
    let put = TxnOp::put(
        own.to_vec(),
        value.to_vec(),
        Some(PutOptions::new().with_lease(lease)),
    );
    Txn::new()
        .when([Compare::create_revision(own.to_vec(), CompareOp::Equal, 0)])
        .and_then([put, TxnOp::get(prefix.to_vec(), Some(all))])
        .or_else([
            TxnOp::get(own.to_vec(), None),
            TxnOp::get(prefix.to_vec(), Some(before)),
        ])
}

/// A place's key as one queue transaction saw it.
struct Entered {
    resp: TxnResponse,
    /// Whether the transaction created the key.
    created: bool,
    /// The key's create revision: its position in the queue, and its token once granted.
    rev: i64,
    /// What the key claims (as stored, when it was already there).
    claim: Claim,
    lease: LeaseState,
    /// When the transaction was sent: a grant's validity counts from here.
    started: Instant,
    /// The place, as reserved before the transaction.
    place: Place,
    /// The place's etcd key.
    own: Vec<u8>,
}

impl EtcdBackend {
    /// The etcd key of a place.
    pub(crate) fn place_key(&self, key: &LockKey, place: &Place) -> Vec<u8> {
        queue_key(self.namespace(), key, self.backend_id, place.slot)
    }

    /// The key and value of `owner`'s place in `key`'s queue when this backend no longer
    /// knows its slot (a release retried after its first try's answer was lost): one of
    /// this backend's few keys in the queue carries the owner's value.
    pub(crate) async fn find_place(
        &self,
        key: &LockKey,
        owner: &Owner,
    ) -> Result<Option<(Vec<u8>, Vec<u8>)>, LockError> {
        let mine = backend_places(self.namespace(), key, self.backend_id);
        let r = self.range(&mine, GetOptions::new().with_prefix()).await?;
        Ok(r.kvs()
            .iter()
            .find(|kv| held_by(kv.value(), owner.token()))
            .map(|kv| (kv.key().to_vec(), kv.value().to_vec())))
    }

    /// What this backend knows of `owner`'s place in `key`'s queue.
    pub(crate) fn place(&self, key: &LockKey, owner: &OwnerToken) -> Option<Place> {
        self.places().get(key, owner).cloned()
    }

    /// The state of a lease bound to our key that this backend did not record (an answer
    /// lost earlier): refreshed now so its end is known.
    pub(crate) async fn adopt_lease(
        &self,
        id: i64,
        known: Option<LeaseState>,
    ) -> Result<Option<LeaseState>, LockError> {
        if let Some(l) = known.filter(|l| l.id == id) {
            return Ok(Some(l));
        }
        let started = Instant::now();
        if !self.leases.keep_alive(id).await? {
            return Ok(None);
        }
        let granted = self.leases.time_to_live(id).await?;
        Ok(granted.map(|(_, ttl)| LeaseState::new(id, ttl, ttl, started)))
    }

    /// Sends the queue transaction ([`claim_txn`]) for `owner`'s place in `key`'s queue
    /// (reserved here, claiming `claim` if new). `None`: try again (the lease was gone, or
    /// the slot held a stale key, now cleared).
    async fn enter_queue(
        &self,
        key: &LockKey,
        owner: &Owner,
        secs: i64,
        claim: Claim,
    ) -> Result<Option<Entered>, LockError> {
        let prefix = self.etcd_key(key);
        let value = claim_value(owner, &claim);
        let started = Instant::now();
        // Reserved before anything is sent: a retry, a release or an abandon of this
        // request finds the same key.
        let place = self.places().reserve(key, owner.token(), claim);
        let own = self.place_key(key, &place);
        // The lease our key is bound to, if it still lives by our clock: a transaction
        // that finds the key present then needs no other lease.
        let known = place
            .lease
            .filter(|l| l.asked_for(secs) && l.alive_until() > started);
        let rev = (place.rev > 0).then_some(place.rev);
        let txn = |id| claim_txn(&own, &prefix, &value, id, rev);
        let Some((lease, resp)) = self.leases.with_lease(secs, known, txn).await? else {
            // The lease is gone, and our key (if any) with it.
            self.places().set(key, place.without_key());
            return Ok(None);
        };
        let created = resp.succeeded();
        // Our key as this transaction saw it: every decision rests on it.
        let (my_rev, my_lease, claim) = if created {
            (header_revision(&resp), lease.id, claim)
        } else {
            match nth_first(&resp, 0) {
                Some(kv) if held_by(kv.value(), owner.token()) => {
                    (kv.create_revision(), kv.lease(), claim_of(kv.value()))
                }
                Some(kv) => {
                    // The slot's key still holds a place this backend gave up (its
                    // delete failed): nobody waits on it any more. Clear it, try again.
                    self.leases.put_spare(lease);
                    let txn = delete_if_created_at(&own, kv.create_revision());
                    self.txn("clear place", txn).await?;
                    return Ok(None);
                }
                // Cannot happen (the compare saw it in the same transaction).
                None => return Ok(None),
            }
        };
        let lease = if my_lease == lease.id {
            lease
        } else {
            // Bound to an earlier lease of ours (an attempt whose answer was lost, or a
            // place this backend forgot): the one brought along is not needed.
            self.leases.put_spare(lease);
            match self.adopt_lease(my_lease, place.lease).await? {
                Some(l) => l,
                None => {
                    // Expired just now: the key went with it.
                    self.places().set(key, place.without_key());
                    return Ok(None);
                }
            }
        };
        Ok(Some(Entered {
            resp,
            created,
            rev: my_rev,
            claim,
            lease,
            started,
            place,
            own,
        }))
    }

    /// Refuses a place just created on a key held with another capacity: removes it (the
    /// key is never redefined) and names both capacities.
    async fn refuse_mismatch(
        &self,
        key: &LockKey,
        owner: &Owner,
        entered: &Entered,
        stored: u64,
        asked: &Claim,
    ) -> LockError {
        let txn = delete_if_created_at(&entered.own, entered.rev);
        match self.txn("refuse claim", txn).await {
            Ok(resp) if resp.succeeded() => {
                self.places().take(key, owner.token());
                self.leases.put_spare(entered.lease);
            }
            // The place expires with its lease; abandon removes it sooner.
            _ => {}
        }
        LockError::capacity_mismatch(key, stored, asked)
    }

    /// The key of `owner`'s place and the value it carries, known or looked up.
    pub(crate) async fn own_place(
        &self,
        key: &LockKey,
        owner: &Owner,
        place: Option<&Place>,
    ) -> Result<Option<(Vec<u8>, Vec<u8>)>, LockError> {
        match place {
            Some(p) => Ok(Some((self.place_key(key, p), claim_value(owner, &p.claim)))),
            None => self.find_place(key, owner).await,
        }
    }

    /// The queue's keys, in queue order.
    pub(crate) async fn read_queue(&self, key: &LockKey) -> Result<Vec<KeyValue>, LockError> {
        let prefix = self.etcd_key(key);
        let mut r = self.range(&prefix, queue_range()).await?;
        Ok(r.take_kvs())
    }

    /// Takes `claim` in `key`'s queue: granted if the place holds, else "held" with the
    /// place left queued (see the module docs).
    pub(crate) async fn try_claim(
        &self,
        key: &LockKey,
        owner: &Owner,
        secs: i64,
        claim: Claim,
    ) -> Result<AcquireOutcome, LockError> {
        let now = Instant::now();
        let room = self.places().take_room(key, owner.token(), secs, now);
        if let Some((rev, lease)) = room {
            // Our watch saw the place hold (see `wait_for_room`): granted as a transaction
            // seeing it would have granted it, without one.
            let token = FencingToken(u64::try_from(rev).unwrap_or(0));
            return Ok(AcquireOutcome::Acquired(lease.grant(token, now)));
        }
        // A place of the owner's answers, whatever this request asks (the rule below
        // serves an exclusive place too: it fits only when it is first).
        let claim = self.place(key, owner.token()).map_or(claim, |p| p.claim);
        for _ in 0..4 {
            let Some(entered) = self.enter_queue(key, owner, secs, claim).await? else {
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
            room: false,
            ..entered.place
        };
        if entered.claim.fits(used, 0) {
            self.places().set(
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
        self.places().set(
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
    /// a wake-up. Only the first is asked: the answer only bounds lockcore's blind wait (the
    /// waiter's watch reports every deletion, expiries included), and each lookup is a
    /// request on the path of every refusal: with four, a semaphore's waiters re-queuing
    /// after each release slowed the releases down.
    pub(crate) async fn blockers_remaining(
        &self,
        earlier: &[&KeyValue],
        claim: &Claim,
    ) -> Result<Option<std::time::Duration>, LockError> {
        let first = earlier.iter().find(|kv| {
            kv.lease() != 0
                && (claim.mode() != ClaimMode::Shared || claim_of(kv.value()).is_exclusive())
        });
        match first {
            Some(kv) => self.leases.holder_remaining(kv.lease()).await,
            None => Ok(None),
        }
    }

    /// Every place of `key`'s queue that holds, in queue order (tokens ascending).
    pub(crate) async fn queue_holders(&self, key: &LockKey) -> Result<Vec<LockInfo>, LockError> {
        let queue = self.read_queue(key).await?;
        let holders = holders(&queue);
        let ttls = join_all(
            holders
                .iter()
                .map(|kv| self.leases.holder_remaining(kv.lease())),
        )
        .await;
        let mut out = Vec::with_capacity(holders.len());
        for (kv, ttl) in holders.into_iter().zip(ttls) {
            let remaining = ttl?;
            // Zero: expired since the read, and gone with its lease.
            if remaining != Some(std::time::Duration::ZERO) {
                out.push(
                    LockInfo::new(label_of(kv.value()), token_of(kv), remaining)
                        .with_claim(claim_of(kv.value())),
                );
            }
        }
        Ok(out)
    }
}
