//! What a backend remembers to pick the cheaper of two right paths: which (key, owner) pairs
//! it granted a shared lease to ([`Leased`]), so a release or a renewal of a lease goes
//! straight to the leases table instead of first paying the exclusive statement's miss.
//! Only a hint: both paths are owner-checked and each falls back to the other, so a pair
//! missing here (a lease granted by another process, or forgotten) or one left behind
//! costs a round trip, never correctness.

use std::collections::HashSet;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Mutex, PoisonError};

use lockcore::{LockKey, Owner};

/// How many pairs the hint remembers before it starts over: a hold whose lease was lost and
/// never released would otherwise stay forever. 8 bytes each.
const MAX_PAIRS: usize = 1 << 20;

/// The pairs, as hashes of key and owner token.
#[derive(Debug, Default)]
pub(crate) struct Leased(Hashes);

impl Leased {
    fn hash(&self, key: &LockKey, owner: &Owner) -> u64 {
        self.0.hash((key.as_bytes(), owner.token().as_bytes()))
    }

    /// The owner was granted (or re-granted) a lease on `key`.
    pub(crate) fn insert(&self, key: &LockKey, owner: &Owner) {
        self.0.insert(self.hash(key, owner));
    }

    /// Whether the owner was granted a lease on `key` that it has not released.
    pub(crate) fn contains(&self, key: &LockKey, owner: &Owner) -> bool {
        // Most backends never grant a lease: no hashing for their renewals and releases.
        self.0.contains(|| self.hash(key, owner))
    }

    /// The owner's lease on `key` is gone (released, or found lost).
    pub(crate) fn remove(&self, key: &LockKey, owner: &Owner) {
        self.0.remove(self.hash(key, owner));
    }
}

/// A set of hashes, bounded by [`MAX_PAIRS`], shared by threads.
#[derive(Debug, Default)]
struct Hashes {
    hasher: RandomState,
    set: Mutex<HashSet<u64>>,
}

impl Hashes {
    fn hash(&self, value: impl std::hash::Hash) -> u64 {
        self.hasher.hash_one(value)
    }

    fn set(&self) -> std::sync::MutexGuard<'_, HashSet<u64>> {
        // The set is a hint: a panic elsewhere while it was locked leaves it usable.
        self.set.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn insert(&self, hash: u64) {
        let mut set = self.set();
        if set.len() >= MAX_PAIRS {
            set.clear();
        }
        set.insert(hash);
    }

    /// Whether the set holds the hash `hash` makes, which an empty set does not compute.
    fn contains(&self, hash: impl FnOnce() -> u64) -> bool {
        let set = self.set();
        !set.is_empty() && set.contains(&hash())
    }

    fn remove(&self, hash: u64) {
        self.set().remove(&hash);
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
