//! Waiting without store notifications (MySQL, SQLite): one poller task per key with
//! waiters in a backend.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use lockcore::driver::{OwnerToken, ReleaseNotifier, Tickets};
use lockcore::{LockError, LockKey};
use tokio::sync::Notify;

use crate::since::Since;
use crate::woken::Woken;

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

/// A fair store's first place in a key's queue: its owner (lower-case hex) and ticket.
pub(crate) type FirstPlace = Option<(String, i64)>;

/// Reads one key's state; implemented by the MySQL and SQLite backends' shared state.
pub(crate) trait Probe: Send + Sync + 'static {
    fn probe<'a>(
        &'a self,
        key: &'a LockKey,
    ) -> Pin<Box<dyn Future<Output = Result<KeyState, LockError>> + Send + 'a>>;

    /// A fair store: the owner of the key's first place in its queue (lower-case hex) and
    /// the place's ticket, `None` when nobody queues.
    fn first_in_queue<'a>(
        &'a self,
        key: &'a LockKey,
    ) -> Pin<Box<dyn Future<Output = Result<FirstPlace, LockError>> + Send + 'a>>;
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
    /// A fair store: how long a free key is left to the first place in its queue, when
    /// that place is another backend's, before this backend's waiters are woken anyway
    /// (the first place may be gone; a waiter's attempt drops it once it lapses).
    pub(crate) free_grace: Duration,
}

/// The first place of a free key's queue takes it within its own backend's poll and one
/// transaction, a few milliseconds.
const FREE_GRACE: Duration = Duration::from_millis(20);

/// A fair store: how often the backend whose waiter has the first place in a held key's
/// queue looks at the key (the timer's resolution). Only that backend looks this often,
/// whatever the number of waiting processes; the others back off.
const HEAD_POLL: Duration = Duration::from_millis(1);

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
        free_grace: FREE_GRACE,
    };

    /// The pace of a database whose probe is a read in the process (SQLite): a key changing
    /// hands between processes is noticed within about a millisecond (the timer's
    /// resolution), a key held by leases looked at every 8 ms at least.
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
    pub(crate) const LOCAL: Pace = Pace {
        first: Duration::from_millis(1),
        leases_max: Duration::from_millis(8),
        free_grace: FREE_GRACE,
    };
}

/// Waiting without store notifications: one poller task per key with waiters in this
/// backend, waking this backend's waiters one at a time through a [`ReleaseNotifier`]
/// (which a release made through this backend also signals directly).
#[derive(Debug)]
pub(crate) struct Waiters {
    pub(crate) notifier: ReleaseNotifier,
    /// Each key's poller: kept alive by its waiters, and poked to look at once.
    pollers: Mutex<HashMap<LockKey, Poller>>,
    /// How many pollers run, sharing [`LOOKS_PER_SECOND`].
    polling: Arc<AtomicUsize>,
    pace: Pace,
    /// Wake every waiter of a key that becomes free, once (see [`Waiters::waking_everyone`]).
    pub(crate) everyone: bool,
    /// A fair store: the places this backend's waiters hold in each key's queue (owner in
    /// lower-case hex → when the place lapses), so a poller wakes them for a free key only
    /// when the first place is theirs.
    places: Mutex<HashMap<LockKey, HashMap<String, Instant>>>,
    /// A fair store's waiters that know their ticket: a poller that finds the key free
    /// wakes the first place's only.
    tickets: Arc<Tickets<(LockKey, i64)>>,
}

/// Waiters of a database across the network (MySQL).
impl Default for Waiters {
    fn default() -> Self {
        Waiters::new(Pace::REMOTE)
    }
}

