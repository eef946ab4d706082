//! Many holds at once: one client takes N keys (64 tasks at a time), keeps them all with
//! the watchdog on for a while, then lets them go. What a process that locks per entity
//! (an invoice, a tenant, a file) pays per hold:
//!
//! * `bytes_per_hold` — the process's resident memory after the N grants, less before, per
//!   hold (lockcore's and the driver's bookkeeping, the allocator's rounding included);
//! * `renewal_rps` — `extend` calls per second while holding, and
//!   `renewal_rps_per_hold_rps` — those calls per hold renewed per second (1.0 while every
//!   renewal is a round trip of its own);
//! * `cpu_pct` — the process's CPU time while holding, in percent of one core;
//! * `holds_lost` — holds whose `lost()` fired.
//!
//! Opt-in (`--case scale`): its full form holds 1k, 10k and 100k keys for 60 s each with a
//! 30 s TTL (`--scale-holds`, `--scale-for` change them). The `cargo test` smoke run holds
//! 100 keys for 1.5 s.
//!
//! Memory is the resident set's growth, so a row after another in the same process reuses
//! what the allocator kept from it: for memory figures run one count per process (e.g.
//! `--scale-holds 100000`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockcore::driver::BoxError;
use lockcore::{LockBackend, LockClient, LockGuard};
use serde_json::json;

use crate::cases::Sample;
use crate::report::{self, Kind, Row};
use crate::target::{CountingBackend, Target};
use crate::Settings;

/// Tasks taking (and releasing) the keys.
const TASKS: usize = 64;

/// Whether the scale case runs: only when asked for by name (it takes minutes), and in the
/// smoke run.
pub fn runs(s: &Settings) -> bool {
    s.mode == "test" || s.cases.iter().any(|c| "scale_holds".contains(c.as_str()))
}

/// Whether the many-keys case (`scale_keys64`: 64 tasks going round 100k keys, ours
/// against the raw baselines) runs: only when asked for by name, and in the smoke run.
pub fn keys_run(s: &Settings) -> bool {
    s.mode == "test" || s.cases.iter().any(|c| "scale_keys64".contains(c.as_str()))
}

/// The keys of the many-keys case.
pub fn spread_keys(s: &Settings) -> usize {
    match s.mode {
        "test" => 1_000,
        _ => 100_000,
    }
}

/// (holds, TTL, how long they are held) of each row.
fn plan(s: &Settings) -> Vec<(usize, Duration, Duration)> {
    let (ns, ttl, hold_for): (&[usize], _, _) = match s.mode {
        "test" => (&[100], Duration::from_secs(1), Duration::from_millis(1500)),
        "quick" => (&[1_000], Duration::from_secs(3), Duration::from_secs(5)),
        _ => (
            &[1_000, 10_000, 100_000],
            Duration::from_secs(30),
            Duration::from_secs(60),
        ),
    };
    let ns = if s.scale_holds.is_empty() {
        ns
    } else {
        &s.scale_holds
    };
    let hold_for = s.scale_for.unwrap_or(hold_for);
    ns.iter().map(|&n| (n, ttl, hold_for)).collect()
}

/// The process's resident memory in bytes (Linux), if known.
pub(crate) fn rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// The process's CPU time so far (Linux, user + system), if known.
fn cpu_time() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may hold spaces) in parentheses.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // Clock ticks are 1/100 s on Linux (USER_HZ).
    Some(Duration::from_millis(ticks * 10))
}

