//! In-process wake-ups of waiters, shared by the backends that have a release signal.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::futures::OwnedNotified;
use tokio::sync::Notify;

use crate::LockKey;

/// Wakes the waiters of one process for a key, **one at a time**.
///
/// A driver that learns of releases (a pub/sub message, a NOTIFY, a watch event, or a
/// release made by its own client) calls [`notify_one`](Self::notify_one); its
/// [`wait_released`](crate::LockBackend::wait_released) subscribes *before* re-checking the
/// key, so a release in between is never lost. Waking one waiter per release avoids a
/// thundering herd; a woken waiter that goes away without trying passes the wake-up on, and
/// a missed message is covered by the caller's remaining-TTL timeout.
#[derive(Debug, Default)]
pub struct ReleaseNotifier {
    keys: Mutex<Keys>,
}

#[derive(Debug, Default)]
struct Keys {
    map: HashMap<LockKey, Weak<Notify>>,
    sweep_at: usize,
}

/// A registration made by [`ReleaseNotifier::subscribe`]; wait on it with
/// [`released`](Self::released).
pub struct Subscription {
    notified: Pin<Box<OwnedNotified>>,
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription").finish_non_exhaustive()
    }
}

impl Subscription {
    /// Resolves at the next [`notify_one`](ReleaseNotifier::notify_one) that picks this
    /// subscription, or any [`notify_all`](ReleaseNotifier::notify_all), for the key.
    pub async fn released(mut self) {
        self.notified.as_mut().await
    }
}

impl ReleaseNotifier {
    /// An empty notifier.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers interest in `key`; from this moment no wake-up for it is missed.
    pub fn subscribe(&self, key: &LockKey) -> Subscription {
        let notify = {
            let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
            if keys.map.len() >= keys.sweep_at {
                keys.map.retain(|_, w| w.strong_count() > 0);
                keys.sweep_at = (keys.map.len() * 2).max(64);
            }
            match keys.map.get(key).and_then(Weak::upgrade) {
                Some(n) => n,
                None => {
                    let n = Arc::new(Notify::new());
                    keys.map.insert(key.clone(), Arc::downgrade(&n));
                    n
                }
            }
        };
        let mut notified = Box::pin(notify.notified_owned());
        notified.as_mut().enable();
        Subscription { notified }
    }

    fn get(&self, key: &LockKey) -> Option<Arc<Notify>> {
        let keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        keys.map.get(key).and_then(Weak::upgrade)
    }

    /// Wakes the longest-waiting subscriber of `key`, if any.
    pub fn notify_one(&self, key: &LockKey) {
        if let Some(n) = self.get(key) {
            n.notify_one();
        }
    }

    /// Wakes every subscriber of `key` (e.g. after a reconnect, when messages may have been
    /// missed).
    pub fn notify_all(&self, key: &LockKey) {
        if let Some(n) = self.get(key) {
            n.notify_waiters();
        }
    }

    /// Wakes every subscriber of every key.
    pub fn notify_everyone(&self) {
        let all: Vec<_> = {
            let keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
            keys.map.values().filter_map(Weak::upgrade).collect()
        };
        for n in all {
            n.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn wakes_one_at_a_time() {
        let n = ReleaseNotifier::new();
        let k = LockKey::new("k").unwrap();
        let a = n.subscribe(&k);
        let b = n.subscribe(&k);
        n.notify_one(&k);
        tokio::time::timeout(Duration::from_secs(1), a.released())
            .await
            .unwrap();
        assert!(
            tokio::time::timeout(Duration::from_millis(50), b.released())
                .await
                .is_err()
        );
    }

    #[tokio::test]
    async fn notification_between_subscribe_and_wait_is_kept() {
        let n = ReleaseNotifier::new();
        let k = LockKey::new("k").unwrap();
        let a = n.subscribe(&k);
        n.notify_all(&k);
        tokio::time::timeout(Duration::from_secs(1), a.released())
            .await
            .unwrap();
    }
}
