//! The waiters of one backend, per key, woken oldest first.
//!
//! A Redlock hand-off has several contenders at once: the woken waiter of every client,
//! and whoever calls `acquire` just then. Most woken waiters lose, and one that waited on
//! lockcore's notifier alone would queue again *behind* the waiters that came after it, so
//! an unlucky one could lose dozens of hand-offs in a row (the wait tail). Here a waiter
//! keeps the time it first waited across its failed attempts (it is known by its owner, which
//! lockcore keeps for the whole `acquire`), and a release wakes the oldest waiter that is
//! waiting at that moment.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lockcore::{LockKey, Owner};
use tokio::sync::Notify;

/// How long a waiter that is not waiting right now (between two attempts) keeps its place;
/// one that gave up without saying so is forgotten after this.
const KEEP_PLACE: Duration = Duration::from_secs(30);

/// A waiter's identity: derived from its owner token, positive and non-zero (a
/// `WaitHint` revision; negative revisions are back-offs).
pub(crate) fn waiter_id(owner: &Owner) -> i64 {
    let bytes = owner.token().as_bytes();
    let mut first = [0u8; 8];
    first.copy_from_slice(&bytes[..8]);
    (u64::from_le_bytes(first) >> 1).max(1) as i64
}

struct Waiting {
    id: i64,
    /// When it first waited: the queue order.
    since: Instant,
    /// When it last left a wait, for forgetting waiters that went away.
    seen: Instant,
    /// Set while it waits; notified (once) to wake it.
    wake: Option<Arc<Notify>>,
}

/// The queue; cheap when nobody waits.
#[derive(Default)]
pub(crate) struct Queue {
    keys: Mutex<Keys>,
}

#[derive(Default)]
struct Keys {
    map: HashMap<LockKey, Vec<Waiting>>,
    sweep_at: usize,
}

/// One wait of one waiter; leaving the queue's "waiting now" state on drop.
pub(crate) struct Wait {
    queue: Arc<Queue>,
    key: LockKey,
    id: i64,
    /// Notified when it is this waiter's turn.
    pub(crate) wake: Arc<Notify>,
}

impl Queue {
    /// Marks waiter `id` as waiting for `key` now, keeping its place if it waited before.
    pub(crate) fn enter(self: &Arc<Self>, key: &LockKey, id: i64) -> Wait {
        let wake = Arc::new(Notify::new());
        let now = Instant::now();
        let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        if keys.map.len() >= keys.sweep_at {
            keys.map.retain(|_, waiting| {
                waiting.retain(|w| w.wake.is_some() || now.duration_since(w.seen) < KEEP_PLACE);
                !waiting.is_empty()
            });
            keys.sweep_at = (keys.map.len() * 2).max(64);
        }
        let waiting = keys.map.entry(key.clone()).or_default();
        match waiting.iter_mut().find(|w| w.id == id) {
            Some(w) => w.wake = Some(wake.clone()),
            None => waiting.push(Waiting {
                id,
                since: now,
                seen: now,
                wake: Some(wake.clone()),
            }),
        }
        Wait {
            queue: self.clone(),
            key: key.clone(),
            id,
            wake,
        }
    }

    /// Wakes the oldest waiter of `key` that is waiting now; `false` when there is none.
    pub(crate) fn wake_oldest(&self, key: &LockKey) -> bool {
        let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        let Some(waiting) = keys.map.get_mut(key) else {
            return false;
        };
        let oldest = waiting
            .iter_mut()
            .filter(|w| w.wake.is_some())
            .min_by_key(|w| w.since);
        match oldest.and_then(|w| w.wake.take()) {
            Some(wake) => {
                // A permit is kept if it is not polling yet; if it stops waiting before it
                // sees it, it tries again anyway (or passes the turn on when cancelled).
                wake.notify_one();
                true
            }
            None => false,
        }
    }

    /// Forgets waiter `id` of `key` (it acquired the lock or gave up).
    pub(crate) fn forget(&self, key: &LockKey, id: i64) {
        let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(waiting) = keys.map.get_mut(key) {
            waiting.retain(|w| w.id != id);
            if waiting.is_empty() {
                keys.map.remove(key);
            }
        }
    }
}

impl Wait {
    /// Ends this wait with the waiter about to try again: it keeps its place.
    pub(crate) fn done(self) {}

    /// Ends this wait because the waiter went away: if it had been woken, its turn goes to
    /// the next oldest waiter.
    fn leave(&self, cancelled: bool) {
        let mut keys = self.queue.keys.lock().unwrap_or_else(|e| e.into_inner());
        let Some(waiting) = keys.map.get_mut(&self.key) else {
            return;
        };
        let Some(w) = waiting.iter_mut().find(|w| w.id == self.id) else {
            return;
        };
        // Woken = its wake handle was taken by `wake_oldest`.
        let woken = w.wake.is_none();
        w.wake = None;
        w.seen = Instant::now();
        drop(keys);
        if cancelled && woken {
            self.queue.wake_oldest(&self.key);
        }
    }
}

/// Dropped without [`Wait::done`]: the wait was cancelled.
pub(crate) struct CancelGuard(pub(crate) Option<Wait>);

impl CancelGuard {
    /// The wait ended normally: the waiter tries again and keeps its place.
    pub(crate) fn finish(mut self) {
        if let Some(wait) = self.0.take() {
            wait.leave(false);
            wait.done();
        }
    }
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        if let Some(wait) = self.0.take() {
            wait.leave(true);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_oldest_waiter_is_woken_even_after_it_waited_again() {
        let q = Arc::new(Queue::default());
        let k = LockKey::new("k").unwrap();
        let first = q.enter(&k, 1);
        let second = q.enter(&k, 2);
        // The first waiter tries again (and loses) between two waits: it keeps its place.
        CancelGuard(Some(first)).finish();
        let first = q.enter(&k, 1);
        assert!(q.wake_oldest(&k));
        tokio::time::timeout(Duration::from_secs(1), first.wake.notified())
            .await
            .unwrap();
        assert!(
            tokio::time::timeout(Duration::from_millis(20), second.wake.notified())
                .await
                .is_err()
        );
    }

    #[tokio::test]
    async fn a_cancelled_waiter_passes_its_turn_on() {
        let q = Arc::new(Queue::default());
        let k = LockKey::new("k").unwrap();
        let first = CancelGuard(Some(q.enter(&k, 1)));
        let second = q.enter(&k, 2);
        assert!(q.wake_oldest(&k));
        drop(first);
        tokio::time::timeout(Duration::from_secs(1), second.wake.notified())
            .await
            .unwrap();
    }

    #[test]
    fn nobody_waiting_wakes_nobody() {
        let q = Arc::new(Queue::default());
        let k = LockKey::new("k").unwrap();
        assert!(!q.wake_oldest(&k));
        let w = q.enter(&k, 3);
        CancelGuard(Some(w)).finish();
        assert!(!q.wake_oldest(&k), "only waiters waiting now are woken");
        q.forget(&k, 3);
        assert!(q.keys.lock().unwrap().map.is_empty());
    }
}
