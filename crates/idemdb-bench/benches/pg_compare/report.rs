//! The summary of a run: lifecycles/s and replay latency from criterion's estimates, the
//! per-lifecycle p99s timed beside them, the CPU per operation, and the drop-stall
//! measurements; PgStore ÷ the hand-written baseline and PgStore ÷ embedded in every
//! comparable row. Printed, and written to
//! `target/bench-results/pg_summary.md` (not in criterion's test mode).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;

use crate::dist::Dist;
use crate::shared::report::{estimate, fmt_val, quantile, table_row, write_machine};
use crate::stall::{CALLERS, StallResult};
use crate::subject::Kind;

/// `"<cell>/<kind>/<name>"` → value, for what criterion does not measure.
static SIDE: Mutex<BTreeMap<String, f64>> = Mutex::new(BTreeMap::new());

pub fn record(cell: &str, kind: Kind, name: &str, value: f64) {
    SIDE.lock()
        .expect("side data")
        .insert(format!("{cell}/{}/{name}", kind.id()), value);
}

fn side(cell: &str, kind: Kind, name: &str) -> Option<f64> {
    SIDE.lock()
        .expect("side data")
        .get(&format!("{cell}/{}/{name}", kind.id()))
        .copied()
}

/// Records that `kind` ran in `cell` in this run (so that criterion's estimate is this run's,
/// not a stale one), and the distribution of its per-operation latencies if any were timed.
pub fn ran(cell: &str, kind: Kind, latencies: &mut [u64]) {
    record(cell, kind, "ran", 1.0);
    if latencies.is_empty() {
        return;
    }
    latencies.sort_unstable();
    let pick = |q: f64| quantile(latencies, q).expect("not empty");
    record(cell, kind, "ops_timed", latencies.len() as f64);
    record(cell, kind, "p50_ns", pick(0.50));
    record(cell, kind, "p99_ns", pick(0.99));
    record(cell, kind, "max_ns", pick(1.0));
    if let Ok(s) = std::fs::read_to_string("/proc/loadavg")
        && let Some(load) = s.split_whitespace().next().and_then(|l| l.parse().ok())
    {
        record(cell, kind, "loadavg_1m_after", load);
    }
}

/// The CPU `used` over `ops` operations of `kind` in `cell`: the machine's and this process's.
pub fn cpu(cell: &str, kind: Kind, used: crate::shared::cpu::Usage, ops: u64) {
    if ops == 0 {
        return;
    }
    let per = |d: std::time::Duration| d.as_secs_f64() * 1e6 / ops as f64;
    record(cell, kind, "cpu_machine_us", per(used.machine));
    record(cell, kind, "cpu_process_us", per(used.process));
}

/// The WAL bytes the server wrote over `ops` operations of `kind` in `cell`.
pub fn wal(cell: &str, kind: Kind, bytes: f64, ops: u64) {
    if ops == 0 {
        return;
    }
    record(cell, kind, "wal_bytes", bytes / ops as f64);
}

/// PgStore's `batches` over a cell's timed loops, answering `batched` of its `calls`: the mean
/// calls per batch, and the share of the calls a batch answered.
pub fn batches(cell: &str, kind: Kind, batches: u64, batched: u64, calls: u64) {
    if batches > 0 {
        record(
            cell,
            kind,
            "calls_per_batch",
            batched as f64 / batches as f64,
        );
    }
    if calls > 0 {
        record(cell, kind, "batched_share", batched as f64 / calls as f64);
    }
}

/// Criterion's median ns per iteration of `kind` in `cell`, if it ran in this run (and this
/// is not criterion's test mode, which measures nothing).
fn median(cell: &str, kind: Kind, test_mode: bool) -> Option<f64> {
    if test_mode || side(cell, kind, "ran").is_none() {
        return None;
    }
    Some(estimate(cell, kind.id())?.median)
}

struct Row {
    cell: String,
    metric: String,
    /// PgStore, the hand-written baseline, embedded.
    vals: [Option<f64>; 3],
    digits: usize,
    ratio: bool,
}

