//! The renewal watchdog: one schedule per process of everything that must be renewed or
//! declared lost at a given moment.
//!
//! One thread per process keeps the schedule of every hold — its next renewal (every
//! `ttl / 3`) and the moment it must be declared lost (`valid_until − margin`) — and starts
//! the renewals that are due. A hold costs an entry in a map, not a task and a timer of its
//! own: most holds are released long before their first renewal, and acquiring and
//! releasing should cost what the store costs.
//!
//! On a backend that renews batches in one request
//! ([`Capabilities::batched_renewals`](crate::Capabilities::batched_renewals)), every
//! renewal due at the same moment goes out in one
//! [`LockBackend::renew`](crate::LockBackend::renew) call (at most
//! [`RENEWAL_BATCH`] each). So that holds taken at different moments fall due together,
//! their renewal times are rounded *down* to a grid of a power-of-two number of
//! milliseconds, at most an eighth of the renewal interval ([`align`]): a renewal comes a
//! little early, never late, and holds of one TTL stay in step once renewed together. The
//! store's load then grows with the number of batches, not with the number of holds: the
//! grid earns its lines on lockbench `postgres --case scale_holds --scale-holds 100000`
//! (docs/performance.md has the figures with and without it). On
//! any other backend, renewals stay spread out as the holds were taken, and each goes out
//! on its own: bunching them would only turn a steady load into bursts.
//!
//! The thread, not a task, keeps the schedule because a hold may outlive the runtime that
//! acquired it, or a client may be used from several runtimes: the lost signal must fire
//! whatever happened to them.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

use crate::backend::RENEWAL_BATCH;
use crate::lease::now_on;

/// What the schedule drives (a hold), seen only through the moments that matter to it.
pub(crate) trait Watched: Send + Sync + Sized + 'static {
    /// The watchdog's part of the state, guarded by the watched thing's own mutex.
    fn watch(&self) -> &Mutex<Watch>;
    /// The identity in the schedule (from [`next_id`]).
    fn watch_id(&self) -> u64;
    /// Whether it is renewed at all (otherwise only its loss is scheduled).
    fn renews(&self) -> bool;
    /// When it must be assumed lost if renewals keep failing.
    fn lost_at(&self) -> Instant;
    /// Released: nothing is due any more.
    fn is_stopped(&self) -> bool;
    /// Its time ran out.
    fn mark_lost(&self);
    /// The runtime whose timers time it, when its store keeps tokio's clock
    /// ([`ClockSource::Tokio`](crate::driver::ClockSource::Tokio)); `None`: the schedule's
    /// thread times it.
    fn timed_by(&self) -> Option<&tokio::runtime::Handle>;
    /// What it may be renewed together with: the same key means one batch (`None`: alone).
    fn batch_key(&self) -> Option<(usize, tokio::runtime::Id)>;
    /// Starts one renewal of every hold of `batches` (each at least one, at most
    /// [`RENEWAL_BATCH`] holds, all of one batch key), at most
    /// [`BATCHES_IN_FLIGHT`] batches at once; each renewal ends with
    /// [`Schedule::renewal_done`] or [`Schedule::stop`].
    fn start_renewals(schedule: &'static Schedule<Self>, batches: Vec<Vec<Arc<Self>>>);
}

/// The watchdog's part of a hold's state.
#[derive(Debug)]
pub(crate) struct Watch {
    /// The hold's entry in the schedule, if it has one.
    due: Option<Instant>,
    /// When the next renewal is due.
    next_renewal: Instant,
    /// A renewal is in flight; it schedules the next one when it ends.
    renewing: bool,
}

impl Watch {
    pub(crate) fn new(first_renewal: Instant) -> Self {
        Watch {
            due: None,
            next_renewal: first_renewal,
            renewing: false,
        }
    }
}

/// A fresh identity for the schedule.
pub(crate) fn next_id() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static IDS: AtomicU64 = AtomicU64::new(0);
    IDS.fetch_add(1, Ordering::Relaxed)
}

