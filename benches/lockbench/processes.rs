//! Hand-off between processes: `PROCESSES` copies of this binary (started as workers)
//! share one key, each taking it, holding it a fixed time, releasing it and asking again at
//! once, as services sharing a lock do. Tasks of one process cannot show this: the client's
//! own line orders them, while between processes only the store (and how fast each
//! process learns of a release) decides who is next.
//!
//! Each worker opens the backend by URL (`distlock::connect_backend`), as a user's process
//! would. The URL goes to it on stdin, never on its command line or in its environment, so
//! a password in it shows in no process listing. The worker says `ready` once connected
//! (and warmed up on a key of its own), measures from the parent's `go`, and answers with
//! one JSON line: every grant as (asked, granted, released) in wall-clock nanoseconds, and
//! its missed deadlines. Wall clock because the grants of different processes are compared.
//!
//! Figures: acquisitions per process (min/max), the wait from asking to holding
//! (p50/p99/p99.9, and the longest in holds), deadline misses at a `wait` of
//! `10 × PROCESSES` holds, and *bypasses*: how many grants went to other processes while
//! one waited. A FIFO lock bounds bypasses by `PROCESSES - 1`; an unfair one does not.
//! What a wait is made of: the holds as they really lasted (grant to the release's answer:
//! the timer's rounding and the release's round trip on top of the nominal hold), and the
//! *hand-off gap* from one holder's release answer to the next grant (the wake-up and the
//! next holder's attempt). A FIFO waiter behind `k` others waits about `k × (hold + gap)`.

use std::io::{BufRead, Write as _};
use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use lockcore::driver::BoxError;
use lockcore::{LockClient, LockError};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use crate::cases::{Sample, TTL};
use crate::report::{self, Kind, Row};
use crate::Settings;

/// The command-line flag that makes this binary a worker.
pub const WORKER_FLAG: &str = "--process-worker";

/// Worker processes of the case (fewer in the `cargo test` smoke run).
const PROCESSES: usize = 8;
const SMOKE_PROCESSES: usize = 3;
/// How long a worker holds the lock each time.
const HOLD: Duration = Duration::from_millis(5);
/// How long a worker may take to connect and warm up.
const READY_WITHIN: Duration = Duration::from_secs(60);
/// How long past the measured time a worker may take to answer.
const ANSWER_WITHIN: Duration = Duration::from_secs(60);

/// The case's name (runs compare by it; it contains `process`).
pub fn case_name(s: &Settings) -> String {
    format!("processes{}", processes(s))
}

fn processes(s: &Settings) -> usize {
    if s.mode == "test" {
        SMOKE_PROCESSES
    } else {
        PROCESSES
    }
}

/// What the parent sends a worker on its first stdin line (as JSON).
struct Plan {
    url: String,
    key: String,
    hold: Duration,
    wait: Duration,
    warmup: Duration,
    measure: Duration,
}

impl Plan {
    fn to_json(&self) -> String {
        let us = |d: Duration| d.as_micros() as u64;
        json!({
            "url": self.url,
            "key": self.key,
            "hold_us": us(self.hold),
            "wait_us": us(self.wait),
            "warmup_us": us(self.warmup),
            "measure_us": us(self.measure),
        })
        .to_string()
    }

    fn from_json(line: &str) -> Result<Self, BoxError> {
        let v: Value = serde_json::from_str(line)?;
        let text = |k: &str| -> Result<String, BoxError> {
            Ok(v[k].as_str().ok_or(format!("plan without {k}"))?.to_owned())
        };
        let us = |k: &str| -> Result<Duration, BoxError> {
            Ok(Duration::from_micros(
                v[k].as_u64().ok_or(format!("plan without {k}"))?,
            ))
        };
        Ok(Plan {
            url: text("url")?,
            key: text("key")?,
            hold: us("hold_us")?,
            wait: us("wait_us")?,
            warmup: us("warmup_us")?,
            measure: us("measure_us")?,
        })
    }
}

/// A worker's answer.
#[derive(Default)]
struct Answer {
    /// (asked, granted, released), wall-clock nanoseconds, of every measured grant.
    grants: Vec<(u64, u64, u64)>,
    /// Acquires that reached their `wait` deadline.
    misses: u64,
    /// Acquires (or releases) that failed otherwise: the store's error at the deadline.
    errors: u64,
}

impl Answer {
    fn to_json(&self) -> String {
        json!({ "grants": self.grants, "misses": self.misses, "errors": self.errors }).to_string()
    }

