//! The measured loops: each case once through `LockClient` ("ours") and once by hand
//! ("raw"), with the same keys, TTL, owners and task layout.

use std::future::Future;
use std::hint::black_box;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lockcore::{AcquireOutcome, BoxError, LockBackend, LockClient, LockKey, Owner, ReleaseOutcome};

use crate::target::{CountingBackend, RawLock};
use crate::Settings;

/// The TTL of every lock the bench takes: long enough never to expire during a cycle, so
/// the watchdog (ttl/3) never fires in the measured loops.
pub const TTL: Duration = Duration::from_secs(10);

/// How long a waiter of the raw hand-off loop naps at most when the store does not say
/// how long the holder has left (lockcore's own blind wait is the same).
const MAX_BLIND_WAIT: Duration = Duration::from_secs(1);

/// Extra time a slice may take beyond its length before the bench calls it stalled.
const STALL: Duration = Duration::from_secs(30);

/// Which implementation a slice runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// `lockcore::LockClient`: `lock(k).acquire()` / `guard.release()`.
    Ours,
    /// The store's operations by hand.
    Raw,
}

/// What one side of a case measured, summed over its slices.
#[derive(Debug, Default)]
pub struct Sample {
    /// Completed cycles (acquisitions in the hand-off case).
    pub ops: u64,
    /// Wall time of the measured slices.
    pub elapsed: Duration,
    /// Nanoseconds per cycle; in the hand-off case, from the acquire call to success.
    pub lat: Vec<u64>,
    /// Hand-off: nanoseconds from a holder calling release to the next holder's success.
    pub gap: Vec<u64>,
    /// Hand-off: acquisitions per task, by task index.
    pub per_task: Vec<u64>,
    /// Hand-off: `try_acquire` calls answered `Held`.
    pub failed: u64,
    /// Hand-off: successions where the releasing task itself took the lock again.
    pub self_handoffs: u64,
}

impl Sample {
    fn absorb(&mut self, other: Sample) {
        self.ops += other.ops;
        self.elapsed += other.elapsed;
        self.lat.extend(other.lat);
        self.gap.extend(other.gap);
        if self.per_task.len() < other.per_task.len() {
            self.per_task.resize(other.per_task.len(), 0);
        }
        for (sum, n) in self.per_task.iter_mut().zip(other.per_task) {
            *sum += n;
        }
        self.failed += other.failed;
        self.self_handoffs += other.self_handoffs;
    }

    /// Operations per second over the measured time.
    pub fn ops_per_sec(&self) -> f64 {
        let secs = self.elapsed.as_secs_f64();
        if secs > 0.0 {
            self.ops as f64 / secs
        } else {
            0.0
        }
    }
}

/// Runs both sides of one case: a warm-up each, then `rounds` alternating slices (raw
/// first in even rounds, ours first in odd ones), so drift on a busy machine hits both
/// sides alike. Returns (ours, raw).
pub async fn compare<F, Fut>(s: &Settings, mut slice: F) -> Result<(Sample, Sample), BoxError>
where
    F: FnMut(Side, Instant, u64) -> Fut,
    Fut: Future<Output = Result<Sample, BoxError>>,
{
    for side in [Side::Raw, Side::Ours] {
        bounded(s.warmup, slice(side, Instant::now() + s.warmup, u64::MAX)).await?;
    }
    let rounds = s.rounds.max(1);
    let per = s.measure / rounds;
    let cap = s
        .samples
        .map_or(u64::MAX, |n| n.div_ceil(u64::from(rounds)).max(1));
    let (mut ours, mut raw) = (Sample::default(), Sample::default());
    for round in 0..rounds {
        let order = if round % 2 == 0 {
            [Side::Raw, Side::Ours]
        } else {
            [Side::Ours, Side::Raw]
        };
        for side in order {
            let got = bounded(per, slice(side, Instant::now() + per, cap)).await?;
            match side {
                Side::Ours => ours.absorb(got),
                Side::Raw => raw.absorb(got),
            }
        }
    }
    Ok((ours, raw))
}

