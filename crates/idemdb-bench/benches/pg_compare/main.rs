//! The PostgreSQL store (`idemdb_postgres::PgStore`) against the table a user would write by hand on
//! the same server (`shared/pg_table.rs`, issue 22) and the embedded engine (`IdemDb`), in one run.
//!
//! All three are driven the same way: callers are OS threads, each driving the async
//! `idemdb::Store` calls to completion with `Handle::block_on` on one shared multi-thread
//! tokio runtime (2 workers, where PgStore's connections also run). PostgreSQL is the test
//! server of `idemdb_testkit::postgres` (`$IDEMDB_TEST_PG`, else a throwaway cluster for the
//! process: fsync on, default `synchronous_commit`), a fresh database per cell; the embedded
//! engine a fresh file per cell under the system's temp dir. Every write is durable.
//!
//! Criterion cells (sample size 10, warm-up 1 s, 3 s, flat sampling):
//! - `pg_lifecycle_{1,4,16,64}`: reserve + complete of fresh keys by N caller threads (one
//!   criterion iteration = one lifecycle on each thread), PgStore's pool and the baseline
//!   holding N connections; the CPU the whole machine (bench and server) and this process
//!   spent per lifecycle, from /proc, over the cell; for both PostgreSQL subjects, the WAL
//!   bytes the server wrote per lifecycle over the timed loops (`pg_current_wal_lsn()`);
//! - `pg_replay_{1,4}`: reserve of a completed key (one of 2,000 preloaded), by 1 and 4
//!   callers.
//!
//! Then, outside criterion, the drop stall (`stall.rs`): 48 due time partitions of 3,000
//! records each, dropped by one `compact_now()` while 64 callers run lifecycles, for both
//! stores, every reserve timed.
//!
//! Run: `cargo bench --bench pg_compare` (about 3 min on the 2-vCPU VM); the summary with
//! PgStore ÷ baseline and PgStore ÷ embedded ratios is printed at the end and written to
//! `target/bench-results/pg_summary.md`. A criterion filter (`-- pg_lifecycle_64`) runs the
//! matching cells only, and the drop stall only if `drop_stall` matches it. In criterion's
//! test mode (`cargo test --benches`) every cell runs once, the stall on tiny sizes with its
//! checks, and nothing is written.

mod callers;
mod dist;
mod report;
#[path = "../shared/mod.rs"]
mod shared;
mod stall;
mod subject;
mod table;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkGroup, Criterion, SamplingMode, Throughput, measurement::WallTime};
use idemdb::{Retention, Scope};
use tokio::runtime::{Handle, Runtime};

use callers::{Callers, Op};
use shared::cpu;
use shared::keys::{OPERATION, PRINCIPAL};
use shared::report::target_dir;
use subject::{Kind, Opened, parallel};

/// Caller threads of the lifecycle cells.
const CALLERS: [usize; 4] = [1, 4, 16, 64];
/// Caller threads of the replay cells.
const REPLAY_CALLERS: [usize; 2] = [1, 4];
/// Completed records preloaded for the replay cell.
const REPLAY_KEYS: u64 = 2_000;
const REPLAY_KEYS_TEST: u64 = 50;

fn main() {
    let test_mode = shared::is_test_mode();
    let started = Instant::now();
    let mut c = shared::criterion(10, Duration::from_secs(3));
    let root = shared::temp_root("idemdb-pg-bench-");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");

    for n in CALLERS {
        lifecycle(&mut c, &rt, root.path(), n);
    }
    let keys = if test_mode {
        REPLAY_KEYS_TEST
    } else {
        REPLAY_KEYS
    };
    for n in REPLAY_CALLERS {
        replay(&mut c, &rt, root.path(), keys, n);
    }
    c.final_summary();

    let mut summary = report::Summary::default();
    summary.criterion_rows(&CALLERS, &REPLAY_CALLERS, test_mode);
    if runs_stall() {
        let sizes = if test_mode {
            &stall::TINY
        } else {
            &stall::FULL
        };
        let results = Kind::BOTH.map(|k| stall::stall(k, rt.handle(), root.path(), sizes));
        summary.stall_rows(&results);
    }

    let mut machine = shared::report::machine();
    machine.extend(subject::pg_settings(rt.handle(), root.path()));
    machine.push(("commit".into(), commit()));
    machine.push(("run finished (UTC)".into(), utc_now()));
    machine.push((
        "whole run".into(),
        format!("{:.0} s", started.elapsed().as_secs_f64()),
    ));
    let md = summary.markdown(&machine);
    println!("\n{md}");
    if test_mode {
        println!("(test mode: every cell ran once, the stall on tiny sizes; nothing written)");
        return;
    }
    let dir = target_dir().join("bench-results");
    std::fs::create_dir_all(&dir).expect("create target/bench-results");
    std::fs::write(dir.join("pg_summary.md"), &md).expect("write pg_summary.md");
    println!("written: {}", dir.join("pg_summary.md").display());
}