    fn from_json(line: &str) -> Result<Self, BoxError> {
        let v: Value = serde_json::from_str(line)?;
        let grants = v["grants"]
            .as_array()
            .ok_or("an answer without grants")?
            .iter()
            .map(|g| match (g[0].as_u64(), g[1].as_u64(), g[2].as_u64()) {
                (Some(asked), Some(granted), Some(released)) => Ok((asked, granted, released)),
                _ => Err(format!("not a grant: {g}")),
            })
            .collect::<Result<_, _>>()?;
        let misses = v["misses"].as_u64().ok_or("an answer without misses")?;
        let errors = v["errors"].as_u64().ok_or("an answer without errors")?;
        Ok(Answer {
            grants,
            misses,
            errors,
        })
    }
}

fn wall_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

// ---- The worker ----

/// The worker's `main`: reads its plan from stdin, runs it, prints its answer.
pub fn worker_main() -> std::process::ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("lockbench worker: cannot start the tokio runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(worker()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lockbench worker {}: {e}", std::process::id());
            std::process::ExitCode::FAILURE
        }
    }
}

/// One line of stdin (blocking: the worker has nothing else to do meanwhile).
fn read_line() -> Result<String, BoxError> {
    let mut line = String::new();
    if std::io::stdin().lock().read_line(&mut line)? == 0 {
        return Err("stdin closed before the parent said what to do".into());
    }
    Ok(line.trim_end().to_owned())
}

fn say(line: &str) -> Result<(), BoxError> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")?;
    out.flush()?;
    Ok(())
}

async fn worker() -> Result<(), BoxError> {
    let plan = Plan::from_json(&read_line()?)?;
    let backend = distlock::connect_backend(&plan.url).await?;
    let client = LockClient::new(backend);
    let (key, hold, wait) = (plan.key.as_str(), plan.hold, plan.wait);
    // Connections open and statements prepared before anyone measures.
    let own = format!("{key}:warm:{}", std::process::id());
    for _ in 0..3 {
        client
            .lock(&own)
            .ttl(TTL)
            .acquire()
            .await?
            .release()
            .await?;
    }
    say("ready")?;
    if tokio::task::spawn_blocking(read_line).await?? != "go" {
        return Err("expected go".into());
    }
    let started = Instant::now();
    let (measure_from, end) = (started + plan.warmup, started + plan.warmup + plan.measure);
    let mut answer = Answer::default();
    while Instant::now() < end {
        let (asked_at, asked) = (Instant::now(), wall_ns());
        match client.lock(key).ttl(TTL).wait(wait).acquire().await {
            Ok(guard) => {
                let granted = wall_ns();
                tokio::time::sleep(hold).await;
                let released = guard.release().await;
                if asked_at >= measure_from {
                    answer.grants.push((asked, granted, wall_ns()));
                }
                if let Err(e) = released {
                    failed(&mut answer, &e);
                }
            }
            Err(LockError::Timeout { .. }) => {
                if asked_at >= measure_from {
                    answer.misses += 1;
                }
            }
            // A store error that outlasted the deadline's retries is counted and shown,
            // not fatal: the figures say how often it happened.
            Err(e) => failed(&mut answer, &e),
        }
    }
    client.shutdown().await;
    client.backend().shutdown().await;
    say(&answer.to_json())
}

/// Counts a failed operation, and shows the first one.
fn failed(answer: &mut Answer, e: &LockError) {
    if answer.errors == 0 {
        eprintln!(
            "lockbench worker {}: {}",
            std::process::id(),
            lockcore::ErrorChain(e)
        );
    }
    answer.errors += 1;
}

// ---- The parent ----

/// One worker process and its pipes.
struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: tokio::io::Lines<BufReader<ChildStdout>>,
}

impl Worker {
    fn spawn() -> Result<Self, BoxError> {
        let mut child = Command::new(std::env::current_exe()?)
            .arg(WORKER_FLAG)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err("a worker's pipes were not opened".into());
        };
        Ok(Worker {
            child,
            stdin,
            stdout: BufReader::new(stdout).lines(),
        })
    }

    async fn send(&mut self, line: &str) -> Result<(), BoxError> {
        self.stdin.write_all(format!("{line}\n").as_bytes()).await?;
        self.stdin.flush().await?;
        Ok(())
    }

    /// The worker's next line, within `within`.
    async fn line(&mut self, within: Duration, what: &str) -> Result<String, BoxError> {
        match tokio::time::timeout(within, self.stdout.next_line()).await {
            Ok(Ok(Some(line))) => Ok(line),
            Ok(Ok(None)) => {
                let status = self.child.wait().await?;
                Err(format!("a worker ended ({status}) before it said {what}").into())
            }
            Ok(Err(e)) => Err(e.into()),
            Err(_) => Err(format!("a worker did not say {what} within {within:?}").into()),
        }
    }
}

