//! Tail latency of one caller's reserves, against the fsync floor (issue 24's tail target:
//! "over a 60 s run at 1 caller, reserve p99.9 ≤ 5× the floor (no checkpoint stall shows)").
//!
//! In one run, each on a fresh file in a temporary directory:
//! - `tail/fsync_floor`: one caller doing floor ops (a 4 KiB pwrite into a preallocated file +
//!   fdatasync), about 10 s.
//! - `tail/idemdb_lifecycle_1`: one caller reserving and completing fresh keys, as a service
//!   does, on a store opened with default settings (a checkpoint by age every 5 s or by size
//!   every 32 MiB, as shipped), 60 s of samples held to that time (see [`idemdb_one_caller`]);
//!   the reserves and the completes are timed apart. The store's stats before and after
//!   (commits, checkpoints and their latencies).
//! - `tail/idemdb_reserve_1`: the same with reserves never completed, so that the in-flight
//!   table grows by every one: the stress case for the checkpoints (see [`Workload`]).
//!
//! Every call is timed on its own and kept, criterion's 1 s warm-up included: the tail is what
//! is measured, and a stall in the warm-up is one too. The report gives each distribution
//! (p50 … max), each workload's reserve p99.9 ÷ the floor's median against the target, how
//! many calls took longer than 5× the floor's median and than 5 ms (a checkpoint stall is
//! 10–30 ms), and the machine's 1-minute load average at start and end (it may be shared).
//!
//! Run: `cargo bench -p idemdb-bench --bench tail` (about 2.5 min; `IDEMDB_BENCH_TAIL_SECS`
//! and `IDEMDB_BENCH_TAIL_WIDTH_MS` change the run's length and the partition width, see
//! [`Setup`]; a criterion filter such as `-- 'floor|lifecycle'` leaves a workload out). The
//! report is printed and written to `target/bench-results/tail.{md,json}`. `cargo test
//! --benches` runs each benchmark once and writes the same report from those few calls.

mod report;
#[path = "../shared/mod.rs"]
mod shared;

use std::path::Path;
use std::time::{Duration, Instant};

use criterion::{BenchmarkGroup, SamplingMode, Throughput, measurement::WallTime};
use idemdb::{IdemDb, Key, ReserveOutcome, Retention, Scope, Stats};
use tempfile::TempDir;

use shared::floor::FsyncFloor;
use shared::keys::{OPERATION, PAYLOAD, PRINCIPAL, RESPONSE, fresh_id, key_bytes};
use shared::timed_loop;

/// The floor needs only a stable median.
const FLOOR_TIME: Duration = Duration::from_secs(10);
/// The run issue 24's target names.
const RUN_TIME: Duration = Duration::from_secs(60);
/// Criterion's samples per benchmark.
const SAMPLES: u32 = 10;
/// Every reservation's lease, as in `compare`.
const LEASE: Duration = Duration::from_secs(30);

/// What the command line's environment changes: the run's length (`IDEMDB_BENCH_TAIL_SECS`,
/// default 60) and the stores' partition width (`IDEMDB_BENCH_TAIL_WIDTH_MS`, default the
/// store's own), to see how the tail moves as the current partition grows.
#[derive(Debug, Clone, Copy)]
pub struct Setup {
    pub run_time: Duration,
    pub width: Option<Duration>,
}

impl Setup {
    fn from_env() -> Setup {
        let number = |var: &str| {
            let value = std::env::var(var).ok()?;
            match value.parse::<u64>() {
                Ok(n) if n > 0 => Some(n),
                _ => panic!("{var}={value:?}: expected a whole number above 0"),
            }
        };
        Setup {
            run_time: number("IDEMDB_BENCH_TAIL_SECS").map_or(RUN_TIME, Duration::from_secs),
            width: number("IDEMDB_BENCH_TAIL_WIDTH_MS").map(Duration::from_millis),
        }
    }
}

/// What one idemdb benchmark measured.
pub struct Run {
    pub workload: Workload,
    /// Every reserve's latency, in ns.
    pub reserves: Vec<u64>,
    /// Every complete's latency, in ns (none for [`Workload::Reserves`]).
    pub completes: Vec<u64>,
    /// The store's stats after open, before the first reserve.
    pub before: Stats,
    /// Its stats after the last call, before close (whose checkpoint is not counted).
    pub after: Stats,
    /// From the store's open to the last call's end (criterion's work between samples
    /// included).
    pub wall: Duration,
    /// From the first sample's start to the last one's end.
    pub measured: Duration,
    /// Iterations criterion asked for in its samples, and calls the time slices ran.
    pub planned: u64,
    pub ran: u64,
}

fn main() {
    let test_mode = shared::is_test_mode();
    let load_start = report::loadavg_1m();
    let mut c = shared::criterion(SAMPLES as usize, FLOOR_TIME);
    let root = shared::temp_root("idemdb-tail-");

    let mut g = c.benchmark_group("tail");
    // Durable operations of 0.1–5 ms: equal iteration counts per sample keep the floor to its
    // time (idemdb's samples are time slices).
    g.sampling_mode(SamplingMode::Flat);
    g.throughput(Throughput::Elements(1));
    // The idemdb benchmarks' time slices count on it, whatever the command line says.
    g.sample_size(SAMPLES as usize);
    let floor = fsync_floor(&mut g, root.path());
    let setup = Setup::from_env();
    g.measurement_time(setup.run_time);
    let runs: Vec<Run> = [Workload::Lifecycles, Workload::Reserves]
        .into_iter()
        .filter_map(|w| idemdb_one_caller(&mut g, root.path(), w, setup))
        .collect();
    g.finish();
    c.final_summary();

    let load_end = report::loadavg_1m();
    report::finish(test_mode, floor, runs, setup, (load_start, load_end));
}

