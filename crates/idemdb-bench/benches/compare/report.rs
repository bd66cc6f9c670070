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
use crate::pool::Spent;
use crate::shared::report::{
    estimate, fmt_val, machine, quantile, table_row, target_dir, write_machine, write_targets,
};

/// The side entries of `reserve_1`'s `idemdb_beside_floor`: `"<PAIRED>/fsync_floor"` and
/// `"<PAIRED>/idemdb"`, each op's latency.
pub const PAIRED: &str = "reserve_1_interleaved";

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

/// Records what a pool of `engine`'s callers spent in `cell`: CPU per operation (this
/// process's, the server's) and the share of the machine that was busy with it.
pub fn record_spent(cell: &str, engine: &str, spent: Spent) {
    if spent.ops == 0 || spent.wall.is_zero() {
        return;
    }
    let per_op = |d: std::time::Duration| d.as_secs_f64() * 1e6 / spent.ops as f64;
    let nproc = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let total = spent.process + spent.servers;
    record(cell, engine, "cpu_us_per_op", per_op(total));
    record(cell, engine, "cpu_server_us_per_op", per_op(spent.servers));
    record(
        cell,
        engine,
        "cpu_machine_share",
        total.as_secs_f64() / spent.wall.as_secs_f64() / nproc,
    );
    let per_op_n = |n: u64| n as f64 / spent.ops as f64;
    let switches = spent.process_switches + spent.server_switches;
    record(cell, engine, "switches_per_op", per_op_n(switches));
    record(
        cell,
        engine,
        "server_switches_per_op",
        per_op_n(spent.server_switches),
    );
    if let Some(commits) = spent.commits {
        record(cell, engine, "commits_per_op", per_op_n(commits));
    }
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
    /// Per engine, in `Kind::ALL`'s order: idemdb first.
    vals: [Option<f64>; 7],
    digits: usize,
}