async fn bounded<Fut>(len: Duration, fut: Fut) -> Result<Sample, BoxError>
where
    Fut: Future<Output = Result<Sample, BoxError>>,
{
    match tokio::time::timeout(len + STALL, fut).await {
        Ok(sample) => sample,
        Err(_) => {
            Err(format!("a slice of {len:?} did not finish within {STALL:?} more: stalled").into())
        }
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Acquire+release cycles, one task per key, all on one client (or one raw connection).
/// Each task does at most `cap / keys` cycles and stops at `until`.
#[allow(clippy::too_many_arguments)]
pub async fn cycles<R: RawLock>(
    side: Side,
    client: &LockClient,
    raw: &Arc<R>,
    keys: &[LockKey],
    label: &Arc<str>,
    until: Instant,
    cap: u64,
) -> Result<Sample, BoxError> {
    let per_task = (cap / keys.len().max(1) as u64).max(1);
    // Several tasks must really interleave, also on a store whose operations never suspend
    // (memory): each task yields once per cycle, on both sides alike.
    let yields = keys.len() > 1;
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(keys.len());
    for key in keys {
        let key = key.clone();
        tasks.push(match side {
            Side::Ours => tokio::spawn(ours_cycles(client.clone(), key, yields, until, per_task)),
            Side::Raw => {
                let label = label.clone();
                tokio::spawn(raw_cycles(raw.clone(), key, label, yields, until, per_task))
            }
        });
    }
    let mut sample = Sample::default();
    for task in tasks {
        let lat = task.await??;
        sample.ops += lat.len() as u64;
        sample.lat.extend(lat);
    }
    sample.elapsed = start.elapsed();
    Ok(sample)
}

async fn ours_cycles(
    client: LockClient,
    key: LockKey,
    yields: bool,
    until: Instant,
    cap: u64,
) -> Result<Vec<u64>, BoxError> {
    let mut lat = Vec::with_capacity(cap.min(1 << 16) as usize);
    let mut t0 = Instant::now();
    while (lat.len() as u64) < cap && t0 < until {
        // The public API takes the name as a string and validates it on every request.
        let guard = client.lock(key.as_str()).ttl(TTL).acquire().await?;
        black_box(guard.token());
        let released = guard.release().await?;
        if released != ReleaseOutcome::Released {
            return Err(format!("ours: release of an uncontended lock said {released:?}").into());
        }
        if yields {
            tokio::task::yield_now().await;
        }
        let t1 = Instant::now();
        lat.push(nanos(t1 - t0));
        t0 = t1;
    }
    Ok(lat)
}

async fn raw_cycles<R: RawLock>(
    raw: Arc<R>,
    key: LockKey,
    label: Arc<str>,
    yields: bool,
    until: Instant,
    cap: u64,
) -> Result<Vec<u64>, BoxError> {
    let mut lat = Vec::with_capacity(cap.min(1 << 16) as usize);
    let mut t0 = Instant::now();
    while (lat.len() as u64) < cap && t0 < until {
        // A fresh owner value per acquisition, as a correct hand-written lock needs too.
        let owner = Owner::new(&*label);
        if !black_box(raw.try_acquire(&key, &owner, TTL).await?) {
            return Err(format!("raw: uncontended key {key} was held").into());
        }
        if !black_box(raw.release(&key, &owner).await?) {
            return Err(format!("raw: release of uncontended key {key} freed nothing").into());
        }
        if yields {
            tokio::task::yield_now().await;
        }
        let t1 = Instant::now();
        lat.push(nanos(t1 - t0));
        t0 = t1;
    }
    Ok(lat)
}

/// The contended hand-off: `tasks` tasks, spread round-robin over the clients (or their
/// counted backend objects, for the raw side), take one key in turn with zero hold time.
pub struct Handoff<'a> {
    /// One client per backend instance, each over the matching counted backend.
    pub clients: &'a [LockClient],
    /// The counted backend instances the clients use.
    pub backends: &'a [Arc<CountingBackend>],
    /// Tasks in the race.
    pub tasks: usize,
    /// Owner label for the raw side.
    pub label: Arc<str>,
}

/// Who released last, and when they called release; taken by the next holder.
type LastRelease = Arc<Mutex<Option<(Instant, usize)>>>;

#[derive(Default)]
struct TaskTally {
    acquisitions: u64,
    wait: Vec<u64>,
    gap: Vec<u64>,
    self_handoffs: u64,
}

impl Handoff<'_> {
    /// One slice on `key`.
    pub async fn slice(
        &self,
        side: Side,
        key: &LockKey,
        until: Instant,
        cap: u64,
    ) -> Result<Sample, BoxError> {
        for b in self.backends {
            b.take_held();
        }
        let last: LastRelease = Arc::new(Mutex::new(None));
        let per_task = (cap / self.tasks.max(1) as u64).max(1);
        let start = Instant::now();
        let mut tasks = Vec::with_capacity(self.tasks);
        for me in 0..self.tasks {
            let (key, last) = (key.clone(), last.clone());
            let pick = me % self.clients.len().max(1);
            tasks.push(match side {
                Side::Ours => tokio::spawn(ours_handoff(
                    self.clients[pick].clone(),
                    key,
                    me,
                    last,
                    until,
                    per_task,
                )),
                Side::Raw => {
                    let backend: Arc<dyn LockBackend> = self.backends[pick].clone();
                    tokio::spawn(raw_handoff(
                        backend,
                        key,
                        self.label.clone(),
                        me,
                        last,
                        until,
                        per_task,
                    ))
                }
            });
        }
        let mut sample = Sample::default();
        for task in tasks {
            let tally = task.await??;
            sample.ops += tally.acquisitions;
            sample.per_task.push(tally.acquisitions);
            sample.lat.extend(tally.wait);
            sample.gap.extend(tally.gap);
            sample.self_handoffs += tally.self_handoffs;
        }
        sample.elapsed = start.elapsed();
        sample.failed = self.backends.iter().map(|b| b.take_held()).sum();
        Ok(sample)
    }
}

