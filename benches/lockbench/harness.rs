//! The harness: command line, the cases of one backend, the table and `results.json`.
//! Everything of lockbench but the list of backends, which the crate root (`main.rs`)
//! hands to [`main`]: a bench crate outside the workspace (`benches/peers`, for peer crates
//! whose dependencies cannot share the workspace's build) compiles these same files with
//! its own list.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockcore::driver::BoxError;
use lockcore::{LockBackend, LockClient, LockKey};

use crate::cases::{self, Handoff, Side};
use crate::report::{self, Kind, Row};
use crate::target::{CountingBackend, RawLock, Target};
use crate::{histogram, plot, processes, scale, shared, waiters};

// ---- Settings ----

/// How long and how much to measure.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Measured time per side of each case.
    pub measure: Duration,
    /// Unmeasured time per side of each case, before measuring.
    pub warmup: Duration,
    /// Alternating slices the measured time is cut into.
    pub rounds: u32,
    /// At most this many measured cycles per side of each case.
    pub samples: Option<u64>,
    /// `full`, `quick` or `test` (run by `cargo test`: a debug-build smoke run).
    pub mode: &'static str,
    /// Run only the cases whose name contains one of these (all when empty).
    pub cases: Vec<String>,
    /// Whole runs of the chosen backends, one after another (a summary gives the median
    /// and range of each figure over them).
    pub repeat: u32,
    /// The scale case's numbers of holds (its defaults when empty).
    pub scale_holds: Vec<usize>,
    /// How long the scale case keeps its holds (its default when `None`).
    pub scale_for: Option<Duration>,
    /// The waiter cases' numbers of waiters (their defaults when empty).
    pub scale_waiters: Vec<usize>,
}

impl Settings {
    /// Whether the case `name` runs.
    pub fn runs(&self, name: &str) -> bool {
        self.cases.is_empty() || self.cases.iter().any(|c| name.contains(c.as_str()))
    }
}

const USAGE: &str = "\
usage: cargo bench --bench lockbench -- [BACKEND...] [OPTIONS]

BACKEND      run only backends whose name contains this (default: all compiled in)
--quick      a short smoke run (0.3 s per side and case)
--duration D measured time per side and case (default 2s; e.g. 500ms, 5s)
--warmup D   warm-up per side and case before measuring (default 500ms)
--samples N  at most N measured cycles per side and case
--rounds N   slices per side and case, order rotating (default 10)
--case NAME  run only the cases whose name contains NAME (uncontended, concurrent64,
             handoff, shared_uncontended, semaphore16x4, readers_writer, processes8,
             scale_holds, scale_waiters, scale_keys64 — the last three only when named,
             e.g. --case scale: minutes per backend; repeatable)
--repeat N   run everything N times and print the median and range of each ratio and
             hand-off figure over the runs (default 1)
--scale-holds N[,N…]  the scale case's numbers of holds (default 1000,10000,100000)
--scale-for D         how long the scale case keeps them (default 60s)
--scale-waiters N[,N…]  the waiter cases' numbers of waiters (default 10000)
--no-json    do not write target/lockbench/results.json
--plot DIR   after the run, write SVG pictures into DIR: per backend the wait-time CDF
             of every row that records waits (wait-cdf-BACKEND.svg), per cross-process
             case the acquisitions per process (processes8-acquisitions.svg)
--metrics    install a Prometheus recorder first, so ours pays for recording its metrics
             (needs --features metrics; without the flag a metrics build records into
             the no-op recorder)";

struct Args {
    filters: Vec<String>,
    settings: Settings,
    write_json: bool,
    metrics: bool,
    /// Where `--plot` writes its pictures.
    plot: Option<PathBuf>,
}

