//! The release announcements: a release publishes one nonce on every instance where it
//! freed a copy a waiter had marked, and this backend wakes one of its waiters per release
//! (see `docs/redlock.md`, the *waiting* row of "The algorithm, and what is different from
//! the write-ups"). Also the nonces themselves.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use driver_redis::__redlock as support;
use lockcore::driver::ReleaseNotifier;
use lockcore::LockKey;

/// How long a release nonce is remembered to count its messages from the instances.
const NONCE_MEMORY: Duration = Duration::from_secs(10);

/// How long after the first announcement of a release a waiter is woken even though fewer
/// than a majority of instances announced it (see [`release_filter`]).
const PARTIAL_ANNOUNCEMENT_WAKE: Duration = Duration::from_millis(2);

/// The filter shared by every instance's pub/sub reader. A release announces itself with
/// one nonce on each instance where it freed a copy a waiter had marked; this backend wakes
/// one of its waiters per release: at the `quorum`-th announcement, when the lock is free on
/// a majority and the woken waiter can win, or [`PARTIAL_ANNOUNCEMENT_WAKE`] after the first
/// if no majority announced by then (through `notifier`).
///
/// The first announcement always comes: a waiter sleeps only after its re-check found (and
/// marked) more than N − q copies held, and a majority holder has q copies, so they share
/// an instance. A majority of announcements does not always come: the holder may have only
/// some of its copies marked (its other copies were not yet held when the waiter looked).
/// Waiting for the quorum-th alone then slept until the TTL (caught by
/// `contended_handoff_keeps_waking`); waking at the first alone wakes waiters before the
/// release has reached a majority, and they lose the race they were woken for (more
/// failed tries per acquisition in lockbench's `handoff`).
pub(crate) fn release_filter(announcements: Arc<Announcements>) -> support::MessageFilter {
    Arc::new(move |key: &LockKey, payload: &[u8]| announcements.heard(key, payload))
}

/// The announcements of releases heard by this backend, counted per (key, nonce), and
/// when each release woke a waiter: once per release, whichever comes first of the
/// quorum-th announcement, the partial-announcement timer, or this backend's own release
/// that nobody announced — and once more for a waiter that began waiting after that
/// wake-up (see [`Announcements::waiting`]).
pub(crate) struct Announcements {
    quorum: usize,
    notifier: Arc<ReleaseNotifier>,
    counts: Mutex<Counts>,
}

#[derive(Default)]
struct Counts {
    /// Per (key, nonce): announcements heard, since when, and when a waiter was woken.
    map: HashMap<(LockKey, Vec<u8>), Heard>,
    /// Per key: when its latest waiter began waiting (registered before its re-check).
    waits: HashMap<LockKey, Instant>,
    sweep_at: usize,
}

/// One release's announcements.
struct Heard {
    count: usize,
    first: Instant,
    woken: Option<Instant>,
}

impl Announcements {
    pub(crate) fn new(quorum: usize, notifier: Arc<ReleaseNotifier>) -> Arc<Self> {
        Arc::new(Announcements {
            quorum,
            notifier,
            counts: Mutex::default(),
        })
    }

    fn counts(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Notes that a waiter of `key` begins waiting: called before its re-check marks the
    /// copies it finds held.
    ///
    /// A release still in progress may already have woken a waiter (at its quorum-th or
    /// first announcement): that waiter tried, found the lock still held on instances the
    /// release had not reached yet, and waits again. Its new re-check marks those copies,
    /// and their release announces the *same* nonce: without this note, the announcement
    /// would count as a repeat and wake nobody, and the waiter would sleep until the
    /// released lease's expiry.
    pub(crate) fn waiting(&self, key: &LockKey) {
        let mut counts = self.counts();
        counts.waits.insert(key.clone(), Instant::now());
    }

    /// The entry of (key, nonce), sweeping old entries now and then.
    fn entry<'a>(counts: &'a mut Counts, key: &LockKey, nonce: &[u8]) -> &'a mut Heard {
        let now = Instant::now();
        if counts.map.len() + counts.waits.len() >= counts.sweep_at {
            counts
                .map
                .retain(|_, h| now.duration_since(h.first) < NONCE_MEMORY);
            counts
                .waits
                .retain(|_, since| now.duration_since(*since) < NONCE_MEMORY);
            counts.sweep_at = ((counts.map.len() + counts.waits.len()) * 2).max(256);
        }
        counts
            .map
            .entry((key.clone(), nonce.to_vec()))
            .or_insert(Heard {
                count: 0,
                first: now,
                woken: None,
            })
    }

    /// A message from an instance's pub/sub reader: whether to wake a waiter now.
    fn heard(self: &Arc<Self>, key: &LockKey, payload: &[u8]) -> bool {
        // `1` is the single-instance driver's message (no nonce to count by).
        if payload == b"1" {
            return true;
        }
        let mut counts = self.counts();
        let latest_wait = counts.waits.get(key).copied();
        let entry = Self::entry(&mut counts, key, payload);
        entry.count += 1;
        if let Some(woken) = entry.woken {
            // Woken already; again only for a waiter that began waiting since.
            if latest_wait.is_some_and(|since| since > woken) {
                entry.woken = Some(Instant::now());
                return true;
            }
            return false;
        }
        if entry.count >= self.quorum {
            entry.woken = Some(Instant::now());
            return true;
        }
        if entry.count == 1 {
            // The reader runs on a runtime; without one (never), the TTL is the fallback.
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                let (this, key, nonce) = (self.clone(), key.clone(), payload.to_vec());
                runtime.spawn(async move {
                    tokio::time::sleep(PARTIAL_ANNOUNCEMENT_WAKE).await;
                    this.wake_once(&key, &nonce);
                });
            }
        }
        false
    }

    /// Wakes one waiter for the release (key, nonce) unless one was woken for it already.
    pub(crate) fn wake_once(&self, key: &LockKey, nonce: &[u8]) {
        let wake = {
            let mut counts = self.counts();
            let entry = Self::entry(&mut counts, key, nonce);
            let first = entry.woken.is_none();
            if first {
                entry.woken = Some(Instant::now());
            }
            first
        };
        if wake {
            self.notifier.notify_one(key);
        }
    }
}

