//! The tail report: the floor's distribution and each workload's, the target for each, the
//! slow calls beside the checkpoints taken, and the load on the machine; printed and written to
//! `target/bench-results/tail.{md,json}`.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use idemdb::{HISTOGRAM_BUCKETS, Histogram};
use serde_json::{Value, json};

use crate::run::{Run, Setup, Workload};
use crate::shared::report::{
    fmt_val, machine, quantile, table_row, target_dir, write_machine, write_targets,
};

/// Issue 24: reserve p99.9 ≤ this many floor medians.
const TARGET_RATIO: f64 = 5.0;
/// Slower than this is a stall, not noise: a checkpoint stall is 10–30 ms.
const STALL_NS: u64 = 5_000_000;

/// The machine's 1-minute load average, if /proc says.
pub fn loadavg_1m() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// A distribution's summary, in µs; `None` where nothing was timed.
struct Dist {
    ops: usize,
    p50: Option<f64>,
    p99: Option<f64>,
    p999: Option<f64>,
    p9999: Option<f64>,
    max: Option<f64>,
}

impl Dist {
    fn of(latencies: &mut [u64]) -> Dist {
        latencies.sort_unstable();
        let us = |q: f64| quantile(latencies, q).map(|ns| ns / 1e3);
        Dist {
            ops: latencies.len(),
            p50: us(0.50),
            p99: us(0.99),
            p999: us(0.999),
            p9999: us(0.9999),
            max: us(1.0),
        }
    }

    fn row(&self, md: &mut String, name: &str) {
        let cells = [self.p50, self.p99, self.p999, self.p9999, self.max];
        let mut row = vec![name.to_string(), fmt_val(Some(self.ops as f64), 0)];
        row.extend(cells.map(|v| fmt_val(v, 0)));
        table_row(md, &row);
    }

    fn json(&self) -> Value {
        json!({
            "ops": self.ops, "p50_us": self.p50, "p99_us": self.p99, "p99_9_us": self.p999,
            "p99_99_us": self.p9999, "max_us": self.max,
        })
    }
}

/// What was recorded between two snapshots of one histogram.
fn since(after: &Histogram, before: &Histogram) -> Histogram {
    let mut buckets = [0; HISTOGRAM_BUCKETS];
    for (i, b) in buckets.iter_mut().enumerate() {
        *b = after.buckets[i].saturating_sub(before.buckets[i]);
    }
    Histogram {
        buckets,
        count: after.count.saturating_sub(before.count),
        sum: after.sum.saturating_sub(before.sum),
    }
}

pub fn finish(
    test_mode: bool,
    mut floor: Vec<u64>,
    runs: Vec<Run>,
    setup: Setup,
    (load_start, load_end): (Option<f64>, Option<f64>),
) {
    if floor.is_empty() && runs.is_empty() {
        println!("(nothing measured: no report)");
        return;
    }
    let floor = Dist::of(&mut floor);
    let mut md = String::new();
    write_machine(&mut md, &machine());
    let load = |l: Option<f64>| fmt_val(l, 2);
    let width = setup.width.map_or_else(
        || "the store's default".to_string(),
        |w| format!("{} ms", w.as_millis()),
    );
    let _ = writeln!(
        md,
        "Each idemdb run: {} s; partition width: {width}.",
        setup.run_time.as_secs()
    );
    let _ = writeln!(
        md,
        "1-minute load average: {} at start, {} at end.{}\n",
        load(load_start),
        load(load_end),
        if test_mode {
            " Test mode: every benchmark ran once."
        } else {
            ""
        },
    );
    table_row(
        &mut md,
        &[
            "one caller",
            "ops",
            "p50 µs",
            "p99 µs",
            "p99.9 µs",
            "p99.99 µs",
            "max µs",
        ],
    );
    let _ = writeln!(md, "|---|--:|--:|--:|--:|--:|--:|");
    floor.row(&mut md, "fsync floor (4 KiB pwrite + fdatasync)");

    let mut json = json!({
        "test_mode": test_mode,
        "machine": machine().into_iter().collect::<BTreeMap<_, _>>(),
        "loadavg_1m": { "start": load_start, "end": load_end },
        "run_s": setup.run_time.as_secs(),
        "partition_width_ms": setup.width.map(|w| w.as_millis() as u64),
        "fsync_floor": floor.json(),
    });
    if runs.is_empty() {
        let _ = writeln!(md, "\n(no idemdb benchmark ran.)");
        return write(&md, &json);
    }
    let bound_ns = floor.p50.map(|f| f * 1e3 * TARGET_RATIO);
    let mut summaries = Vec::new();
    for mut run in runs {
        let reserves = Summary::of(&mut run.reserves, bound_ns);
        reserves
            .dist
            .row(&mut md, &format!("{}: reserve", run_label(run.workload)));
        let completes = (!run.completes.is_empty()).then(|| {
            let c = Summary::of(&mut run.completes, bound_ns);
            c.dist
                .row(&mut md, &format!("{}: complete", run_label(run.workload)));
            c
        });
        summaries.push((run, reserves, completes));
    }

    // One caller's p99.9 against the floor, each workload a row of its own: (target, shown,
    // ratio, met).
    let ratios: Vec<(String, String, Option<f64>, Option<bool>)> = summaries
        .iter()
        .map(|(run, reserves, _)| {
            let ratio = reserves.dist.p999.zip(floor.p50).map(|(p, f)| p / f);
            let what = format!(
                "reserve p99.9 ≤ 5× the fsync floor's median (1 caller, {} s; {})",
                setup.run_time.as_secs(),
                run_label(run.workload)
            );
            let shown = ratio.map_or_else(|| "–".into(), |r| format!("{r:.2}×"));
            // One call each in test mode: no verdict.
            let met = ratio.filter(|_| !test_mode).map(|r| r <= TARGET_RATIO);
            (what, shown, ratio, met)
        })
        .collect();
    write_targets(
        &mut md,
        ratios
            .iter()
            .map(|(what, shown, _, met)| (what.as_str(), shown.as_str(), *met)),
    );

    // The disk's own share of the tail: the floor alone against its median.
    let floor_ratio = floor.p999.zip(floor.p50).map(|(p, f)| p / f);
    let _ = writeln!(
        md,
        "\nThe floor's own p99.9 is {} its median, in the same run: what the disk alone gives.",
        floor_ratio.map_or_else(|| "–".into(), |r| format!("{r:.2}×")),
    );

    let mut targets = Vec::new();
    for ((run, reserves, completes), (what, _, ratio, met)) in summaries.iter().zip(&ratios) {
        let key = run.workload.bench();
        json[key] = run_details(&mut md, run, reserves, completes.as_ref());
        targets.push(json!({
            "target": what,
            "p99_9_over_floor_median": ratio,
            "met": met,
        }));
    }
    json["targets"] = json!(targets);
    json["floor_p99_9_over_floor_median"] = json!(floor_ratio);
    write(&md, &json);
}