/// The rows of the case: one per number of holds.
pub async fn rows<T: Target>(target: &T, s: &Settings, prefix: &str) -> Result<Vec<Row>, BoxError> {
    let backend = T::NAME;
    let mut rows = Vec::new();
    for (n, ttl, hold_for) in plan(s) {
        let counted = CountingBackend::new(target.backend().await?);
        let as_dyn: Arc<dyn LockBackend> = counted.clone();
        let client = LockClient::new(as_dyn);
        let ttl = ttl.max(client.capabilities().min_ttl);
        // The client's first connections before the baseline.
        let warm = format!("{prefix}:scale{n}:warm");
        client
            .lock(warm.as_str())
            .ttl(ttl)
            .acquire()
            .await?
            .release()
            .await?;
        let rss_before = rss_bytes();
        let took = Instant::now();
        let guards = take(&client, prefix, n, ttl).await?;
        let taking = took.elapsed();
        let rss_after = rss_bytes();
        counted.take_renewals();
        let (cpu0, t0) = (cpu_time(), Instant::now());
        tokio::time::sleep(hold_for).await;
        let (cpu1, held) = (cpu_time(), t0.elapsed());
        let renewals = counted.take_renewals();
        let (extends, renewed) = (renewals.requests, renewals.extended);
        let lost = guards.iter().filter(|g| g.is_lost()).count();
        let releasing = Instant::now();
        let not_released = give_back(guards).await?;
        let released = releasing.elapsed();
        client.shutdown().await;
        client.backend().shutdown().await;

        let secs = held.as_secs_f64();
        let bytes_per_hold = match (rss_before, rss_after) {
            (Some(b), Some(a)) => Some(a.saturating_sub(b) as f64 / n as f64),
            _ => None,
        };
        let cpu_pct = match (cpu0, cpu1) {
            (Some(a), Some(b)) => Some(100.0 * b.saturating_sub(a).as_secs_f64() / secs),
            _ => None,
        };
        let renewal_rps = extends as f64 / secs;
        let renewed_rps = renewed as f64 / secs;
        let per_hold_rps = if renewed > 0 {
            Some(renewal_rps / renewed_rps)
        } else {
            None
        };
        let sample = Sample {
            ops: n as u64,
            elapsed: taking,
            ..Sample::default()
        };
        let case = format!("scale_holds{n}");
        let mut got = report::group(backend, &case, Kind::Cycles, sample, Vec::new());
        let mut row = got.pop().ok_or("no row for the case")?;
        let round1 = |v: f64| (v * 10.0).round() / 10.0;
        for (k, v) in [
            ("holds", json!(n)),
            ("ttl_s", json!(ttl.as_secs_f64())),
            ("held_s", json!(round1(secs))),
            ("bytes_per_hold", json!(bytes_per_hold.map(f64::round))),
            ("renewal_rps", json!(round1(renewal_rps))),
            ("renewed_holds_per_s", json!(round1(renewed_rps))),
            (
                "renewal_rps_per_hold_rps",
                json!(per_hold_rps.map(|v| (v * 1000.0).round() / 1000.0)),
            ),
            ("cpu_pct", json!(cpu_pct.map(round1))),
            ("holds_lost", json!(lost)),
            ("renewals_not_held", json!(renewals.not_held)),
            ("renewals_failed", json!(renewals.failed)),
            (
                "slowest_renewal_ms",
                json!(round1(renewals.slowest.as_secs_f64() * 1000.0)),
            ),
            ("release_failures", json!(not_released)),
            (
                "acquire_s",
                json!((taking.as_secs_f64() * 100.0).round() / 100.0),
            ),
            (
                "release_s",
                json!((released.as_secs_f64() * 100.0).round() / 100.0),
            ),
        ] {
            row.extra.insert(k.into(), v);
        }
        let show =
            |v: Option<f64>, unit: &str| v.map_or("-".to_owned(), |v| format!("{v:.0}{unit}"));
        row.note = Some(format!(
            "{n} holds ({ttl:?} TTL) held {secs:.0} s: {} per hold · renewal requests {renewal_rps:.1}/s for {renewed_rps:.0} holds renewed/s ({} per hold renewed) · CPU {} of a core · lost {lost} (renewals answered not held {}, failed {}; slowest request {:.1?}) · failed releases {not_released} · taken in {taking:.1?}, released in {released:.1?}",
            show(bytes_per_hold, " B"),
            per_hold_rps.map_or("-".to_owned(), |v| format!("{v:.4}")),
            cpu_pct.map_or("-".to_owned(), |v| format!("{v:.1} %")),
            renewals.not_held,
            renewals.failed,
            renewals.slowest,
        ));
        if let Some(e) = &renewals.last_error {
            if let Some(note) = row.note.as_mut() {
                note.push_str(&format!(" · last renewal error: {e}"));
            }
        }
        rows.push(row);
    }
    Ok(rows)
}

/// Takes `n` keys, `TASKS` at a time.
async fn take(
    client: &LockClient,
    prefix: &str,
    n: usize,
    ttl: Duration,
) -> Result<Vec<LockGuard>, BoxError> {
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::with_capacity(TASKS);
    for _ in 0..TASKS {
        let (client, next, prefix) = (client.clone(), next.clone(), prefix.to_owned());
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                if i >= n {
                    return Ok::<_, BoxError>(mine);
                }
                let key = format!("{prefix}:scale{n}:{i}");
                mine.push(client.lock(key.as_str()).ttl(ttl).acquire().await?);
            }
        }));
    }
    let mut guards = Vec::with_capacity(n);
    for task in tasks {
        guards.extend(task.await??);
    }
    Ok(guards)
}

/// Releases every guard, `TASKS` at a time: how many releases failed (a lost hold's, or
/// the store's error).
async fn give_back(guards: Vec<LockGuard>) -> Result<u64, BoxError> {
    let per = guards.len().div_ceil(TASKS).max(1);
    let mut guards = guards.into_iter();
    let mut tasks = Vec::new();
    loop {
        let chunk: Vec<LockGuard> = guards.by_ref().take(per).collect();
        if chunk.is_empty() {
            break;
        }
        tasks.push(tokio::spawn(async move {
            let mut failed = 0;
            for g in chunk {
                if g.release().await.is_err() {
                    failed += 1;
                }
            }
            failed
        }));
    }
    let mut failed = 0;
    for task in tasks {
        failed += task.await?;
    }
    Ok(failed)
}