/// The moment the renewal grid counts from.
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// `at` rounded down to the renewal grid of a hold renewed every `interval`: a multiple of
/// the largest power-of-two number of milliseconds that is at most `interval / 8` (1 ms at
/// least), counted from a process-wide epoch. Holds of one interval share a grid, and the
/// grids of different intervals meet at the coarser one's points.
pub(crate) fn align(at: Instant, interval: Duration) -> Instant {
    let eighth = (interval / 8).as_millis().max(1);
    // The largest power of two not above `eighth`.
    let step_ms = 1u128 << (127 - eighth.leading_zeros());
    let epoch = epoch();
    let Some(since) = at.checked_duration_since(epoch) else {
        return at;
    };
    let step_ns = step_ms * 1_000_000;
    let aligned_ns = since.as_nanos() / step_ns * step_ns;
    // `aligned_ns <= since`, which came from a `Duration`: it fits.
    let aligned = Duration::new(
        (aligned_ns / 1_000_000_000) as u64,
        (aligned_ns % 1_000_000_000) as u32,
    );
    epoch + aligned
}

/// How many batches of one backend fall due together and are renewed at once, at most.
/// 100,000 holds of one PostgreSQL backend fall due as 98 batches: sent at once, they queued
/// for the pool's 8 connections ahead of the acquisitions, and an acquisition waited more
/// than its 5 s for a connection. Each batch's time limit starts when it is sent.
pub(crate) const BATCHES_IN_FLIGHT: usize = 4;

/// The process's schedule.
pub(crate) struct Schedule<W> {
    state: Mutex<State<W>>,
    wake: Condvar,
}

struct State<W> {
    entries: BTreeMap<(Instant, u64), Weak<W>>,
    /// When the thread looks at the schedule next; `None` while it waits for an entry.
    armed: Option<Instant>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A new schedule with its thread: called once per process, by the owner of the static that
/// keeps it.
///
/// # Errors
///
/// The operating system's refusal to start the thread.
pub(crate) fn start<W: Watched>() -> Result<&'static Schedule<W>, String> {
    epoch();
    let schedule: &'static Schedule<W> = Box::leak(Box::new(Schedule {
        state: Mutex::new(State {
            entries: BTreeMap::new(),
            armed: None,
        }),
        wake: Condvar::new(),
    }));
    std::thread::Builder::new()
        .name("distlock-watchdog".into())
        .spawn(move || schedule.run())
        .map(|_| schedule)
        .map_err(|e| e.to_string())
}

impl<W: Watched> Schedule<W> {
    /// Starts watching `hold`.
    pub(crate) fn start(&'static self, hold: &Arc<W>) {
        let first = if hold.renews() {
            lock(hold.watch()).next_renewal.min(hold.lost_at())
        } else {
            hold.lost_at()
        };
        self.set(hold, first);
    }

    /// Stops watching `hold` (released). A renewal in flight sees its stop signal.
    pub(crate) fn stop(&self, hold: &W) {
        let mut state = lock(&self.state);
        if let Some(due) = lock(hold.watch()).due.take() {
            state.entries.remove(&(due, hold.watch_id()));
        }
    }

    /// A renewal of `hold` ended; the next is due at `next`.
    pub(crate) fn renewal_done(&'static self, hold: &Arc<W>, next: Instant) {
        let mut watch = lock(hold.watch());
        watch.renewing = false;
        watch.next_renewal = next;
        drop(watch);
        if !hold.is_stopped() {
            self.set(hold, next.min(hold.lost_at()));
        }
    }

    /// Looks at `hold` again at `at`.
    fn set(&'static self, hold: &Arc<W>, at: Instant) {
        if let Some(runtime) = hold.timed_by() {
            // A paused clock moves only with the runtime's own timers: one sleeps until
            // `at`, as the thread would. (Not the thread's map: its instants are real.)
            lock(hold.watch()).due = Some(at);
            let watched = Arc::downgrade(hold);
            runtime.spawn(async move {
                tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await;
                self.timer_fired(&watched, at);
            });
            return;
        }
        let mut state = lock(&self.state);
        let mut watch = lock(hold.watch());
        if let Some(old) = watch.due.replace(at) {
            state.entries.remove(&(old, hold.watch_id()));
        }
        drop(watch);
        state
            .entries
            .insert((at, hold.watch_id()), Arc::downgrade(hold));
        // The thread sleeps until `armed`: wake it only when this entry is due earlier. A
        // sequence of short holds therefore never wakes it; it finds them gone later.
        if state.armed.is_none_or(|armed| at < armed) {
            state.armed = Some(at);
            self.wake.notify_one();
        }
    }

