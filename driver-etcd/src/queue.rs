//! A lock's queue and its exclusive claims: etcd's concurrency recipe for locks, with the
//! grant always decided by what sees the contender's own key: a transaction, or a waiting
//! share's own watch (see `claims` and `wait`).
//!
//! Each contender puts a key of its own under the lock's prefix (`lock_key + hex(backend
//! id) + hex(slot)`, the owner token in the value, compared by every operation), bound to
//! its lease, and the key with the lowest `create_revision` holds the lock (its
//! token is that revision). A contender that is not first waits for the deletion of the
//! key just before its own (its predecessor) only (reported by the backend's one watch of
//! the queue, `crate::watch::QueueWatches`), so a release wakes exactly one waiter,
//! in queue order, and no attempt fails in vain. While it waits, its lease is kept alive,
//! so a long wait does not cost it its place.
//!
//! The safety rule (the bug Jepsen found in etcd's own lock in 2020): a contender holds the
//! lock only when one transaction saw its own key present *and* first (a waiting share:
//! when its own watch, which reports its key's deletion too, showed room made before any
//! such deletion). A waiter whose key expired or was revoked while it waited finds it
//! absent in its next transaction, which queues it again at the back; it is never told
//! "acquired" on the strength of an earlier look at the queue.

use std::sync::Arc;
use std::time::Instant;

use etcd_client::{Compare, CompareOp, GetOptions, KeyValue, SortOrder, Txn, TxnOp};
use lockcore::driver::{AcquireOutcome, Contention, OwnerToken, WaitHint};
use lockcore::{Claim, FencingToken, LockError, LockKey, Owner};
use tokio::sync::Notify;

use crate::backend::EtcdBackend;
use crate::capabilities::NAME;
use crate::encoding::{
    backend_places, claim_of, claim_value, held_by, holder_value, lock_key, queue_key,
};
use crate::leases::{LeaseState, Leased, TxnResult};
use crate::places::{Place, WaitsFor};
use crate::store::{header_revision, nth_all, nth_first};
use crate::store::{place_txn, queue_range, Entered};

/// The queue transaction of an exclusive claim: put the owner's key bound to `lease` if it
/// is absent, and in the same transaction read the queue's first key and the owner's
/// predecessor.
///
/// * created: `[put, first, last two]` — the new key is the last, so the other of the
///   last two (if any) is its predecessor;
/// * present: `[own key, first]`, plus `[predecessor]` (the last key created before
///   `rev`) when the place's revision `rev` is known.
fn queue_txn(own: &[u8], prefix: &[u8], value: &[u8], lease: i64, rev: Option<i64>) -> Txn {
    let first = || TxnOp::get(prefix.to_vec(), Some(queue_range(SortOrder::Ascend, 1)));
    let mut present = vec![first()];
    if let Some(rev) = rev {
        present.push(TxnOp::get(
            prefix.to_vec(),
            Some(queue_range(SortOrder::Descend, 1).with_max_create_revision(rev - 1)),
        ));
    }
    let last_two = TxnOp::get(prefix.to_vec(), Some(queue_range(SortOrder::Descend, 2)));
    place_txn(own, value, lease, [first(), last_two], present)
}

impl EtcdBackend {
    pub(crate) fn reserve_place(&self, key: &LockKey, owner: &OwnerToken, claim: Claim) -> Place {
        let mut places = self.places.lock().unwrap_or_else(|e| e.into_inner());
        places.reserve(key, owner, claim)
    }

    /// The etcd key of a place.
    pub(crate) fn place_key(&self, key: &LockKey, place: &Place) -> Vec<u8> {
        queue_key(&self.namespace, key, self.backend_id, place.slot)
    }

    /// The key and value of `owner`'s place in `key`'s queue when this backend no longer
    /// knows its slot (a release retried after its first try's answer was lost): one of
    /// this backend's few keys in the queue carries the owner's value.
    pub(crate) async fn find_place(
        &self,
        key: &LockKey,
        owner: &Owner,
    ) -> Result<Option<(Vec<u8>, Vec<u8>)>, LockError> {
        let mine = backend_places(&self.namespace, key, self.backend_id);
        let token = *owner.token();
        self.endpoints
            .call("get", |mut c| {
                let mine = mine.clone();
                async move {
                    let r = c.get(mine, Some(GetOptions::new().with_prefix())).await?;
                    Ok(r.kvs()
                        .iter()
                        .find(|kv| held_by(kv.value(), &token))
                        .map(|kv| (kv.key().to_vec(), kv.value().to_vec())))
                }
            })
            .await
    }