/// How a workload is named in the report.
fn run_label(workload: Workload) -> &'static str {
    match workload {
        Workload::Lifecycles => "lifecycles (reserve + complete)",
        Workload::Reserves => "reserves never completed",
    }
}

/// A distribution and how many of its calls were slow.
struct Summary {
    dist: Dist,
    /// Slower than 5× the floor's median (`None`: no floor was measured).
    slow_floor: Option<usize>,
    /// Slower than [`STALL_NS`].
    slow_stall: usize,
}

impl Summary {
    fn of(latencies: &mut [u64], bound_ns: Option<f64>) -> Summary {
        let slow_floor = bound_ns.map(|b| latencies.iter().filter(|&&l| l as f64 > b).count());
        let slow_stall = latencies.iter().filter(|&&l| l > STALL_NS).count();
        Summary {
            dist: Dist::of(latencies),
            slow_floor,
            slow_stall,
        }
    }

    fn json(&self) -> Value {
        let mut v = self.dist.json();
        v["slower_than_5x_floor_median"] = json!(self.slow_floor);
        v["slower_than_5ms"] = json!(self.slow_stall);
        v
    }
}

/// One run's paragraph (calls, slow calls, commits, checkpoints) and its JSON.
fn run_details(
    md: &mut String,
    run: &Run,
    reserves: &Summary,
    completes: Option<&Summary>,
) -> Value {
    let checkpoints = run.after.checkpoints.saturating_sub(run.before.checkpoints);
    let commits = run.after.commits.saturating_sub(run.before.commits);
    let took = since(
        &run.after.checkpoint_latency_us,
        &run.before.checkpoint_latency_us,
    );
    // The histogram has log2 buckets: a quantile is known only up to its bucket's top.
    let (ck_p50, ck_max) = if took.count > 0 {
        (
            Some(took.quantile_upper_bound(0.5) as f64),
            Some(took.quantile_upper_bound(1.0) as f64),
        )
    } else {
        (None, None)
    };
    let wall = run.wall.as_secs_f64();
    let slow = |s: &Summary| s.slow_floor.map_or_else(|| "–".into(), |n| n.to_string());
    let completes_said = completes.map_or_else(String::new, |c| {
        format!(
            " Completes: {} slower than 5× the floor's median, {} slower than 5 ms.",
            slow(c),
            c.slow_stall
        )
    });
    let _ = writeln!(
        md,
        "\n{} over {wall:.1} s ({:.1} s of samples after criterion's warm-up, both timed): \
         {} reserves in {} commits; {} slower than 5× the floor's median, {} slower than 5 \
         ms.{completes_said} Samples are time slices: criterion asked for {} iterations, {} \
         ran.",
        run_label(run.workload),
        run.measured.as_secs_f64(),
        fmt_val(Some(reserves.dist.ops as f64), 0),
        fmt_val(Some(commits as f64), 0),
        slow(reserves),
        reserves.slow_stall,
        fmt_val(Some(run.planned as f64), 0),
        fmt_val(Some(run.ran as f64), 0),
    );
    let _ = writeln!(
        md,
        "Checkpoints taken: {checkpoints}; {} timed on their own (by size or age): mean {} µs, \
         p50 ≤ {} µs, max ≤ {} µs (log2 buckets: the bound is the bucket's top).",
        took.count,
        fmt_val((took.count > 0).then(|| took.mean()), 0),
        fmt_val(ck_p50, 0),
        fmt_val(ck_max, 0),
    );
    json!({
        "reserve": reserves.json(),
        "complete": completes.map(Summary::json),
        "wall_s": wall,
        "commits": commits,
        "samples_s": run.measured.as_secs_f64(),
        "iterations_asked": run.planned,
        "iterations_ran": run.ran,
        "checkpoints": {
            "taken": checkpoints,
            "timed": took.count,
            "mean_us": (took.count > 0).then(|| took.mean()),
            "p50_us_at_most": ck_p50,
            "max_us_at_most": ck_max,
            "latency_us_log2_buckets": took.buckets.to_vec(),
        },
    })
}

fn write(md: &str, json: &Value) {
    println!("\n{md}");
    let dir = target_dir().join("bench-results");
    std::fs::create_dir_all(&dir).expect("create target/bench-results");
    std::fs::write(dir.join("tail.md"), md).expect("write tail.md");
    std::fs::write(
        dir.join("tail.json"),
        serde_json::to_string_pretty(json).expect("json"),
    )
    .expect("write tail.json");
    println!("written: {}", dir.join("tail.md").display());
}
