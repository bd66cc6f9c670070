//! Side measurements (p99s, the load's CPU) and the summary table of a run.
//!
//! Criterion writes its estimates to `target/criterion/<cell>/<engine>/new/estimates.json`;
//! what criterion does not measure is kept here and written to
//! `target/bench-results/side.json`. At the end of a run both are read back and the table is
//! printed and written to `target/bench-results/summary.{md,json}`. Running the bench with a
//! filter that matches nothing (`cargo bench --bench compare -- report-only`) re-prints the
//! table of the last run.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;

use serde_json::{Value, json};

use crate::engines::Kind;
use crate::shared::report::{
    estimate, fmt_val, machine, quantile, table_row, target_dir, write_machine, write_targets,
};

/// `"<cell>/<engine>"` → name → value.
type Side = BTreeMap<String, BTreeMap<String, f64>>;

static SIDE: Mutex<Side> = Mutex::new(BTreeMap::new());

/// Records one side measurement of `engine` in `cell`.
pub fn record(cell: &str, engine: &str, name: &str, value: f64) {
    SIDE.lock()
        .expect("side data")
        .entry(format!("{cell}/{engine}"))
        .or_default()
        .insert(name.to_string(), value);
}

/// Records the distribution of per-operation latencies (ns) of `engine` in `cell`.
/// Records nothing if the benchmark did not run (filtered out).
pub fn record_latencies(cell: &str, engine: &str, latencies: &mut [u64]) {
    if latencies.is_empty() {
        return;
    }
    after_bench(cell, engine);
    latencies.sort_unstable();
    let pick = |q: f64| quantile(latencies, q).expect("not empty");
    let mean = latencies.iter().map(|&l| l as f64).sum::<f64>() / latencies.len() as f64;
    record(cell, engine, "ops_timed", latencies.len() as f64);
    record(cell, engine, "p50_ns", pick(0.50));
    record(cell, engine, "p99_ns", pick(0.99));
    record(cell, engine, "max_ns", pick(1.0));
    record(cell, engine, "mean_ns", mean);
}

