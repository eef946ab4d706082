//! In-process wake-ups of waiters, shared by the backends that have a release signal.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

use crate::LockKey;

/// A place in line for a request that was just told the lock is held (lower = earlier).
pub(crate) fn next_place() -> u64 {
    PLACES.fetch_add(1, Ordering::Relaxed)
}

static PLACES: AtomicU64 = AtomicU64::new(0);

/// Wakes the waiters of one process for a key, **one at a time**, in the order they first
/// found the lock held.
///
/// A driver that learns of releases (a pub/sub message, a NOTIFY, a watch event, or a
/// release made by its own client) calls [`notify_one`](Self::notify_one); its
/// [`wait_released`](crate::LockBackend::wait_released) subscribes *before* re-checking the
/// key, so a release in between is never lost. Waking one waiter per release avoids a
/// thundering herd; a woken waiter that goes away without trying passes the wake-up on, and
/// a missed message is covered by the caller's remaining-TTL timeout.
///
/// Waiters are served by their place in line: a request that was woken, lost the race to
/// another process and waits again keeps its place at the front instead of queueing behind
/// everyone who arrived after it (the place comes from the `LockClient` request; a wait
/// outside one queues by the time it subscribed).
#[derive(Debug, Default)]
pub struct ReleaseNotifier {
    keys: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    keys: Mutex<Keys>,
    /// How many keys have subscribers, updated under the mutex: a release nobody waits
    /// for is announced without taking it.
    keyed: AtomicUsize,
}

#[derive(Debug, Default)]
struct Keys {
    /// The subscribers of each key, by (place in line, subscription number).
    map: HashMap<LockKey, BTreeMap<(u64, u64), oneshot::Sender<()>>>,
    next: u64,
}

impl Keys {
    /// Wakes the first subscriber of `key` still listening (the first whose place is
    /// after `behind`, if given).
    fn wake_one(&mut self, key: &LockKey, behind: Option<u64>) {
        let Some(queue) = self.map.get_mut(key) else {
            return;
        };
        let first = behind.map_or(Some((0, 0)), |place| place.checked_add(1).map(|p| (p, 0)));
        while let Some(id) = first.and_then(|from| queue.range(from..).next().map(|(id, _)| *id)) {
            let waiter = queue.remove(&id);
            if waiter.is_some_and(|w| w.send(()).is_ok()) {
                break;
            }
        }
        if queue.is_empty() {
            self.map.remove(key);
        }
    }

    fn wake_all(&mut self, key: &LockKey) {
        for (_, waiter) in self.map.remove(key).into_iter().flatten() {
            let _ = waiter.send(());
        }
    }
}

/// The subscribers, locked; the count of keys with subscribers is refreshed on unlock.
struct Locked<'a> {
    keys: MutexGuard<'a, Keys>,
    keyed: &'a AtomicUsize,
}

impl std::ops::Deref for Locked<'_> {
    type Target = Keys;
    fn deref(&self) -> &Keys {
        &self.keys
    }
}

impl std::ops::DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut Keys {
        &mut self.keys
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        self.keyed.store(self.keys.map.len(), Ordering::SeqCst);
    }
}

fn lock(shared: &Shared) -> Locked<'_> {
    Locked {
        keys: shared.keys.lock().unwrap_or_else(|e| e.into_inner()),
        keyed: &shared.keyed,
    }
}

/// A registration made by [`ReleaseNotifier::subscribe`]; wait on it with
/// [`released`](Self::released).
pub struct Subscription {
    keys: Arc<Shared>,
    key: LockKey,
    id: (u64, u64),
    woken: oneshot::Receiver<()>,
    consumed: bool,
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl Subscription {
    /// Resolves at the next [`notify_one`](ReleaseNotifier::notify_one) that picks this
    /// subscription, or any [`notify_all`](ReleaseNotifier::notify_all), for the key.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a wake-up that picked this subscription but was not seen is passed on
    /// to the next subscriber.
    pub async fn released(mut self) {
        let _ = (&mut self.woken).await;
        self.consumed = true;
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        if self.consumed {
            return;
        }
        let mut keys = lock(&self.keys);
        let queued = keys
            .map
            .get_mut(&self.key)
            .and_then(|queue| queue.remove(&self.id));
        if queued.is_none() && self.woken.try_recv().is_ok() {
            // Picked, but going away without trying: the next waiter gets the wake-up.
            keys.wake_one(&self.key, None);
        } else if keys.map.get(&self.key).is_some_and(BTreeMap::is_empty) {
            keys.map.remove(&self.key);
        }
    }
}

impl ReleaseNotifier {
    /// An empty notifier.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers interest in `key` for the waiter at `place` in this process's line (the
    /// `place` given to [`LockBackend::wait_released`](crate::LockBackend::wait_released);
    /// lower is earlier, and waiters at one place are woken in the order they subscribed).
    /// From this moment no wake-up for `key` is missed.
    pub fn subscribe(&self, key: &LockKey, place: u64) -> Subscription {
        let (tx, woken) = oneshot::channel();
        let mut keys = lock(&self.keys);
        let seq = keys.next;
        keys.next += 1;
        let id = (place, seq);
        keys.map.entry(key.clone()).or_default().insert(id, tx);
        drop(keys);
        Subscription {
            keys: self.keys.clone(),
            key: key.clone(),
            id,
            woken,
            consumed: false,
        }
    }

