//! Waiting without store notifications (MySQL, SQLite): one poller task per key with
//! waiters in a backend.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use lockcore::{LockError, LockKey, ReleaseNotifier};

use crate::since::Since;

/// The state of one key as a poller sees it.
pub(crate) enum KeyState {
    /// Nobody holds it (no row, or the row expired or was released).
    Free,
    /// Held with this fence for about this long still (until the soonest lease expires,
    /// when `shared`: held by leases, whose releases bump the fence).
    Held {
        fence: i64,
        remaining: Duration,
        shared: bool,
    },
}

/// Reads one key's state; implemented by the MySQL and SQLite backends' shared state.
pub(crate) trait Probe: Send + Sync + 'static {
    fn probe<'a>(
        &'a self,
        key: &'a LockKey,
    ) -> Pin<Box<dyn Future<Output = Result<KeyState, LockError>> + Send + 'a>>;
}

/// First and longest poll interval: start at a few milliseconds so a hand-off between
/// processes is quick, back off to 100 ms while the same holder keeps the lock.
const POLL_FIRST: Duration = Duration::from_millis(2);
const POLL_MAX: Duration = Duration::from_millis(100);

/// How often a backend's pollers look: from `first` whenever the key changes, doubling
/// while it does not, up to 100 ms on a key held exclusively and up to `leases_max` on a
/// key held by leases (which come and go: a writer behind readers should not sleep long
/// past the last reader's release).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pace {
    pub(crate) first: Duration,
    pub(crate) leases_max: Duration,
}

impl Pace {
    /// The pace of a database across the network (MySQL).
    pub(crate) const REMOTE: Pace = Pace {
        first: POLL_FIRST,
        leases_max: POLL_MAX,
    };

    /// The pace of a database whose probe is a read in the process (SQLite): a key changing
    /// hands between processes is noticed within about a millisecond (the timer's
    /// resolution), a key held by leases looked at every 8 ms at least.
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
    pub(crate) const LOCAL: Pace = Pace {
        first: Duration::from_millis(1),
        leases_max: Duration::from_millis(8),
    };
}

/// Waiting without store notifications: one poller task per key with waiters in this
/// backend, waking this backend's waiters one at a time through a [`ReleaseNotifier`]
/// (which a release made through this backend also signals directly).
#[derive(Debug)]
pub(crate) struct Waiters {
    pub(crate) notifier: ReleaseNotifier,
    pollers: Mutex<HashMap<LockKey, Weak<PollerHandle>>>,
    pace: Pace,
    /// Wake every waiter of a key that becomes free, once (see [`Waiters::waking_everyone`]).
    pub(crate) everyone: bool,
}

/// Waiters of a database across the network (MySQL).
impl Default for Waiters {
    fn default() -> Self {
        Waiters::new(Pace::REMOTE)
    }
}

/// Kept alive by every waiter of a key; the poller stops once none is left.
#[derive(Debug)]
pub(crate) struct PollerHandle;

impl Waiters {
    /// Waiters whose pollers poll at `pace`.
    pub(crate) fn new(pace: Pace) -> Self {
        Waiters {
            notifier: ReleaseNotifier::default(),
            pollers: Mutex::default(),
            pace,
            everyone: false,
        }
    }

    /// A fair store's waiters: the store, not this process, knows which of them is first,
    /// so a key that becomes free (or a release through this backend) wakes each of them
    /// once, and the first place takes it; waking one at a time would wake the wrong one
    /// whenever several of this process's waiters queue for one key.
    pub(crate) fn waking_everyone(mut self, everyone: bool) -> Self {
        self.everyone = everyone;
        self
    }

    /// Wakes this backend's waiters of `key`: one, or every one (a fair store).
    pub(crate) fn wake(&self, key: &LockKey) {
        if self.everyone {
            self.notifier.notify_all(key);
        } else {
            self.notifier.notify_one(key);
        }
    }

    /// Waits until `key` is probably free or `max_wait` passes: subscribe first, make sure
    /// a poller runs, then re-check, so a release in between is never slept through (a
    /// release of a lease shows as a fence other than `revision`, the one the refused
    /// claim saw).
    pub(crate) async fn wait<P: Probe>(
        self: &Arc<Self>,
        probe: &Arc<P>,
        key: &LockKey,
        since: Since,
        max_wait: Duration,
    ) -> Result<(), LockError> {
        let subscription = self.notifier.subscribe(key);
        let _poller = self.poller(probe, key);
        let remaining = match probe.probe(key).await? {
            KeyState::Free if since.changed(None) => return Ok(()),
            // Free but reserved: the poller wakes us while it stays free.
            KeyState::Free => max_wait,
            KeyState::Held { fence, .. } if since.changed(Some(fence)) => return Ok(()),
            KeyState::Held { remaining, .. } => remaining,
        };
        // A hair past the holder's expiry, so the next attempt finds it expired.
        let bound = max_wait.min(remaining + Duration::from_millis(1));
        let _ = tokio::time::timeout(bound, subscription.released()).await;
        Ok(())
    }