/// Notes the machine's 1-minute load average at the end of a benchmark: other work on the
/// machine shows up there.
pub fn after_bench(cell: &str, engine: &str) {
    let load = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<f64>().ok());
    if let Some(load) = load {
        record(cell, engine, "loadavg_1m_after", load);
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Better {
    Higher,
    Lower,
}

struct Row {
    cell: String,
    metric: &'static str,
    better: Better,
    /// idemdb, redb naive, SQLite, SQLite with one shared connection.
    vals: [Option<f64>; 4],
    digits: usize,
}

impl Row {
    fn ratio(&self, baseline: usize) -> Option<f64> {
        // A percentage lost or a CPU share is compared against the target, not as a ratio.
        if self.metric.contains('%') {
            return None;
        }
        Some(self.vals[0]? / self.vals[baseline]?)
    }
}

/// The whole run as rows; missing estimates are left empty.
fn rows(side: &Side) -> Vec<Row> {
    let sidev = |cell: &str, engine: &str, name: &str| -> Option<f64> {
        side.get(&format!("{cell}/{engine}"))?.get(name).copied()
    };
    let per_engine =
        |f: &dyn Fn(&str) -> Option<f64>| -> [Option<f64>; 4] { Kind::ALL.map(|k| f(k.id())) };
    let mut rows = Vec::new();
    let cell = "reserve_1";
    rows.push(Row {
        cell: cell.into(),
        metric: "median latency, µs ↓",
        better: Better::Lower,
        vals: per_engine(&|e| Some(estimate(cell, e)?.median / 1e3)),
        digits: 0,
    });
    rows.push(Row {
        cell: cell.into(),
        metric: "p99 latency, µs ↓",
        better: Better::Lower,
        vals: per_engine(&|e| Some(sidev(cell, e, "p99_ns")? / 1e3)),
        digits: 0,
    });
    for n in [1u32, 4, 16, 64] {
        let cell = format!("lifecycle_{n}");
        rows.push(Row {
            cell: cell.clone(),
            metric: "lifecycles/s ↑",
            better: Better::Higher,
            vals: per_engine(&|e| Some(f64::from(n) * 1e9 / estimate(&cell, e)?.median)),
            digits: 0,
        });
        rows.push(Row {
            cell: cell.clone(),
            metric: "p99 lifecycle latency, ms ↓",
            better: Better::Lower,
            vals: per_engine(&|e| Some(sidev(&cell, e, "p99_ns")? / 1e6)),
            digits: 2,
        });
    }
    for n in [1u32, 64] {
        let cell = format!("execute_{n}");
        rows.push(Row {
            cell: cell.clone(),
            metric: "executes/s ↑",
            better: Better::Higher,
            vals: per_engine(&|e| Some(f64::from(n) * 1e9 / estimate(&cell, e)?.median)),
            digits: 0,
        });
        rows.push(Row {
            cell: cell.clone(),
            metric: "p99 execute latency, ms ↓",
            better: Better::Lower,
            vals: per_engine(&|e| Some(sidev(&cell, e, "p99_ns")? / 1e6)),
            digits: 2,
        });
    }
    for t in [1u32, 2] {
        let cell = format!("replay_{t}");
        rows.push(Row {
            cell: cell.clone(),
            metric: "median ns per replay (per thread) ↓",
            better: Better::Lower,
            vals: per_engine(&|e| Some(estimate(&cell, e)?.median)),
            digits: 0,
        });
        rows.push(Row {
            cell: cell.clone(),
            metric: "replays/s, all threads ↑",
            better: Better::Higher,
            vals: per_engine(&|e| Some(f64::from(t) * 1e9 / estimate(&cell, e)?.median)),
            digits: 0,
        });
    }
    let cell = "replay_1_load64";
    rows.push(Row {
        cell: cell.into(),
        metric: "median ns per replay ↓",
        better: Better::Lower,
        vals: per_engine(&|e| Some(estimate(cell, e)?.median)),
        digits: 0,
    });
    rows.push(Row {
        cell: cell.into(),
        metric: "replays/s ↑",
        better: Better::Higher,
        vals: per_engine(&|e| Some(1e9 / estimate(cell, e)?.median)),
        digits: 0,
    });
    rows.push(Row {
        cell: cell.into(),
        metric: "replay throughput lost vs replay_1, % ↓",
        better: Better::Lower,
        vals: per_engine(&|e| {
            let idle = estimate("replay_1", e)?.median;
            let loaded = estimate(cell, e)?.median;
            Some(100.0 * (1.0 - idle / loaded))
        }),
        digits: 1,
    });
    rows.push(Row {
        cell: cell.into(),
        metric: "CPU the load takes, % of the machine",
        better: Better::Lower,
        vals: per_engine(&|e| Some(100.0 * sidev(cell, e, "load_machine_share")?)),
        digits: 1,
    });
    rows.push(Row {
        cell: cell.into(),
        metric: "the load's lifecycles/s ↑",
        better: Better::Higher,
        vals: per_engine(&|e| sidev(cell, e, "load_lifecycles_per_s")),
        digits: 0,
    });
    rows
}

fn fmt_ratio(r: Option<f64>) -> String {
    match r {
        None => "–".into(),
        Some(r) if r >= 100.0 => format!("{r:.0}×"),
        Some(r) if r >= 10.0 => format!("{r:.1}×"),
        Some(r) => format!("{r:.2}×"),
    }
}

struct Target {
    what: &'static str,
    measured: Option<f64>,
    shown: String,
    met: Option<bool>,
}

fn find<'a>(rows: &'a [Row], cell: &str, metric_prefix: &str) -> Option<&'a Row> {
    rows.iter()
        .find(|r| r.cell == cell && r.metric.starts_with(metric_prefix))
}

