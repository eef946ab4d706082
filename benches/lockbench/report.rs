//! Rows, percentiles, the printed table and `results.json`.

use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};

use crate::cases::Sample;
use crate::histogram::Histogram;

/// Latency percentiles in microseconds.
#[derive(Clone, Copy, Debug, Default)]
pub struct Percentiles {
    pub p50: f64,
    pub p99: f64,
    pub p999: f64,
}

impl Percentiles {
    /// Nearest-rank percentiles of nanosecond samples (sorts them).
    pub fn of(ns: &mut [u64]) -> Percentiles {
        if ns.is_empty() {
            return Percentiles::default();
        }
        ns.sort_unstable();
        let at = |q: f64| {
            let rank = (q * ns.len() as f64).ceil() as usize;
            ns[rank.clamp(1, ns.len()) - 1] as f64 / 1000.0
        };
        Percentiles {
            p50: at(0.50),
            p99: at(0.99),
            p999: at(0.999),
        }
    }
}

/// One line of the table and one object of `results.json`.
#[derive(Debug)]
pub struct Row {
    pub backend: &'static str,
    pub case: String,
    pub ops_per_sec: f64,
    pub lat: Percentiles,
    pub samples: u64,
    pub baseline: Option<String>,
    pub ratio: Option<f64>,
    /// Case-specific fields, in JSON and on a second table line.
    pub extra: Map<String, Value>,
    /// The second table line, if any.
    pub note: Option<String>,
    /// Rows whose latencies are waits (hand-offs, permits, processes): their distribution,
    /// for `--plot`.
    pub waits: Option<Histogram>,
}

/// Whether the case measured hand-offs (gap, fairness, failed tries), other waits (the
/// latency is a wait, its figures are the case's own) or plain cycles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Cycles,
    Handoff,
    Waits,
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn row(backend: &'static str, case: String, kind: Kind, mut s: Sample) -> Row {
    let waits = (kind != Kind::Cycles).then(|| Histogram::of(&s.lat));
    let lat = Percentiles::of(&mut s.lat);
    let mut extra = Map::new();
    let mut note = None;
    if kind == Kind::Handoff {
        let gap = Percentiles::of(&mut s.gap);
        let min = s.per_task.iter().copied().min().unwrap_or(0);
        let max = s.per_task.iter().copied().max().unwrap_or(0);
        let failed = if s.ops > 0 {
            s.failed as f64 / s.ops as f64
        } else {
            0.0
        };
        let successions = s.gap.len() as f64;
        let self_pct = if successions > 0.0 {
            100.0 * s.self_handoffs as f64 / successions
        } else {
            0.0
        };
        for (name, v) in [
            ("wait_p50_us", lat.p50),
            ("wait_p99_us", lat.p99),
            ("wait_p999_us", lat.p999),
            ("gap_p50_us", gap.p50),
            ("gap_p99_us", gap.p99),
            ("gap_p999_us", gap.p999),
            ("failed_tries_per_acquisition", failed),
            ("self_handoff_pct", self_pct),
        ] {
            extra.insert(name.into(), json!(round3(v)));
        }
        extra.insert("acquisitions_per_task_min".into(), json!(min));
        extra.insert("acquisitions_per_task_max".into(), json!(max));
        extra.insert("acquisitions_per_task".into(), json!(s.per_task));
        extra.insert("tasks".into(), json!(s.per_task.len()));
        note = Some(format!(
            "gap {}/{}/{} µs · wait {}/{}/{} µs (p50/p99/p99.9) · per task min/max {min}/{max} · failed tries/acq {failed:.3} · same task again {self_pct:.0}%",
            us(gap.p50), us(gap.p99), us(gap.p999), us(lat.p50), us(lat.p99), us(lat.p999),
        ));
    }
    Row {
        backend,
        case,
        ops_per_sec: s.ops_per_sec(),
        lat,
        samples: s.ops,
        baseline: None,
        ratio: None,
        extra,
        note,
        waits,
    }
}

/// The throughput ratio of two sides measured in the same rounds: the median over rounds
/// of ours / theirs. Each round's slices run back to back, so a burst of load from other
/// processes mostly hits one round and the median shrugs it off, where the ratio of the
/// totals would not.
fn paired_ratio(ours: &[f64], theirs: &[f64]) -> Option<f64> {
    let mut ratios: Vec<f64> = ours
        .iter()
        .zip(theirs)
        .filter(|(_, t)| **t > 0.0)
        .map(|(o, t)| o / t)
        .collect();
    if ratios.is_empty() {
        return None;
    }
    ratios.sort_by(f64::total_cmp);
    let mid = ratios.len() / 2;
    Some(if ratios.len() % 2 == 1 {
        ratios[mid]
    } else {
        (ratios[mid - 1] + ratios[mid]) / 2.0
    })
}

