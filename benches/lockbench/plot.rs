//! `--plot DIR`: the run's pictures as SVG, drawn with `plotters` (no fonts: the SVG
//! backend writes labels as `<text>`).
//!
//! * `wait-cdf-<backend>.svg` — per backend, the wait-time CDF (log-scale time) of every
//!   row that records waits: ours against the hand loop and the baselines that wait by
//!   themselves in the hand-off case, and the waits of the permit, writer and
//!   cross-process cases. Rows of the same name from `--repeat` runs are merged.
//! * `<case>-acquisitions.svg` — per cross-process case (`processes8`), acquisitions per
//!   worker process, a bar per backend (and run) for each: fairness between processes.

use std::path::{Path, PathBuf};

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use serde_json::Value;

use crate::histogram::Histogram;
use crate::report::Row;

/// Width, and height of the chart above its legend.
const WIDTH: u32 = 960;
const CHART_HEIGHT: u32 = 560;
/// Height of one legend line.
const LEGEND_LINE: u32 = 24;
/// Distinct colours that read on white (Tableau's ten), in turn.
const COLOURS: [RGBColor; 10] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0xe3, 0x77, 0xc2),
    RGBColor(0x7f, 0x7f, 0x7f),
    RGBColor(0xbc, 0xbd, 0x22),
    RGBColor(0x17, 0xbe, 0xcf),
];

fn colour(i: usize) -> RGBColor {
    COLOURS[i % COLOURS.len()]
}

/// The picture's size for `lines` legend lines under the chart.
fn size(lines: usize) -> (u32, u32) {
    (WIDTH, CHART_HEIGHT + 16 + LEGEND_LINE * lines as u32)
}

/// The legend under the chart, one line per series: its mark, then its label.
fn legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    entries: &[(ShapeStyle, bool, String)],
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let text =
        TextStyle::from(("sans-serif", 16).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
    for (i, (style, bar, label)) in entries.iter().enumerate() {
        let y = 8 + LEGEND_LINE as i32 / 2 + i as i32 * LEGEND_LINE as i32;
        if *bar {
            area.draw(&Rectangle::new([(80, y - 7), (104, y + 7)], *style))?;
        } else {
            area.draw(&PathElement::new(vec![(80, y), (104, y)], *style))?;
        }
        area.draw(&Text::new(label.as_str(), (114, y), text.clone()))?;
    }
    Ok(())
}

/// A time axis label: µs below a millisecond, then ms, then s.
fn time_label(us: &f64) -> String {
    if *us < 1000.0 {
        format!("{us} µs")
    } else if *us < 1e6 {
        format!("{} ms", us / 1000.0)
    } else {
        format!("{} s", us / 1e6)
    }
}

/// Writes every picture the rows allow into `dir` (created if missing); returns the files.
pub fn write_all(dir: &Path, rows: &[Row]) -> Result<Vec<PathBuf>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let mut written = Vec::new();
    let mut save = |name: String, svg: String| {
        let path = dir.join(name);
        std::fs::write(&path, svg).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        written.push(path);
        Ok::<_, String>(())
    };
    for backend in in_order(rows.iter().map(|r| r.backend)) {
        let series = wait_series(rows.iter().filter(|r| r.backend == backend));
        if !series.is_empty() {
            save(
                format!("wait-cdf-{backend}.svg"),
                wait_cdf_svg(backend, &series)?,
            )?;
        }
    }
    let per_process = |r: &Row| r.extra.get("acquisitions_per_process").is_some();
    let cases = in_order(
        rows.iter()
            .filter(|r| per_process(r))
            .map(|r| r.case.as_str()),
    );
    for case in cases {
        let of_case: Vec<&Row> = rows.iter().filter(|r| r.case == case).collect();
        save(
            format!("{case}-acquisitions.svg"),
            processes_svg(case, &of_case)?,
        )?;
    }
    Ok(written)
}

