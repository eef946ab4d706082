//! The nemesis: faults injected one after another, each recorded in the history, each
//! followed by a wait (bounded) for the lock to be granted again.

use std::time::Duration;

use super::event::{EventKind, Ms, WorkerId};
use super::register::Register;
use super::worker::{Spawner, WorkerProcess};
use super::{HistoryStore, Workload};
use crate::harness::FaultLink;
use crate::proxy::TcpProxy;

/// The latest a jittered fault lands after its trigger: past a hold's 1–8 ms of work, so
/// that it may land mid-write, during the release, or in the worker's next attempt.
pub(crate) const JITTER_MAX: Duration = Duration::from_millis(12);

/// The nemesis of one run and the workers it plays with.
pub(crate) struct Nemesis<'a> {
    pub(crate) register: &'a Register,
    pub(crate) spawner: &'a Spawner,
    pub(crate) workers: Vec<WorkerProcess>,
    /// Each worker's proxies to the store's endpoints, when the partition nemesis runs.
    pub(crate) proxies: Vec<(WorkerId, Vec<TcpProxy>)>,
    pub(crate) next_id: WorkerId,
    pub(crate) store: &'a dyn HistoryStore,
    pub(crate) workload: &'a Workload,
    /// Remarks for the report (a fault skipped and why).
    pub(crate) notes: Vec<String>,
}

impl Nemesis<'_> {
    /// Starts the workers.
    pub(crate) async fn spawn_workers(&mut self) -> Result<(), String> {
        for _ in 0..self.workload.workers {
            self.spawn().await?;
        }
        Ok(())
    }

    /// Starts a worker, with proxies of its own to the store when the partition nemesis
    /// runs.
    async fn spawn(&mut self) -> Result<WorkerId, String> {
        let id = self.next_id;
        self.next_id += 1;
        let endpoints = if self.workload.partition {
            self.store.endpoints()
        } else {
            Vec::new()
        };
        let mut proxies = Vec::new();
        for endpoint in endpoints {
            let proxy = TcpProxy::start(endpoint)
                .await
                .map_err(|e| format!("cannot start a proxy to {endpoint}: {e}"))?;
            proxies.push(proxy);
        }
        let address = if proxies.is_empty() {
            self.spawner.config.store.clone()
        } else {
            let via: Vec<_> = proxies.iter().map(TcpProxy::addr).collect();
            self.store.address_via(&via)
        };
        let worker = self
            .spawner
            .spawn(id, &address)
            .map_err(|e| format!("cannot start worker process: {e}"))?;
        let pid = worker.pid().unwrap_or(0);
        self.register.record(EventKind::Spawned { worker: id, pid });
        self.workers.push(worker);
        if !proxies.is_empty() {
            self.proxies.push((id, proxies));
        }
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

    /// Waits up to the liveness bound for a read the register accepted, recorded from
    /// index `from` on, and returns its worker: a holder, between its read and its write.
    async fn next_reader(&self, from: usize) -> Option<WorkerId> {
        self.register
            .wait_for(from, self.workload.liveness_bound(), |e| {
                matches!(e.kind, EventKind::Read { outcome: Ok(_), .. })
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
            if w.partition {
                self.partition(round).await?;
            }
            if w.kill {
                self.kill().await?;
            }
            if w.clock {
                self.clock_steps(round).await?;
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

    /// SIGSTOP a worker between its fenced read and write (a reader: after its read), for
    /// longer than the TTL, then SIGCONT. In
    /// rounds after the first, with jitter, the stop lands up to [`JITTER_MAX`] later: before
    /// or after the write, during the release or the next attempt.
    async fn pause(&mut self, round: usize) -> Result<(), String> {
        let Some(id) = self.next_reader(self.register.len()).await else {
            self.notes
                .push("pause skipped: no worker read the register".to_owned());
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

    /// Cuts a holder off from the store (both directions held on every connection of its
    /// own proxies, none closed) past its lease, then heals. The holder is the reader of a
    /// read the register answers with a stall of two TTLs, so that it holds on and writes
    /// late, after another worker could have been granted the key and used the register.
    /// Nothing excuses an overlap here: the holder's `lost()` must fire before the next
    /// conflicting grant, and its late write must be refused.
    async fn partition(&mut self, round: usize) -> Result<(), String> {
        if self.proxies.is_empty() {
            if round == 0 {
                self.notes.push(
                    "partition skipped: the store names no endpoints \
                     (HistoryStore::endpoints is empty)"
                        .to_owned(),
                );
            }
            return Ok(());
        }
        let from = self.register.stall_next_read(self.workload.ttl * 2);
        let holding = self.next_reader(from).await;
        self.register.clear_stall();
        let Some(id) = holding else {
            self.notes
                .push("partition skipped: no worker held the key".to_owned());
            return Ok(());
        };
        if round > 0 {
            self.jitter(&format!("round {}: the partition of w{id}", round + 1))
                .await;
        }
        let Some((_, proxies)) = self.proxies.iter().find(|(w, _)| *w == id) else {
            return Ok(());
        };
        // Recorded before the cut and after the heal: the recorded partition covers the
        // real one.
        self.register.record(EventKind::Partitioned { worker: id });
        for proxy in proxies {
            proxy.pause().await;
        }
        // The fault itself: the holder stays cut off until its lease has run out.
        tokio::time::sleep(self.workload.pause_for()).await;
        for proxy in proxies {
            proxy.resume().await;
        }
        let from = self.register.len();
        self.register.record(EventKind::Healed { worker: id });
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
        self.proxies.retain(|(w, _)| *w != id);
        let from = self.register.len();
        self.spawn().await?;
        self.next_grant(from).await;
        Ok(())
    }

    /// Steps the store's wall clock forward by ten TTLs, back to the real time, back by ten
    /// TTLs, and to the real time again, waiting for a grant after each step.
    async fn clock_steps(&mut self, round: usize) -> Result<(), String> {
        if !self.store.can_set_clock() {
            if round == 0 {
                self.notes.push(
                    "clock steps skipped: this store has no clock hook \
                     (HistoryStore::can_set_clock is false)"
                        .to_owned(),
                );
            }
            return Ok(());
        }
        let step = i64::try_from(self.workload.ttl.as_millis() * 10).unwrap_or(i64::MAX);
        for offset_ms in [step, 0, -step, 0] {
            let from = self.register.len();
            self.register.record(EventKind::ClockSet { offset_ms });
            self.store.set_clock(offset_ms).await?;
            self.next_grant(from).await;
            // A few holds at this offset before the next step.
            for _ in 0..3 {
                let from = self.register.len();
                self.next_grant(from).await;
            }
        }
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