#[derive(Default)]
pub struct Summary {
    rows: Vec<Row>,
}

impl Summary {
    fn row(
        &mut self,
        cell: &str,
        metric: impl Into<String>,
        vals: [Option<f64>; 3],
        digits: usize,
    ) {
        self.rows.push(Row {
            cell: cell.into(),
            metric: metric.into(),
            vals,
            digits,
            ratio: true,
        });
    }

    fn plain(
        &mut self,
        cell: &str,
        metric: impl Into<String>,
        vals: [Option<f64>; 3],
        digits: usize,
    ) {
        self.rows.push(Row {
            cell: cell.into(),
            metric: metric.into(),
            vals,
            digits,
            ratio: false,
        });
    }

    /// The criterion cells' rows.
    pub fn criterion_rows(&mut self, callers: &[usize], replayers: &[usize], test_mode: bool) {
        let all = |f: &dyn Fn(Kind) -> Option<f64>| Kind::ALL.map(f);
        for &n in callers {
            let cell = format!("pg_lifecycle_{n}");
            self.row(
                &cell,
                "lifecycles/s ↑",
                all(&|k| Some(n as f64 * 1e9 / median(&cell, k, test_mode)?)),
                0,
            );
            self.row(
                &cell,
                "p99 lifecycle latency, ms ↓",
                all(&|k| Some(side(&cell, k, "p99_ns")? / 1e6)),
                2,
            );
            self.cpu_rows(&cell, "lifecycle");
            self.row(
                &cell,
                "WAL bytes per lifecycle ↓",
                all(&|k| side(&cell, k, "wal_bytes")),
                0,
            );
            self.batch_rows(&cell);
        }
        for &n in replayers {
            let cell = format!("pg_replay_{n}");
            self.row(
                &cell,
                "replays/s ↑",
                all(&|k| Some(n as f64 * 1e9 / median(&cell, k, test_mode)?)),
                0,
            );
            self.row(
                &cell,
                "median µs per replay ↓",
                all(&|k| Some(side(&cell, k, "p50_ns")? / 1e3)),
                1,
            );
            self.cpu_rows(&cell, "replay");
            self.row(
                &cell,
                "WAL bytes per replay ↓",
                all(&|k| side(&cell, k, "wal_bytes")),
                0,
            );
            self.batch_rows(&cell);
        }
    }

    /// PgStore's batch sizes (no ratio: only PgStore batches).
    fn batch_rows(&mut self, cell: &str) {
        let pg = |name: &str| [side(cell, Kind::Postgres, name), None, None];
        self.plain(cell, "PgStore calls per batch", pg("calls_per_batch"), 1);
        self.plain(
            cell,
            "PgStore share of calls answered by a batch",
            pg("batched_share"),
            2,
        );
    }

    fn cpu_rows(&mut self, cell: &str, what: &str) {
        let all = |f: &dyn Fn(Kind) -> Option<f64>| Kind::ALL.map(f);
        self.row(
            cell,
            format!("CPU µs per {what}, whole machine (bench + server) ↓"),
            all(&|k| side(cell, k, "cpu_machine_us")),
            0,
        );
        self.row(
            cell,
            "… of which the bench process (client side) ↓".to_string(),
            all(&|k| side(cell, k, "cpu_process_us")),
            0,
        );
    }

