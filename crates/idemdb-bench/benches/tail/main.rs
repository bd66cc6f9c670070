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
mod run;
#[path = "../shared/mod.rs"]
mod shared;

use std::path::Path;
use std::time::{Duration, Instant};

use criterion::{BenchmarkGroup, SamplingMode, Throughput, measurement::WallTime};
use idemdb::{IdemDb, Key, ReserveOutcome, Retention, Scope, Stats};
use tempfile::TempDir;

use run::{Run, Setup, Workload};
use shared::floor::FsyncFloor;
use shared::keys::{OPERATION, PAYLOAD, PRINCIPAL, RESPONSE, fresh_id, key_bytes};
use shared::timed_loop;

/// The floor needs only a stable median.
const FLOOR_TIME: Duration = Duration::from_secs(10);
/// Criterion's samples per benchmark.
const SAMPLES: u32 = 10;
/// Every reservation's lease, as in `compare`.
const LEASE: Duration = Duration::from_secs(30);

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

/// One caller's calls on fresh keys on a fresh store, each reserve (and complete) timed on its
/// own; `None` if filtered out.
///
/// The run is held to its time whatever criterion planned: criterion sizes its samples from
/// the 1 s warm-up, on a store far smaller than 60 s of calls leave, and a loaded disk
/// makes the warm-up unlike the rest (one run planned 60 s and took 207 s, another took
/// 48 s). So the warm-up's calls (1, 2, 4, … iterations) run as asked, and the k-th sample
/// runs until k tenths of the run's time ([`run::RUN_TIME`] unless [`Setup`] says) have passed
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
