//! A real process killed with SIGKILL at random moments, over 50 times, on one file: after
//! each kill the file is reopened and every outcome the process printed is checked
//! (invariants I1–I5), then the workload continues on the same file.

mod common;

use std::path::Path;
use std::time::Instant;

use common::worker::{Acks, Worker, open_expiring_worker_db, open_worker_db};

const KILLS: usize = 60;

fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// After the kill of run `run`, of a worker whose records live `ttl_ms` (none: a day) in
/// partitions `width_ms` wide (none: a quarter of the TTL).
fn check(path: &Path, acks: &Acks, run: &str, ttl_ms: Option<u64>, width_ms: Option<u64>) {
    let mut raw = idemdb::redb::Database::open(path).unwrap();
    assert!(raw.check_integrity().unwrap(), "redb integrity check (I4)");
    drop(raw);
    // Opening replays the log: the rows written after the last checkpoint are there only
    // after it (the worker registers `orders`, so its rows ride in the log).
    let db = match ttl_ms {
        Some(ttl) => open_expiring_worker_db(path, ttl, width_ms),
        None => open_worker_db(path),
    }
    .unwrap();
    acks.check_outcomes_expiring(&db, ttl_ms);
    // I3: one probe key per run: a run that printed no new token must not meet the previous
    // run's probe.
    acks.check_tokens(&db, &format!("probe-{run}"));
}

#[test]
fn sigkill_at_random_moments_loses_nothing_acknowledged() {
    let worker = Worker::new();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("killed.idemdb");
    let mut acks = Acks::default();
    let mut rng = 0x2545_f491_4f6c_dd1d ^ std::process::id() as u64;
    let started = Instant::now();
    for run in 0..KILLS {
        let run = format!("r{run}");
        worker.run_and_kill(&path, &run, 5 + xorshift(&mut rng) % 60, &mut acks);
        check(&path, &acks, &run, None, None);
    }
    eprintln!(
        "{KILLS} kills, {} acknowledged outcomes checked over {} keys, {:.1} s",
        acks.lines,
        acks.keys.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(acks.lines > KILLS, "the worker acknowledged almost nothing");
}

/// Records of a 200 ms TTL, in 50 ms partitions, with the worker's compactor looking every
/// 20 ms: over the kills, partitions expire and drop (each step a durable commit) while the
/// workload writes, and some kills land during a pass. After each kill: every acknowledged
/// outcome that cannot have expired holds, every record still there is what was
/// acknowledged, and tokens stay above all issued. (Power loss inside each sync of a drop
/// step: crash_power_loss, whose Expire script compacts.)
#[test]
fn sigkill_while_partitions_expire_and_drop_loses_nothing_live() {
    const TTL_MS: u64 = 200;
    let mut worker = Worker::new();
    worker.ttl_ms = Some(TTL_MS);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("expiring.idemdb");
    let mut acks = Acks::default();
    let mut rng = 0x9e37_79b9_7f4a_7c15 ^ std::process::id() as u64;
    let started = Instant::now();
    let mut runs_with_drops = 0;
    for run in 0..KILLS {
        let (before, run) = (acks.drops, format!("x{run}"));
        // Long enough, some runs, for the partitions of the runs before to come due.
        worker.run_and_kill(&path, &run, 5 + xorshift(&mut rng) % 120, &mut acks);
        runs_with_drops += usize::from(acks.drops > before);
        check(&path, &acks, &run, Some(TTL_MS), None);
    }
    eprintln!(
        "{KILLS} kills, {} acknowledged outcomes over {} keys, {} partitions dropped in {} \
         runs, {:.1} s",
        acks.lines,
        acks.keys.len(),
        acks.drops,
        runs_with_drops,
        started.elapsed().as_secs_f64()
    );
    assert!(acks.lines > KILLS, "the worker acknowledged almost nothing");
    assert!(
        runs_with_drops >= KILLS / 4,
        "partitions dropped in only {runs_with_drops} of {KILLS} runs"
    );
}

/// Records of a 1 s TTL in 10 ms partitions, with the worker's compactor looking every 100 ms:
/// closed partitions are widened into 60 ms ones (docs/design.md §8.8) while the workload
/// writes, and some kills land during a build step or a switch. After each kill, as above; and
/// the file holds a wide partition after most runs.
#[test]
fn sigkill_while_partitions_are_widened_loses_nothing_live() {
    const TTL_MS: u64 = 1_000;
    const WIDTH_MS: u64 = 10;
    let mut worker = Worker::new();
    worker.ttl_ms = Some(TTL_MS);
    worker.width_ms = Some(WIDTH_MS);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("widened.idemdb");
    let mut acks = Acks::default();
    let mut rng = 0x6a09_e667_f3bc_c909 ^ std::process::id() as u64;
    let started = Instant::now();
    let mut runs_with_wide = 0;
    for run in 0..KILLS {
        let run = format!("w{run}");
        worker.run_and_kill(&path, &run, 50 + xorshift(&mut rng) % 200, &mut acks);
        runs_with_wide += usize::from(wide_partitions(&path, WIDTH_MS) > 0);
        check(&path, &acks, &run, Some(TTL_MS), Some(WIDTH_MS));
    }
    eprintln!(
        "{KILLS} kills, {} acknowledged outcomes over {} keys, a wide partition after {} \
         runs, {:.1} s",
        acks.lines,
        acks.keys.len(),
        runs_with_wide,
        started.elapsed().as_secs_f64()
    );
    assert!(acks.lines > KILLS, "the worker acknowledged almost nothing");
    assert!(
        runs_with_wide >= KILLS / 4,
        "a wide partition after only {runs_with_wide} of {KILLS} runs"
    );
}

/// The partitions of the closed database at `path` wider than `width_ms`.
fn wide_partitions(path: &Path, width_ms: u64) -> usize {
    common::partition_tables(path)
        .iter()
        .filter_map(|name| {
            name.strip_prefix("idemdb_p_")?
                .split('_')
                .nth(1)?
                .parse()
                .ok()
        })
        .filter(|&width: &u64| width > width_ms)
        .count()
}
