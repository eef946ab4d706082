//! Each key's line of one client's requests: where the store does not order waiters, one
//! request at a time (the head) waits for the store and tries; the others wait their turn
//! here, in arrival order, as `tokio::sync::Mutex` serves its waiters.

use std::collections::hash_map::{Entry, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::LockKey;

/// The lines of one client, by key. Every waiting request joins its key's line before its
/// first attempt and leaves it when answered.
#[derive(Default)]
pub(crate) struct Lines {
    per_key: Mutex<HashMap<LockKey, Line>>,
}

/// One key's line: the turn (held by the head) and how many requests are in it.
type Line = (Arc<tokio::sync::Mutex<()>>, usize);

impl Lines {
    fn per_key(&self) -> MutexGuard<'_, HashMap<LockKey, Line>> {
        self.per_key.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Joins `key`'s line: its turn, to wait for.
    pub(crate) fn join(&self, key: &LockKey) -> Arc<tokio::sync::Mutex<()>> {
        let mut per_key = self.per_key();
        let (turn, n) = per_key.entry(key.clone()).or_default();
        *n += 1;
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
        }
    }

    /// How many requests are in `key`'s line.
    #[cfg(test)]
    pub(crate) fn len(&self, key: &LockKey) -> usize {
        self.per_key().get(key).map_or(0, |(_, n)| *n)
    }
}