/// Runs the case on the backend at `url` (its key under `prefix`): one row.
pub async fn rows(
    backend: &'static str,
    s: &Settings,
    url: &str,
    prefix: &str,
) -> Result<Vec<Row>, BoxError> {
    let n = processes(s);
    let wait = HOLD * 10 * n as u32;
    let plan_line = Plan {
        url: url.to_owned(),
        key: format!("{prefix}:processes"),
        hold: HOLD,
        wait,
        warmup: s.warmup,
        measure: s.measure,
    }
    .to_json();
    let mut workers = (0..n)
        .map(|_| Worker::spawn())
        .collect::<Result<Vec<_>, _>>()?;
    for w in &mut workers {
        w.send(&plan_line).await?;
    }
    for w in &mut workers {
        let said = w.line(READY_WITHIN, "ready").await?;
        if said != "ready" {
            return Err(format!("a worker said {said:?} instead of ready").into());
        }
    }
    for w in &mut workers {
        w.send("go").await?;
    }
    let within = s.warmup + s.measure + wait + ANSWER_WITHIN;
    let mut answers = Vec::with_capacity(n);
    for w in &mut workers {
        let line = w.line(within, "its answer").await?;
        answers.push(Answer::from_json(&line)?);
        let status = w.child.wait().await?;
        if !status.success() {
            return Err(format!("a worker ended with {status}").into());
        }
    }
    Ok(vec![row(backend, case_name(s), s.measure, wait, &answers)?])
}

/// Grants that went to others while each grant's process waited: for grants sorted by
/// the instant they were granted, those granted after a grant was asked for and before it
/// was granted (a process asks again only after its previous grant, so none is its own).
fn bypasses(grants: &[(u64, u64)]) -> Vec<u64> {
    let mut by_grant: Vec<(u64, u64)> = grants.to_vec();
    by_grant.sort_unstable_by_key(|&(_, granted)| granted);
    let granted: Vec<u64> = by_grant.iter().map(|&(_, g)| g).collect();
    by_grant
        .iter()
        .enumerate()
        .map(|(i, &(asked, _))| {
            let first_after_ask = granted.partition_point(|&g| g <= asked);
            i.saturating_sub(first_after_ask) as u64
        })
        .collect()
}

/// The hand-off gaps: for grants in the order granted, from the previous holder's release
/// answer to this grant (zero when the grant came first: the store freed the key before
/// the release's answer arrived).
fn handoff_gaps(answers: &[Answer]) -> Vec<u64> {
    let mut grants: Vec<(u64, u64)> = answers
        .iter()
        .flat_map(|a| a.grants.iter().map(|&(_, g, r)| (g, r)))
        .collect();
    grants.sort_unstable();
    grants
        .windows(2)
        .map(|w| w[1].0.saturating_sub(w[0].1))
        .collect()
}

