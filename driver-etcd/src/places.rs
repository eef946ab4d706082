//! This backend's places in lock queues: which slot (and so which etcd key) each
//! local contender has, what it knows of that key, and what it waits for.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockcore::driver::OwnerToken;
use lockcore::{Claim, FencingToken, LockKey};

use crate::leases::LeaseState;

/// How long a place reserved for a request that never got an answer is kept.
const RESERVATION: Duration = Duration::from_secs(60);
/// One of this backend's places in a lock's queue.
#[derive(Clone, Debug)]
pub(crate) struct Place {
    pub(crate) owner: OwnerToken,
    /// What the place claims (the claim of the request that created it: a later request
    /// of the same owner gets the same place, whatever it asks).
    pub(crate) claim: Claim,
    /// Which of this backend's keys in the queue is the owner's (see `queue_key`).
    pub(crate) slot: u32,
    /// When the slot was given to the owner.
    pub(crate) reserved: Instant,
    /// The create revision of the place's key: its position, and its token once first;
    /// 0 until a transaction has seen the key.
    pub(crate) rev: i64,
    /// The lease the key is bound to, once known.
    pub(crate) lease: Option<LeaseState>,
    /// On the shared renewal lease: the key's mod revision when a renewal last saw it
    /// this owner's there, so the next one proves it unchanged by a compare (0: unknown).
    pub(crate) seen: i64,
    /// Whether the last transaction found it first, i.e. the owner holds the lock.
    pub(crate) held: bool,
    /// What a waiting place waits for: the keys before it (see [`Blockers`]).
    pub(crate) blockers: Option<Arc<Blockers>>,
    /// The place's own watch saw the keys before it leave room for it while the place was
    /// still there: it holds, and the next attempt needs no transaction to know it (see
    /// [`Places::take_room`]).
    pub(crate) room: bool,
}

impl Place {
    /// The place's fencing token once it holds: its key's create revision.
    pub(crate) fn token(&self) -> FencingToken {
        FencingToken(u64::try_from(self.rev).unwrap_or(0))
    }

    /// The same place after its lease, and its key with it, is gone: no key yet, no lease.
    pub(crate) fn without_key(self) -> Place {
        Place {
            rev: 0,
            lease: None,
            seen: 0,
            room: false,
            ..self
        }
    }
}

/// The keys before a waiting place, with their weights: it fits once
/// enough of them are gone. Keys before a place are never created later (revisions only
/// grow), so the set only shrinks, and a deletion of one of its names is the deletion of
/// the incarnation in the set.
#[derive(Debug)]
pub(crate) struct Blockers {
    /// Every key created before the place that was alive when `seen`: name and weight.
    pub(crate) keys: Vec<(Vec<u8>, u64)>,
    /// The revision at which they were seen.
    pub(crate) seen: i64,
}

/// This backend's places, by lock key (a handful per key at most: one per local contender).
#[derive(Default)]
pub(crate) struct Places {
    map: HashMap<LockKey, Vec<Place>>,
    len: usize,
    sweep_at: usize,
}

impl Places {
    pub(crate) fn get(&self, key: &LockKey, owner: &OwnerToken) -> Option<&Place> {
        self.map.get(key)?.iter().find(|p| p.owner == *owner)
    }

    pub(crate) fn by_rev(&self, key: &LockKey, rev: i64) -> Option<&Place> {
        self.map.get(key)?.iter().find(|p| p.rev == rev)
    }

    /// The owner's place in `key`'s queue, reserving a free slot if it has none.
    pub(crate) fn reserve(&mut self, key: &LockKey, owner: &OwnerToken, claim: Claim) -> Place {
        if let Some(p) = self.get(key, owner) {
            return p.clone();
        }
        if self.len >= self.sweep_at {
            // Places whose lease ended without a release (a caller that went away) are
            // dropped, a lease later than etcd drops them, so their slots are free again.
            let now = Instant::now();
            self.map.retain(|_, v| {
                v.retain(|p| {
                    let until = p.lease.map_or(p.reserved, |l| l.alive_until() + l.ttl());
                    until.max(p.reserved + RESERVATION) > now
                });
                !v.is_empty()
            });
            self.len = self.map.values().map(Vec::len).sum();
            self.sweep_at = (self.len * 2).max(1024);
        }
        let places = self.map.entry(key.clone()).or_default();
        let slot = (0u32..)
            .find(|s| places.iter().all(|p| p.slot != *s))
            .unwrap_or(u32::MAX);
        let place = Place {
            owner: *owner,
            claim,
            slot,
            reserved: Instant::now(),
            rev: 0,
            lease: None,
            seen: 0,
            held: false,
            blockers: None,
            room: false,
        };
        places.push(place.clone());
        self.len += 1;
        place
    }

    /// Updates the owner's place (a no-op if it was given up meanwhile).
    pub(crate) fn set(&mut self, key: &LockKey, place: Place) {
        if let Some(p) = self.get_mut(key, &place.owner) {
            *p = place;
        }
    }

    pub(crate) fn take(&mut self, key: &LockKey, owner: &OwnerToken) -> Option<Place> {
        let places = self.map.get_mut(key)?;
        let i = places.iter().position(|p| p.owner == *owner)?;
        let place = places.swap_remove(i);
        if places.is_empty() {
            self.map.remove(key);
        }
        self.len -= 1;
        Some(place)
    }

    /// Records that the waiting place of `owner` at revision `rev` holds: its watch saw the
    /// keys before it leave room while it was still there (a no-op if that place is gone).
    pub(crate) fn room_made(&mut self, key: &LockKey, owner: &OwnerToken, rev: i64) {
        if let Some(p) = self.get_mut(key, owner).filter(|p| p.rev == rev && !p.held) {
            p.room = true;
        }
    }

    /// The grant of `owner`'s place if its watch saw it hold ([`room_made`](Self::room_made))
    /// and its lease, asked for `secs` seconds, was refreshed recently enough to be counted
    /// on for at least half its TTL from `now` (a waiter's lease is refreshed every TTL/3):
    /// `(revision, lease)`, the place now marked as holding. `None`: a transaction decides.
    pub(crate) fn take_room(
        &mut self,
        key: &LockKey,
        owner: &OwnerToken,
        secs: i64,
        now: Instant,
    ) -> Option<(i64, LeaseState)> {
        let p = self.get_mut(key, owner).filter(|p| p.room)?;
        p.room = false;
        let lease = p
            .lease
            .filter(|l| l.asked_for(secs) && l.alive_until() > now + l.ttl() / 2)?;
        p.held = true;
        p.blockers = None;
        Some((p.rev, lease))
    }

    fn get_mut(&mut self, key: &LockKey, owner: &OwnerToken) -> Option<&mut Place> {
        self.map
            .get_mut(key)?
            .iter_mut()
            .find(|p| p.owner == *owner)
    }

    /// Records that the lease `lease` of `owner`'s place at revision `rev` was refreshed
    /// by a request that started at `started` (a no-op if that place is gone).
    pub(crate) fn refreshed(
        &mut self,
        key: &LockKey,
        owner: &OwnerToken,
        rev: i64,
        lease: i64,
        started: Instant,
    ) {
        let place = self.get_mut(key, owner).filter(|p| p.rev == rev);
        if let Some(l) = place
            .and_then(|p| p.lease.as_mut())
            .filter(|l| l.id == lease)
        {
            l.refreshed = l.refreshed.max(started);
        }
    }

    pub(crate) fn clear(&mut self) {
        self.map.clear();
        self.len = 0;
    }
}