/// The rows of one case: the baselines as `(row name, sample)`, the primary first, then
/// ours with its ratios: `ratio` and `p50_ratio` against the primary baseline, and a `vs`
/// object with the ratios against every baseline.
pub fn group(
    backend: &'static str,
    case: &str,
    kind: Kind,
    ours: Sample,
    baselines: Vec<(String, Sample)>,
) -> Vec<Row> {
    let slices: Vec<Vec<f64>> = baselines.iter().map(|(_, s)| s.slices.clone()).collect();
    let ours_slices = ours.slices.clone();
    let mut rows: Vec<Row> = baselines
        .into_iter()
        .map(|(name, sample)| row(backend, name, kind, sample))
        .collect();
    let mut ours_row = row(backend, case.to_owned(), kind, ours);
    let div = |a: f64, b: f64| if b > 0.0 { Some(round3(a / b)) } else { None };
    let get = |r: &Row, k: &str| r.extra.get(k).and_then(Value::as_f64).unwrap_or(0.0);
    let mut vs = Map::new();
    let mut others = Vec::new();
    for (i, base) in rows.iter().enumerate() {
        let ratio = paired_ratio(&ours_slices, &slices[i]).map(round3);
        let p50_ratio = div(ours_row.lat.p50, base.lat.p50);
        let mut entry = Map::new();
        entry.insert("ratio".into(), json!(ratio));
        entry.insert("p50_ratio".into(), json!(p50_ratio));
        if kind == Kind::Handoff {
            let gap = div(get(&ours_row, "gap_p50_us"), get(base, "gap_p50_us"));
            entry.insert("gap_p50_ratio".into(), json!(gap));
            if i == 0 {
                ours_row.extra.insert("gap_p50_ratio".into(), json!(gap));
            }
        }
        if i == 0 {
            ours_row.baseline = Some(base.case.clone());
            ours_row.ratio = ratio;
            let totals = div(ours_row.ops_per_sec, base.ops_per_sec);
            ours_row
                .extra
                .insert("ratio_of_totals".into(), json!(totals));
            ours_row.extra.insert("p50_ratio".into(), json!(p50_ratio));
        } else {
            let show = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.2}"));
            others.push(format!(
                "vs {}: ops × {}, p50 × {}",
                base.case,
                show(ratio),
                show(p50_ratio)
            ));
        }
        vs.insert(base.case.clone(), Value::Object(entry));
    }
    ours_row.extra.insert("vs".into(), Value::Object(vs));
    if !others.is_empty() {
        let others = others.join(" · ");
        ours_row.note = Some(match ours_row.note.take() {
            Some(note) => format!("{note}\n{others}"),
            None => others,
        });
    }
    rows.push(ours_row);
    rows
}

/// A microsecond figure with a precision that suits its size.
fn us(v: f64) -> String {
    if v < 10.0 {
        format!("{v:.2}")
    } else if v < 100.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.0}")
    }
}

/// Prints the table: one line per row, the ratio columns on "ours" rows.
pub fn print_table(rows: &[Row]) {
    let bw = rows
        .iter()
        .map(|r| r.backend.len())
        .max()
        .unwrap_or(0)
        .max(7);
    let cw = rows
        .iter()
        .map(|r| r.case.chars().count())
        .max()
        .unwrap_or(0)
        .max(4);
    println!(
        "{:<bw$} {:<cw$} {:>11} {:>9} {:>9} {:>9} {:>9} {:>7} {:>7}",
        "backend", "case", "ops/s", "p50 µs", "p99 µs", "p99.9 µs", "samples", "ops ×", "p50 ×"
    );
    for r in rows {
        let ratio = r.ratio.map_or(String::new(), |v| format!("{v:.2}"));
        let p50_ratio = r
            .extra
            .get("p50_ratio")
            .and_then(Value::as_f64)
            .map_or(String::new(), |v| format!("{v:.2}"));
        println!(
            "{:<bw$} {:<cw$} {:>11.0} {:>9} {:>9} {:>9} {:>9} {:>7} {:>7}",
            r.backend,
            r.case,
            r.ops_per_sec,
            us(r.lat.p50),
            us(r.lat.p99),
            us(r.lat.p999),
            r.samples,
            ratio,
            p50_ratio
        );
        if let Some(note) = &r.note {
            for line in note.lines() {
                println!("{:<bw$}   └ {line}", "");
            }
        }
    }
}

/// The median and range of `values` as `median [min–max]` (`-` when there are none).
fn spread(mut values: Vec<f64>, show: impl Fn(f64) -> String) -> String {
    if values.is_empty() {
        return "-".to_owned();
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    let median = if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    };
    format!(
        "{} [{}–{}]",
        show(median),
        show(values[0]),
        show(values[values.len() - 1])
    )
}

