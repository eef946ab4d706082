//! Which (key, owner) pairs this backend granted a shared lease to, so a release or a
//! renewal of a lease goes straight to the leases table instead of first paying the
//! exclusive statement's miss. Only a hint: both paths are owner-checked and each falls
//! back to the other, so a pair missing here (a lease granted by another process, or
//! forgotten) or one left behind costs a round trip, never correctness.

use std::collections::HashSet;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Mutex, PoisonError};

use lockcore::{LockKey, Owner};

/// How many pairs the hint remembers before it starts over: a hold whose lease was lost and
/// never released would otherwise stay forever. 8 bytes each.
const MAX_PAIRS: usize = 1 << 20;

/// The pairs, as hashes of key and owner token.
#[derive(Debug, Default)]
pub(crate) struct Leased {
    hasher: RandomState,
    pairs: Mutex<HashSet<u64>>,
}

impl Leased {
    fn hash(&self, key: &LockKey, owner: &Owner) -> u64 {
        self.hasher
            .hash_one((key.as_bytes(), owner.token().as_bytes()))
    }

    fn pairs(&self) -> std::sync::MutexGuard<'_, HashSet<u64>> {
        // The set is a hint: a panic elsewhere while it was locked leaves it usable.
        self.pairs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The owner was granted (or re-granted) a lease on `key`.
    pub(crate) fn insert(&self, key: &LockKey, owner: &Owner) {
        let hash = self.hash(key, owner);
        let mut pairs = self.pairs();
        if pairs.len() >= MAX_PAIRS {
            pairs.clear();
        }
        pairs.insert(hash);
    }

    /// Whether the owner was granted a lease on `key` that it has not released.
    pub(crate) fn contains(&self, key: &LockKey, owner: &Owner) -> bool {
        let pairs = self.pairs();
        // Most backends never grant a lease: no hashing for their renewals and releases.
        !pairs.is_empty() && pairs.contains(&self.hash(key, owner))
    }

    /// The owner's lease on `key` is gone (released, or found lost).
    pub(crate) fn remove(&self, key: &LockKey, owner: &Owner) {
        let hash = self.hash(key, owner);
        self.pairs().remove(&hash);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_pairs_until_removed() {
        let leased = Leased::default();
        let (a, b) = (LockKey::new("a").unwrap(), LockKey::new("b").unwrap());
        let (me, you) = (Owner::new("me"), Owner::new("you"));
        leased.insert(&a, &me);
        assert!(leased.contains(&a, &me));
        assert!(!leased.contains(&b, &me));
        assert!(!leased.contains(&a, &you));
        leased.remove(&a, &me);
        assert!(!leased.contains(&a, &me));
    }
}