fn targets(rows: &[Row]) -> Vec<Target> {
    let ratio_target = |what, cell, metric, baseline, bound: f64, at_least: bool| {
        let r = find(rows, cell, metric).and_then(|r| r.ratio(baseline));
        Target {
            what,
            measured: r,
            shown: fmt_ratio(r),
            met: r.map(|r| if at_least { r >= bound } else { r <= bound }),
        }
    };
    // Issue 14's targets. "Before the log" is idemdb's last run before it (docs/benchmarks.md,
    // 2026-12-03 07:14, 3e4fd55): it cannot run in the same process as this build.
    let absolute = |what, cell, metric, bound: f64| {
        let v = find(rows, cell, metric).and_then(|r| r.vals[0]);
        Target {
            what,
            measured: v,
            shown: v.map_or("–".into(), |v| format!("{v:.0}/s")),
            met: v.map(|v| v >= bound),
        }
    };
    let mut out = vec![
        ratio_target(
            "reserve_1 median below SQLite's",
            "reserve_1",
            "median",
            2,
            1.0,
            false,
        ),
        ratio_target(
            "lifecycle_1 throughput ≥ SQLite's",
            "lifecycle_1",
            "lifecycles/s",
            2,
            1.0,
            true,
        ),
        ratio_target(
            "execute_1 throughput ≥ SQLite's",
            "execute_1",
            "executes/s",
            2,
            1.0,
            true,
        ),
        absolute(
            "lifecycle_64 ≥ 40,000/s (2.5× the 18.0k the issue quotes; 2.8× 14,224/s, the last run before the log)",
            "lifecycle_64",
            "lifecycles/s",
            40_000.0,
        ),
        absolute(
            "execute_64 ≥ 2× before the log (2 × 10.9k the issue quotes = 21,800/s)",
            "execute_64",
            "executes/s",
            21_800.0,
        ),
    ];
    let floor = estimate("reserve_1", "fsync_floor").map(|e| e.median);
    let reserve = estimate("reserve_1", "idemdb").map(|e| e.median);
    let vs_floor = reserve.zip(floor).map(|(a, b)| a / b);
    out.insert(
        0,
        Target {
            what: "reserve_1 median ≤ 1.2× the fsync floor measured in the same run",
            measured: vs_floor,
            shown: fmt_ratio(vs_floor),
            met: vs_floor.map(|r| r <= 1.2),
        },
    );
    let replay = find(rows, "replay_1", "median").and_then(|r| r.vals[0]);
    out.push(Target {
        what: "replay_1 median ≤ 1.5 µs",
        measured: replay,
        shown: replay.map_or("–".into(), |v| format!("{:.2} µs", v / 1e3)),
        met: replay.map(|v| v <= 1500.0),
    });
    let lost = find(rows, "replay_1_load64", "replay throughput lost").and_then(|r| r.vals[0]);
    let share = find(rows, "replay_1_load64", "CPU the load").and_then(|r| r.vals[0]);
    out.push(Target {
        what: "replay under a 64-caller write load loses no more than the CPU share the load takes",
        measured: lost,
        shown: match (lost, share) {
            (Some(l), Some(s)) => format!("lost {l:.1}% vs load {s:.1}% of the machine"),
            _ => "–".into(),
        },
        met: lost.zip(share).map(|(l, s)| l <= s),
    });
    out
}

