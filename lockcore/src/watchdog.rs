//! The renewal watchdog.
//!
//! One thread per process keeps the schedule of every hold — its next renewal (every
//! `ttl / 3`) and the moment it must be declared lost (`valid_until − margin`) — and spawns
//! each renewal on the tokio runtime that acquired the hold. A hold costs an entry in a
//! map, not a task and a timer of its own: most holds are released long before their first
//! renewal, and acquiring and releasing should cost what the store costs.
//!
//! The thread, not a task, keeps the schedule because a hold may outlive the runtime that
//! acquired it, or a client may be used from several runtimes: the lost signal must fire
//! whatever happened to them.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

use crate::guard::Hold;
use crate::lease::valid_until;
use crate::{ErrorChain, ExtendOutcome, LockError, Operation};

/// The watchdog's part of a hold's state, guarded by the hold's own mutex.
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

/// The identity of a hold in the schedule.
pub(crate) fn next_id() -> u64 {
    static IDS: AtomicU64 = AtomicU64::new(0);
    IDS.fetch_add(1, Ordering::Relaxed)
}

/// The process's schedule of holds.
pub(crate) struct Schedule {
    state: Mutex<State>,
    wake: Condvar,
}

struct State {
    entries: BTreeMap<(Instant, u64), Weak<Hold>>,
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
    /// Starts watching a new hold.
    pub(crate) fn start(&self, hold: &Arc<Hold>) {
        let first = if hold.renew {
            lock(&hold.watch).next_renewal.min(hold.lost_at())
        } else {
            hold.lost_at()
        };
        self.set(hold, first);
    }

    /// Stops watching `hold` (released). A renewal in flight sees the hold's stop signal.
    pub(crate) fn stop(&self, hold: &Hold) {
        let mut state = lock(&self.state);
        if let Some(due) = lock(&hold.watch).due.take() {
            state.entries.remove(&(due, hold.id));
        }
    }

    /// Looks at `hold` again at `at`.
    fn set(&self, hold: &Arc<Hold>, at: Instant) {
        let mut state = lock(&self.state);
        let mut watch = lock(&hold.watch);
        if let Some(old) = watch.due.replace(at) {
            state.entries.remove(&(old, hold.id));
        }
        drop(watch);
        state.entries.insert((at, hold.id), Arc::downgrade(hold));
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
                if let Some(hold) = entry.remove().upgrade() {
                    let mut watch = lock(&hold.watch);
                    if watch.due == Some(at) {
                        watch.due = None;
                    }
                    drop(watch);
                    due.push(hold);
                }
            }
            if !due.is_empty() {
                drop(state);
                for hold in due {
                    self.tick(&hold, now);
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

    /// An entry of `hold` is due: declare it lost, start a renewal, or look again later.
    fn tick(&'static self, hold: &Arc<Hold>, now: Instant) {
        if hold.stopped().is_cancelled() {
            return;
        }
        let lost_at = hold.lost_at();
        if now >= lost_at {
            hold.mark_lost();
            return;
        }
        let mut watch = lock(&hold.watch);
        if !hold.renew || watch.renewing || now < watch.next_renewal {
            let next = if hold.renew && !watch.renewing {
                watch.next_renewal.min(lost_at)
            } else {
                lost_at
            };
            drop(watch);
            self.set(hold, next);
            return;
        }
        watch.renewing = true;
        drop(watch);
        // If the renewal hangs (or its runtime is gone), the lost signal still fires.
        self.set(hold, lost_at);
        hold.runtime.spawn(renew(self, hold.clone()));
    }
}

/// One renewal of `hold`, bounded so that a hung store cannot hold up the next attempt.
async fn renew(schedule: &'static Schedule, hold: Arc<Hold>) {
    let interval = hold.ttl / 3;
    let attempt_timeout = (hold.ttl / 4).max(Duration::from_millis(1));
    let started = Instant::now();
    let attempt = tokio::select! {
        biased;
        _ = hold.stopped().cancelled() => return,
        r = tokio::time::timeout(attempt_timeout, hold.backend.extend(&hold.key, &hold.owner, hold.ttl)) => r,
    };
    let next = match attempt {
        Ok(Ok(ExtendOutcome::Extended(grant))) => {
            hold.set_valid_until(
                valid_until(started, grant.ttl, grant.valid_until).max(hold.valid_until()),
            );
            hold.renewed();
            started + interval
        }
        Ok(Ok(ExtendOutcome::NotHeld)) => {
            hold.mark_lost();
            schedule.stop(&hold);
            return;
        }
        Ok(Err(e)) => {
            let e = e.during(Operation::Renew, &hold.key);
            let error = ErrorChain(&e).to_string();
            tracing::warn!(key = %hold.key, %error, "lock renewal failed; retrying");
            hold.renewal_failed(error);
            Instant::now() + interval / 4
        }
        Err(_) => {
            tracing::warn!(key = %hold.key, timeout = ?attempt_timeout, "lock renewal timed out; retrying");
            hold.renewal_failed(format!(
                "renewing {:?}: no answer from {} within {attempt_timeout:?}",
                hold.key.as_str(),
                hold.backend.name()
            ));
            Instant::now() + interval / 4
        }
    };
    let mut watch = lock(&hold.watch);
    watch.renewing = false;
    watch.next_renewal = next;
    drop(watch);
    if !hold.stopped().is_cancelled() {
        schedule.set(&hold, next.min(hold.lost_at()));
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use crate::memory::MemoryBackend;
    use crate::LockClient;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_schedule_keeps_many_holds_of_different_ttls() {
        let store = MemoryBackend::new();
        let client = LockClient::new(store.clone());
        let mut guards = Vec::new();
        for i in 0..60u64 {
            let ttl = Duration::from_millis(150 + 5 * i);
            guards.push(
                client
                    .lock(format!("k{i}"))
                    .ttl(ttl)
                    .acquire()
                    .await
                    .unwrap(),
            );
        }
        // Several TTLs: without renewals every one of them would have expired.
        tokio::time::sleep(Duration::from_millis(1200)).await;
        assert_eq!(store.held_count(), 60);
        assert!(guards.iter().all(|g| !g.is_lost()));
        assert!(guards.iter().all(|g| g.valid_until() > Instant::now()));
        for g in guards {
            assert_eq!(g.release().await.unwrap(), crate::ReleaseOutcome::Released);
        }
        assert_eq!(store.held_count(), 0);
    }

    #[test]
    fn lost_fires_even_when_the_acquiring_runtime_is_gone() {
        let store = MemoryBackend::new();
        let first = tokio::runtime::Runtime::new().unwrap();
        let guard = first.block_on(async {
            let client = LockClient::new(store.clone());
            client
                .lock("k")
                .ttl(Duration::from_millis(300))
                .acquire()
                .await
                .unwrap()
        });
        // No runtime is left to renew the lease: the hold must be reported lost before it
        // ends, not silently expire.
        drop(first);
        let second = tokio::runtime::Runtime::new().unwrap();
        let started = Instant::now();
        second.block_on(async {
            tokio::time::timeout(Duration::from_secs(5), guard.lost())
                .await
                .expect("lost() never fired");
        });
        assert!(started.elapsed() < Duration::from_millis(600));
        drop(guard);
    }
}
