//! Shared claims: the shared and permit cycles against the exclusive one on the same
//! backend, a semaphore under more demand than supply, and a writer among overlapping
//! readers. Run for every backend that declares shared claims (and semaphores).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lockcore::driver::BoxError;
use lockcore::{LockClient, LockKey, ReleaseOutcome};
use serde_json::json;

use crate::cases::{self, Sample, Side, TTL};
use crate::report::{self, Kind, Row};
use crate::Settings;

/// Tasks, clients and permits of the semaphore case.
const SEM_TASKS: usize = 16;
const SEM_CLIENTS: usize = 2;
const SEM_PERMITS: u32 = 4;
/// How long a semaphore holder keeps its permit.
const SEM_HOLD: Duration = Duration::from_millis(5);
/// Reader tasks of the readers/writer case, their hold, and the writer's hold and pause.
const READERS: usize = 6;
const READER_HOLD: Duration = Duration::from_millis(20);
const WRITER_HOLD: Duration = Duration::from_millis(2);
const WRITER_PAUSE: Duration = Duration::from_millis(30);

/// The claim a cycle takes.
#[derive(Clone, Copy)]
enum Mode {
    Exclusive,
    Shared,
    Permit,
}

fn mode_of(side: Side) -> Mode {
    match side {
        Side::Raw(0) => Mode::Exclusive,
        Side::Raw(_) => Mode::Permit,
        _ => Mode::Shared,
    }
}

/// Every shared-claim case the backend can run, as rows.
pub async fn rows(
    backend: &'static str,
    s: &Settings,
    clients: &[LockClient],
    prefix: &str,
) -> Result<Vec<Row>, BoxError> {
    let Some(client) = clients.first() else {
        return Ok(Vec::new());
    };
    let caps = client.capabilities();
    let mut rows = Vec::new();
    if !caps.shared {
        return Ok(rows);
    }
    if s.runs("shared_uncontended") {
        // Ours = shared; the primary "baseline" is the exclusive cycle on the same client,
        // so `ratio` is shared ÷ exclusive throughput; then one permit of a semaphore.
        let mut sides = vec![Side::Ours, Side::Raw(0)];
        if caps.semaphores {
            sides.push(Side::Raw(1));
        }
        let mut slice_no = 0u32;
        let got = cases::compare(s, &sides, |side, until, cap| {
            slice_no += 1;
            let key = LockKey::new(format!("{prefix}:su:{slice_no}"));
            let client = client.clone();
            async move { cycles(&client, &key?, mode_of(side), until, cap).await }
        })
        .await
        .map_err(|e| format!("{backend}/shared_uncontended: {e}"))?;
        let mut got = got.into_iter();
        let ours = got.next().unwrap_or_default();
        let names = ["shared_uncontended_exclusive", "shared_uncontended_permit"];
        let baselines = names.iter().map(|n| n.to_string()).zip(got).collect();
        rows.extend(report::group(
            backend,
            "shared_uncontended",
            Kind::Cycles,
            ours,
            baselines,
        ));
    }
    if caps.semaphores && s.runs("semaphore16x4") {
        let key = LockKey::new(format!("{prefix}:sem"))?;
        let measured = semaphore(clients, &key, s.measure).await?;
        rows.extend(annotated(backend, "semaphore16x4", measured));
    }
    if s.runs("readers_writer") {
        let key = LockKey::new(format!("{prefix}:rw"))?;
        let measured = readers_writer(clients, &key, s.measure).await?;
        rows.extend(annotated(backend, "readers_writer", measured));
    }
    Ok(rows)
}

/// The row of a case without a baseline, with its own fields and second line.
fn annotated(
    backend: &'static str,
    case: &str,
    (sample, extra, note): (Sample, Extra, String),
) -> Vec<Row> {
    // Both cases measure waits: for a permit, for the writer's turn.
    let mut rows = report::group(backend, case, Kind::Waits, sample, Vec::new());
    if let Some(row) = rows.last_mut() {
        row.extra.extend(extra);
        row.note = Some(note);
    }
    rows
}