/// The distinct items, in the order they first come.
fn in_order<T: PartialEq>(items: impl Iterator<Item = T>) -> Vec<T> {
    let mut seen = Vec::new();
    for item in items {
        if !seen.contains(&item) {
            seen.push(item);
        }
    }
    seen
}

/// One curve of a CDF picture.
struct Curve {
    label: String,
    ours: bool,
    waits: Histogram,
}

/// The rows with waits, merged by name (runs of `--repeat`), in the rows' order.
fn wait_series<'a>(rows: impl Iterator<Item = &'a Row>) -> Vec<Curve> {
    let mut curves: Vec<(&str, Curve)> = Vec::new();
    for row in rows {
        let Some(waits) = row.waits.as_ref().filter(|h| h.count() > 0) else {
            continue;
        };
        match curves.iter_mut().find(|(case, _)| *case == row.case) {
            Some((_, curve)) => curve.waits.merge(waits),
            None => curves.push((
                &row.case,
                Curve {
                    label: row.case.clone(),
                    // Only ours' rows carry ratios against baselines.
                    ours: row.extra.contains_key("vs"),
                    waits: waits.clone(),
                },
            )),
        }
    }
    curves.into_iter().map(|(_, c)| c).collect()
}

/// A wait in µs with a precision that suits its size.
fn show_us(ns: u64) -> String {
    let us = ns as f64 / 1000.0;
    if us < 10.0 {
        format!("{us:.2} µs")
    } else if us < 1000.0 {
        format!("{us:.0} µs")
    } else {
        format!("{:.1} ms", us / 1000.0)
    }
}

fn drawing<E: std::error::Error + Send + Sync>(
    what: &str,
) -> impl FnOnce(DrawingAreaErrorKind<E>) -> String + '_ {
    move |e| format!("drawing {what}: {e}")
}

/// The wait-time CDFs of one backend's rows, as an SVG document.
fn wait_cdf_svg(backend: &str, curves: &[Curve]) -> Result<String, String> {
    let what = format!("the wait CDF of {backend}");
    let err = || drawing(&what);
    // Whole decades around every wait (in µs), the smallest at least 0.01 µs.
    let lowest = curves.iter().map(|c| c.waits.quantile(0.0)).min();
    let highest = curves.iter().map(|c| c.waits.quantile(1.0)).max();
    let decade_below = |ns: u64| 10f64.powf((ns.max(10) as f64 / 1000.0).log10().floor());
    let decade_above = |ns: u64| 10f64.powf((ns.max(10) as f64 / 1000.0).log10().ceil());
    let lo = decade_below(lowest.unwrap_or(1000));
    let hi = decade_above(highest.unwrap_or(1000)).max(lo * 10.0);
    let mut entries = Vec::new();
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, size(curves.len())).into_drawing_area();
        root.fill(&WHITE).map_err(err())?;
        let (top, bottom) = root.split_vertically(CHART_HEIGHT);
        let mut chart = ChartBuilder::on(&top)
            .caption(
                format!("{backend}: wait from the acquire call to success (CDF)"),
                ("sans-serif", 26),
            )
            .margin(16)
            .margin_right(40)
            .x_label_area_size(56)
            .y_label_area_size(72)
            .build_cartesian_2d((lo..hi).log_scale(), 0f64..1.0)
            .map_err(err())?;
        chart
            .configure_mesh()
            .x_desc("wait (log scale)")
            .y_desc("share of waits ≤ x")
            .label_style(("sans-serif", 16))
            .axis_desc_style(("sans-serif", 17))
            .x_label_formatter(&time_label)
            .y_label_formatter(&|y| format!("{y:.1}"))
            .draw()
            .map_err(err())?;
        for (i, curve) in curves.iter().enumerate() {
            let style = colour(i).stroke_width(if curve.ours { 3 } else { 2 });
            // A staircase from zero at the smallest wait, rising at each bucket's upper
            // end to the share of waits up to it (exact there; nothing is drawn between).
            let first = (curve.waits.quantile(0.0) as f64 / 1000.0).max(lo);
            let mut points = vec![(first, 0.0)];
            for (ns, share) in curve.waits.cdf() {
                let x = (ns as f64 / 1000.0).max(lo);
                let below = points.last().map_or(0.0, |p| p.1);
                points.extend([(x, below), (x, share)]);
            }
            chart
                .draw_series(LineSeries::new(points, style))
                .map_err(err())?;
            let w = &curve.waits;
            let label = format!(
                "{}{}: {} waits · p50 {} · p99 {} · p99.9 {} · max {}",
                curve.label,
                if curve.ours { " (ours)" } else { "" },
                w.count(),
                show_us(w.quantile(0.5)),
                show_us(w.quantile(0.99)),
                show_us(w.quantile(0.999)),
                show_us(w.quantile(1.0)),
            );
            entries.push((style, false, label));
        }
        legend(&bottom, &entries).map_err(err())?;
        root.present().map_err(err())?;
    }
    Ok(svg)
}

