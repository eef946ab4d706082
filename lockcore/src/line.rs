//! Each key's line of one client's requests: where the store does not order waiters, one
//! request at a time (the head) waits for the store and tries; the others wait their turn
//! here, in arrival order, as `tokio::sync::Mutex` serves its waiters.

use std::collections::hash_map::{Entry, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::LockKey;

/// The lines of one client, by key.
#[derive(Default)]
pub(crate) struct Lines {
    /// Requests in all lines: while it is zero (no contention) nothing else is looked at.
    total: AtomicUsize,
    per_key: Mutex<HashMap<LockKey, Line>>,
}

/// One key's line: the turn (held by the head) and how many requests are in it.
type Line = (Arc<tokio::sync::Mutex<()>>, usize);

impl Lines {
    fn per_key(&self) -> MutexGuard<'_, HashMap<LockKey, Line>> {
        self.per_key.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether requests of this client are in `key`'s line.
    pub(crate) fn any(&self, key: &LockKey) -> bool {
        self.total.load(Ordering::Acquire) > 0 && self.per_key().contains_key(key)
    }

    /// Joins `key`'s line: its turn, to wait for.
    pub(crate) fn join(&self, key: &LockKey) -> Arc<tokio::sync::Mutex<()>> {
        let mut per_key = self.per_key();
        let (turn, n) = per_key.entry(key.clone()).or_default();
        *n += 1;
        self.total.fetch_add(1, Ordering::AcqRel);
        turn.clone()
    }

    /// Leaves `key`'s line.
    pub(crate) fn leave(&self, key: &LockKey) {
        let mut per_key = self.per_key();
        if let Entry::Occupied(mut line) = per_key.entry(key.clone()) {
            line.get_mut().1 -= 1;
            if line.get().1 == 0 {
                line.remove();
            }
            self.total.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// How many requests are in `key`'s line.
    #[cfg(test)]
    pub(crate) fn len(&self, key: &LockKey) -> usize {
        self.per_key().get(key).map_or(0, |(_, n)| *n)
    }
}