/// Acquire+release cycles of one claim on one key, one task.
async fn cycles(
    client: &LockClient,
    key: &LockKey,
    mode: Mode,
    until: Instant,
    cap: u64,
) -> Result<Sample, BoxError> {
    let mut sample = Sample::default();
    let start = Instant::now();
    let mut t0 = start;
    while sample.ops < cap && t0 < until {
        let request = match mode {
            Mode::Exclusive => client.lock(key.as_str()),
            Mode::Shared => client.lock(key.as_str()).shared(),
            Mode::Permit => client.semaphore(key.as_str(), SEM_PERMITS),
        };
        let guard = request.ttl(TTL).acquire().await?;
        std::hint::black_box(guard.token());
        let released = guard.release().await?;
        if released != ReleaseOutcome::Released {
            return Err(format!("release of an uncontended claim said {released:?}").into());
        }
        let t1 = Instant::now();
        sample
            .lat
            .push(u64::try_from((t1 - t0).as_nanos()).unwrap_or(u64::MAX));
        sample.ops += 1;
        t0 = t1;
    }
    sample.elapsed = start.elapsed();
    Ok(sample)
}

/// Permits in use, integrated over time.
#[derive(Default)]
struct Occupancy {
    in_use: u64,
    most: u64,
    since: Option<Instant>,
    /// Permit-nanoseconds.
    integral: f64,
}

impl Occupancy {
    fn change(&mut self, by: i64) {
        let now = Instant::now();
        if let Some(since) = self.since {
            self.integral += self.in_use as f64 * (now - since).as_nanos() as f64;
        }
        self.since = Some(now);
        self.in_use = self.in_use.saturating_add_signed(by);
        self.most = self.most.max(self.in_use);
    }
}

type Extra = serde_json::Map<String, serde_json::Value>;