    /// Whether anyone is subscribed, to any key (a hint: a subscription may be made or
    /// dropped the next moment).
    pub fn has_subscribers(&self) -> bool {
        self.keys.keyed.load(Ordering::SeqCst) > 0
    }

    /// Wakes the subscriber of `key` first in line, if any.
    pub fn notify_one(&self, key: &LockKey) {
        self.wake(key, None);
    }

    /// Wakes the first subscriber of `key` whose place is after `place`, if any: a waiter
    /// at `place` passing on a wake-up it could not use (its claim was refused by another
    /// waiter's [reservation](crate::WaitHint::behind_reservation)) wakes only waiters
    /// behind it, so a wake-up goes down the line once, never round in a circle.
    pub fn notify_behind(&self, key: &LockKey, place: u64) {
        self.wake(key, Some(place));
    }

    fn wake(&self, key: &LockKey, behind: Option<u64>) {
        // Nobody subscribed: nothing to wake. A subscription made concurrently counts as
        // made after this release; its subscriber re-checks the key after subscribing.
        if self.keys.keyed.load(Ordering::SeqCst) == 0 {
            return;
        }
        lock(&self.keys).wake_one(key, behind);
    }

    /// Wakes every subscriber of `key` (e.g. after a reconnect, when messages may have been
    /// missed).
    pub fn notify_all(&self, key: &LockKey) {
        lock(&self.keys).wake_all(key);
    }

    /// Wakes every subscriber of every key.
    pub fn notify_everyone(&self) {
        let all = std::mem::take(&mut lock(&self.keys).map);
        for (_, waiter) in all.into_values().flatten() {
            let _ = waiter.send(());
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
        let a = n.subscribe(&k, u64::MAX);
        let b = n.subscribe(&k, u64::MAX);
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
        let a = n.subscribe(&k, u64::MAX);
        n.notify_all(&k);
        tokio::time::timeout(Duration::from_secs(1), a.released())
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn a_woken_waiter_that_waits_again_keeps_its_place() {
        let n = ReleaseNotifier::new();
        let k = LockKey::new("k").unwrap();
        let early = n.subscribe(&k, 1);
        let late = n.subscribe(&k, 2);
        n.notify_one(&k);
        tokio::time::timeout(Duration::from_secs(1), early.released())
            .await
            .unwrap();
        // It lost the race to another process and waits again: still first in line.
        let early = n.subscribe(&k, 1);
        n.notify_one(&k);
        tokio::time::timeout(Duration::from_secs(1), early.released())
            .await
            .unwrap();
        assert!(
            tokio::time::timeout(Duration::from_millis(50), late.released())
                .await
                .is_err()
        );
    }

    #[tokio::test]
    async fn a_wake_up_passed_on_goes_only_to_waiters_behind_the_passer() {
        let n = ReleaseNotifier::new();
        let k = LockKey::new("k").unwrap();
        let first = n.subscribe(&k, 1);
        let third = n.subscribe(&k, 3);
        let fourth = n.subscribe(&k, 4);
        // The waiter at place 2 passes on: the one at 3 is woken, not the one at 1.
        n.notify_behind(&k, 2);
        tokio::time::timeout(Duration::from_secs(1), third.released())
            .await
            .unwrap();
        // The last in line passes on: nobody is behind it.
        n.notify_behind(&k, 4);
        assert!(
            tokio::time::timeout(Duration::from_millis(50), fourth.released())
                .await
                .is_err()
        );
        // Outside a pass, the first in line.
        let fourth = n.subscribe(&k, 4);
        n.notify_one(&k);
        tokio::time::timeout(Duration::from_secs(1), first.released())
            .await
            .unwrap();
        assert!(
            tokio::time::timeout(Duration::from_millis(50), fourth.released())
                .await
                .is_err()
        );
    }

    #[tokio::test]
    async fn a_picked_waiter_that_goes_away_passes_the_wake_up_on() {
        let n = ReleaseNotifier::new();
        let k = LockKey::new("k").unwrap();
        let a = n.subscribe(&k, u64::MAX);
        let b = n.subscribe(&k, u64::MAX);
        n.notify_one(&k);
        drop(a);
        tokio::time::timeout(Duration::from_secs(1), b.released())
            .await
            .unwrap();
        assert!(
            n.keys.keys.lock().unwrap().map.is_empty(),
            "nothing left behind"
        );
        assert_eq!(n.keys.keyed.load(Ordering::SeqCst), 0);
    }
}