    pub(crate) fn place(&self, key: &LockKey, owner: &OwnerToken) -> Option<Place> {
        let places = self.places.lock().unwrap_or_else(|e| e.into_inner());
        places.get(key, owner).cloned()
    }

    pub(crate) fn set_place(&self, key: &LockKey, place: Place) {
        let mut places = self.places.lock().unwrap_or_else(|e| e.into_inner());
        places.set(key, place);
    }

    pub(crate) fn take_place(&self, key: &LockKey, owner: &OwnerToken) -> Option<Place> {
        let mut places = self.places.lock().unwrap_or_else(|e| e.into_inner());
        places.take(key, owner)
    }

    /// The key created last before revision `rev` in the queue at `prefix`, and the
    /// revision of the read.
    pub(crate) async fn predecessor(
        &self,
        prefix: &[u8],
        rev: i64,
    ) -> Result<(Option<KeyValue>, i64), LockError> {
        self.endpoints
            .call("get", |mut c| {
                let prefix = prefix.to_vec();
                async move {
                    let opts = queue_range(SortOrder::Descend, 1).with_max_create_revision(rev - 1);
                    let mut r = c.get(prefix, Some(opts)).await?;
                    let at = r.header().map(|h| h.revision()).unwrap_or(0);
                    Ok((r.take_kvs().into_iter().next(), at))
                }
            })
            .await
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
        self.leases.lease_state(id, started).await
    }

