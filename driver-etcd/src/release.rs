//! How a place ends or goes on: release (the holder's, or a compensating one), abandon (a
//! waiter giving up), and extend (a holder's renewal) — each finds the owner's place
//! whatever it claims.

use std::time::Instant;

use etcd_client::{Compare, CompareOp, DeleteOptions, KeyValue, Txn, TxnOp};
use lockcore::driver::{ExtendOutcome, Grant};
use lockcore::{LockError, LockKey, Owner, ReleaseOutcome};

use crate::backend::EtcdBackend;
use crate::capabilities::NAME;
use crate::encoding::{claim_of, claim_value, held_by};
use crate::leases::LeaseState;
use crate::places::Place;
use crate::store::{deleted_kv, nth_all, nth_first, token_of};
use crate::store::{fits_at, holders, holding_range};

/// The release of the place `own` carrying `value`: read whether it holds (the queue's
/// first key; for a share, the whole queue), then delete it, in one transaction.
fn release_txn(own: &[u8], prefix: &[u8], value: &[u8]) -> Txn {
    let delete = TxnOp::delete(own.to_vec(), Some(DeleteOptions::new().with_prev_key()));
    let mine = Compare::value(own.to_vec(), CompareOp::Equal, value.to_vec());
    let queue = TxnOp::get(prefix.to_vec(), Some(holding_range(&claim_of(value))));
    Txn::new().when([mine]).and_then([queue, delete])
}

impl EtcdBackend {
    pub(crate) async fn release_place(
        &self,
        key: &LockKey,
        owner: &Owner,
    ) -> Result<ReleaseOutcome, LockError> {
        let prefix = self.etcd_key(key);
        let place = self.place(key, owner.token());
        let Some((own, value)) = self.own_place(key, owner, place.as_ref()).await? else {
            return Ok(ReleaseOutcome::NotHeld);
        };
        // Whether the place held the lock is read before the delete, in the same
        // transaction: an exclusive place held it if it was first, a share if the keys
        // before it left room for it. Either way the place goes: a compensating release
        // after a failed attempt must not leave one behind.
        let resp = match self
            .txn("release", release_txn(&own, &prefix, &value))
            .await
        {
            Ok(resp) => resp,
            Err(e) => {
                // A place on a shared lease would live on with the other holds' renewals:
                // deleted before that lease is kept alive again.
                if let Some(l) = place.as_ref().and_then(|p| p.lease) {
                    if self.leases.is_shared(l.id) {
                        self.leases.orphan(l.id, own.clone(), value.clone());
                    }
                }
                return Err(e);
            }
        };
        self.places().take(key, owner.token());
        let Some(deleted) = deleted_kv(&resp).filter(|_| resp.succeeded()) else {
            return Ok(ReleaseOutcome::NotHeld);
        };
        // The lease has no key left: kept for the next acquisition (a lease this backend
        // did not know, of a place it forgot, is left to expire).
        if let Some(l) = place.and_then(|p| p.lease) {
            if l.id == deleted.lease() {
                self.leases.put_spare(l);
            }
        }
        let claim = claim_of(&value);
        Ok(
            if fits_at(&nth_all(&resp, 0), deleted.create_revision(), &claim) {
                ReleaseOutcome::Released
            } else {
                ReleaseOutcome::NotHeld
            },
        )
    }

    pub(crate) async fn abandon_place(
        &self,
        key: &LockKey,
        owner: &Owner,
    ) -> Result<(), LockError> {
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
            claim_value(owner, &place.claim),
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
            let mut places = self.places();
            if places
                .get(key, owner.token())
                .is_some_and(|p| p.rev == place.rev && !p.held)
            {
                places.take(key, owner.token());
            }
            drop(places);
            if resp.succeeded() {
                if let Some(l) = place.lease {
                    self.leases.put_spare(l);
                }
            }
        }
        Ok(())
    }

    pub(crate) async fn extend_place(
        &self,
        key: &LockKey,
        owner: &Owner,
    ) -> Result<ExtendOutcome, LockError> {
        let prefix = self.etcd_key(key);
        let place = self.place(key, owner.token());
        let Some((own, value)) = self.own_place(key, owner, place.as_ref()).await? else {
            return Ok(ExtendOutcome::NotHeld);
        };
        let claim = claim_of(&value);
        let started = Instant::now();
        // A read-only transaction: our key, and whether it still holds (first, or room
        // left for it by the keys before it: the queue's first key, or for a share all).
        let txn = Txn::new().and_then([
            TxnOp::get(own.clone(), None),
            TxnOp::get(prefix.clone(), Some(holding_range(&claim))),
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
        let holds = |kv: &KeyValue| fits_at(&nth_all(&resp, 1), kv.create_revision(), &claim);
        let Some(kv) = mine.filter(holds) else {
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
            self.places().set(
                key,
                Place {
                    rev: kv.create_revision(),
                    lease: Some(lease),
                    held: true,
                    room: false,
                    ..p
                },
            );
        }
        Ok(ExtendOutcome::Extended(Grant::new(
            token_of(&kv),
            lease.ttl(),
        )))
    }

    /// Breaks every hold on `key` (the exclusive holder, or every share that holds): one
    /// transaction deletes them if they are still the same incarnations, then their leases
    /// are revoked so their renewals fail at once. Waiting places stay queued.
    pub(crate) async fn break_holders(&self, key: &LockKey) -> Result<ReleaseOutcome, LockError> {
        for _ in 0..8 {
            let queue = self.read_queue(key).await?;
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