fn lock_last(last: &LastRelease) -> std::sync::MutexGuard<'_, Option<(Instant, usize)>> {
    last.lock().unwrap_or_else(|e| e.into_inner())
}

/// Records a success at `t1` after a wait that began at `t0`. Called while holding the
/// lock, so only the holder ever touches `last`.
fn record_success(tally: &mut TaskTally, last: &LastRelease, me: usize, t0: Instant, t1: Instant) {
    tally.acquisitions += 1;
    tally.wait.push(nanos(t1 - t0));
    if let Some((released_at, by)) = lock_last(last).take() {
        tally
            .gap
            .push(nanos(t1.saturating_duration_since(released_at)));
        if by == me {
            tally.self_handoffs += 1;
        }
    }
}

async fn ours_handoff(
    client: LockClient,
    key: LockKey,
    me: usize,
    last: LastRelease,
    until: Instant,
    cap: u64,
) -> Result<TaskTally, BoxError> {
    let mut tally = TaskTally::default();
    loop {
        let t0 = Instant::now();
        let guard = client.lock(key.as_str()).ttl(TTL).acquire().await?;
        record_success(&mut tally, &last, me, t0, Instant::now());
        black_box(guard.token());
        let releasing = Instant::now();
        *lock_last(&last) = Some((releasing, me));
        let released = guard.release().await?;
        if released != ReleaseOutcome::Released {
            return Err(format!("ours: hand-off release said {released:?}").into());
        }
        if releasing >= until || tally.acquisitions >= cap {
            return Ok(tally);
        }
        // Zero hold, but let the other tasks run: on a store whose operations never
        // suspend (memory) the releasing task would otherwise take the lock again forever.
        tokio::task::yield_now().await;
    }
}

async fn raw_handoff(
    backend: Arc<dyn LockBackend>,
    key: LockKey,
    label: Arc<str>,
    me: usize,
    last: LastRelease,
    until: Instant,
    cap: u64,
) -> Result<TaskTally, BoxError> {
    let mut tally = TaskTally::default();
    loop {
        let t0 = Instant::now();
        let owner = Owner::new(&*label);
        loop {
            match backend.try_acquire(&key, &owner, TTL).await? {
                AcquireOutcome::Acquired(grant) => {
                    black_box(grant.token);
                    break;
                }
                AcquireOutcome::Held(c) => {
                    let nap = c.remaining_ttl.unwrap_or(MAX_BLIND_WAIT).min(TTL);
                    backend.wait_released(&key, &c.hint, nap).await?;
                }
            }
        }
        record_success(&mut tally, &last, me, t0, Instant::now());
        let releasing = Instant::now();
        *lock_last(&last) = Some((releasing, me));
        let released = backend.release(&key, &owner).await?;
        if released != ReleaseOutcome::Released {
            return Err(format!("raw: hand-off release said {released:?}").into());
        }
        if releasing >= until || tally.acquisitions >= cap {
            return Ok(tally);
        }
        // Zero hold, but let the other tasks run: on a store whose operations never
        // suspend (memory) the releasing task would otherwise take the lock again forever.
        tokio::task::yield_now().await;
    }
}
