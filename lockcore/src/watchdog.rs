//! The renewal watchdog: one schedule per process of everything that must be renewed or
//! declared lost at a given moment.
//!
//! One thread per process keeps the schedule of every hold — its next renewal (every
//! `ttl / 3`) and the moment it must be declared lost (`valid_until − margin`) — and asks
//! each hold to start its renewal when it is due. A hold costs an entry in a map, not a task
//! and a timer of its own: most holds are released long before their first renewal, and
//! acquiring and releasing should cost what the store costs.
//!
//! The thread, not a task, keeps the schedule because a hold may outlive the runtime that
//! acquired it, or a client may be used from several runtimes: the lost signal must fire
//! whatever happened to them.
//!
//! The schedule knows nothing of guards, clients or stores: it drives anything that is
//! [`Watched`].

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Instant;

use crate::LockError;

/// What the schedule drives: a hold, seen only through the moments that matter to it.
pub(crate) trait Watched: Send + Sync + 'static {
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
    /// Starts one renewal, which ends with [`Schedule::renewal_done`] or
    /// [`Schedule::stop`].
    fn start_renewal(self: Arc<Self>, schedule: &'static Schedule);
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
    static IDS: AtomicU64 = AtomicU64::new(0);
    IDS.fetch_add(1, Ordering::Relaxed)
}

/// The process's schedule.
pub(crate) struct Schedule {
    state: Mutex<State>,
    wake: Condvar,
}

struct State {
    entries: BTreeMap<(Instant, u64), Weak<dyn Watched>>,
    /// When the thread looks at the schedule next; `None` while it waits for an entry.
    armed: Option<Instant>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The schedule, starting its thread the first time.
///
/// # Errors
///
/// [`LockError::Backend`] if the operating system refuses to start the thread.
pub(crate) fn schedule() -> Result<&'static Schedule, LockError> {
    static SCHEDULE: OnceLock<Result<&'static Schedule, String>> = OnceLock::new();
    let started = SCHEDULE.get_or_init(|| {
        let schedule: &'static Schedule = Box::leak(Box::new(Schedule {
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
    });
    started
        .as_ref()
        .map(|s| *s)
        .map_err(|e| LockError::backend("lockcore", format!("cannot start the watchdog: {e}")))
}

impl Schedule {
    /// Starts watching `watched`.
    pub(crate) fn start<W: Watched>(&self, watched: &Arc<W>) {
        let first = if watched.renews() {
            lock(watched.watch()).next_renewal.min(watched.lost_at())
        } else {
            watched.lost_at()
        };
        let weak: Weak<W> = Arc::downgrade(watched);
        self.set(&**watched, weak as Weak<dyn Watched>, first);
    }

    /// Stops watching `watched` (released). A renewal in flight sees its stop signal.
    pub(crate) fn stop(&self, watched: &dyn Watched) {
        let mut state = lock(&self.state);
        if let Some(due) = lock(watched.watch()).due.take() {
            state.entries.remove(&(due, watched.watch_id()));
        }
    }

    /// A renewal of `watched` ended; the next is due at `next`.
    pub(crate) fn renewal_done<W: Watched>(&self, watched: &Arc<W>, next: Instant) {
        let mut watch = lock(watched.watch());
        watch.renewing = false;
        watch.next_renewal = next;
        drop(watch);
        if !watched.is_stopped() {
            let weak: Weak<W> = Arc::downgrade(watched);
            self.set(
                &**watched,
                weak as Weak<dyn Watched>,
                next.min(watched.lost_at()),
            );
        }
    }

    /// Looks at `watched` again at `at`.
    fn set(&self, watched: &dyn Watched, weak: Weak<dyn Watched>, at: Instant) {
        let mut state = lock(&self.state);
        let mut watch = lock(watched.watch());
        if let Some(old) = watch.due.replace(at) {
            state.entries.remove(&(old, watched.watch_id()));
        }
        drop(watch);
        state.entries.insert((at, watched.watch_id()), weak);
        // The thread sleeps until `armed`: wake it only when this entry is due earlier. A
        // sequence of short holds therefore never wakes it; it finds them gone later.
        if state.armed.map_or(true, |armed| at < armed) {
            state.armed = Some(at);
            self.wake.notify_one();
        }
    }

    fn run(&'static self) {
        let mut state = lock(&self.state);
        loop {
            let now = Instant::now();
            let mut due = Vec::new();
            while let Some(entry) = state.entries.first_entry() {
                let (at, _) = *entry.key();
                if at > now {
                    break;
                }
                if let Some(watched) = entry.remove().upgrade() {
                    let mut watch = lock(watched.watch());
                    if watch.due == Some(at) {
                        watch.due = None;
                    }
                    drop(watch);
                    due.push(watched);
                }
            }
            if !due.is_empty() {
                drop(state);
                for watched in due {
                    self.tick(watched, now);
                }
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

    /// An entry of `watched` is due: declare it lost, start a renewal, or look again later.
    fn tick(&'static self, watched: Arc<dyn Watched>, now: Instant) {
        if watched.is_stopped() {
            return;
        }
        let lost_at = watched.lost_at();
        if now >= lost_at {
            watched.mark_lost();
            return;
        }
        let renews = watched.renews();
        let mut watch = lock(watched.watch());
        if !renews || watch.renewing || now < watch.next_renewal {
            let next = if renews && !watch.renewing {
                watch.next_renewal.min(lost_at)
            } else {
                lost_at
            };
            drop(watch);
            self.set(&*watched, Arc::downgrade(&watched), next);
            return;
        }
        watch.renewing = true;
        drop(watch);
        // If the renewal hangs (or its runtime is gone), the lost signal still fires.
        self.set(&*watched, Arc::downgrade(&watched), lost_at);
        watched.start_renewal(self);
    }
}