/// Counts like `1000,10000` for the option `name`.
fn parse_counts(name: &str, v: &str) -> Result<Vec<usize>, String> {
    v.split(',')
        .map(|n| {
            n.trim()
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=10_000_000).contains(n))
                .ok_or(format!("{name} needs counts like 1000,10000, got {v:?}"))
        })
        .collect()
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let (num, scale) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else {
        (s, 1.0)
    };
    match num.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v * scale < 86_400.0 => {
            Ok(Duration::from_secs_f64(v * scale))
        }
        _ => Err(format!("not a duration: {s:?} (try 2s or 500ms)")),
    }
}

fn parse_args(args: impl IntoIterator<Item = String>) -> Result<Args, String> {
    let mut filters = Vec::new();
    let (mut quick, mut bench) = (false, false);
    let (mut measure, mut warmup, mut samples, mut rounds) = (None, None, None, None);
    let mut repeat = 1;
    let mut write_json = true;
    let mut metrics = false;
    let mut plot = None;
    let mut cases = Vec::new();
    let (mut scale_holds, mut scale_for) = (Vec::new(), None);
    let mut scale_waiters = Vec::new();
    let mut it = args.into_iter();
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            // `cargo bench` passes --bench; `cargo test` does not.
            "--bench" => bench = true,
            "--quick" => quick = true,
            "--no-json" => write_json = false,
            "--metrics" => metrics = true,
            "--case" => cases.push(value("--case")?),
            "--plot" => plot = Some(PathBuf::from(value("--plot")?)),
            "--scale-for" => scale_for = Some(parse_duration(&value("--scale-for")?)?),
            "--scale-holds" => {
                scale_holds = parse_counts("--scale-holds", &value("--scale-holds")?)?
            }
            "--scale-waiters" => {
                scale_waiters = parse_counts("--scale-waiters", &value("--scale-waiters")?)?
            }
            "--duration" => measure = Some(parse_duration(&value("--duration")?)?),
            "--warmup" => warmup = Some(parse_duration(&value("--warmup")?)?),
            "--samples" => {
                let v = value("--samples")?;
                samples = Some(
                    v.parse::<u64>()
                        .ok()
                        .filter(|n| *n > 0)
                        .ok_or(format!("--samples needs a positive count, got {v:?}"))?,
                );
            }
            "--rounds" => {
                let v = value("--rounds")?;
                rounds = Some(
                    v.parse::<u32>()
                        .ok()
                        .filter(|n| (1..=100).contains(n))
                        .ok_or(format!("--rounds needs 1..=100, got {v:?}"))?,
                );
            }
            "--repeat" => {
                let v = value("--repeat")?;
                repeat = v
                    .parse::<u32>()
                    .ok()
                    .filter(|n| (1..=100).contains(n))
                    .ok_or(format!("--repeat needs 1..=100, got {v:?}"))?;
            }
            "-h" | "--help" => return Err(USAGE.into()),
            other if other.starts_with('-') => {
                return Err(format!("unknown option {other}\n{USAGE}"))
            }
            name => filters.push(name.to_owned()),
        }
    }
    // Without --bench we run under `cargo test` (a debug build): smoke-test only.
    let mode = match (bench, quick) {
        (false, _) => "test",
        (true, true) => "quick",
        (true, false) => "full",
    };
    // A smoke run only shows that every case still runs against every store: the shortest
    // slices that still take a few samples (the whole run: 174 s with quick's slices).
    let (default_measure, default_warmup) = match mode {
        "test" => (Duration::from_millis(40), Duration::from_millis(10)),
        "quick" => (Duration::from_millis(300), Duration::from_millis(100)),
        _ => (Duration::from_secs(2), Duration::from_millis(500)),
    };
    let settings = Settings {
        measure: measure.unwrap_or(default_measure),
        warmup: warmup.unwrap_or(default_warmup),
        rounds: rounds.unwrap_or(if mode == "full" { 10 } else { 2 }),
        samples,
        cases,
        mode,
        repeat,
        scale_holds,
        scale_for,
        scale_waiters,
    };
    Ok(Args {
        filters,
        settings,
        write_json: write_json && mode != "test",
        metrics,
        plot,
    })
}