/// Acquisitions per process of a cross-process case: one group of bars per process, a bar
/// per row (backend, and run under `--repeat`).
fn processes_svg(case: &str, rows: &[&Row]) -> Result<String, String> {
    let what = format!("the acquisitions of {case}");
    let err = || drawing(&what);
    let series: Vec<(String, Vec<u64>)> = rows
        .iter()
        .map(|r| {
            let counts: Vec<u64> = match r.extra.get("acquisitions_per_process") {
                Some(Value::Array(a)) => a.iter().filter_map(Value::as_u64).collect(),
                _ => Vec::new(),
            };
            let get = |k: &str| r.extra.get(k).and_then(Value::as_f64);
            let label = format!(
                "{}{}: {} acquisitions · min/max {} · longest wait {} holds · deadline misses {}",
                r.backend,
                get("run").map_or(String::new(), |n| format!(" run {n}")),
                counts.iter().sum::<u64>(),
                get("acquisitions_min_over_max").map_or("-".to_owned(), |v| format!("{v:.2}")),
                get("wait_max_holds").map_or("-".to_owned(), |v| format!("{v:.1}")),
                get("deadline_misses").map_or("-".to_owned(), |v| format!("{v}")),
            );
            (label, counts)
        })
        .collect();
    let processes = series
        .iter()
        .map(|(_, c)| c.len())
        .max()
        .unwrap_or(0)
        .max(1);
    let most = series
        .iter()
        .flat_map(|(_, c)| c)
        .copied()
        .max()
        .unwrap_or(0)
        .max(1);
    let hold = rows
        .first()
        .and_then(|r| r.extra.get("hold_ms"))
        .and_then(Value::as_f64)
        .map_or(String::new(), |ms| format!(", {ms} ms holds"));
    let mut entries = Vec::new();
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, size(series.len())).into_drawing_area();
        root.fill(&WHITE).map_err(err())?;
        let (top, bottom) = root.split_vertically(CHART_HEIGHT);
        let mut chart = ChartBuilder::on(&top)
            .caption(
                format!("{case}: acquisitions per process{hold}"),
                ("sans-serif", 26),
            )
            .margin(16)
            .margin_right(40)
            .x_label_area_size(56)
            .y_label_area_size(72)
            .build_cartesian_2d(0.5f64..processes as f64 + 0.5, 0f64..most as f64 * 1.1)
            .map_err(err())?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(processes + 1)
            .x_label_formatter(&|x| {
                if (x - x.round()).abs() < 1e-9 && *x >= 1.0 {
                    format!("{}", x.round() as u64)
                } else {
                    String::new()
                }
            })
            .x_desc("worker process")
            .y_desc("acquisitions")
            .label_style(("sans-serif", 16))
            .axis_desc_style(("sans-serif", 17))
            .y_label_formatter(&|y| format!("{y:.0}"))
            .draw()
            .map_err(err())?;
        let width = 0.8 / series.len().max(1) as f64;
        for (s, (label, counts)) in series.iter().enumerate() {
            let style = colour(s).filled();
            let bars = counts.iter().enumerate().map(move |(p, &n)| {
                let left = (p + 1) as f64 - 0.4 + s as f64 * width;
                Rectangle::new([(left, 0.0), (left + width * 0.9, n as f64)], style)
            });
            chart.draw_series(bars).map_err(err())?;
            entries.push((style, true, label.clone()));
        }
        legend(&bottom, &entries).map_err(err())?;
        root.present().map_err(err())?;
    }
    Ok(svg)
}

