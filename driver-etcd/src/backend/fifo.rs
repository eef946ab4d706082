//! The FIFO layout ([`EtcdConfig::fair`](crate::EtcdConfig::fair)): etcd's concurrency
//! recipe for fair locks, with the grant always decided by a transaction that sees the
//! contender's own key.
//!
//! Each contender puts a key of its own under the lock's prefix (`lock_key + hex(backend
//! id) + hex(slot)`, the owner token in the value, compared by every operation), bound to
//! its lease, and the key with the lowest `create_revision` holds the lock (its
//! token is that revision). A contender that is not first waits for the deletion of the
//! key just before its own (its predecessor) only, so a release wakes exactly one waiter,
//! in queue order, and no attempt fails in vain. While it waits, its lease is kept alive,
//! so a long wait does not cost it its place.
//!
//! The safety rule (the bug Jepsen found in etcd's own lock in 2020): a contender holds the
//! lock only when one transaction saw its own key present *and* first. A waiter whose key
//! expired or was revoked while it waited finds it absent in its next transaction, which
//! queues it again at the back; it is never told "acquired" on the strength of an earlier
//! look at the queue.

pub(super) mod places;
mod wait;

use std::sync::Arc;
use std::time::Instant;

use etcd_client::{
    Compare, CompareOp, DeleteOptions, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget,
    Txn, TxnOp,
};
use lockcore::{
    AcquireOutcome, Contention, ExtendOutcome, FencingToken, Grant, LockError, LockInfo, LockKey,
    Owner, OwnerToken, ReleaseOutcome, WaitHint,
};
use tokio::sync::Notify;

use super::leases::{remaining_ttl, LeaseState, Leased, TxnResult};
use super::requests::{deleted_lease, header_revision, nth_all, nth_first, token_of};
use super::EtcdBackend;
use crate::capabilities::NAME;
use crate::encoding::{backend_places, held_by, holder_value, label_of, lock_key, queue_key};
use places::{Place, WaitsFor};

/// The range of a lock's whole queue, sorted by create revision.
fn queue_range(order: SortOrder, limit: i64) -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, order)
        .with_limit(limit)
}

impl EtcdBackend {
    fn reserve_place(&self, key: &LockKey, owner: &OwnerToken) -> Place {
        let mut places = self.places.lock().unwrap_or_else(|e| e.into_inner());
        places.reserve(key, owner)
    }

    /// The etcd key of a place.
    fn place_key(&self, key: &LockKey, place: &Place) -> Vec<u8> {
        queue_key(&self.namespace, key, self.backend_id, place.slot)
    }