    /// Sends one queue transaction for `owner`'s place in `key`'s queue (reserved here,
    /// claiming `claim` if new): `txn(own key, lease, known revision)`, whose success branch
    /// puts the place and whose failure branch begins with a get of it. `None`: try again
    /// (the lease was gone, or the slot held a stale key, now cleared).
    pub(crate) async fn enter_queue(
        &self,
        key: &LockKey,
        owner: &Owner,
        secs: i64,
        claim: Claim,
        txn: impl Fn(&[u8], i64, Option<i64>) -> Txn,
    ) -> Result<Option<Entered>, LockError> {
        let started = Instant::now();
        // Reserved before anything is sent: a retry, a release or an abandon of this
        // request finds the same key.
        let place = self.reserve_place(key, owner.token(), claim);
        let own = self.place_key(key, &place);
        // The lease our key is bound to, if it still lives by our clock: a transaction
        // that finds the key present then needs no other lease.
        let known = place
            .lease
            .filter(|l| l.asked_for(secs) && l.alive_until() > started);
        let rev = (place.rev > 0).then_some(place.rev);
        let (lease, result) = match self
            .leases
            .with_lease(secs, known, |id| {
                self.leases.lease_txn("acquire", txn(&own, id, rev))
            })
            .await?
        {
            Leased::Done(lease, result) => (lease, result),
            Leased::Retry => {
                // The lease is gone, and our key (if any) with it.
                self.set_place(key, place.without_key());
                return Ok(None);
            }
        };
        let (resp, created) = match result {
            TxnResult::Created(r) => (r, true),
            TxnResult::Exists(r) => (r, false),
            TxnResult::LeaseMissing => return Ok(None),
        };
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
                    let txn = Txn::new()
                        .when([Compare::create_revision(
                            own.clone(),
                            CompareOp::Equal,
                            kv.create_revision(),
                        )])
                        .and_then([TxnOp::delete(own.clone(), None)]);
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
                    self.set_place(key, place.without_key());
                    return Ok(None);
                }
            }
        };
        Ok(Some(Entered {
            resp,
            created,
            rev: my_rev,
            known_rev: place.rev,
            claim,
            lease,
            started,
            place,
            own,
        }))
    }

    /// Refuses a place just created on a key held with another capacity: removes it (the
    /// key is never redefined) and names both capacities.
    pub(crate) async fn refuse_mismatch(
        &self,
        key: &LockKey,
        owner: &Owner,
        entered: &Entered,
        stored: u64,
        asked: &Claim,
    ) -> LockError {
        let own = &entered.own;
        let txn = Txn::new()
            .when([Compare::create_revision(
                own.clone(),
                CompareOp::Equal,
                entered.rev,
            )])
            .and_then([TxnOp::delete(own.clone(), None)]);
        match self.txn("refuse claim", txn).await {
            Ok(resp) if resp.succeeded() => {
                self.take_place(key, owner.token());
                self.leases.put_spare(entered.lease);
            }
            // The place expires with its lease; abandon removes it sooner.
            _ => {}
        }
        LockError::capacity_mismatch(key, stored, asked)
    }

    pub(crate) async fn try_acquire(
        &self,
        key: &LockKey,
        owner: &Owner,
        secs: i64,
    ) -> Result<AcquireOutcome, LockError> {
        if let Some(claim) = self
            .place(key, owner.token())
            .map(|p| p.claim)
            .filter(|c| !c.is_exclusive())
        {
            // The owner's place claims a share: that place answers, whatever is asked.
            return self.try_claim(key, owner, secs, claim).await;
        }
        let prefix = lock_key(&self.namespace, key);
        let value = holder_value(owner);
        let exclusive = Claim::exclusive();
        for _ in 0..4 {
            let Some(entered) = self
                .enter_queue(key, owner, secs, exclusive, |own, id, rev| {
                    queue_txn(own, &prefix, &value, id, rev)
                })
                .await?
            else {
                continue;
            };
            if !entered.claim.is_exclusive() {
                // Our own earlier place, claiming a share (a place this backend forgot).
                return self.try_claim(key, owner, secs, entered.claim).await;
            }
            let Entered {
                resp,
                created,
                rev: my_rev,
                known_rev,
                lease,
                started,
                place,
                ..
            } = &entered;
            let (created, my_rev, lease, started) = (*created, *my_rev, *lease, *started);
            let own = entered.own.as_slice();
            let seen = header_revision(resp);
            let first = nth_first(resp, 1);
            // A range after a put in one transaction sees the put, so the queue is never
            // empty here; were it not so, an empty queue next to our new key means ours is
            // the only one.
            let is_first = match &first {
                Some(kv) => kv.key() == own,
                None => created,
            };
            if is_first {
                self.set_place(
                    key,
                    Place {
                        rev: my_rev,
                        lease: Some(lease),
                        held: true,
                        waits_for: None,
                        room: false,
                        ..place.clone()
                    },
                );
                let token = FencingToken(u64::try_from(my_rev).unwrap_or(0));
                return Ok(AcquireOutcome::Acquired(lease.grant(token, started)));
            }
            if created {
                // Every place of a queue agrees on its capacity (each is checked against
                // those before it when created), so the first one tells.
                let stored = first.as_ref().map_or(exclusive, |kv| claim_of(kv.value()));
                if !stored.same_capacity(&exclusive) {
                    return Err(self
                        .refuse_mismatch(key, owner, &entered, stored.capacity(), &exclusive)
                        .await);
                }
            }
            // Queued: find the key just before ours.
            let pred = if created {
                nth_all(resp, 2)
                    .into_iter()
                    .find(|kv| kv.key() != own && kv.create_revision() < my_rev)
                    .map(|kv| (kv, seen))
            } else if *known_rev == my_rev {
                nth_first(resp, 2).map(|kv| (kv, seen))
            } else {
                match self.predecessor(&prefix, my_rev).await? {
                    (Some(kv), at) => Some((kv, at)),
                    (None, _) => None,
                }
            };
            let mut place = Place {
                rev: my_rev,
                lease: Some(lease),
                held: false,
                waits_for: None,
                room: false,
                ..place.clone()
            };
            let Some((pred, at)) = pred else {
                // Everyone before us left since the transaction: look again.
                self.set_place(key, place);
                continue;
            };
            place.waits_for = Some(WaitsFor {
                key: pred.key().to_vec(),
                rev: pred.create_revision(),
                seen: at,
                wake: Arc::new(Notify::new()),
            });
            self.set_place(key, place);
            // The holder's remaining TTL bounds how long lockcore waits blind; our own
            // predecessor's deletion is what wakes us.
            let lease = first.as_ref().map_or(0, KeyValue::lease);
            let remaining = self.leases.holder_remaining(lease).await?;
            // The hint names our place (its revision); wait_released finds what to watch
            // from it.
            return Ok(AcquireOutcome::Held(
                Contention::new(remaining).with_hint(WaitHint::at_revision(my_rev)),
            ));
        }
        Err(LockError::unavailable(
            NAME,
            "leases kept expiring before the lock could be queued for",
        ))
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

    /// The queue's first `limit` keys (0: all of them), in queue order.
    pub(crate) async fn read_queue(
        &self,
        key: &LockKey,
        limit: i64,
    ) -> Result<Vec<KeyValue>, LockError> {
        let prefix = lock_key(&self.namespace, key);
        self.endpoints
            .call("get", |mut c| {
                let prefix = prefix.clone();
                async move {
                    let mut r = c
                        .get(prefix, Some(queue_range(SortOrder::Ascend, limit)))
                        .await?;
                    Ok(r.take_kvs())
                }
            })
            .await
    }
}
