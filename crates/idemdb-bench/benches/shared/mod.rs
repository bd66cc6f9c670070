//! What the benches (`compare`, `retention`, `pg_compare`, `tail`) share: the stored keys and
//! bodies, criterion's setup and files, caller threads, CPU time, the fsync floor, the
//! hand-written PostgreSQL table, and the markdown report's pieces. Each bench includes it with
//! `#[path = "../shared/mod.rs"] mod shared;`.

// Each bench uses only part of it.
#![allow(dead_code)]

pub mod callers;
pub mod cpu;
pub mod floor;
pub mod keys;
pub mod pg_table;
pub mod report;

use std::path::Path;
use std::time::{Duration, Instant};

use criterion::Criterion;
use rusqlite::Connection;
use tempfile::TempDir;

/// Criterion's own rule: `cargo bench` passes `--bench`; without it (`cargo test --benches`),
/// or with `--test`, every benchmark runs once.
pub fn is_test_mode() -> bool {
    let args: Vec<String> = std::env::args().collect();
    let bench = args.iter().any(|a| a == "--bench");
    let test = args.iter().any(|a| a == "--test");
    !bench || test
}

/// Criterion with a 1 s warm-up and no plots, then the command line's settings.
pub fn criterion(sample_size: usize, measurement: Duration) -> Criterion {
    Criterion::default()
        .sample_size(sample_size)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(measurement)
        .without_plots()
        .configure_from_args()
}

/// The run's temporary directory under the system's temp dir; every store lives below it.
pub fn temp_root(prefix: &str) -> TempDir {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .expect("tempdir")
}

/// Whole nanoseconds.
pub fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Times `op` one call at a time: criterion gets the sum, the side report the distribution
/// (every call's latency in ns, appended to `latencies`).
pub fn timed_loop(iters: u64, latencies: &mut Vec<u64>, mut op: impl FnMut()) -> Duration {
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        let start = Instant::now();
        op();
        let took = start.elapsed();
        latencies.push(nanos(took));
        total += took;
    }
    total
}

/// A SQLite connection in WAL mode with `synchronous=FULL`: every commit durable. The busy
/// timeout, if any, is set first, so that switching to WAL already waits on a busy file.
pub fn sqlite_wal_full(path: &Path, busy_timeout: Option<Duration>) -> Connection {
    let conn = Connection::open(path).expect("open sqlite");
    if let Some(timeout) = busy_timeout {
        conn.busy_timeout(timeout).expect("busy_timeout");
    }
    let mode: String = conn
        .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
        .expect("journal_mode");
    assert_eq!(mode.to_lowercase(), "wal");
    conn.pragma_update(None, "synchronous", "FULL")
        .expect("synchronous");
    conn
}