/// A fresh directory for one benchmark.
fn fresh_dir(root: &Path) -> TempDir {
    tempfile::tempdir_in(root).expect("tempdir")
}

/// Every floor op's latency (ns); empty if the benchmark was filtered out.
fn fsync_floor(g: &mut BenchmarkGroup<'_, WallTime>, root: &Path) -> Vec<u64> {
    let mut floor: Option<(FsyncFloor, TempDir)> = None;
    let mut latencies = Vec::with_capacity(1 << 14);
    g.bench_function("fsync_floor", |b| {
        let (floor, _) = floor.get_or_insert_with(|| {
            let dir = fresh_dir(root);
            (FsyncFloor::open(dir.path()), dir)
        });
        b.iter_custom(|iters| timed_loop(iters, &mut latencies, || floor.op()));
    });
    latencies
}

/// What one caller does with each fresh key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    /// Reserve, then complete: the in-flight table holds only the one reservation in flight,
    /// and the finished records go to the current time partition, as in service.
    Lifecycles,
    /// Reserve and never complete: every reservation stays in the in-flight table, which grows
    /// by each one (about 600,000 in 60 s), so each checkpoint rewrites most of its leaves.
    /// The stress case: no service leaves every reservation open.
    Reserves,
}

impl Workload {
    /// The benchmark's name.
    pub fn bench(self) -> &'static str {
        match self {
            Workload::Lifecycles => "idemdb_lifecycle_1",
            Workload::Reserves => "idemdb_reserve_1",
        }
    }
}

/// One caller's calls on fresh keys on a fresh store, each reserve (and complete) timed on its
/// own; `None` if filtered out.
///
/// The run is held to its time whatever criterion planned: criterion sizes its samples from
/// the 1 s warm-up, on a store far smaller than 60 s of calls leave, and a loaded disk
/// makes the warm-up unlike the rest (one run planned 60 s and took 207 s, another took
/// 48 s). So the warm-up's calls (1, 2, 4, … iterations) run as asked, and the k-th sample
/// runs until k tenths of the run's time ([`RUN_TIME`] unless [`Setup`] says) have passed
/// since the first sample began, however many calls that is; criterion is given the sample's
/// mean per call times the iterations it asked for. An iteration is one reserve, or one
/// reserve and its complete.
fn idemdb_one_caller(
    g: &mut BenchmarkGroup<'_, WallTime>,
    root: &Path,
    workload: Workload,
    setup: Setup,
) -> Option<Run> {
    let scope = Scope::new(OPERATION, PRINCIPAL);
    let mut state: Option<(IdemDb, TempDir, Stats, Instant)> = None;
    // 60 s of calls of a few hundred µs: a few hundred thousand.
    let mut reserves = Vec::with_capacity(1 << 19);
    let mut completes = Vec::with_capacity(if workload == Workload::Lifecycles {
        1 << 19
    } else {
        0
    });
    let mut calls = 0;
    // The first sample's start, and the samples begun.
    let mut samples: Option<(Instant, u32)> = None;
    let (mut planned, mut ran) = (0, 0);
    g.bench_function(workload.bench(), |b| {
        let (db, ..) = state.get_or_insert_with(|| {
            let dir = fresh_dir(root);
            // Default settings (but a width asked for): the checkpoint cadence is what this
            // bench looks at.
            let mut retention = Retention::default();
            if let Some(width) = setup.width {
                retention = retention.partition_width(width);
            }
            let db = IdemDb::builder()
                .retention(retention)
                .open(dir.path().join("tail.idemdb"))
                .expect("open idemdb");
            let before = db.stats();
            (db, dir, before, Instant::now())
        });
        b.iter_custom(|iters| {
            let warm_up = samples.is_none() && 1u64.checked_shl(calls) == Some(iters);
            calls += 1;
            let until = (!warm_up).then(|| {
                let (start, begun) = samples.get_or_insert_with(|| (Instant::now(), 0));
                *begun += 1;
                *start + setup.run_time / SAMPLES * *begun
            });
            let mut total = Duration::ZERO;
            let mut done = 0;
            loop {
                let key = Key::new(key_bytes(fresh_id()));
                let mut reservation = None;
                total += timed_loop(1, &mut reserves, || {
                    match db
                        .reserve(&scope, &key, PAYLOAD, LEASE)
                        .expect("idemdb reserve")
                    {
                        ReserveOutcome::Acquired(r) => reservation = Some(r),
                        other => panic!("fresh key not acquired: {other:?}"),
                    }
                });
                if let (Workload::Lifecycles, Some(r)) = (workload, &reservation) {
                    total += timed_loop(1, &mut completes, || {
                        db.complete(r, RESPONSE).expect("idemdb complete");
                    });
                }
                done += 1;
                match until {
                    None if done == iters => break,
                    Some(until) if Instant::now() >= until => break,
                    _ => {}
                }
            }
            if until.is_some() {
                planned += iters;
                ran += done;
            }
            total.mul_f64(iters as f64 / done as f64)
        });
    });
    let (db, dir, before, opened) = state?;
    let wall = opened.elapsed();
    let measured = samples.map_or(Duration::ZERO, |(start, _)| start.elapsed());
    let after = db.stats();
    drop(db);
    drop(dir);
    Some(Run {
        workload,
        reserves,
        completes,
        before,
        after,
        wall,
        measured,
        planned,
        ran,
    })
}