    /// The drop-stall rows: `[PostgreSQL, embedded]`.
    pub fn stall_rows(&mut self, r: &[StallResult; 2]) {
        let c = "drop_stall";
        let us = |d: &Dist, q: f64| d.q(q).map(|v| v / 1e3);
        let both = |f: &dyn Fn(&StallResult) -> Option<f64>| [f(&r[0]), None, f(&r[1])];
        self.plain(
            c,
            "records due (partitions × records each)",
            both(&|s| Some(s.records as f64)),
            0,
        );
        self.plain(
            c,
            "fill, s (PostgreSQL: API + INSERT … SELECT copies; embedded: API)",
            both(&|s| Some(s.fill_s)),
            1,
        );
        let labels = [
            "1. load alone (before)",
            "2. load beside compact_now",
            "3. load alone (after)",
        ];
        for (i, label) in labels.iter().enumerate() {
            for (q, name) in [(0.5, "p50"), (0.99, "p99"), (1.0, "max")] {
                self.row(
                    c,
                    format!("{label}: reserve {name}, µs ↓"),
                    both(&|s| us(&s.phases[i], q)),
                    0,
                );
            }
            self.plain(
                c,
                format!("{label}: reserves timed"),
                both(&|s| Some(s.phases[i].0.len() as f64)),
                0,
            );
            self.row(
                c,
                format!("{label}: lifecycles/s ↑"),
                both(&|s| Some(s.lifecycles_per_s[i])),
                0,
            );
        }
        self.plain(
            c,
            "2. reserves overlapping the compact_now call",
            both(&|s| Some(s.overlapping.0.len() as f64)),
            0,
        );
        self.row(
            c,
            "… their reserve p50, µs ↓",
            both(&|s| us(&s.overlapping, 0.5)),
            0,
        );
        self.row(
            c,
            "… their reserve p99, µs ↓",
            both(&|s| us(&s.overlapping, 0.99)),
            0,
        );
        self.row(
            c,
            "… their reserve max, µs ↓",
            both(&|s| us(&s.overlapping, 1.0)),
            0,
        );
        self.row(
            c,
            "compact_now total, ms ↓",
            both(&|s| Some(s.compacted.took.as_secs_f64() * 1e3)),
            1,
        );
        self.plain(
            c,
            "… longest detach + drop of one partition, ms",
            both(&|s| Some(s.compacted.longest_drop?.as_secs_f64() * 1e3)),
            1,
        );
        self.plain(
            c,
            "… partitions dropped (checked: none due left; PostgreSQL: gone from pg_class)",
            both(&|s| Some(s.compacted.partitions_dropped as f64)),
            0,
        );
        self.plain(
            c,
            "… partitions created ahead",
            both(&|s| Some(s.compacted.partitions_created? as f64)),
            0,
        );
    }

    pub fn markdown(&self, machine: &[(String, String)]) -> String {
        let mut md = String::new();
        write_machine(&mut md, machine);
        table_row(
            &mut md,
            &[
                "cell",
                "metric (↑ higher is better, ↓ lower)",
                "PgStore",
                "hand-written table",
                "embedded",
                "PgStore ÷ table",
                "PgStore ÷ embedded",
            ],
        );
        let _ = writeln!(md, "|---|---|--:|--:|--:|--:|--:|");
        for r in &self.rows {
            let [a, b, c] = r.vals.map(|v| fmt_val(v, r.digits));
            let ratio = |over: Option<f64>| match (r.ratio, r.vals[0], over) {
                (true, Some(x), Some(y)) if y > 0.0 => fmt_ratio(x / y),
                _ => "–".into(),
            };
            let (to_table, to_embedded) = (ratio(r.vals[1]), ratio(r.vals[2]));
            table_row(
                &mut md,
                &[
                    r.cell.as_str(),
                    &r.metric,
                    &a,
                    &b,
                    &c,
                    &to_table,
                    &to_embedded,
                ],
            );
        }
        let _ = writeln!(
            md,
            "\nCallers are OS threads driving the async `Store` calls with `Handle::block_on` on \
             one multi-thread tokio runtime (2 workers), for every subject; the hand-written table \
             is `INSERT … ON CONFLICT DO NOTHING` (a `SELECT` on conflict) and a guarded \
             `UPDATE`, autocommit, prepared, one connection per caller (benches/shared/pg_table.rs). \
             The drop-stall load has {CALLERS} callers."
        );
        md
    }
}

fn fmt_ratio(r: f64) -> String {
    if r >= 100.0 {
        format!("{r:.0}×")
    } else if r >= 10.0 {
        format!("{r:.1}×")
    } else if r >= 0.01 {
        format!("{r:.2}×")
    } else {
        format!("{r:.4}×")
    }
}