/// Whether the drop stall runs: always, unless a criterion filter is given that
/// `drop_stall` does not match (as a substring).
fn runs_stall() -> bool {
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    filters.is_empty() || filters.iter().any(|f| "drop_stall".contains(f.as_str()))
}

fn group<'a>(c: &'a mut Criterion, name: &str, ops_per_iter: u64) -> BenchmarkGroup<'a, WallTime> {
    let mut g = c.benchmark_group(name);
    // PostgreSQL's operations take ms: equal iteration counts per sample keep every cell
    // within its few seconds.
    g.sampling_mode(SamplingMode::Flat);
    g.throughput(Throughput::Elements(ops_per_iter));
    g
}

fn default_retention() -> Retention {
    Retention::default()
}

/// `threads` callers each running lifecycles of fresh keys, on each subject.
fn lifecycle(c: &mut Criterion, rt: &Runtime, root: &Path, threads: usize) {
    let cell = format!("pg_lifecycle_{threads}");
    let scope = Scope::new(OPERATION, PRINCIPAL);
    cell_of_callers(c, rt.handle(), &cell, threads, |kind| {
        let opened = Opened::open(kind, rt.handle(), root, threads, default_retention(), None);
        let subject = opened.subject.clone();
        let handle = rt.handle().clone();
        let scope = scope.clone();
        let op: Op = Arc::new(move |id| {
            subject.lifecycle(&handle, &scope, id);
        });
        (op, opened)
    });
}

/// `threads` callers replaying completed keys, on each subject.
fn replay(c: &mut Criterion, rt: &Runtime, root: &Path, keys: u64, threads: usize) {
    let cell = format!("pg_replay_{threads}");
    let scope = Scope::new(OPERATION, PRINCIPAL);
    cell_of_callers(c, rt.handle(), &cell, threads, |kind| {
        let handle: Handle = rt.handle().clone();
        let opened = Opened::open(kind, &handle, root, 16, default_retention(), None);
        let subject = opened.subject.clone();
        parallel(16, 0..keys, &|id| {
            subject.lifecycle(&handle, &scope, id);
        });
        let scope = scope.clone();
        // The callers' ids are fresh: each names one of the preloaded keys.
        let op: Op = Arc::new(move |id| subject.replay(&handle, &scope, id % keys));
        (op, opened)
    });
}

/// One criterion cell of `threads` callers running `op` on each subject, opened by `open`
/// when the cell starts and closed (callers first) when it ends; the latencies, the CPU and
/// (PostgreSQL) the WAL written per operation go to the report.
fn cell_of_callers(
    c: &mut Criterion,
    rt: &Handle,
    cell: &str,
    threads: usize,
    open: impl Fn(Kind) -> (Op, Opened),
) {
    let mut g = group(c, cell, threads as u64);
    for kind in Kind::ALL {
        let mut state: Option<(Callers, Opened)> = None;
        let mut latencies = Vec::new();
        let (mut used, mut ops) = (cpu::Usage::default(), 0u64);
        let mut wal: Option<f64> = None;
        // PgStore's batches and the calls they answered over the timed loops.
        let mut batched = (0u64, 0u64);
        g.bench_function(kind.id(), |b| {
            let (callers, opened) = state.get_or_insert_with(|| {
                let (op, opened) = open(kind);
                (Callers::new(threads, op), opened)
            });
            b.iter_custom(|iters| {
                let wal_before = opened.wal_position(rt);
                let batches_before = opened.batches();
                let before = cpu::Usage::now();
                let took = callers.run(iters, &mut latencies);
                used.add(cpu::Usage::now().since(before));
                if let (Some(b0), Some(b1)) = (batches_before, opened.batches()) {
                    batched.0 += b1.0 - b0.0;
                    batched.1 += b1.1 - b0.1;
                }
                if let (Some(w0), Some(w1)) = (wal_before, opened.wal_position(rt)) {
                    *wal.get_or_insert_default() += w1 - w0;
                }
                ops += iters * threads as u64;
                took
            });
        });
        if let Some(state) = state.take() {
            if kind == Kind::Postgres {
                // A lifecycle is two calls (reserve, complete), a replay one.
                let calls = if cell.starts_with("pg_lifecycle") {
                    2
                } else {
                    1
                };
                report::batches(cell, kind, batched.0, batched.1, ops * calls);
            }
            drop(state);
            report::ran(cell, kind, &mut latencies);
            report::cpu(cell, kind, used, ops);
            if let Some(wal) = wal {
                report::wal(cell, kind, wal, ops);
            }
        }
    }
    g.finish();
}

/// The commit the bench was built at, and whether the tree had uncommitted changes.
fn commit() -> String {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    match git(&["rev-parse", "--short", "HEAD"]) {
        Some(head) => {
            let dirty = git(&["status", "--porcelain", "--untracked-files=no"])
                .is_some_and(|s| !s.is_empty());
            if dirty {
                format!("{head} + uncommitted changes")
            } else {
                head
            }
        }
        None => "?".into(),
    }
}

fn utc_now() -> String {
    std::process::Command::new("date")
        .args(["-u", "+%F %T"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "?".into())
}