impl Row {
    fn ratio(&self, baseline: usize) -> Option<f64> {
        // A percentage lost or a CPU share is compared against the target, not as a ratio;
        // nor is a part of a whole ("of which").
        if self.metric.contains('%') || self.metric.starts_with("… of which") {
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
        |f: &dyn Fn(&str) -> Option<f64>| -> [Option<f64>; 7] { Kind::ALL.map(|k| f(k.id())) };
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
    // The async cells (tasks on one runtime thread) get the same rows as the threads' cells.
    for name in ["lifecycle", "lifecycle_async"] {
        for n in [1u32, 4, 16, 64] {
            let cell = format!("{name}_{n}");
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
            rows.push(Row {
                cell: cell.clone(),
                metric: "CPU per lifecycle, µs (bench process + server) ↓",
                better: Better::Lower,
                vals: per_engine(&|e| sidev(&cell, e, "cpu_us_per_op")),
                digits: 0,
            });
            rows.push(Row {
                cell: cell.clone(),
                metric: "… of which the server's, µs",
                better: Better::Lower,
                vals: per_engine(&|e| sidev(&cell, e, "cpu_server_us_per_op")),
                digits: 0,
            });
            rows.push(Row {
                cell: cell.clone(),
                metric: "CPU busy with it, % of the machine",
                better: Better::Lower,
                vals: per_engine(&|e| Some(100.0 * sidev(&cell, e, "cpu_machine_share")?)),
                digits: 0,
            });
            // The hand-offs: a thread that sleeps until it is woken is switched out once.
            rows.push(Row {
                cell: cell.clone(),
                metric: "context switches per lifecycle (bench process + server) ↓",
                better: Better::Lower,
                vals: per_engine(&|e| sidev(&cell, e, "switches_per_op")),
                digits: 2,
            });
            rows.push(Row {
                cell: cell.clone(),
                metric: "… of which the server's",
                better: Better::Lower,
                vals: per_engine(&|e| sidev(&cell, e, "server_switches_per_op")),
                digits: 2,
            });
            rows.push(Row {
                cell: cell.clone(),
                metric: "writes per durable commit (idemdb: ops per log append)",
                better: Better::Higher,
                vals: per_engine(&|e| Some(2.0 / sidev(&cell, e, "commits_per_op")?)),
                digits: 1,
            });
        }
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

/// Redis's column in `Row::vals`.
const REDIS: usize = 4;
/// Naive redb's column.
const NAIVE: usize = 1;
/// The fsync floor's column: a sync per write per caller.
const FLOOR: usize = 6;

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

/// Issue 24's targets, as ratios measured in this run.
fn targets_24(rows: &[Row], side: &Side) -> Vec<Target> {
    let at_least = |what, cell, metric, baseline, bound: f64| {
        let r = find(rows, cell, metric).and_then(|r| r.ratio(baseline));
        Target {
            what,
            measured: r,
            shown: fmt_ratio(r),
            met: r.map(|r| r >= bound),
        }
    };
    let floor = estimate("reserve_1", "fsync_floor").map(|e| e.median);
    let reserve = estimate("reserve_1", "idemdb").map(|e| e.median);
    let vs_floor = reserve.zip(floor).map(|(a, b)| a / b);
    let p50 = |engine: &str| {
        side.get(&format!("{PAIRED}/{engine}"))?
            .get("p50_ns")
            .copied()
    };
    let paired = p50("idemdb").zip(p50("fsync_floor"));
    // Two durable writes per lifecycle, each at the floor at best.
    let lifecycle_1_row = find(rows, "lifecycle_1", "lifecycles/s");
    let lifecycle_1 = lifecycle_1_row.and_then(|r| r.vals[0]);
    let of_two_floors = lifecycle_1.zip(floor).map(|(l, f)| l * 2.0 * f / 1e9);
    // The same against the floor's own lifecycles (two syncs each) in the cell, seconds apart.
    let in_cell = lifecycle_1_row.and_then(|r| r.ratio(FLOOR));
    let p99 = find(rows, "lifecycle_64", "p99").and_then(|r| r.vals[0].zip(r.vals[REDIS]));
    // Reported, not bounded: idemdb's CPU per lifecycle, beside Redis's in the same cell.
    let cpu_reported = |what, cell| {
        let row = find(rows, cell, "CPU per lifecycle");
        let idem = row.and_then(|r| r.vals[0]);
        let redis = row.and_then(|r| r.vals[REDIS]);
        Target {
            what,
            measured: idem,
            shown: match (idem, redis) {
                (Some(i), Some(r)) => format!("{i:.0} µs vs Redis {r:.0} µs"),
                (Some(i), None) => format!("{i:.0} µs"),
                _ => "–".into(),
            },
            met: idem.map(|_| true),
        }
    };
    vec![
        at_least(
            "lifecycle_1 ≥ SQLite's",
            "lifecycle_1",
            "lifecycles/s",
            2,
            1.0,
        ),
        Target {
            what: "lifecycle_1 ≥ 0.85× of two fsync floors (1 s ÷ 2 floor medians)",
            measured: of_two_floors,
            shown: fmt_ratio(of_two_floors),
            met: of_two_floors.map(|r| r >= 0.85),
        },
        Target {
            what: "lifecycle_1 ≥ 0.85× of two fsync floors, the floor's lifecycles run in the cell right before idemdb's",
            measured: in_cell,
            shown: fmt_ratio(in_cell),
            met: in_cell.map(|r| r >= 0.85),
        },
        Target {
            what: "reserve_1 median ≤ 1.1× the fsync floor",
            measured: vs_floor,
            shown: fmt_ratio(vs_floor),
            met: vs_floor.map(|r| r <= 1.1),
        },
        Target {
            what: "reserve_1 median ≤ 1.1× the fsync floor, the two interleaved op by op",
            measured: paired.map(|(a, b)| a / b),
            shown: paired.map_or("–".into(), |(a, b)| {
                format!("{:.2}× ({:.0} µs vs {:.0} µs)", a / b, a / 1e3, b / 1e3)
            }),
            met: paired.map(|(a, b)| a / b <= 1.1),
        },
        at_least(
            "lifecycle_4 ≥ 1.5× Redis always",
            "lifecycle_4",
            "lifecycles/s",
            REDIS,
            1.5,
        ),
        at_least(
            "lifecycle_16 ≥ 1.5× Redis always",
            "lifecycle_16",
            "lifecycles/s",
            REDIS,
            1.5,
        ),
        at_least(
            "lifecycle_64 ≥ 2× Redis always",
            "lifecycle_64",
            "lifecycles/s",
            REDIS,
            2.0,
        ),
        Target {
            what: "lifecycle_64 p99 ≤ Redis always's",
            measured: p99.map(|(a, b)| a / b),
            shown: p99.map_or("–".into(), |(a, b)| format!("{a:.2} ms vs {b:.2} ms")),
            met: p99.map(|(a, b)| a <= b),
        },
        at_least(
            "lifecycle_async_4 ≥ 1.5× Redis always (async API: tasks on one runtime thread)",
            "lifecycle_async_4",
            "lifecycles/s",
            REDIS,
            1.5,
        ),
        at_least(
            "lifecycle_async_16 ≥ 1.5× Redis always (async API)",
            "lifecycle_async_16",
            "lifecycles/s",
            REDIS,
            1.5,
        ),
        at_least(
            "lifecycle_async_64 ≥ 2× Redis always (async API)",
            "lifecycle_async_64",
            "lifecycles/s",
            REDIS,
            2.0,
        ),
        cpu_reported(
            "lifecycle_async_1 CPU per lifecycle reported (bench process + server)",
            "lifecycle_async_1",
        ),
        cpu_reported(
            "lifecycle_async_64 CPU per lifecycle reported (bench process + server)",
            "lifecycle_async_64",
        ),
        at_least(
            "replay_1 ≥ 2× raw redb (replays/s)",
            "replay_1",
            "replays/s",
            NAIVE,
            2.0,
        ),
    ]
}

/// Each lifecycle cell against its floor: how far each engine shares syncs between callers.
fn write_disk_bound(md: &mut String, rows: &[Row]) {
    let _ = writeln!(
        md,
        "\nLifecycles/s against the floor at as many callers (each caller's own 4 KiB pwrite + \
         fdatasync per write, two per lifecycle, every caller its own file; above 1× an engine \
         shares syncs between callers):\n"
    );
    table_row(
        md,
        &[
            "callers",
            "floor, lifecycles/s",
            "idemdb ÷ floor",
            "Redis ÷ floor",
        ],
    );
    let _ = writeln!(md, "|--:|--:|--:|--:|");
    for n in [1, 4, 16, 64] {
        let Some(row) = find(rows, &format!("lifecycle_{n}"), "lifecycles/s") else {
            continue;
        };
        let of = |i: usize| row.vals[i].zip(row.vals[FLOOR]).map(|(a, f)| a / f);
        table_row(
            md,
            &[
                n.to_string(),
                fmt_val(row.vals[FLOOR], 0),
                fmt_ratio(of(0)),
                fmt_ratio(of(REDIS)),
            ],
        );
    }
}

/// Saves the side data of this run (merged over the last run's), then prints and writes the
/// summary. In criterion's test mode nothing is measured, so nothing is written.
pub fn finish(test_mode: bool, servers: &[(String, String)]) {
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
    let targets_24 = targets_24(&rows, &side);
    let mut md = String::new();
    let mut about = machine();
    about.extend(servers.iter().cloned());
    write_machine(&mut md, &about);
    table_row(
        &mut md,
        &[
            "cell",
            "metric (↑ higher is better, ↓ lower)",
            "idemdb",
            "redb naive",
            "SQLite",
            "SQLite, 1 shared conn",
            "Redis always",
            "PostgreSQL table",
            "fsync floor, a sync per write per caller",
            "idemdb ÷ naive",
            "idemdb ÷ SQLite",
            "idemdb ÷ SQLite 1 conn",
            "idemdb ÷ Redis",
            "idemdb ÷ PostgreSQL",
            "idemdb ÷ floor",
        ],
    );
    let _ = writeln!(
        md,
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"
    );
    for r in &rows {
        let mut cells = vec![r.cell.clone(), r.metric.to_string()];
        cells.extend(r.vals.map(|v| fmt_val(v, r.digits)));
        cells.extend((1..Kind::ALL.len()).map(|i| fmt_ratio(r.ratio(i))));
        table_row(&mut md, &cells);
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
    write_disk_bound(&mut md, &rows);
    let busy = side
        .get("run/sqlite")
        .and_then(|m| m.get("busy_retries"))
        .copied()
        .unwrap_or(0.0);
    let _ = writeln!(
        md,
        "SQLite calls retried after SQLITE_BUSY outlived busy_timeout: {busy:.0}."
    );
    let _ = writeln!(md, "\nIssue 14's targets:");
    write_targets(
        &mut md,
        targets.iter().map(|t| (t.what, t.shown.as_str(), t.met)),
    );
    let _ = writeln!(md, "\nIssue 24's targets (ratios in this run):");
    write_targets(
        &mut md,
        targets_24.iter().map(|t| (t.what, t.shown.as_str(), t.met)),
    );
    println!("\n{md}");
    std::fs::write(dir.join("summary.md"), &md).expect("write summary.md");

    let json_rows: Vec<Value> = rows
        .iter()
        .map(|r| {
            let mut row = json!({
                "cell": r.cell,
                "metric": r.metric,
                "higher_is_better": r.better == Better::Higher,
            });
            for (i, kind) in Kind::ALL.iter().enumerate() {
                row[kind.id()] = json!(r.vals[i]);
                if i > 0 {
                    row[format!("idemdb_over_{}", kind.id())] = json!(r.ratio(i));
                }
            }
            row
        })
        .collect();
    let mut estimates = serde_json::Map::new();
    for cell in [
        "reserve_1",
        "lifecycle_1",
        "lifecycle_4",
        "lifecycle_16",
        "lifecycle_64",
        "lifecycle_async_1",
        "lifecycle_async_4",
        "lifecycle_async_16",
        "lifecycle_async_64",
        "execute_1",
        "execute_64",
        "replay_1",
        "replay_2",
        "replay_1_load64",
    ] {
        for bench in Kind::ALL.map(Kind::id) {
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
        "targets": targets.iter().chain(&targets_24).map(|t| json!({
            "target": t.what, "measured": t.measured, "shown": t.shown, "met": t.met,
        })).collect::<Vec<_>>(),
        "servers": servers.iter().cloned().collect::<BTreeMap<_, _>>(),
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
