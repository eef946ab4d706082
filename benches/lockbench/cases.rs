//! The measured loops: each case once through `LockClient` ("ours") and once by hand
//! ("raw"), with the same keys, TTL, owners and task layout.

use std::future::Future;
use std::hint::black_box;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lockcore::driver::BoxError;
use lockcore::driver::{AcquireOutcome, LockBackendExt};
use lockcore::{LockBackend, LockClient, LockKey, Owner, ReleaseOutcome};

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
    /// Hand-off case: a hand loop of `try_acquire` + `wait_released` + `release` on the
    /// backend trait object.
    Trait,
    /// The target's raw baseline number `n`: the store's own client, by hand.
    Raw(usize),
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
    /// Operations per second of each measured slice, in round order.
    pub slices: Vec<f64>,
}

impl Sample {
    fn absorb(&mut self, other: Sample) {
        let rate = other.ops_per_sec();
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
        if other.slices.is_empty() {
            self.slices.push(rate);
        } else {
            self.slices.extend(other.slices);
        }
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

/// Runs every side of one case: a warm-up each, then `rounds` rounds of one slice per
/// side, the order rotating each round so drift on a busy machine hits all sides alike.
/// Returns one sample per side, in the order of `sides`.
pub async fn compare<F, Fut>(
    s: &Settings,
    sides: &[Side],
    mut slice: F,
) -> Result<Vec<Sample>, BoxError>
where
    F: FnMut(Side, Instant, u64) -> Fut,
    Fut: Future<Output = Result<Sample, BoxError>>,
{
    for &side in sides {
        bounded(s.warmup, slice(side, Instant::now() + s.warmup, u64::MAX)).await?;
    }
    let rounds = s.rounds.max(1);
    let per = s.measure / rounds;
    let cap = s
        .samples
        .map_or(u64::MAX, |n| n.div_ceil(u64::from(rounds)).max(1));
    let mut out: Vec<Sample> = sides.iter().map(|_| Sample::default()).collect();
    for round in 0..rounds as usize {
        for i in 0..sides.len() {
            let at = (i + round) % sides.len();
            let got = bounded(per, slice(sides[at], Instant::now() + per, cap)).await?;
            out[at].absorb(got);
        }
    }
    Ok(out)
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

/// Acquire+release cycles, one task per entry of `tasks`, each going round its own keys,
/// all on one client (or one baseline connection). Each task does at most `cap / tasks`
/// cycles and stops at `until`.
#[allow(clippy::too_many_arguments)]
pub async fn cycles<R: RawLock>(
    side: Side,
    client: &LockClient,
    raws: &[Arc<R>],
    keys: &[Vec<LockKey>],
    label: &Arc<str>,
    until: Instant,
    cap: u64,
) -> Result<Sample, BoxError> {
    let per_task = (cap / keys.len().max(1) as u64).max(1);
    // Several tasks must really interleave, also on a store whose operations never suspend
    // (memory): each task yields once per cycle, on every side alike.
    let yields = keys.len() > 1;
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(keys.len());
    for key in keys {
        if key.is_empty() {
            continue;
        }
        let key = key.clone();
        tasks.push(match side {
            Side::Ours => tokio::spawn(ours_cycles(client.clone(), key, yields, until, per_task)),
            Side::Raw(n) => {
                let raw = raws.get(n).ok_or("no such baseline")?.clone();
                let label = label.clone();
                tokio::spawn(raw_cycles(raw, key, label, yields, until, per_task))
            }
            Side::Trait => return Err("the trait-object loop only runs the hand-off case".into()),
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
    keys: Vec<LockKey>,
    yields: bool,
    until: Instant,
    cap: u64,
) -> Result<Vec<u64>, BoxError> {
    let mut lat = Vec::with_capacity(cap.min(1 << 16) as usize);
    let mut t0 = Instant::now();
    while (lat.len() as u64) < cap && t0 < until {
        let key = &keys[lat.len() % keys.len()];
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
    keys: Vec<LockKey>,
    label: Arc<str>,
    yields: bool,
    until: Instant,
    cap: u64,
) -> Result<Vec<u64>, BoxError> {
    let mut lat = Vec::with_capacity(cap.min(1 << 16) as usize);
    let mut t0 = Instant::now();
    while (lat.len() as u64) < cap && t0 < until {
        let key = &keys[lat.len() % keys.len()];
        // A fresh owner value per acquisition, as a correct hand-written lock needs too.
        let owner = Owner::new(&*label);
        if !black_box(raw.try_acquire(key, &owner, TTL).await?) {
            return Err(format!("raw: uncontended key {key} was held").into());
        }
        if !black_box(raw.release(key, &owner).await?) {
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
/// counted backend objects, or one baseline connection per client), take one key in turn
/// with zero hold time.
pub struct Handoff<'a, R> {
    /// One client per backend instance, each over the matching counted backend.
    pub clients: &'a [LockClient],
    /// The counted backend instances the clients use.
    pub backends: &'a [Arc<CountingBackend>],
    /// Per client, its own instances of the target's baselines.
    pub raws: &'a [Vec<Arc<R>>],
    /// Tasks in the race.
    pub tasks: usize,
    /// Owner label for the hand loops.
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
    /// Failed tries counted by the loop itself (baselines; the others are counted by the
    /// `CountingBackend`).
    failed: u64,
}

impl<R: RawLock> Handoff<'_, R> {
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
            let (key, last, label) = (key.clone(), last.clone(), self.label.clone());
            let pick = me % self.clients.len().max(1);
            let run = Run {
                key,
                me,
                last,
                until,
                cap: per_task,
            };
            tasks.push(match side {
                Side::Ours => tokio::spawn(ours_handoff(self.clients[pick].clone(), run)),
                Side::Trait => {
                    let backend: Arc<dyn LockBackend> = self.backends[pick].clone();
                    tokio::spawn(trait_handoff(backend, label, run))
                }
                Side::Raw(n) => {
                    let raw = self.raws[pick].get(n).ok_or("no such baseline")?.clone();
                    tokio::spawn(raw_handoff(raw, label, run))
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
            sample.failed += tally.failed;
        }
        sample.elapsed = start.elapsed();
        sample.failed += self.backends.iter().map(|b| b.take_held()).sum::<u64>();
        Ok(sample)
    }
}

/// What every hand-off task needs to know.
struct Run {
    key: LockKey,
    me: usize,
    last: LastRelease,
    until: Instant,
    cap: u64,
}

impl Run {
    /// Records a success at `t1` after a wait that began at `t0`. Called while holding the
    /// lock, so only the holder ever touches `last`.
    fn success(&self, tally: &mut TaskTally, t0: Instant, t1: Instant) {
        tally.acquisitions += 1;
        tally.wait.push(nanos(t1 - t0));
        if let Some((released_at, by)) = lock_last(&self.last).take() {
            tally
                .gap
                .push(nanos(t1.saturating_duration_since(released_at)));
            if by == self.me {
                tally.self_handoffs += 1;
            }
        }
    }

    /// Notes the start of a release; returns when it started.
    fn releasing(&self) -> Instant {
        let at = Instant::now();
        *lock_last(&self.last) = Some((at, self.me));
        at
    }

    /// Whether the task stops after a release that started at `released_at`.
    fn done(&self, tally: &TaskTally, released_at: Instant) -> bool {
        released_at >= self.until || tally.acquisitions >= self.cap
    }
}

fn lock_last(last: &LastRelease) -> std::sync::MutexGuard<'_, Option<(Instant, usize)>> {
    last.lock().unwrap_or_else(|e| e.into_inner())
}

async fn ours_handoff(client: LockClient, run: Run) -> Result<TaskTally, BoxError> {
    let mut tally = TaskTally::default();
    loop {
        let t0 = Instant::now();
        let guard = client.lock(run.key.as_str()).ttl(TTL).acquire().await?;
        run.success(&mut tally, t0, Instant::now());
        black_box(guard.token());
        let released_at = run.releasing();
        let released = guard.release().await?;
        if released != ReleaseOutcome::Released {
            return Err(format!("ours: hand-off release said {released:?}").into());
        }
        if run.done(&tally, released_at) {
            return Ok(tally);
        }
        // Zero hold, but let the other tasks run: on a store whose operations never
        // suspend (memory) the releasing task would otherwise take the lock again forever.
        tokio::task::yield_now().await;
    }
}

async fn trait_handoff(
    backend: Arc<dyn LockBackend>,
    label: Arc<str>,
    run: Run,
) -> Result<TaskTally, BoxError> {
    let key = &run.key;
    let mut tally = TaskTally::default();
    loop {
        let t0 = Instant::now();
        let owner = Owner::new(&*label);
        loop {
            match backend.try_acquire(key, &owner, TTL).await? {
                AcquireOutcome::Acquired(grant) => {
                    black_box(grant.token);
                    break;
                }
                AcquireOutcome::Held(c) => {
                    let nap = c.remaining_ttl.unwrap_or(MAX_BLIND_WAIT).min(TTL);
                    // Not a client's waiter: no place in a line (`u64::MAX`, last).
                    backend.wait_released(key, &c.hint, u64::MAX, nap).await?;
                }
            }
        }
        run.success(&mut tally, t0, Instant::now());
        let released_at = run.releasing();
        let released = backend.release(key, &owner).await?;
        if released != ReleaseOutcome::Released {
            return Err(format!("trait loop: hand-off release said {released:?}").into());
        }
        if run.done(&tally, released_at) {
            return Ok(tally);
        }
        tokio::task::yield_now().await;
    }
}

async fn raw_handoff<R: RawLock>(
    raw: Arc<R>,
    label: Arc<str>,
    run: Run,
) -> Result<TaskTally, BoxError> {
    let key = &run.key;
    let mut tally = TaskTally::default();
    loop {
        let t0 = Instant::now();
        let owner = Owner::new(&*label);
        if raw.waits_itself() {
            // Its own waiting acquire; past `TTL` (never, with zero holds) it asks again.
            loop {
                if let Some(failed) = raw.acquire_waiting(key, &owner, TTL, TTL).await? {
                    tally.failed += failed;
                    break;
                }
            }
        } else {
            while !black_box(raw.try_acquire(key, &owner, TTL).await?) {
                tally.failed += 1;
                raw.wait_released(key, TTL).await?;
            }
        }
        run.success(&mut tally, t0, Instant::now());
        let released_at = run.releasing();
        if !raw.release(key, &owner).await? {
            return Err("raw: hand-off release freed nothing".into());
        }
        if run.done(&tally, released_at) {
            return Ok(tally);
        }
        tokio::task::yield_now().await;
    }
}