/// 16 tasks over 2 clients want one of 4 permits, hold it 5 ms, and ask again at once:
/// demand always exceeds supply. Reports the time-weighted share of permits in use, the
/// most ever out, and acquisitions per task.
///
/// Two clocks per hold, because the store's view can only be bracketed from the client:
/// * *in use* (the occupancy share) runs from the grant's answer to the release's answer —
///   a permit is in use until the store says it is free again. The grant was applied up to
///   one answer trip before its answer, the release up to one answer trip before its
///   answer, so the two ends are off by about the same amount in the same direction. What
///   counts as idle is the hand-off itself: the freed permit's wake-up and the next claim.
/// * *out at once* (the capacity check) runs from the grant's answer to the moment the
///   release is sent, which lies inside the store's hold: more than 4 there is a real
///   violation, never an artefact of answer latency.
async fn semaphore(
    clients: &[LockClient],
    key: &LockKey,
    length: Duration,
) -> Result<(Sample, Extra, String), BoxError> {
    let occupancy = Arc::new(Mutex::new(Occupancy::default()));
    let out = Arc::new(Mutex::new(Occupancy::default()));
    let start = Instant::now();
    let until = start + length.max(Duration::from_millis(500));
    let mut tasks = Vec::new();
    for i in 0..SEM_TASKS {
        let client = clients[i % SEM_CLIENTS.min(clients.len())].clone();
        let (key, occupancy, out) = (key.clone(), occupancy.clone(), out.clone());
        tasks.push(tokio::spawn(async move {
            let mut waits = Vec::new();
            while Instant::now() < until {
                let t0 = Instant::now();
                let guard = client
                    .semaphore(key.as_str(), SEM_PERMITS)
                    .ttl(TTL)
                    .acquire()
                    .await?;
                waits.push(u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX));
                lock(&occupancy).change(1);
                lock(&out).change(1);
                tokio::time::sleep(SEM_HOLD).await;
                lock(&out).change(-1);
                guard.release().await?;
                lock(&occupancy).change(-1);
            }
            Ok::<_, BoxError>(waits)
        }));
    }
    let mut sample = Sample::default();
    let mut per_task = Vec::new();
    for task in tasks {
        let waits = task.await??;
        per_task.push(waits.len() as u64);
        sample.ops += waits.len() as u64;
        sample.lat.extend(waits);
    }
    let occ = lock(&occupancy);
    let most = lock(&out).most;
    // Measured up to the last release (tasks stop asking after `until`).
    let span = occ.since.map_or(start.elapsed(), |t| t - start);
    sample.elapsed = span;
    let used = occ.integral / (f64::from(SEM_PERMITS) * span.as_nanos() as f64);
    let (min, max) = (
        per_task.iter().copied().min().unwrap_or(0),
        per_task.iter().copied().max().unwrap_or(0),
    );
    let mut extra = Extra::new();
    extra.insert("permits".into(), json!(SEM_PERMITS));
    extra.insert("tasks".into(), json!(SEM_TASKS));
    extra.insert("hold_ms".into(), json!(SEM_HOLD.as_millis() as u64));
    extra.insert(
        "permits_in_use_pct".into(),
        json!((used * 1000.0).round() / 10.0),
    );
    extra.insert("most_permits_out".into(), json!(most));
    extra.insert("acquisitions_per_task_min".into(), json!(min));
    extra.insert("acquisitions_per_task_max".into(), json!(max));
    let note = format!(
        "permits in use {:.1}% of the time · most out at once {} of {SEM_PERMITS} · per task min/max {min}/{max}",
        used * 100.0,
        most
    );
    Ok((sample, extra, note))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Six reader tasks over the clients keep the key read-held without a gap (each holds
/// 20 ms and asks again at once); one writer asks for it every 30 ms and holds it 2 ms.
/// Reports the writer's waits against the longest reader hold it can find.
async fn readers_writer(
    clients: &[LockClient],
    key: &LockKey,
    length: Duration,
) -> Result<(Sample, Extra, String), BoxError> {
    let start = Instant::now();
    let until = start + length.max(Duration::from_millis(500));
    let reads = Arc::new(AtomicU64::new(0));
    let mut readers = Vec::new();
    for i in 0..READERS {
        let client = clients[i % clients.len()].clone();
        let (key, reads) = (key.clone(), reads.clone());
        readers.push(tokio::spawn(async move {
            while Instant::now() < until {
                let guard = client
                    .lock(key.as_str())
                    .shared()
                    .ttl(TTL)
                    .acquire()
                    .await?;
                reads.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(READER_HOLD).await;
                guard.release().await?;
            }
            Ok::<_, BoxError>(())
        }));
    }
    let writer = clients[clients.len() - 1].clone();
    let mut sample = Sample::default();
    tokio::time::sleep(READER_HOLD).await;
    while Instant::now() < until {
        let t0 = Instant::now();
        let guard = writer.lock(key.as_str()).ttl(TTL).acquire().await?;
        sample
            .lat
            .push(u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX));
        sample.ops += 1;
        tokio::time::sleep(WRITER_HOLD).await;
        guard.release().await?;
        tokio::time::sleep(WRITER_PAUSE).await;
    }
    for r in readers {
        r.await??;
    }
    sample.elapsed = start.elapsed();
    let most = sample.lat.iter().copied().max().unwrap_or(0) as f64 / 1e6;
    let mut sorted = sample.lat.clone();
    let p = report::Percentiles::of(&mut sorted);
    let reads = reads.load(Ordering::Relaxed);
    let mut extra = Extra::new();
    extra.insert(
        "reader_hold_ms".into(),
        json!(READER_HOLD.as_millis() as u64),
    );
    extra.insert(
        "writer_wait_p50_ms".into(),
        json!((p.p50 / 10.0).round() / 100.0),
    );
    extra.insert(
        "writer_wait_p99_ms".into(),
        json!((p.p99 / 10.0).round() / 100.0),
    );
    extra.insert(
        "writer_wait_max_ms".into(),
        json!((most * 100.0).round() / 100.0),
    );
    extra.insert("writes".into(), json!(sample.ops));
    extra.insert("reads".into(), json!(reads));
    let note = format!(
        "writer wait p50/p99/max {:.1}/{:.1}/{most:.1} ms against reader holds of {} ms · {} writes, {reads} reads",
        p.p50 / 1000.0,
        p.p99 / 1000.0,
        READER_HOLD.as_millis(),
        sample.ops
    );
    Ok((sample, extra, note))
}
