//! Leases a broken store keeps beside its lock records, for
//! [`Breakage::ExtendTrustsLease`](super::Breakage::ExtendTrustsLease): a renewal that
//! finds the record gone is answered from the lease, as a keep-alive of a store's own lease
//! (an etcd lease, a database session) would be without a check of the record.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use lockcore::{FencingToken, LockKey, Owner};

/// Each holder's lease: the token it was granted and when the lease runs out.
#[derive(Debug, Default)]
pub(super) struct Leases(HashMap<(LockKey, String), (FencingToken, Instant)>);

impl Leases {
    /// `owner` was granted (or renewed) `key` with `token` for `ttl`.
    pub(super) fn granted(
        &mut self,
        key: &LockKey,
        owner: &Owner,
        token: FencingToken,
        ttl: Duration,
    ) {
        let id = (key.clone(), owner.token().to_hex());
        self.0.insert(id, (token, Instant::now() + ttl));
    }

    /// The token of `owner`'s lease on `key` while the lease lives, which this renews for
    /// `ttl`; `None` once it ran out.
    pub(super) fn keep_alive(
        &mut self,
        key: &LockKey,
        owner: &Owner,
        ttl: Duration,
    ) -> Option<FencingToken> {
        let id = (key.clone(), owner.token().to_hex());
        let now = Instant::now();
        match self.0.get_mut(&id) {
            Some((token, until)) if *until > now => {
                *until = now + ttl;
                Some(*token)
            }
            _ => {
                self.0.remove(&id);
                None
            }
        }
    }

    /// `owner` released `key`: its lease goes with it.
    pub(super) fn released(&mut self, key: &LockKey, owner: &Owner) {
        self.0.remove(&(key.clone(), owner.token().to_hex()));
    }
}