/// The nonces of this backend's releases: a random base and a counter, in hex.
pub(crate) struct Nonces {
    base: u64,
    next: AtomicU64,
}

impl Nonces {
    /// Nonces from the random `base`.
    pub(crate) fn new(base: u64) -> Self {
        Nonces {
            base,
            next: AtomicU64::new(0),
        }
    }

    /// A release's nonce.
    pub(crate) fn next(&self) -> String {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        format!("{:016x}{n:x}", self.base)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nonces_are_the_base_then_the_counter_in_hex() {
        let nonces = Nonces::new(0xabc);
        assert_eq!(nonces.next(), "0000000000000abc0");
        assert_eq!(nonces.next(), "0000000000000abc1");
    }

    #[tokio::test]
    async fn one_wake_per_release_at_the_quorum_th_announcement_or_soon_after_the_first() {
        let notifier = Arc::new(ReleaseNotifier::new());
        let announcements = Announcements::new(3, notifier.clone());
        let f = release_filter(announcements.clone());
        let k = LockKey::new("k").unwrap();
        let wakes: Vec<bool> = (0..5).map(|_| f(&k, b"abc")).collect();
        assert_eq!(wakes, [false, false, true, false, false]);
        assert!(
            f(&k, b"1") && f(&k, b"1"),
            "driver-redis's messages carry no nonce"
        );
        // A release announced by fewer than a majority still wakes one waiter, a little
        // later, through the notifier; and only one.
        let first = notifier.subscribe(&k, u64::MAX);
        let second = notifier.subscribe(&k, u64::MAX);
        assert!(!f(&k, b"partial"));
        let started = Instant::now();
        tokio::time::timeout(Duration::from_secs(5), first.released())
            .await
            .expect("the partial announcement woke nobody");
        assert!(started.elapsed() >= PARTIAL_ANNOUNCEMENT_WAKE);
        assert!(
            !f(&k, b"partial") && !f(&k, b"partial"),
            "woken once per release"
        );
        assert!(
            tokio::time::timeout(Duration::from_millis(50), second.released())
                .await
                .is_err()
        );
        // A release of this backend that no instance announced wakes one of its waiters at
        // once, and counts as that release's wake-up: a late announcement wakes no second.
        let local = notifier.subscribe(&k, u64::MAX);
        announcements.wake_once(&k, b"local");
        tokio::time::timeout(Duration::from_secs(5), local.released())
            .await
            .expect("the unannounced release woke nobody");
        let third = notifier.subscribe(&k, u64::MAX);
        assert!(!f(&k, b"local") && !f(&k, b"local") && !f(&k, b"local"));
        assert!(
            tokio::time::timeout(Duration::from_millis(50), third.released())
                .await
                .is_err()
        );
    }

    #[test]
    fn a_waiter_that_waits_again_during_a_release_is_woken_by_its_later_announcements() {
        let notifier = Arc::new(ReleaseNotifier::new());
        let announcements = Announcements::new(3, notifier);
        let f = release_filter(announcements.clone());
        let (k, other) = (LockKey::new("k").unwrap(), LockKey::new("other").unwrap());
        // The release reached a majority and woke a waiter, which lost and waits again
        // (its re-check marked the copies the release has yet to reach).
        assert_eq!(
            [f(&k, b"r1"), f(&k, b"r1"), f(&k, b"r1")],
            [false, false, true]
        );
        std::thread::sleep(Duration::from_millis(1));
        announcements.waiting(&k);
        assert!(f(&k, b"r1"), "the later announcement woke nobody");
        assert!(!f(&k, b"r1"), "woken again without a new waiter");
        // A waiter of another key does not re-arm this key's releases.
        std::thread::sleep(Duration::from_millis(1));
        announcements.waiting(&other);
        assert!(!f(&k, b"r1"));
    }
}