/// A key's running poller, as its backend knows it: whether any waiter still keeps it,
/// and what makes it look at once.
type Poller = (Weak<PollerHandle>, Arc<Notify>);

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
            everyone: false,
            places: Mutex::default(),
            tickets: Arc::default(),
        }
    }

    /// A fair store refused `owner` and kept (or gave) it a place in `key`'s queue, which
    /// lapses after `ttl` unless renewed.
    pub(crate) fn queued(&self, key: &LockKey, owner: &OwnerToken, ttl: Duration) {
        let mut places = self.places.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let of_key = places.entry(key.clone()).or_default();
        // Lapsed places (waiters that vanished without leaving) are dropped each time the
        // map doubles past 64, not at every refusal: a scan per attempt would cost every
        // waiter of a crowded key the whole crowd. A lapsed place counts for nothing
        // meanwhile (`has_place` checks the lapse).
        if of_key.len() >= 64 && of_key.len().is_power_of_two() {
            of_key.retain(|_, lapses| *lapses > now);
        }
        of_key.insert(owner.to_hex(), now + ttl);
    }

    /// `owner`'s place in `key`'s queue is gone (granted, or left).
    pub(crate) fn left(&self, key: &LockKey, owner: &OwnerToken) {
        let mut places = self.places.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(of_key) = places.get_mut(key) {
            of_key.remove(&owner.to_hex());
            if of_key.is_empty() {
                places.remove(key);
            }
        }
    }

    /// Whether `owner` (lower-case hex) is one of this backend's live places in `key`'s
    /// queue.
    fn has_place(&self, key: &LockKey, owner: &str) -> bool {
        let places = self.places.lock().unwrap_or_else(|e| e.into_inner());
        places
            .get(key)
            .and_then(|of_key| of_key.get(owner))
            .is_some_and(|lapses| *lapses > Instant::now())
    }

    /// A fair store's waiters: the store, not this process, knows which of them is first.
    /// A poller that finds the key free wakes the waiter of the first place's ticket when
    /// that place is this backend's; waiters that do not know their ticket (and every
    /// waiter, once another backend's first place has left the key free past the grace)
    /// are all woken, and the first place takes it.
    pub(crate) fn waking_everyone(mut self, everyone: bool) -> Self {
        self.everyone = everyone;
        self
    }

    /// Wakes this backend's waiters of `key`: one, or every one that does not know its
    /// ticket (a fair store: the key's poller, made to look at once, wakes the first
    /// place's).
    pub(crate) fn wake(&self, key: &LockKey) {
        if self.everyone {
            self.notifier.notify_all(key);
            let pollers = self.pollers.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((_, poke)) = pollers.get(key) {
                poke.notify_one();
            }
        } else {
            self.notifier.notify_one(key);
        }
    }

    /// Waits until `key` is probably free or `max_wait` passes: subscribe first, make sure
    /// a poller runs, then re-check, so a release in between is never slept through (a
    /// release of a lease shows as a fence other than `revision`, the one the refused
    /// claim saw). A fair store's waiter that knows its place (`ticket`) waits for its
    /// turn only: a key changing hands among the places ahead of it is no reason to ask.
    /// Any other waiter subscribes at `line`, its place in this process's line (see
    /// [`LockBackend::wait_released`](lockcore::LockBackend::wait_released)).
    pub(crate) async fn wait<P: Probe>(
        self: &Arc<Self>,
        probe: &Arc<P>,
        key: &LockKey,
        since: Since,
        ticket: Option<i64>,
        line: u64,
        max_wait: Duration,
    ) -> Result<(), LockError> {
        let ticket = ticket.filter(|_| self.everyone);
        let woken = match ticket {
            Some(ticket) => Woken::Ticket(self.tickets.wait((key.clone(), ticket))),
            None => Woken::Release(self.notifier.subscribe(key, line)),
        };
        let _poller = self.poller(probe, key);
        let remaining = match (ticket, probe.probe(key).await?) {
            (Some(_), KeyState::Held { remaining, .. }) => remaining,
            // Free: our turn, unless a place ahead of ours has it (then the poller wakes
            // us when ours comes).
            (Some(ticket), KeyState::Free) => match probe.first_in_queue(key).await? {
                Some((_, first)) if first < ticket => max_wait,
                _ => return Ok(()),
            },
            (None, KeyState::Free) if since.changed(None) => return Ok(()),
            // Free but reserved: the poller wakes us while it stays free.
            (None, KeyState::Free) => max_wait,
            (None, KeyState::Held { fence, .. }) if since.changed(Some(fence)) => return Ok(()),
            (None, KeyState::Held { remaining, .. }) => remaining,
        };
        // A hair past the holder's expiry, so the next attempt finds it expired.
        let bound = max_wait.min(remaining + Duration::from_millis(1));
        let _ = tokio::time::timeout(bound, woken.woken()).await;
        Ok(())
    }

    /// A fair store's free key: wakes the waiter of the first place's `ticket` if that
    /// place is this backend's (`ours`), or else every waiter of the key here; waiters that
    /// do not know their ticket are woken either way.
    fn wake_turn(&self, key: &LockKey, ticket: Option<i64>, ours: bool) {
        self.notifier.notify_all(key);
        match ticket {
            // Not registered: the waiter is asking now, and takes the key.
            Some(ticket) if ours => {
                self.tickets.wake(&(key.clone(), ticket));
            }
            _ => self.tickets.wake_where(|(k, _)| k == key),
        }
    }

    fn poller<P: Probe>(self: &Arc<Self>, probe: &Arc<P>, key: &LockKey) -> Arc<PollerHandle> {
        let mut pollers = self.pollers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(handle) = pollers.get(key).and_then(|(w, _)| w.upgrade()) {
            return handle;
        }
        pollers.retain(|_, (w, _)| w.strong_count() > 0);
        let handle = Arc::new(PollerHandle);
        let poke = Arc::new(Notify::new());
        pollers.insert(key.clone(), (Arc::downgrade(&handle), poke.clone()));
        tokio::spawn(poll(
            self.pace,
            self.polling.clone(),
            Arc::downgrade(self),
            probe.clone(),
            key.clone(),
            Arc::downgrade(&handle),
            poke,
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
    poke: Arc<Notify>,
) {
    let mut interval = pace.first;
    let mut last_fence = None;
    let mut was_free = false;
    // A fair store: since when the key has been seen free, and whether the first place in
    // its queue was this backend's waiter's at the holder's first look (then the key is
    // looked at closely until it is free: nobody else's look hands it on).
    // (The grace runs per first place: see below.)
    let mut free_since: Option<(Instant, Option<i64>)> = None;
    let mut next_is_ours = false;
    let _counted = Polling::start(&polling);
    loop {
        // A release through this backend pokes: the first place may be one of its waiters.
        // The looks of all its keys together stay within the budget.
        let pause = interval.max(spread(polling.load(Ordering::Relaxed)));
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = poke.notified() => interval = pace.first,
        }
        if handle.strong_count() == 0 {
            return;
        }
        let Some(waiters) = waiters.upgrade() else {
            return;
        };
        match probe.probe(&key).await {
            Ok(KeyState::Free) if waiters.everyone => {
                // A fair store's free key is the first place's: its backend's waiters are
                // all woken at each look while it stays free (one that subscribed just
                // after a look must not sleep until its place lapses), the others' only
                // once it has stayed free past the grace (the first place may be gone).
                // So a hand-off costs one attempt, not one per backend; the looks slow
                // down while the first place does not take it.
                let (ours, ticket) = match probe.first_in_queue(&key).await {
                    Ok(Some((first, ticket))) => (waiters.has_place(&key, &first), Some(ticket)),
                    Ok(None) | Err(_) => (true, None),
                };
                // The grace is the first place's: a key handed on between two looks (holds
                // shorter than a look) is free at every look with a new first place, and
                // waking every waiter of a backend that is not first at each look herded
                // them all into each hand-off.
                let since = match free_since {
                    Some((since, first)) if first == ticket => since,
                    _ => {
                        let now = Instant::now();
                        free_since = Some((now, ticket));
                        now
                    }
                };
                if ours || since.elapsed() >= pace.free_grace {
                    waiters.wake_turn(&key, ticket, ours);
                }
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
                free_since = None;
                // A new holder means the lock is changing hands: keep polling closely. On a
                // key held by leases a new fence may also be a release that made room. A
                // waiter is woken by a new exclusive holder too (not on a fair store, whose
                // queue keeps the order): a release happened, and a waiter that has waited
                // long asks again to mark the key as its next turn before the next release
                // (its claim's `waited`), as NOTIFY's waiters do at each release.
                let changed = last_fence.is_some_and(|f| f != fence);
                if changed && (shared || !waiters.everyone) {
                    waiters.notifier.notify_one(&key);
                }
                was_free = false;
                if waiters.everyone && last_fence != Some(fence) {
                    // A fair store's queue moved on: is the next turn ours? (The looks of
                    // the first place's backend are the ones a hand-off waits for.)
                    next_is_ours = match probe.first_in_queue(&key).await {
                        Ok(Some((first, _))) => waiters.has_place(&key, &first),
                        Ok(None) | Err(_) => false,
                    };
                }
                let most = if shared { pace.leases_max } else { POLL_MAX };
                interval = if next_is_ours {
                    HEAD_POLL
                } else if changed {
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

    use lockcore::driver::WaitHint;

    use super::*;

    /// A probe that answers `state(n)` at its `n`th look (from 1) and names `first` as the
    /// first place in the key's queue, counting its looks.
    struct Scripted {
        state: fn(i64) -> KeyState,
        first: Option<(String, i64)>,
        /// The first place's ticket is the number of looks so far (a new place at each).
        moving: bool,
        looks: AtomicI64,
    }

    impl Scripted {
        fn new(state: fn(i64) -> KeyState, first: Option<(String, i64)>) -> Arc<Self> {
            Arc::new(Scripted {
                state,
                first,
                moving: false,
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

        fn first_in_queue<'a>(
            &'a self,
            _: &'a LockKey,
        ) -> Pin<Box<dyn Future<Output = Result<FirstPlace, LockError>> + Send + 'a>> {
            let looks = self.looks.load(Ordering::SeqCst);
            let first = (self.first.clone())
                .map(|(owner, ticket)| (owner, if self.moving { looks } else { ticket }));
            Box::pin(async move { Ok(first) })
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

    /// How long a fair store's waiter, refused while the key was free but kept for the
    /// first place, waits (at most `max_wait`) when the first place is `first` ("ours":
    /// the place this backend recorded for the waiter) and the grace is `grace`.
    async fn waited_for_free(first: Option<&str>, grace: Duration, max_wait: Duration) -> Duration {
        waited_for_free_key(first, false, grace, max_wait).await
    }

    /// [`waited_for_free`], with the first place moving on at each look if `moving`.
    async fn waited_for_free_key(
        first: Option<&str>,
        moving: bool,
        grace: Duration,
        max_wait: Duration,
    ) -> Duration {
        let pace = Pace {
            free_grace: grace,
            ..Pace::REMOTE
        };
        let waiters = Arc::new(Waiters::new(pace).waking_everyone(true));
        let key = LockKey::new("free").unwrap();
        let ours = OwnerToken::generate();
        waiters.queued(&key, &ours, Duration::from_secs(60));
        let first = first.map(|f| {
            if f == "ours" {
                (ours.to_hex(), 1)
            } else {
                (f.to_string(), 1)
            }
        });
        // A key that stays free, its queue's first place `first`'s.
        let mut probe = Scripted::new(|_| KeyState::Free, first);
        if let Some(p) = Arc::get_mut(&mut probe) {
            p.moving = moving;
        }
        let since = Since::of(&WaitHint::at_revision(1).behind_reservation());
        let started = Instant::now();
        waiters
            .wait(&probe, &key, since, None, u64::MAX, max_wait)
            .await
            .unwrap();
        started.elapsed()
    }

    /// A free key wakes the backend whose waiter has the first place, and one nobody
    /// queues for wakes everyone.
    #[tokio::test]
    async fn a_fair_stores_free_key_wakes_the_first_places_backend() {
        let (grace, max_wait) = (Duration::from_secs(30), Duration::from_secs(10));
        for first in [Some("ours"), None] {
            let took = waited_for_free(first, grace, max_wait).await;
            assert!(
                took < Duration::from_secs(2),
                "{first:?}: woken only after {took:?}"
            );
        }
    }

    /// Another backend's first place has the free key to itself for the grace (one
    /// attempt per hand-off, not one per backend); past it, everyone is woken (that place
    /// may be gone).
    #[tokio::test]
    async fn a_fair_stores_free_key_is_left_to_another_first_place_for_the_grace() {
        let other = OwnerToken::generate().to_hex();
        let max_wait = Duration::from_millis(300);
        let took = waited_for_free(Some(&other), Duration::from_secs(30), max_wait).await;
        assert!(took >= max_wait, "woken after {took:?}");
        let grace = Duration::from_millis(20);
        let took = waited_for_free(Some(&other), grace, Duration::from_secs(10)).await;
        assert!(
            took >= grace && took < Duration::from_secs(2),
            "woken after {took:?}"
        );
    }

    /// The grace is per first place: a key handed on between two looks (holds shorter than
    /// a look) is free at every look, with a new first place each time, none of them this
    /// backend's. Its waiter is not woken: it would herd into every hand-off.
    #[tokio::test]
    async fn a_key_handed_on_between_looks_keeps_other_backends_waiting() {
        let other = OwnerToken::generate().to_hex();
        let max_wait = Duration::from_millis(400);
        let grace = Duration::from_millis(20);
        let took = waited_for_free_key(Some(&other), true, grace, max_wait).await;
        assert!(
            took >= max_wait,
            "woken after {took:?} although each first place had the key for less than the \
             grace"
        );
    }

    /// How often a fair store's poller looks at a key held all along for 300 ms, when the
    /// first place is this backend's waiter's (`ours`) or another backend's.
    async fn looks_while_held(ours: bool) -> i64 {
        let waiters = Arc::new(Waiters::new(Pace::REMOTE).waking_everyone(true));
        let key = LockKey::new("held").unwrap();
        let owner = OwnerToken::generate();
        waiters.queued(&key, &owner, Duration::from_secs(60));
        let first = if ours {
            owner.to_hex()
        } else {
            OwnerToken::generate().to_hex()
        };
        let probe = Scripted::new(|_| held(1), Some((first, 1)));
        let since = Since::of(&WaitHint::at_revision(1));
        let max_wait = Duration::from_millis(300);
        waiters
            .wait(&probe, &key, since, None, u64::MAX, max_wait)
            .await
            .unwrap();
        probe.looks.load(Ordering::SeqCst)
    }

    /// The hand-off waits for the look of the first place's backend: that backend looks
    /// at the held key every millisecond or so; the others back off (2, 4, 8 … 100 ms).
    #[tokio::test]
    async fn only_the_first_places_backend_looks_closely() {
        let ours = looks_while_held(true).await;
        let theirs = looks_while_held(false).await;
        assert!(
            ours >= 30,
            "the first place's backend looked {ours} times in 300 ms"
        );
        assert!(
            theirs <= 15,
            "another backend looked {theirs} times in 300 ms"
        );
    }

    /// Waiters on many keys share the backend's budget of looks: 200 keys whose first
    /// places are this backend's (each alone looked at every millisecond) are looked at
    /// about a thousand times a second in all, not two hundred thousand.
    #[tokio::test]
    async fn pollers_of_many_keys_share_a_budget_of_looks() {
        let waiters = Arc::new(Waiters::new(Pace::REMOTE).waking_everyone(true));
        let owner = OwnerToken::generate();
        let probe = Scripted::new(|_| held(1), Some((owner.to_hex(), 1)));
        let max_wait = Duration::from_millis(500);
        let mut waiting = Vec::new();
        for i in 0..200 {
            let key = LockKey::new(format!("key{i}")).unwrap();
            waiters.queued(&key, &owner, Duration::from_secs(60));
            let (waiters, probe) = (waiters.clone(), probe.clone());
            waiting.push(tokio::spawn(async move {
                let since = Since::of(&WaitHint::at_revision(1));
                waiters
                    .wait(&probe, &key, since, None, u64::MAX, max_wait)
                    .await
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

    /// A fair store's waiter that knows its ticket (2) re-checks a free key for its turn:
    /// behind another place (ticket 1) it waits (the grace outlasts the test); first, or
    /// with its place gone (the first place's ticket above its own), it asks at once.
    #[tokio::test]
    async fn a_waiter_with_a_ticket_asks_for_its_turn_only() {
        let waited = |first: i64| async move {
            let pace = Pace {
                free_grace: Duration::from_secs(30),
                ..Pace::REMOTE
            };
            let waiters = Arc::new(Waiters::new(pace).waking_everyone(true));
            let key = LockKey::new("turn").unwrap();
            let probe = Scripted::new(
                |_| KeyState::Free,
                Some((OwnerToken::generate().to_hex(), first)),
            );
            let since = Since::of(&WaitHint::at_revision(1).behind_reservation());
            let max_wait = Duration::from_millis(300);
            let started = Instant::now();
            waiters
                .wait(&probe, &key, since, Some(2), u64::MAX, max_wait)
                .await
                .unwrap();
            started.elapsed()
        };
        let behind = waited(1).await;
        assert!(
            behind >= Duration::from_millis(300),
            "behind another place, asked after {behind:?}"
        );
        for first in [2, 3] {
            let took = waited(first).await;
            assert!(
                took < Duration::from_millis(100),
                "first place {first}: asked only after {took:?}"
            );
        }
    }

    /// A place that was granted or left no longer counts as this backend's.
    #[test]
    fn a_place_left_or_lapsed_is_not_ours() {
        let waiters = Waiters::new(Pace::REMOTE);
        let key = LockKey::new("k").unwrap();
        let (a, b) = (OwnerToken::generate(), OwnerToken::generate());
        waiters.queued(&key, &a, Duration::from_secs(60));
        waiters.queued(&key, &b, Duration::ZERO);
        assert!(waiters.has_place(&key, &a.to_hex()));
        assert!(!waiters.has_place(&key, &b.to_hex()), "lapsed");
        waiters.left(&key, &a);
        assert!(!waiters.has_place(&key, &a.to_hex()), "left");
    }

    async fn waited(waiters: Waiters, max_wait: Duration) -> Duration {
        // A key that changes hands at every look and is never free.
        let (waiters, probe) = (Arc::new(waiters), Scripted::new(held, None));
        let key = LockKey::new("handed-on").unwrap();
        let since = Since::of(&WaitHint::none());
        let started = Instant::now();
        waiters
            .wait(&probe, &key, since, None, u64::MAX, max_wait)
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

    /// On a fair store the queue keeps the order: a new holder wakes nobody.
    #[tokio::test]
    async fn a_fair_stores_waiters_sleep_through_a_change_of_holder() {
        let max_wait = Duration::from_millis(300);
        let took = waited(Waiters::new(Pace::REMOTE).waking_everyone(true), max_wait).await;
        assert!(took >= max_wait, "woken after {took:?}");
    }
}