// ---- Running one backend ----

type RowsFuture<'a> = Pin<Box<dyn Future<Output = Result<Vec<Row>, BoxError>> + 'a>>;

/// A compiled-in backend: its name and how to run its cases.
pub struct Registration {
    name: &'static str,
    run: for<'a> fn(&'a Settings) -> RowsFuture<'a>,
}

impl Registration {
    pub fn of<T: Target>() -> Self {
        Registration {
            name: T::NAME,
            run: |s| Box::pin(run_target::<T>(s)),
        }
    }
}

/// Tasks of the concurrent case.
const CONCURRENT_TASKS: usize = 64;
/// Tasks and clients of the hand-off case.
const HANDOFF_TASKS: usize = 8;
const HANDOFF_CLIENTS: usize = 2;

fn run_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{:x}-{:x}", nanos & 0xffff_ffff_ffff, std::process::id())
}

fn key(name: String) -> Result<LockKey, BoxError> {
    Ok(LockKey::new(name)?)
}

/// The baselines of a target, each on its own connection: names and instances.
async fn baselines<T: Target>(
    target: &T,
) -> Result<(Vec<&'static str>, Vec<Arc<T::Raw>>), BoxError> {
    let raws = target.raw().await?;
    if raws.is_empty() {
        return Err(format!("{}: Target::raw gave no baseline", T::NAME).into());
    }
    Ok(raws.into_iter().map(|(n, r)| (n, Arc::new(r))).unzip())
}

/// Row names of the baselines `sides` stand for (all but the first, which is ours).
fn baseline_rows(case: &str, sides: &[Side], names: &[&str]) -> Vec<String> {
    sides
        .iter()
        .map(|side| match side {
            Side::Ours => case.to_owned(),
            Side::Trait => format!("{case}_raw"),
            Side::Raw(n) => format!("{case}_{}", names[*n]),
        })
        .collect()
}

/// Runs one case over `sides` (ours first) and turns the samples into rows.
fn rows_of(
    backend: &'static str,
    case: &str,
    kind: Kind,
    sides: &[Side],
    names: &[&str],
    samples: Vec<cases::Sample>,
) -> Vec<Row> {
    let mut named = baseline_rows(case, sides, names).into_iter().zip(samples);
    let ours = named.next().map(|(_, s)| s).unwrap_or_default();
    report::group(backend, case, kind, ours, named.collect())
}