    fn run(&'static self) {
        let mut state = lock(&self.state);
        loop {
            // The thread times only holds of stores on the monotonic clock.
            let now = Instant::now();
            let mut due = Vec::new();
            while let Some(entry) = state.entries.first_entry() {
                let (at, _) = *entry.key();
                if at > now {
                    break;
                }
                if let Some(hold) = entry.remove().upgrade() {
                    let mut watch = lock(hold.watch());
                    if watch.due == Some(at) {
                        watch.due = None;
                    }
                    drop(watch);
                    due.push(hold);
                }
            }
            if !due.is_empty() {
                drop(state);
                let renew: Vec<Arc<W>> = due.into_iter().filter(|h| self.tick(h, now)).collect();
                self.start_renewals(renew);
                state = lock(&self.state);
                continue;
            }
            state = match state.entries.first_key_value().map(|((at, _), _)| *at) {
                Some(at) => {
                    state.armed = Some(at);
                    let wait = at.saturating_duration_since(now);
                    self.wake
                        .wait_timeout(state, wait)
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
                None => {
                    state.armed = None;
                    self.wake.wait(state).unwrap_or_else(|e| e.into_inner())
                }
            };
        }
    }

    /// The timer set for `at` on a hold timed by its runtime went off: the hold is due,
    /// unless it was stopped or looked at anew since.
    fn timer_fired(&'static self, watched: &Weak<W>, at: Instant) {
        let Some(hold) = watched.upgrade() else {
            return;
        };
        {
            let mut watch = lock(hold.watch());
            if watch.due != Some(at) {
                return;
            }
            watch.due = None;
        }
        if self.tick(&hold, now_on(crate::ClockSource::Tokio)) {
            self.start_renewals(vec![hold]);
        }
    }

    /// An entry of `hold` is due: declare it lost, or look again later. Answers whether its
    /// renewal is to start now (it is then marked as renewing and its loss is scheduled, in
    /// case the renewal hangs or its runtime is gone).
    fn tick(&'static self, hold: &Arc<W>, now: Instant) -> bool {
        if hold.is_stopped() {
            return false;
        }
        let lost_at = hold.lost_at();
        if now >= lost_at {
            hold.mark_lost();
            return false;
        }
        let renews = hold.renews();
        let mut watch = lock(hold.watch());
        if !renews || watch.renewing || now < watch.next_renewal {
            let next = if renews && !watch.renewing {
                watch.next_renewal.min(lost_at)
            } else {
                lost_at
            };
            drop(watch);
            self.set(hold, next);
            return false;
        }
        watch.renewing = true;
        drop(watch);
        self.set(hold, lost_at);
        true
    }

    /// Starts the renewals of `holds`: one batch per backend and runtime, of at most
    /// [`RENEWAL_BATCH`] holds, on the runtime that acquired them.
    fn start_renewals(&'static self, holds: Vec<Arc<W>>) {
        let mut groups: HashMap<(usize, tokio::runtime::Id), Vec<Arc<W>>> = HashMap::new();
        for hold in holds {
            match hold.batch_key() {
                Some(key) => groups.entry(key).or_default().push(hold),
                // One request per renewal anyway: each goes out on its own, as soon as due.
                None => W::start_renewals(self, vec![vec![hold]]),
            }
        }
        for (_, mut group) in groups {
            let mut batches = Vec::with_capacity(group.len().div_ceil(RENEWAL_BATCH));
            while !group.is_empty() {
                let rest = group.split_off(group.len().min(RENEWAL_BATCH));
                batches.push(std::mem::replace(&mut group, rest));
            }
            W::start_renewals(self, batches);
        }
    }
}
