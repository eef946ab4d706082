//! The nemesis: faults injected one after another, each recorded in the history, each
//! followed by a wait (bounded) for the lock to be granted again.

use std::time::Duration;

use super::event::{EventKind, Ms, WorkerId};
use super::register::Register;
use super::worker::{Spawner, WorkerProcess};
use super::{HistoryStore, Mode, Workload};

/// The latest a jittered fault lands after its trigger: past a hold's 1–8 ms of work, so
/// that it may land mid-write, during the release, or in the worker's next attempt.
pub(crate) const JITTER_MAX: Duration = Duration::from_millis(12);

/// The nemesis of one run and the workers it plays with.
pub(crate) struct Nemesis<'a> {
    pub(crate) register: &'a Register,
    pub(crate) spawner: &'a Spawner,
    pub(crate) workers: Vec<WorkerProcess>,
    pub(crate) next_id: WorkerId,
    pub(crate) store: &'a dyn HistoryStore,
    pub(crate) workload: &'a Workload,
    /// Remarks for the report (a fault skipped and why).
    pub(crate) notes: Vec<String>,
}

impl Nemesis<'_> {
    /// Starts the workers.
    pub(crate) fn spawn_workers(&mut self) -> Result<(), String> {
        for _ in 0..self.workload.workers {
            self.spawn()?;
        }
        Ok(())
    }

    fn spawn(&mut self) -> Result<WorkerId, String> {
        let id = self.next_id;
        self.next_id += 1;
        let worker = self
            .spawner
            .spawn(id)
            .map_err(|e| format!("cannot start worker process: {e}"))?;
        let pid = worker.pid().unwrap_or(0);
        self.register.record(EventKind::Spawned { worker: id, pid });
        self.workers.push(worker);
        Ok(id)
    }

    /// Waits up to the liveness bound for a grant recorded from index `from` on.
    async fn next_grant(&self, from: usize) -> Option<WorkerId> {
        self.register
            .wait_for(from, self.workload.liveness_bound(), |e| {
                matches!(e.kind, EventKind::Acquired { .. })
            })
            .await
            .and_then(|e| e.kind.worker())
    }

    /// Warm-up, then the faults of every round, then a quiet tail.
    pub(crate) async fn run(&mut self) -> Result<(), String> {
        let w = self.workload;
        for _ in 0..w.warmup_grants {
            if self.next_grant(self.register.len()).await.is_none() {
                self.notes
                    .push("no grant during the warm-up: faults skipped".to_owned());
                return Ok(());
            }
        }
        let mut restart_noted = false;
        for round in 0..w.rounds {
            if w.pause {
                self.pause(round).await?;
            }
            if w.kill {
                self.kill().await?;
            }
            if w.restart {
                if self.store.can_restart() {
                    self.restart().await?;
                } else if !restart_noted {
                    restart_noted = true;
                    self.notes.push(
                        "store restart skipped: this store has no restart hook \
                         (HistoryStore::can_restart is false)"
                            .to_owned(),
                    );
                }
            }
        }
        // The fault is the point of this wait: the workload runs on undisturbed.
        tokio::time::sleep(w.tail).await;
        Ok(())
    }

    fn process(&self, id: WorkerId) -> Option<&WorkerProcess> {
        self.workers.iter().find(|w| w.id == id)
    }

    /// How long after its trigger a fault lands, when the workload jitters faults: a random
    /// 0 to [`JITTER_MAX`], noted in the report.
    async fn jitter(&mut self, what: &str) {
        if !self.workload.jitter {
            return;
        }
        let mut b = [0u8; 8];
        let _ = getrandom::fill(&mut b);
        let micros = u64::from_le_bytes(b) % (JITTER_MAX.as_micros() as u64 + 1);
        let offset = Duration::from_micros(micros);
        self.notes
            .push(format!("{what} {} after its trigger", Ms(offset)));
        tokio::time::sleep(offset).await;
    }

    /// SIGSTOP a worker between its fenced read and write (a semaphore's holder: right
    /// after its grant, as it reads nothing), for longer than the TTL, then SIGCONT. In
    /// rounds after the first, with jitter, the stop lands up to [`JITTER_MAX`] later: before
    /// or after the write, during the release or the next attempt.
    async fn pause(&mut self, round: usize) -> Result<(), String> {
        let bound = self.workload.liveness_bound();
        let from = self.register.len();
        let semaphore = matches!(self.workload.mode, Mode::Semaphore(_));
        let holding = self
            .register
            .wait_for(from, bound, |e| match e.kind {
                EventKind::Read { outcome: Ok(_), .. } => !semaphore,
                EventKind::Acquired { .. } => semaphore,
                _ => false,
            })
            .await;
        let Some(id) = holding.and_then(|e| e.kind.worker()) else {
            self.notes
                .push("pause skipped: no worker held the key".to_owned());
            return Ok(());
        };
        if round > 0 {
            self.jitter(&format!("round {}: the pause of w{id}", round + 1))
                .await;
        }
        let Some(worker) = self.process(id) else {
            return Ok(());
        };
        // Recorded before the signal and after SIGCONT: the recorded pause covers the
        // real one.
        self.register.record(EventKind::Paused { worker: id });
        worker
            .signal(libc::SIGSTOP)
            .map_err(|e| format!("SIGSTOP w{id}: {e}"))?;
        // The fault itself: the worker stays stopped until its lease has run out.
        tokio::time::sleep(self.workload.pause_for()).await;
        let resumed = worker.signal(libc::SIGCONT);
        let from = self.register.len();
        self.register.record(EventKind::Resumed { worker: id });
        resumed.map_err(|e| format!("SIGCONT w{id}: {e}"))?;
        self.next_grant(from).await;
        Ok(())
    }

    /// SIGKILL a worker after it acquired (with jitter, up to [`JITTER_MAX`] later: while it
    /// works, releases or asks again), and start a new one.
    async fn kill(&mut self) -> Result<(), String> {
        let from = self.register.len();
        let Some(id) = self.next_grant(from).await else {
            self.notes
                .push("kill skipped: no worker acquired".to_owned());
            return Ok(());
        };
        self.jitter(&format!("the kill of w{id}")).await;
        self.register.record(EventKind::Killed { worker: id });
        if let Some(at) = self.workers.iter().position(|w| w.id == id) {
            let mut worker = self.workers.swap_remove(at);
            worker.kill();
        }
        let from = self.register.len();
        self.spawn()?;
        self.next_grant(from).await;
        Ok(())
    }

    /// Restart the store through the caller's hook.
    async fn restart(&mut self) -> Result<(), String> {
        self.register.record(EventKind::StoreDown);
        let restarted = self.store.restart().await;
        let from = self.register.len();
        self.register.record(EventKind::StoreUp);
        restarted.map_err(|e| format!("the store restart failed: {e}"))?;
        self.next_grant(from).await;
        Ok(())
    }

    /// Stops every worker (SIGKILL, reaped).
    pub(crate) fn stop_workers(&mut self) {
        for mut w in self.workers.drain(..) {
            w.kill();
        }
    }
}

impl Drop for Nemesis<'_> {
    fn drop(&mut self) {
        self.stop_workers();
    }
}

/// Liveness bound used when the workload does not set one: three TTLs and three seconds.
pub(crate) fn default_liveness_bound(ttl: Duration) -> Duration {
    ttl * 3 + Duration::from_secs(3)
}