/// After `--repeat N`: for each of our rows, the median and range over the runs of its
/// ratio against every baseline and, for hand-offs, of the wait p99.9, the gap p50 and the
/// failed tries per acquisition (the same hand-off figures for every baseline row); for
/// the case between processes, its waits, spread, bypasses and deadline misses.
pub fn print_summary(runs: &[Vec<Row>]) {
    println!(
        "over {} runs: median [min–max] of each run's figure",
        runs.len()
    );
    let Some(first) = runs.first() else {
        return;
    };
    let ratio = |v: f64| format!("{v:.2}");
    let get = |r: &Row, k: &str| r.extra.get(k).and_then(Value::as_f64);
    for proto in first {
        let same: Vec<&Row> = runs
            .iter()
            .filter_map(|rows| {
                rows.iter()
                    .find(|r| r.backend == proto.backend && r.case == proto.case)
            })
            .collect();
        let mut parts = Vec::new();
        if let Some(Value::Object(vs)) = proto.extra.get("vs") {
            for base in vs.keys() {
                let ratios = same
                    .iter()
                    .filter_map(|r| match r.extra.get("vs") {
                        Some(Value::Object(vs)) => vs.get(base)?.get("ratio")?.as_f64(),
                        _ => None,
                    })
                    .collect();
                parts.push(format!("ops × vs {base} {}", spread(ratios, ratio)));
            }
        }
        let of = |k: &str| same.iter().filter_map(|r| get(r, k)).collect::<Vec<_>>();
        if proto.extra.contains_key("gap_p50_us") {
            parts.push(format!("wait p99.9 {} µs", spread(of("wait_p999_us"), us)));
            parts.push(format!("gap p50 {} µs", spread(of("gap_p50_us"), us)));
            parts.push(format!(
                "failed tries/acq {}",
                spread(of("failed_tries_per_acquisition"), ratio)
            ));
        }
        if proto.extra.contains_key("acquisitions_min_over_max") {
            let count = |v: f64| format!("{v:.0}");
            parts.push(format!("wait p99 {} µs", spread(of("wait_p99_us"), us)));
            parts.push(format!("wait p99.9 {} µs", spread(of("wait_p999_us"), us)));
            parts.push(format!(
                "hold as held p50 {} µs",
                spread(of("hold_actual_p50_us"), us)
            ));
            parts.push(format!(
                "hand-off gap p50 {} µs, p99 {} µs",
                spread(of("handoff_gap_p50_us"), us),
                spread(of("handoff_gap_p99_us"), us)
            ));
            parts.push(format!(
                "longest wait {} holds",
                spread(of("wait_max_holds"), ratio)
            ));
            parts.push(format!(
                "per process min/max {}",
                spread(of("acquisitions_min_over_max"), ratio)
            ));
            parts.push(format!("bypass max {}", spread(of("bypass_max"), count)));
            parts.push(format!(
                "deadline misses {}",
                spread(of("deadline_misses"), count)
            ));
        }
        if !parts.is_empty() {
            println!("{} {}: {}", proto.backend, proto.case, parts.join(" · "));
        }
    }
}

fn to_json(r: &Row, mode: &str) -> Value {
    let mut obj = Map::new();
    obj.insert("backend".into(), json!(r.backend));
    obj.insert("case".into(), json!(r.case));
    obj.insert("ops_per_sec".into(), json!(r.ops_per_sec.round()));
    obj.insert("p50_us".into(), json!(round3(r.lat.p50)));
    obj.insert("p99_us".into(), json!(round3(r.lat.p99)));
    obj.insert("p999_us".into(), json!(round3(r.lat.p999)));
    obj.insert("samples".into(), json!(r.samples));
    obj.insert("baseline".into(), json!(r.baseline));
    obj.insert("ratio".into(), json!(r.ratio));
    obj.insert("mode".into(), json!(mode));
    for (k, v) in &r.extra {
        obj.insert(k.clone(), v.clone());
    }
    Value::Object(obj)
}

/// Where `results.json` goes: `$CARGO_TARGET_DIR/lockbench`, else the `target` directory
/// this binary was built in, else `target/` of the workspace.
pub fn results_path() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .or_else(|| {
            // …/target/release/deps/lockbench-HASH
            let exe = std::env::current_exe().ok()?;
            let deps = exe.parent()?;
            (deps.file_name()? == "deps").then(|| deps.parent()?.parent().map(Path::to_path_buf))?
        })
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    target.join("lockbench").join("results.json")
}

/// Writes the rows as a JSON array.
pub fn write_json(rows: &[Row], mode: &str, path: &Path) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let all: Vec<Value> = rows.iter().map(|r| to_json(r, mode)).collect();
    let text = serde_json::to_string_pretty(&all).map_err(std::io::Error::other)?;
    std::fs::write(path, text + "\n")
}