async fn run_target<T: Target>(s: &Settings) -> Result<Vec<Row>, BoxError> {
    let name = T::NAME;
    let target = T::setup()
        .await
        .map_err(|e| format!("{name}: setup failed: {}", lockcore::ErrorChain(&*e)))?;
    let label: Arc<str> = Arc::from(lockcore::driver::default_label());
    let prefix = format!("lockbench:{}", run_id());
    let client = LockClient::builder(target.backend().await?)
        .label(&*label)
        .build();
    let (names, raws) = baselines(&target).await?;
    for (n, raw) in raws.iter().enumerate() {
        if names[..n].contains(&names[n]) {
            return Err(format!("{name}: two baselines are named {:?}", names[n]).into());
        }
        if raw.handoff() && names[n] == "raw" {
            return Err(format!(
                "{name}: a baseline that runs the hand-off case must not be named \"raw\" \
                 (handoff_raw is the loop over the backend trait object)"
            )
            .into());
        }
    }
    let mut rows = Vec::new();

    // Ours, then every baseline; each side on keys of its own, so a slow release on one
    // side can never be seen by another.
    let sides: Vec<Side> = std::iter::once(Side::Ours)
        .chain((0..raws.len()).map(Side::Raw))
        .collect();
    let keys_of = |case: &str, n: usize| -> Result<Vec<Vec<LockKey>>, BoxError> {
        (0..sides.len())
            .map(|side| {
                (0..n)
                    .map(|i| key(format!("{prefix}:{case}:{side}:{i}")))
                    .collect()
            })
            .collect()
    };
    let side_index = |side: Side| match side {
        Side::Ours | Side::Trait => 0,
        Side::Raw(n) => n + 1,
    };

    // 1. Uncontended, sequential, one client; 2. 64 concurrent tasks on distinct keys,
    //    one client.
    for (case, tag, tasks) in [
        ("uncontended", "seq", 1),
        ("concurrent64", "c64", CONCURRENT_TASKS),
    ] {
        if !s.runs(case) {
            continue;
        }
        let keys: Vec<Vec<Vec<LockKey>>> = keys_of(tag, tasks)?
            .into_iter()
            .map(|side| side.into_iter().map(|k| vec![k]).collect())
            .collect();
        let got = cases::compare(s, &sides, |side, until, cap| {
            cases::cycles(
                side,
                &client,
                &raws,
                &keys[side_index(side)],
                &label,
                until,
                cap,
            )
        })
        .await
        .map_err(|e| format!("{name}/{case}: {e}"))?;
        rows.extend(rows_of(name, case, Kind::Cycles, &sides, &names, got));
    }

    // 3. Contended hand-off: 8 tasks over 2 independent clients, one key, zero hold.
    //    Ours and the trait-object loop go through the same counted backend instances;
    //    baselines that can wait by themselves join with one connection per client.
    let mut backends = Vec::with_capacity(HANDOFF_CLIENTS);
    let mut clients = Vec::with_capacity(HANDOFF_CLIENTS);
    let mut raw_sets = Vec::with_capacity(HANDOFF_CLIENTS);
    if s.runs("handoff") {
        for _ in 0..HANDOFF_CLIENTS {
            let counted = CountingBackend::new(target.backend().await?);
            let as_dyn: Arc<dyn LockBackend> = counted.clone();
            clients.push(LockClient::builder(as_dyn).label(&*label).build());
            backends.push(counted);
            raw_sets.push(baselines(&target).await?.1);
        }
        let mut sides = vec![Side::Ours, Side::Trait];
        sides.extend(
            (0..raws.len())
                .filter(|&n| raws[n].handoff())
                .map(Side::Raw),
        );
        let handoff = Handoff {
            clients: &clients,
            backends: &backends,
            raws: &raw_sets,
            tasks: HANDOFF_TASKS,
            label: label.clone(),
        };
        // A fresh key per slice: a slice never sees the previous one's last release.
        let mut slice_no = 0u32;
        let got = cases::compare(s, &sides, |side, until, cap| {
            slice_no += 1;
            let k = key(format!("{prefix}:handoff:{slice_no}"));
            let handoff = &handoff;
            async move { handoff.slice(side, &k?, until, cap).await }
        })
        .await
        .map_err(|e| format!("{name}/handoff: {e}"))?;
        rows.extend(rows_of(name, "handoff", Kind::Handoff, &sides, &names, got));
    }

    // Several keys at once, against the same keys taken one by one.
    rows.extend(crate::keys3::rows(name, s, &client, &prefix).await?);

    // 4. Shared claims, where the backend has them: two clients, as two processes.
    let mut shared_clients = Vec::new();
    if ["shared_uncontended", "semaphore16x4", "readers_writer"]
        .iter()
        .any(|c| s.runs(c))
        && client.capabilities().shared
    {
        for _ in 0..2 {
            let backend = target.backend().await?;
            shared_clients.push(LockClient::builder(backend).label(&*label).build());
        }
        let got = shared::rows(name, s, &shared_clients, &prefix).await;
        rows.extend(got.map_err(|e| format!("{name}/shared: {e}"))?);
    }

    // 5. Many holds at once (opt-in: minutes).
    if scale::runs(s) {
        let got = scale::rows(&target, s, &prefix).await;
        rows.extend(got.map_err(|e| format!("{name}/scale_holds: {}", lockcore::ErrorChain(&*e)))?);
    }

    // 5b. Many waiters at once (opt-in).
    if waiters::runs(s) {
        let got = waiters::rows(&target, s, &prefix).await;
        rows.extend(
            got.map_err(|e| format!("{name}/scale_waiters: {}", lockcore::ErrorChain(&*e)))?,
        );
    }

    // 5c. 64 tasks spread over many keys (opt-in).
    if scale::keys_run(s) {
        let n = scale::spread_keys(s);
        let per_side: Vec<Vec<Vec<LockKey>>> = (0..sides.len())
            .map(|side| {
                let mut tasks: Vec<Vec<LockKey>> = vec![Vec::new(); CONCURRENT_TASKS];
                for i in 0..n {
                    tasks[i % CONCURRENT_TASKS].push(key(format!("{prefix}:k64:{side}:{i}"))?);
                }
                Ok::<_, BoxError>(tasks)
            })
            .collect::<Result<_, _>>()?;
        let got = cases::compare(s, &sides, |side, until, cap| {
            cases::cycles(
                side,
                &client,
                &raws,
                &per_side[side_index(side)],
                &label,
                until,
                cap,
            )
        })
        .await
        .map_err(|e| format!("{name}/scale_keys64: {e}"))?;
        rows.extend(rows_of(
            name,
            "scale_keys64",
            Kind::Cycles,
            &sides,
            &names,
            got,
        ));
    }

    // 6. Hand-off between processes, for a store other processes can open.
    if s.runs(&processes::case_name(s)) {
        if let Some(url) = target.url() {
            let got = processes::rows(name, s, &url, &prefix).await;
            rows.extend(got.map_err(|e| format!("{name}/{}: {e}", processes::case_name(s)))?);
        }
    }

    for c in clients.iter().chain(&shared_clients).chain([&client]) {
        c.shutdown().await;
        c.backend().shutdown().await;
    }
    Ok(rows)
}