/// Checks the pictures on made-up rows: the files, their series and a refused directory
/// (run by the smoke run under `cargo test`: a bench has no test harness).
pub fn self_check() -> Result<(), String> {
    use crate::cases::Sample;
    use crate::report::{self, Kind};

    let sample = |lat: Vec<u64>| Sample {
        ops: lat.len() as u64,
        elapsed: std::time::Duration::from_secs(1),
        per_task: vec![lat.len() as u64],
        lat,
        ..Sample::default()
    };
    let mut rows = report::group(
        "checkstore",
        "handoff",
        Kind::Handoff,
        sample((1..=1000).map(|n| n * 1000).collect()),
        vec![(
            "handoff_raw".to_owned(),
            sample((1..=1000).map(|n| n * 2000).collect()),
        )],
    );
    rows.extend(report::group(
        "checkstore",
        "uncontended",
        Kind::Cycles,
        sample(vec![5000; 10]),
        Vec::new(),
    ));
    let mut processes = report::group(
        "checkstore",
        "processes3",
        Kind::Waits,
        sample(vec![7_000_000; 30]),
        Vec::new(),
    );
    for row in &mut processes {
        let extra = [
            ("acquisitions_per_process", serde_json::json!([11, 10, 9])),
            ("acquisitions_min_over_max", serde_json::json!(0.818)),
        ];
        row.extra.extend(extra.map(|(k, v)| (k.to_owned(), v)));
    }
    rows.extend(processes);

    let dir = std::env::temp_dir().join(format!("lockbench-plot-check-{}", std::process::id()));
    let written = write_all(&dir, &rows);
    let checked = written.and_then(|files| {
        let names: Vec<String> = files
            .iter()
            .filter_map(|f| Some(f.file_name()?.to_str()?.to_owned()))
            .collect();
        let expected = ["wait-cdf-checkstore.svg", "processes3-acquisitions.svg"];
        if names != expected {
            return Err(format!("--plot wrote {names:?}, expected {expected:?}"));
        }
        let read = |name: &str| {
            std::fs::read_to_string(dir.join(name)).map_err(|e| format!("{name}: {e}"))
        };
        let cdf = read("wait-cdf-checkstore.svg")?;
        for needle in [
            "<svg",
            "</svg>",
            "handoff (ours): 1000 waits",
            "handoff_raw: 1000 waits · p50 1.0 ms",
            "processes3 (ours): 30 waits",
            "<polyline",
        ] {
            if !cdf.contains(needle) {
                return Err(format!("wait-cdf-checkstore.svg lacks {needle:?}"));
            }
        }
        if cdf.contains("uncontended") {
            return Err("wait-cdf-checkstore.svg draws a row of cycles".into());
        }
        let bars = read("processes3-acquisitions.svg")?;
        if !bars.contains("checkstore: 30 acquisitions · min/max 0.82")
            || bars.matches("<rect").count() < 4
        {
            return Err("processes3-acquisitions.svg lacks the backend's bars".into());
        }
        Ok(())
    });
    let _ = std::fs::remove_dir_all(&dir);
    checked?;

    // A directory that cannot exist (under a file) is an error naming it, not a panic.
    let file = std::env::temp_dir().join(format!("lockbench-plot-file-{}", std::process::id()));
    std::fs::write(&file, "").map_err(|e| format!("{}: {e}", file.display()))?;
    let refused = write_all(&file.join("img"), &rows);
    let _ = std::fs::remove_file(&file);
    match refused {
        Err(e) if e.contains("cannot create") && e.contains("lockbench-plot-file") => Ok(()),
        other => Err(format!("--plot under a file: {other:?}")),
    }
}