/// The nearest-rank `q` quantile of `sorted`.
fn quantile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn row(
    backend: &'static str,
    case: String,
    measure: Duration,
    wait: Duration,
    answers: &[Answer],
) -> Result<Row, BoxError> {
    let per_process: Vec<u64> = answers.iter().map(|a| a.grants.len() as u64).collect();
    let all: Vec<(u64, u64)> = answers
        .iter()
        .flat_map(|a| a.grants.iter().map(|&(asked, granted, _)| (asked, granted)))
        .collect();
    let mut held: Vec<u64> = answers
        .iter()
        .flat_map(|a| a.grants.iter().map(|&(_, g, r)| r.saturating_sub(g)))
        .collect();
    held.sort_unstable();
    let mut gaps = handoff_gaps(answers);
    gaps.sort_unstable();
    let us = |ns: u64| ns / 1000;
    let misses: u64 = answers.iter().map(|a| a.misses).sum();
    let errors: u64 = answers.iter().map(|a| a.errors).sum();
    let mut waits: Vec<u64> = all.iter().map(|&(a, g)| g.saturating_sub(a)).collect();
    let longest = waits.iter().copied().max().unwrap_or(0);
    let mut passed = bypasses(&all);
    passed.sort_unstable();
    let (bypass_p50, bypass_p99) = (quantile(&passed, 0.5), quantile(&passed, 0.99));
    let bypass_max = passed.last().copied().unwrap_or(0);
    let sample = Sample {
        ops: all.len() as u64,
        elapsed: measure,
        lat: std::mem::take(&mut waits),
        ..Sample::default()
    };
    let mut rows = report::group(backend, &case, Kind::Waits, sample, Vec::new());
    let mut row = rows.pop().ok_or("no row for the case")?;
    let (min, max) = (
        per_process.iter().copied().min().unwrap_or(0),
        per_process.iter().copied().max().unwrap_or(0),
    );
    let spread = if max > 0 {
        min as f64 / max as f64
    } else {
        0.0
    };
    let holds = longest as f64 / HOLD.as_nanos() as f64;
    for (k, v) in [
        ("processes", json!(answers.len())),
        ("hold_ms", json!(HOLD.as_secs_f64() * 1e3)),
        ("wait_deadline_ms", json!(wait.as_secs_f64() * 1e3)),
        ("acquisitions_per_process", json!(per_process)),
        ("acquisitions_per_process_min", json!(min)),
        ("acquisitions_per_process_max", json!(max)),
        (
            "acquisitions_min_over_max",
            json!((spread * 1000.0).round() / 1000.0),
        ),
        ("wait_p50_us", json!(row.lat.p50)),
        ("wait_p99_us", json!(row.lat.p99)),
        ("wait_p999_us", json!(row.lat.p999)),
        ("wait_max_us", json!(longest / 1000)),
        ("wait_max_holds", json!((holds * 10.0).round() / 10.0)),
        ("hold_actual_p50_us", json!(us(quantile(&held, 0.5)))),
        ("hold_actual_p99_us", json!(us(quantile(&held, 0.99)))),
        ("handoff_gap_p50_us", json!(us(quantile(&gaps, 0.5)))),
        ("handoff_gap_p99_us", json!(us(quantile(&gaps, 0.99)))),
        ("handoff_gap_p999_us", json!(us(quantile(&gaps, 0.999)))),
        ("bypass_p50", json!(bypass_p50)),
        ("bypass_p99", json!(bypass_p99)),
        ("bypass_max", json!(bypass_max)),
        ("deadline_misses", json!(misses)),
        ("errors", json!(errors)),
    ] {
        row.extra.insert(k.into(), v);
    }
    row.note = Some(format!(
        "{} processes, {} ms holds (as held p50 {:.2} ms) · per process min/max {min}/{max} ({spread:.2}) · longest wait {:.1} ms = {holds:.1} holds · hand-off gap p50/p99/p99.9 {:.2}/{:.2}/{:.2} ms · grants to others while waiting p50/p99/max {bypass_p50}/{bypass_p99}/{bypass_max} · deadline misses {misses} (wait {wait:?}) · errors {errors}",
        answers.len(),
        HOLD.as_millis(),
        quantile(&held, 0.5) as f64 / 1e6,
        longest as f64 / 1e6,
        quantile(&gaps, 0.5) as f64 / 1e6,
        quantile(&gaps, 0.99) as f64 / 1e6,
        quantile(&gaps, 0.999) as f64 / 1e6,
    ));
    Ok(row)
}

/// Checks the bypass arithmetic on known histories (run by the smoke run under
/// `cargo test`: a bench has no test harness).
pub fn self_check() -> Result<(), String> {
    // A asks at 0, granted at 10; B asks at 1, granted at 20; C asks at 2, granted at 30;
    // A asks again at 15 and is granted at 40 (after B and C: FIFO).
    let fifo = [(0, 10), (1, 20), (2, 30), (15, 40)];
    // A releaser that takes it again at once passes nobody, and the waiter it keeps out
    // is passed by every one of its grants.
    let unfair = [(0, 10), (11, 12), (13, 14), (1, 50)];
    // A holds 10–20 and 30–40, B 22–35: B's grant came 2 after A's release answer, A's
    // second grant before B's release answer arrived.
    let a = Answer {
        grants: vec![(0, 10, 20), (25, 30, 40)],
        ..Answer::default()
    };
    let b = Answer {
        grants: vec![(5, 22, 35)],
        ..Answer::default()
    };
    let gaps = handoff_gaps(&[a, b]);
    if gaps != [2, 0] {
        return Err(format!("hand-off gaps: {gaps:?}, expected [2, 0]"));
    }
    for (history, expected) in [(&fifo, [0, 1, 2, 2]), (&unfair, [0, 0, 0, 3])] {
        let got = bypasses(history);
        if got != expected {
            return Err(format!(
                "bypasses of {history:?}: {got:?}, expected {expected:?}"
            ));
        }
    }
    Ok(())
}