/// Saves the side data of this run (merged over the last run's), then prints and writes the
/// summary. In criterion's test mode nothing is measured, so nothing is written.
pub fn finish(test_mode: bool) {
    if test_mode {
        println!("(test mode: every benchmark ran once; no summary)");
        return;
    }
    let dir = target_dir().join("bench-results");
    std::fs::create_dir_all(&dir).expect("create target/bench-results");
    let side_path = dir.join("side.json");
    let mut side: Side = std::fs::read_to_string(&side_path)
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or_default();
    // Field by field: a filtered run replaces only what it measured.
    for (k, v) in SIDE.lock().expect("side data").iter() {
        side.entry(k.clone()).or_default().extend(v.clone());
    }
    std::fs::write(
        &side_path,
        serde_json::to_string_pretty(&side).expect("json"),
    )
    .expect("write side.json");

    let rows = rows(&side);
    let targets = targets(&rows);
    let mut md = String::new();
    write_machine(&mut md, &machine());
    table_row(
        &mut md,
        &[
            "cell",
            "metric (↑ higher is better, ↓ lower)",
            "idemdb",
            "redb naive",
            "SQLite",
            "SQLite, 1 shared conn",
            "idemdb ÷ naive",
            "idemdb ÷ SQLite",
            "idemdb ÷ SQLite 1 conn",
        ],
    );
    let _ = writeln!(md, "|---|---|--:|--:|--:|--:|--:|--:|--:|");
    for r in &rows {
        let [a, b, c, d] = r.vals.map(|v| fmt_val(v, r.digits));
        let ratios = [1, 2, 3].map(|i| fmt_ratio(r.ratio(i)));
        table_row(
            &mut md,
            &[
                r.cell.as_str(),
                r.metric,
                a.as_str(),
                b.as_str(),
                c.as_str(),
                d.as_str(),
                ratios[0].as_str(),
                ratios[1].as_str(),
                ratios[2].as_str(),
            ],
        );
    }
    let floor_median = estimate("reserve_1", "fsync_floor").map(|e| e.median);
    let floor_p99 = side
        .get("reserve_1/fsync_floor")
        .and_then(|m| m.get("p99_ns"))
        .copied();
    let idem_reserve = estimate("reserve_1", "idemdb").map(|e| e.median);
    let _ = writeln!(
        md,
        "\nfsync floor (4 KiB pwrite into a preallocated file + fdatasync), in the reserve_1 cell: \
         median {} µs, p99 {} µs; idemdb's reserve median is {} the floor.",
        fmt_val(floor_median.map(|v| v / 1e3), 0),
        fmt_val(floor_p99.map(|v| v / 1e3), 0),
        fmt_ratio(idem_reserve.zip(floor_median).map(|(a, b)| a / b)),
    );
    let busy = side
        .get("run/sqlite")
        .and_then(|m| m.get("busy_retries"))
        .copied()
        .unwrap_or(0.0);
    let _ = writeln!(
        md,
        "SQLite calls retried after SQLITE_BUSY outlived busy_timeout: {busy:.0}."
    );
    write_targets(
        &mut md,
        targets.iter().map(|t| (t.what, t.shown.as_str(), t.met)),
    );
    println!("\n{md}");
    std::fs::write(dir.join("summary.md"), &md).expect("write summary.md");

    let json_rows: Vec<Value> = rows
        .iter()
        .map(|r| {
            json!({
                "cell": r.cell,
                "metric": r.metric,
                "higher_is_better": r.better == Better::Higher,
                "idemdb": r.vals[0],
                "redb_naive": r.vals[1],
                "sqlite": r.vals[2],
                "sqlite_shared": r.vals[3],
                "idemdb_over_naive": r.ratio(1),
                "idemdb_over_sqlite": r.ratio(2),
                "idemdb_over_sqlite_shared": r.ratio(3),
            })
        })
        .collect();
    let mut estimates = serde_json::Map::new();
    for cell in [
        "reserve_1",
        "lifecycle_1",
        "lifecycle_4",
        "lifecycle_16",
        "lifecycle_64",
        "execute_1",
        "execute_64",
        "replay_1",
        "replay_2",
        "replay_1_load64",
    ] {
        for bench in [
            "idemdb",
            "redb_naive",
            "sqlite",
            "sqlite_shared",
            "fsync_floor",
        ] {
            if let Some(e) = estimate(cell, bench) {
                estimates.insert(
                    format!("{cell}/{bench}"),
                    json!({
                        "median_ns_per_iter": e.median,
                        "median_ci95": [e.median_lo, e.median_hi],
                        "mean_ns_per_iter": e.mean,
                    }),
                );
            }
        }
    }
    let json = json!({
        "machine": machine().into_iter().collect::<BTreeMap<_, _>>(),
        "rows": json_rows,
        "targets": targets.iter().map(|t| json!({
            "target": t.what, "measured": t.measured, "shown": t.shown, "met": t.met,
        })).collect::<Vec<_>>(),
        "criterion_estimates": estimates,
        "side": side,
    });
    std::fs::write(
        dir.join("summary.json"),
        serde_json::to_string_pretty(&json).expect("json"),
    )
    .expect("write summary.json");
    println!("written: {}", dir.join("summary.md").display());
}