// ---- main ----

/// The one-minute load average, where the system tells it (Linux).
fn load_1m() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    text.split_whitespace().next()?.parse().ok()
}

/// A Prometheus recorder (histograms in buckets, upkeep every second) without its HTTP
/// endpoint: what recording costs in a real process.
#[cfg(feature = "metrics")]
fn install_recorder() -> Result<(), String> {
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
    let buckets = [1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 0.1, 1.0, 10.0];
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &buckets)
        .and_then(|b| b.install_recorder())
        .map_err(|e| e.to_string())?;
    std::thread::Builder::new()
        .name("lockbench-metrics-upkeep".into())
        .spawn(move || loop {
            std::thread::sleep(Duration::from_secs(1));
            handle.run_upkeep();
        })
        .map(drop)
        .map_err(|e| e.to_string())
}

#[cfg(not(feature = "metrics"))]
fn install_recorder() -> Result<(), String> {
    Err("this build records no metrics: run it with `--features metrics`".into())
}

/// Runs lockbench over the backends `all` (those compiled in).
pub fn main(all: Vec<Registration>) -> ExitCode {
    if std::env::args().nth(1).as_deref() == Some(processes::WORKER_FLAG) {
        return processes::worker_main();
    }
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(msg) => {
            eprintln!("{msg}");
            return ExitCode::FAILURE;
        }
    };
    if args.metrics {
        if let Err(e) = install_recorder() {
            eprintln!("lockbench: --metrics: {e}");
            return ExitCode::FAILURE;
        }
    }
    // Before minutes of measuring: a directory that cannot be made fails the run now.
    if let Some(dir) = &args.plot {
        if let Err(e) = std::fs::create_dir_all(dir) {
            eprintln!("lockbench: --plot: cannot create {}: {e}", dir.display());
            return ExitCode::FAILURE;
        }
    }
    let s = &args.settings;
    for f in &args.filters {
        if !all.iter().any(|r| r.name.contains(f.as_str())) {
            let names: Vec<_> = all.iter().map(|r| r.name).collect();
            eprintln!(
                "lockbench: no compiled-in backend matches {f:?}; compiled in: {} \
                 (enable the facade feature, e.g. `cargo bench --features {f} --bench lockbench -- {f}`)",
                names.join(", ")
            );
            return ExitCode::FAILURE;
        }
    }
    // A filter that names a backend exactly chooses that one (`redis` is not also
    // `redis_nofence`); any other chooses every backend whose name contains it (`redlock`).
    let picks = |f: &str, name: &str| {
        if all.iter().any(|r| r.name == f) {
            name == f
        } else {
            name.contains(f)
        }
    };
    let chosen: Vec<&Registration> = all
        .iter()
        .filter(|r| args.filters.is_empty() || args.filters.iter().any(|f| picks(f, r.name)))
        .collect();

    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("lockbench: cannot start the tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let workers = runtime.metrics().num_workers();
    println!(
        "lockbench ({} build, mode {}, {workers} tokio workers): {} rounds × {:?} per side and case after a {:?} warm-up{}",
        if cfg!(debug_assertions) { "debug" } else { "release" },
        s.mode,
        s.rounds,
        s.measure / s.rounds.max(1),
        s.warmup,
        s.samples.map_or(String::new(), |n| format!(", at most {n} samples")),
    );
    if s.mode == "test" {
        println!("lockbench: run without --bench (cargo test): smoke run, figures not meaningful, no results.json");
        for check in [
            processes::self_check,
            histogram::self_check,
            plot::self_check,
        ] {
            if let Err(e) = check() {
                eprintln!("lockbench: {e}");
                return ExitCode::FAILURE;
            }
        }
    }

    let mut failed = false;
    let mut runs = Vec::new();
    for run in 1..=s.repeat {
        let mut run_rows = Vec::new();
        for r in &chosen {
            // On a shared machine other processes take cores from client and server
            // alike: the load average says how much to trust the absolute figures.
            let load = load_1m();
            let started = Instant::now();
            match runtime.block_on((r.run)(s)) {
                Ok(mut got) => {
                    eprintln!(
                        "lockbench: {} done in {:.1?} (load average before: {}){}",
                        r.name,
                        started.elapsed(),
                        load.map_or("unknown".to_owned(), |l| format!("{l:.2}")),
                        if s.repeat > 1 {
                            format!(", run {run} of {}", s.repeat)
                        } else {
                            String::new()
                        }
                    );
                    for row in &mut got {
                        row.extra.insert("load_1m".into(), serde_json::json!(load));
                        if s.repeat > 1 {
                            row.extra.insert("run".into(), serde_json::json!(run));
                        }
                    }
                    run_rows.extend(got);
                }
                Err(e) => {
                    eprintln!("lockbench: {} FAILED: {e}", r.name);
                    failed = true;
                }
            }
        }
        println!();
        if s.repeat > 1 {
            println!("run {run} of {}:", s.repeat);
        }
        report::print_table(&run_rows);
        runs.push(run_rows);
    }
    if s.repeat > 1 {
        println!();
        report::print_summary(&runs);
    }
    let rows: Vec<report::Row> = runs.into_iter().flatten().collect();
    if args.write_json && !rows.is_empty() {
        let path = report::results_path();
        match report::write_json(&rows, s.mode, &path) {
            Ok(()) => println!("\nwrote {}", path.display()),
            Err(e) => {
                eprintln!("lockbench: cannot write {}: {e}", path.display());
                failed = true;
            }
        }
    }
    if let Some(dir) = &args.plot {
        match plot::write_all(dir, &rows) {
            Ok(files) if files.is_empty() => {
                eprintln!("lockbench: --plot: no row of this run records waits or processes");
            }
            Ok(files) => {
                for f in files {
                    println!("wrote {}", f.display());
                }
            }
            Err(e) => {
                eprintln!("lockbench: --plot: {e}");
                failed = true;
            }
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
