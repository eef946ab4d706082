//! Each key's line of one client's requests: where the store does not order waiters, one
//! request at a time (the head) waits for the store and tries; the others wait their turn
//! here, in arrival order, as `tokio::sync::Mutex` serves its waiters.
//!
//! A request alone in its line (almost every one) takes the turn without a mutex: the
//! mutex is made when a second request joins, locked for the head, and the head unlocks
//! it as it leaves. That spares an allocation and a lock per acquisition (lockbench
//! `memory --case uncontended`).

use std::collections::hash_map::Entry;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::OwnedMutexGuard;

use crate::key::KeyMap;
use crate::LockKey;

/// The lines of one client, by key. Every waiting request joins its key's line before its
/// first attempt and leaves it when answered.
#[derive(Default)]
pub(crate) struct Lines {
    per_key: Mutex<KeyMap<LockKey, Line>>,
}

/// One key's line.
struct Line {
    /// The turn, once a second request joined while the head held it.
    turn: Option<Arc<tokio::sync::Mutex<()>>>,
    /// The turn as locked for a head that took it alone, without the mutex: unlocked when
    /// that head leaves.
    alone_head: Option<OwnedMutexGuard<()>>,
    /// How many requests are in the line, the head included.
    len: usize,
}

/// A request's turn in its line.
pub(crate) enum Turn {
    /// It is the head: it took the turn alone (no guard) or from the mutex.
    Head(Option<OwnedMutexGuard<()>>),
    /// Another request is the head: the turn to wait for.
    Behind(Arc<tokio::sync::Mutex<()>>),
}

impl Lines {
    fn per_key(&self) -> MutexGuard<'_, KeyMap<LockKey, Line>> {
        self.per_key.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Joins `key`'s line, taking the turn if it is free.
    pub(crate) fn join(&self, key: &LockKey) -> Turn {
        let mut per_key = self.per_key();
        let line = match per_key.entry(key.clone()) {
            Entry::Vacant(vacant) => {
                vacant.insert(Line {
                    turn: None,
                    alone_head: None,
                    len: 1,
                });
                return Turn::Head(None);
            }
            Entry::Occupied(occupied) => occupied.into_mut(),
        };
        line.len += 1;
        let turn = match &line.turn {
            Some(turn) => turn.clone(),
            None => {
                // The head took the turn alone: lock the new mutex for it.
                let turn = Arc::new(tokio::sync::Mutex::new(()));
                line.alone_head = turn.clone().try_lock_owned().ok();
                line.turn = Some(turn.clone());
                turn
            }
        };
        match turn.clone().try_lock_owned() {
            Ok(guard) => Turn::Head(Some(guard)),
            Err(_) => Turn::Behind(turn),
        }
    }

    /// Leaves `key`'s line; `head_alone`: the request was a head that took the turn alone,
    /// which it gives up now.
    pub(crate) fn leave(&self, key: &LockKey, head_alone: bool) {
        let mut per_key = self.per_key();
        if let Entry::Occupied(mut line) = per_key.entry(key.clone()) {
            if head_alone {
                drop(line.get_mut().alone_head.take());
            }
            line.get_mut().len -= 1;
            if line.get().len == 0 {
                line.remove();
            }
        }
    }

    /// How many requests are in `key`'s line.
    #[cfg(test)]
    pub(crate) fn len(&self, key: &LockKey) -> usize {
        self.per_key().get(key).map_or(0, |line| line.len)
    }
}
