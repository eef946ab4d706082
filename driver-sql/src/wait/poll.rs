//! Why not sqlx's own: MySQL and SQLite send no notifications (PostgreSQL's: sqlx's PgListener).
//!
//! Waiting without store notifications (MySQL, SQLite): one poller task per key with
//! waiters in a backend.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use lockcore::driver::ReleaseNotifier;
use lockcore::{LockError, LockKey};

use crate::backend::lock::Store;
use crate::dialect::Dialect;
use crate::units::micros;
use crate::wait::since::Since;

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

/// How many looks a backend's pollers take per second at most, all keys together. One key
/// is looked at as often as its pace says (every millisecond at the closest); waiters on
/// many keys share the budget, so a backend with waiters on 10,000 keys does not ask the
/// database ten million times a second (its waiters' own attempts then queued behind the
/// looks, and 10,000 waiters did not even line up in ten minutes).
const LOOKS_PER_SECOND: u64 = 1_000;

/// The shortest time between two looks at one key while `keys` keys are polled.
fn spread(keys: usize) -> Duration {
    let keys = u64::try_from(keys).unwrap_or(u64::MAX);
    Duration::from_micros(keys.saturating_mul(1_000_000 / LOOKS_PER_SECOND))
}

/// One poller counted among its backend's while it runs.
struct Polling(Arc<AtomicUsize>);

impl Polling {
    fn start(count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Polling(count.clone())
    }
}

impl Drop for Polling {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
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
    /// Each key's poller, kept alive by its waiters.
    pollers: Mutex<HashMap<LockKey, Weak<PollerHandle>>>,
    /// How many pollers run, sharing [`LOOKS_PER_SECOND`].
    polling: Arc<AtomicUsize>,
    pace: Pace,
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
            polling: Arc::default(),
            pace,
        }
    }

    /// Wakes one of this backend's waiters of `key`.
    pub(crate) fn wake(&self, key: &LockKey) {
        self.notifier.notify_one(key);
    }

    /// Waits until `key` is probably free or `max_wait` passes: subscribe first, make sure
    /// a poller runs, then re-check, so a release in between is never slept through (a
    /// release of a lease shows as a fence other than `revision`, the one the refused
    /// claim saw). The waiter subscribes at `line`, its place in this process's line (see
    /// [`LockBackend::wait_released`](lockcore::LockBackend::wait_released)).
    pub(crate) async fn wait<P: Probe>(
        self: &Arc<Self>,
        probe: &Arc<P>,
        key: &LockKey,
        since: Since,
        line: u64,
        max_wait: Duration,
    ) -> Result<(), LockError> {
        let subscription = self.notifier.subscribe(key, line);
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
            self.polling.clone(),
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
    polling: Arc<AtomicUsize>,
    waiters: Weak<Waiters>,
    probe: Arc<P>,
    key: LockKey,
    handle: Weak<PollerHandle>,
) {
    let mut interval = pace.first;
    let mut last_fence = None;
    let _counted = Polling::start(&polling);
    loop {
        // The looks of all its keys together stay within the budget.
        let pause = interval.max(spread(polling.load(Ordering::Relaxed)));
        tokio::time::sleep(pause).await;
        if handle.strong_count() == 0 {
            return;
        }
        let Some(waiters) = waiters.upgrade() else {
            return;
        };
        match probe.probe(&key).await {
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
                // waiter is woken by a new exclusive holder too: a release happened, and a
                // waiter that has waited long asks again to mark the key as its next turn
                // before the next release (its claim's `waited`), as NOTIFY's waiters do at
                // each release.
                let changed = last_fence.is_some_and(|f| f != fence);
                if changed {
                    waiters.notifier.notify_one(&key);
                }
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

/// The poller's view of a key (MySQL, SQLite).
#[cfg(any(feature = "mysql", feature = "sqlite"))]
impl<D: Dialect> Probe for Store<D> {
    fn probe<'a>(
        &'a self,
        key: &'a LockKey,
    ) -> Pin<Box<dyn Future<Output = Result<KeyState, LockError>> + Send + 'a>> {
        Box::pin(async move {
            Ok(match self.state(key).await? {
                None => KeyState::Free,
                Some((_, fence, remaining, capacity)) => KeyState::Held {
                    fence,
                    remaining: micros(remaining),
                    shared: capacity != 0,
                },
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicI64, Ordering};
    use std::time::Instant;

    use lockcore::driver::WaitHint;

    use super::*;

    /// A probe that answers `state(n)` at its `n`th look (from 1), counting its looks.
    struct Scripted {
        state: fn(i64) -> KeyState,
        looks: AtomicI64,
    }

    impl Scripted {
        fn new(state: fn(i64) -> KeyState) -> Arc<Self> {
            Arc::new(Scripted {
                state,
                looks: AtomicI64::new(0),
            })
        }
    }

    impl Probe for Scripted {
        fn probe<'a>(
            &'a self,
            _: &'a LockKey,
        ) -> Pin<Box<dyn Future<Output = Result<KeyState, LockError>> + Send + 'a>> {
            let n = self.looks.fetch_add(1, Ordering::SeqCst) + 1;
            let state = (self.state)(n);
            Box::pin(async move { Ok(state) })
        }
    }

    /// Held for 10 s more with fence `fence`.
    fn held(fence: i64) -> KeyState {
        KeyState::Held {
            fence,
            remaining: Duration::from_secs(10),
            shared: false,
        }
    }

    /// Waiters on many keys share the backend's budget of looks: 200 keys held all along
    /// (each alone looked at about nine times in 500 ms, its pace doubling from 2 ms to
    /// 100 ms) are looked at about a thousand times a second in all.
    #[tokio::test]
    async fn pollers_of_many_keys_share_a_budget_of_looks() {
        let waiters = Arc::new(Waiters::new(Pace::REMOTE));
        let probe = Scripted::new(|_| held(1));
        let max_wait = Duration::from_millis(500);
        let mut waiting = Vec::new();
        for i in 0..200 {
            let key = LockKey::new(format!("key{i}")).unwrap();
            let (waiters, probe) = (waiters.clone(), probe.clone());
            waiting.push(tokio::spawn(async move {
                let since = Since::of(&WaitHint::at_revision(1));
                waiters.wait(&probe, &key, since, u64::MAX, max_wait).await
            }));
        }
        for w in waiting {
            w.await.unwrap().unwrap();
        }
        let looks = probe.looks.load(Ordering::SeqCst);
        // Each waiter looks once itself; the pollers share 1,000 looks a second.
        assert!(
            looks <= 200 + 1_000,
            "200 keys were looked at {looks} times in 500 ms"
        );
        assert!(looks > 200, "the pollers never looked ({looks} looks)");
    }

    async fn waited(waiters: Waiters, max_wait: Duration) -> Duration {
        // A key that changes hands at every look and is never free.
        let (waiters, probe) = (Arc::new(waiters), Scripted::new(held));
        let key = LockKey::new("handed-on").unwrap();
        let since = Since::of(&WaitHint::none());
        let started = Instant::now();
        waiters
            .wait(&probe, &key, since, u64::MAX, max_wait)
            .await
            .unwrap();
        started.elapsed()
    }

    /// A new holder wakes a waiter, which asks again while the key is held (and marks it
    /// if it has waited long), as NOTIFY's waiters do at each release.
    #[tokio::test]
    async fn a_key_changing_hands_wakes_a_waiter() {
        let took = waited(Waiters::new(Pace::REMOTE), Duration::from_secs(10)).await;
        assert!(took < Duration::from_secs(2), "woken only after {took:?}");
    }
}