    /// The key of `owner`'s place in `key`'s queue when this backend no longer knows its
    /// slot (a release retried after its first try's answer was lost): one of this
    /// backend's few keys in the queue carries the owner's value.
    async fn find_place(&self, key: &LockKey, owner: &Owner) -> Result<Option<Vec<u8>>, LockError> {
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
                        .map(|kv| kv.key().to_vec()))
                }
            })
            .await
    }

    fn place(&self, key: &LockKey, owner: &OwnerToken) -> Option<Place> {
        let places = self.places.lock().unwrap_or_else(|e| e.into_inner());
        places.get(key, owner).cloned()
    }

    fn set_place(&self, key: &LockKey, place: Place) {
        let mut places = self.places.lock().unwrap_or_else(|e| e.into_inner());
        places.set(key, place);
    }

    fn take_place(&self, key: &LockKey, owner: &OwnerToken) -> Option<Place> {
        let mut places = self.places.lock().unwrap_or_else(|e| e.into_inner());
        places.take(key, owner)
    }

    /// The queue transaction: put the owner's key bound to `lease` if it is absent, and in
    /// the same transaction read the queue's first key and the owner's predecessor.
    ///
    /// * created: `[put, first, last two]` — the new key is the last, so the other of the
    ///   last two (if any) is its predecessor;
    /// * present: `[own key, first]`, plus `[predecessor]` (the last key created before
    ///   `rev`) when the place's revision `rev` is known.
    async fn queue_txn(
        &self,
        own: &[u8],
        prefix: &[u8],
        value: &[u8],
        lease: i64,
        rev: Option<i64>,
    ) -> Result<TxnResult, LockError> {
        let mut present = vec![
            TxnOp::get(own.to_vec(), None),
            TxnOp::get(prefix.to_vec(), Some(queue_range(SortOrder::Ascend, 1))),
        ];
        if let Some(rev) = rev {
            present.push(TxnOp::get(
                prefix.to_vec(),
                Some(queue_range(SortOrder::Descend, 1).with_max_create_revision(rev - 1)),
            ));
        }
        let txn = Txn::new()
            .when([Compare::create_revision(own.to_vec(), CompareOp::Equal, 0)])
            .and_then([
                TxnOp::put(
                    own.to_vec(),
                    value.to_vec(),
                    Some(PutOptions::new().with_lease(lease)),
                ),
                TxnOp::get(prefix.to_vec(), Some(queue_range(SortOrder::Ascend, 1))),
                TxnOp::get(prefix.to_vec(), Some(queue_range(SortOrder::Descend, 2))),
            ])
            .or_else(present);
        self.leases.lease_txn("acquire", txn).await
    }

    /// The key created last before revision `rev` in the queue at `prefix`, and the
    /// revision of the read.
    async fn predecessor(
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
    async fn adopt_lease(
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

    pub(super) async fn fifo_try_acquire(
        &self,
        key: &LockKey,
        owner: &Owner,
        secs: i64,
    ) -> Result<AcquireOutcome, LockError> {
        let prefix = lock_key(&self.namespace, key);
        let value = holder_value(owner);
        for _ in 0..4 {
            let started = Instant::now();
            // Reserved before anything is sent: a retry, a release or an abandon of this
            // request finds the same key.
            let place = self.reserve_place(key, owner.token());
            let own = self.place_key(key, &place);
            // The lease our key is bound to, if it still lives by our clock: a transaction
            // that finds the key present then needs no other lease.
            let known = place
                .lease
                .filter(|l| l.asked == secs && l.alive_until() > started);
            let rev = (place.rev > 0).then_some(place.rev);
            let (lease, result) = match self
                .leases
                .with_lease(secs, known, |id| {
                    self.queue_txn(&own, &prefix, &value, id, rev)
                })
                .await?
            {
                Leased::Done(lease, result) => (lease, result),
                Leased::Retry => {
                    // The lease is gone, and our key (if any) with it.
                    self.set_place(key, place.without_key());
                    continue;
                }
            };
            let (resp, created) = match result {
                TxnResult::Created(r) => (r, true),
                TxnResult::Exists(r) => (r, false),
                TxnResult::LeaseMissing => continue,
            };
            let seen = header_revision(&resp);
            // Our key as this transaction saw it: every decision below rests on it.
            let (my_rev, my_lease) = if created {
                (seen, lease.id)
            } else {
                match nth_first(&resp, 0) {
                    Some(kv) if held_by(kv.value(), owner.token()) => {
                        (kv.create_revision(), kv.lease())
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
                        continue;
                    }
                    // Cannot happen (the compare saw it in the same transaction).
                    None => continue,
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
                        continue;
                    }
                }
            };
            let first = nth_first(&resp, 1);
            // A range after a put in one transaction sees the put, so the queue is never
            // empty here; were it not so, an empty queue next to our new key means ours is
            // the only one.
            let is_first = match &first {
                Some(kv) => kv.key() == own.as_slice(),
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
                        ..place
                    },
                );
                let token = FencingToken(u64::try_from(my_rev).unwrap_or(0));
                return Ok(AcquireOutcome::Acquired(lease.grant(token, started)));
            }
            // Queued: find the key just before ours.
            let pred = if created {
                nth_all(&resp, 2)
                    .into_iter()
                    .find(|kv| kv.key() != own.as_slice() && kv.create_revision() < my_rev)
                    .map(|kv| (kv, seen))
            } else if rev == Some(my_rev) {
                nth_first(&resp, 2).map(|kv| (kv, seen))
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
                ..place
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

    /// The key of `owner`'s place, known or looked up.
    async fn own_key(
        &self,
        key: &LockKey,
        owner: &Owner,
        place: Option<&Place>,
    ) -> Result<Option<Vec<u8>>, LockError> {
        match place {
            Some(p) => Ok(Some(self.place_key(key, p))),
            None => self.find_place(key, owner).await,
        }
    }

    pub(super) async fn fifo_release(
        &self,
        key: &LockKey,
        owner: &Owner,
    ) -> Result<ReleaseOutcome, LockError> {
        let prefix = lock_key(&self.namespace, key);
        let place = self.place(key, owner.token());
        let Some(own) = self.own_key(key, owner, place.as_ref()).await? else {
            return Ok(ReleaseOutcome::NotHeld);
        };
        // The first key is read before the delete, in the same transaction: whether we
        // held the lock or only a place in its queue. Either way the place goes: a
        // compensating release after a failed attempt must not leave one behind.
        let txn = Txn::new()
            .when([Compare::value(
                own.clone(),
                CompareOp::Equal,
                holder_value(owner),
            )])
            .and_then([
                TxnOp::get(prefix.clone(), Some(queue_range(SortOrder::Ascend, 1))),
                TxnOp::delete(own.clone(), Some(DeleteOptions::new().with_prev_key())),
            ]);
        let resp = self.txn("release", txn).await?;
        self.take_place(key, owner.token());
        if !resp.succeeded() {
            return Ok(ReleaseOutcome::NotHeld);
        }
        let was_first = nth_first(&resp, 0).is_some_and(|kv| kv.key() == own.as_slice());
        let deleted_lease = deleted_lease(&resp);
        self.places
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .wake_successor(key, &own);
        // The lease has no key left: keep it for the next acquisition.
        match (place.and_then(|p| p.lease), deleted_lease) {
            (Some(l), Some(d)) if l.id == d => self.leases.put_spare(l),
            (_, Some(d)) if d != 0 => self.leases.revoke_later(d),
            _ => {}
        }
        Ok(if was_first {
            ReleaseOutcome::Released
        } else {
            ReleaseOutcome::NotHeld
        })
    }

    pub(super) async fn fifo_abandon(&self, key: &LockKey, owner: &Owner) -> Result<(), LockError> {
        let Some(place) = self.place(key, owner.token()) else {
            // Nothing queued that we know of (a failed attempt is compensated by release).
            return Ok(());
        };
        if place.held {
            // A later request of the same owner holds the lock through this place.
            return Ok(());
        }
        let own = self.place_key(key, &place);
        // Only this owner's place, and only the one this backend knows (an owner's later
        // place has another revision).
        let mut compare = vec![Compare::value(
            own.clone(),
            CompareOp::Equal,
            holder_value(owner),
        )];
        if place.rev > 0 {
            compare.push(Compare::create_revision(
                own.clone(),
                CompareOp::Equal,
                place.rev,
            ));
        }
        let txn = Txn::new()
            .when(compare)
            .and_then([TxnOp::delete(own.clone(), None)])
            .or_else([TxnOp::get(own.clone(), None)]);
        let resp = self.txn("abandon", txn).await?;
        // Deleted now, or already gone: the slot is free (unless a later request of the
        // owner has taken the place over meanwhile).
        let gone = resp.succeeded() || nth_first(&resp, 0).is_none();
        if gone {
            let mut places = self.places.lock().unwrap_or_else(|e| e.into_inner());
            if places
                .get(key, owner.token())
                .is_some_and(|p| p.rev == place.rev && !p.held)
            {
                places.take(key, owner.token());
            }
            places.wake_successor(key, &own);
            drop(places);
            if resp.succeeded() {
                if let Some(l) = place.lease {
                    self.leases.put_spare(l);
                }
            }
        }
        Ok(())
    }

    pub(super) async fn fifo_extend(
        &self,
        key: &LockKey,
        owner: &Owner,
    ) -> Result<ExtendOutcome, LockError> {
        let prefix = lock_key(&self.namespace, key);
        let place = self.place(key, owner.token());
        let Some(own) = self.own_key(key, owner, place.as_ref()).await? else {
            return Ok(ExtendOutcome::NotHeld);
        };
        let started = Instant::now();
        // A read-only transaction: our key, and whether it is still first.
        let txn = Txn::new().and_then([
            TxnOp::get(own.clone(), None),
            TxnOp::get(prefix.clone(), Some(queue_range(SortOrder::Ascend, 1))),
        ]);
        let known = place.as_ref().and_then(|p| p.lease);
        let (resp, alive) = match known {
            Some(l) => {
                let (resp, alive) =
                    tokio::join!(self.txn("extend", txn), self.leases.keep_alive(l.id));
                (resp?, Some(alive))
            }
            None => (self.txn("extend", txn).await?, None),
        };
        let mine = nth_first(&resp, 0).filter(|kv| held_by(kv.value(), owner.token()));
        let first = nth_first(&resp, 1);
        let Some(kv) = mine.filter(|_| first.is_some_and(|f| f.key() == own.as_slice())) else {
            return Ok(ExtendOutcome::NotHeld);
        };
        let lease = match (known, alive) {
            (Some(l), Some(alive)) if l.id == kv.lease() => {
                if !alive? {
                    return Ok(ExtendOutcome::NotHeld);
                }
                LeaseState {
                    refreshed: started,
                    ..l
                }
            }
            _ => match self.adopt_lease(kv.lease(), None).await? {
                Some(l) => l,
                None => return Ok(ExtendOutcome::NotHeld),
            },
        };
        if let Some(p) = place {
            self.set_place(
                key,
                Place {
                    rev: kv.create_revision(),
                    lease: Some(lease),
                    held: true,
                    waits_for: None,
                    ..p
                },
            );
        }
        Ok(ExtendOutcome::Extended(Grant::new(
            token_of(&kv),
            lease.ttl(),
        )))
    }

    /// The queue's first key.
    async fn first_in_queue(&self, key: &LockKey) -> Result<Option<KeyValue>, LockError> {
        let prefix = lock_key(&self.namespace, key);
        self.endpoints
            .call("get", |mut c| {
                let prefix = prefix.clone();
                async move {
                    let mut r = c
                        .get(prefix, Some(queue_range(SortOrder::Ascend, 1)))
                        .await?;
                    Ok(r.take_kvs().into_iter().next())
                }
            })
            .await
    }

    pub(super) async fn fifo_inspect(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        for _ in 0..8 {
            let Some(kv) = self.first_in_queue(key).await? else {
                return Ok(None);
            };
            let remaining = if kv.lease() == 0 {
                None
            } else {
                match self.leases.time_to_live(kv.lease()).await? {
                    Some((left, granted)) => Some(remaining_ttl(left, granted)),
                    // Expired since the read: the next in line holds it now, or nobody.
                    None => continue,
                }
            };
            return Ok(Some(LockInfo::new(
                label_of(kv.value()),
                token_of(&kv),
                remaining,
            )));
        }
        Err(LockError::unavailable(
            NAME,
            "the lock kept changing hands during inspect",
        ))
    }

    pub(super) async fn fifo_force_release(
        &self,
        key: &LockKey,
    ) -> Result<ReleaseOutcome, LockError> {
        self.force_release_holder(|| self.first_in_queue(key)).await
    }
}