    fn poller<P: Probe>(self: &Arc<Self>, probe: &Arc<P>, key: &LockKey) -> Arc<PollerHandle> {
        let mut pollers = self.pollers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(handle) = pollers.get(key).and_then(Weak::upgrade) {
            return handle;
        }
        pollers.retain(|_, w| w.strong_count() > 0);
        let handle = Arc::new(PollerHandle);
        pollers.insert(key.clone(), Arc::downgrade(&handle));
        tokio::spawn(poll(
            self.pace,
            Arc::downgrade(self),
            probe.clone(),
            key.clone(),
            Arc::downgrade(&handle),
        ));
        handle
    }
}

async fn poll<P: Probe>(
    pace: Pace,
    waiters: Weak<Waiters>,
    probe: Arc<P>,
    key: LockKey,
    handle: Weak<PollerHandle>,
) {
    let mut interval = pace.first;
    let mut last_fence = None;
    let mut was_free = false;
    loop {
        tokio::time::sleep(interval).await;
        if handle.strong_count() == 0 {
            return;
        }
        let Some(waiters) = waiters.upgrade() else {
            return;
        };
        match probe.probe(&key).await {
            Ok(KeyState::Free) if waiters.everyone => {
                // A fair store's waiters are all woken at each look while the key is free
                // (one that subscribed just after a look must not sleep until its place
                // lapses); the looks slow down while the first place does not take it.
                waiters.notifier.notify_all(&key);
                interval = if was_free {
                    (interval * 2).min(POLL_MAX)
                } else {
                    pace.first
                };
                was_free = true;
                last_fence = None;
            }
            Ok(KeyState::Free) => {
                waiters.notifier.notify_one(&key);
                interval = pace.first;
                last_fence = None;
            }
            Ok(KeyState::Held {
                fence,
                remaining,
                shared,
            }) => {
                // A new holder means the lock is changing hands: keep polling closely. On a
                // key held by leases a new fence may also be a release that made room. A
                // waiter is woken by a new exclusive holder too (not on a fair store, whose
                // queue keeps the order): a release happened, and a waiter that has waited
                // long asks again to mark the key as its next turn before the next release
                // (lockcore::starving_for), as NOTIFY's waiters do at each release.
                let changed = last_fence.is_some_and(|f| f != fence);
                if changed && (shared || !waiters.everyone) {
                    waiters.notifier.notify_one(&key);
                }
                was_free = false;
                let most = if shared { pace.leases_max } else { POLL_MAX };
                interval = if changed {
                    pace.first
                } else {
                    (interval * 2).min(most)
                };
                interval = interval.min(remaining + Duration::from_millis(1));
                last_fence = Some(fence);
            }
            Err(e) => {
                tracing::debug!(key = %key, error = %lockcore::ErrorChain(&e), "polling a lock failed");
                interval = POLL_MAX;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicI64, Ordering};
    use std::time::Instant;

    use lockcore::WaitHint;

    use super::*;

    /// A key that changes hands at every look and is never free.
    struct HandedOn(AtomicI64);

    impl Probe for HandedOn {
        fn probe<'a>(
            &'a self,
            _: &'a LockKey,
        ) -> Pin<Box<dyn Future<Output = Result<KeyState, LockError>> + Send + 'a>> {
            let fence = self.0.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move {
                Ok(KeyState::Held {
                    fence,
                    remaining: Duration::from_secs(10),
                    shared: false,
                })
            })
        }
    }

    async fn waited(waiters: Waiters, max_wait: Duration) -> Duration {
        let (waiters, probe) = (Arc::new(waiters), Arc::new(HandedOn(AtomicI64::new(1))));
        let key = LockKey::new("handed-on").unwrap();
        let since = Since::of(&WaitHint::none());
        let started = Instant::now();
        waiters.wait(&probe, &key, since, max_wait).await.unwrap();
        started.elapsed()
    }

    /// A new holder wakes a waiter, which asks again while the key is held (and marks it
    /// if it has waited long), as NOTIFY's waiters do at each release.
    #[tokio::test]
    async fn a_key_changing_hands_wakes_a_waiter() {
        let took = waited(Waiters::new(Pace::REMOTE), Duration::from_secs(10)).await;
        assert!(took < Duration::from_secs(2), "woken only after {took:?}");
    }

    /// On a fair store the queue keeps the order: a new holder wakes nobody.
    #[tokio::test]
    async fn a_fair_stores_waiters_sleep_through_a_change_of_holder() {
        let max_wait = Duration::from_millis(300);
        let took = waited(Waiters::new(Pace::REMOTE).waking_everyone(true), max_wait).await;
        assert!(took >= max_wait, "woken after {took:?}");
    }
}
