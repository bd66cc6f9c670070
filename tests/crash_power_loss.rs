//! Power loss at every sync point of both files, the database and its log: a concurrent
//! scripted workload (every operation, group commit forming real batches, checkpoints by
//! size, caller code, compaction and close) is crashed inside its n-th sync for every n, with
//! the pending writes of both files dropped, kept, or torn at random; the image is reopened
//! and checked against what was acknowledged (invariants I1–I5 in docs/design.md). Each
//! crash image is then crashed again inside every sync of its own recovery, and that image
//! is checked the same way.

use std::sync::Arc;
use std::time::Instant;

use idemdb::ManualClock;
use idemdb::testing::{
    FaultBackend, KeyLog, Script, TearMode, check_recovered, open_workload, run_workload,
};

const THREADS: usize = 4;
const START_MS: u64 = 1_767_225_600_000;

struct Run {
    crashed: bool,
    /// The power loss struck inside a sync of the log (else of the database file).
    in_log: bool,
    disk: FaultBackend,
    logs: Vec<KeyLog>,
    clock: ManualClock,
}

/// Runs the workload with a power loss armed inside the `sync`-th sync after open.
fn run(sync: Option<(u64, TearMode)>, scripts_per_thread: usize) -> Run {
    let backend = FaultBackend::new();
    let clock = ManualClock::new(START_MS);
    let db = Arc::new(open_workload(backend.clone(), &clock).unwrap());
    if let Some((n, mode)) = sync {
        backend.crash_at_sync(n, mode);
    }
    let logs = run_workload(&db, &clock, THREADS, scripts_per_thread);
    drop(db);
    let crashed = backend.crashed_disk();
    Run {
        crashed: crashed.is_some(),
        in_log: backend.crash_struck_log() == Some(true),
        disk: crashed.unwrap_or_else(|| backend.durable_disk()),
        logs,
        clock,
    }
}

/// Crashes the recovery of `disk` inside each of its syncs in turn and checks what that
/// leaves; returns how many syncs recovery took.
fn crash_recovery_at_every_sync(r: &Run, mode: TearMode) -> u64 {
    let mut j = 0;
    loop {
        let disk = r.disk.live_disk();
        disk.crash_at_sync(j, mode);
        let reopened = open_workload(disk.clone(), &r.clock);
        drop(reopened);
        let Some(crashed) = disk.crashed_disk() else {
            return j;
        };
        check_recovered(crashed, r.clock.clone(), &r.logs)
            .unwrap_or_else(|e| panic!("crash in sync {j} of recovery with {mode:?}: {e}"));
        j += 1;
    }
}

#[test]
fn every_sync_point_with_dropped_kept_and_torn_writes() {
    let started = Instant::now();
    let scripts = 4 * Script::ALL.len();
    let baseline = run(None, scripts);
    assert!(!baseline.crashed);
    let summary = check_recovered(baseline.disk, baseline.clock, &baseline.logs).unwrap();
    assert_eq!(summary.in_flight, 0);

    let (mut points, mut runs, mut torn, mut acked, mut in_flight) = (0u64, 0u64, 0u64, 0u64, 0u64);
    let (mut in_drops, mut recognised, mut max_partitions) = (0u64, 0u64, 0u64);
    let (mut log_runs, mut in_recovery, mut replayed) = (0u64, 0u64, 0u64);
    let mut n = 0;
    loop {
        let modes = [
            TearMode::DropAll,
            TearMode::KeepAll,
            TearMode::Random(n * 7919 + 1),
            TearMode::Random(n * 104_729 + 3),
        ];
        let mut reached = false;
        for mode in modes {
            let r = run(Some((n, mode)), scripts);
            if !r.crashed {
                continue;
            }
            reached = true;
            runs += 1;
            torn += u64::from(matches!(mode, TearMode::Random(_)));
            if matches!(mode, TearMode::Random(_)) {
                in_recovery += crash_recovery_at_every_sync(&r, mode);
            }
            log_runs += u64::from(r.in_log);
            let check = check_recovered(r.disk, r.clock, &r.logs)
                .unwrap_or_else(|e| panic!("crash in sync {n} with {mode:?}: {e}"));
            acked += check.acked_calls;
            in_flight += check.in_flight;
            in_drops += check.compactions_in_flight;
            recognised += check.recognised_after_crash;
            replayed += check.replayed_frames;
            max_partitions = max_partitions.max(check.partitions);
        }
        if !reached {
            break;
        }
        points += 1;
        n += 1;
    }
    eprintln!(
        "crash points: {points}, crashed runs: {runs} ({torn} with random tear patterns, \
         {log_runs} struck in a sync of the log), crashes inside recovery: {in_recovery}, \
         log frames replayed: {replayed}, \
         acknowledged calls verified: {acked}, in-flight calls resolved: {in_flight} \
         ({in_drops} of them partition drops), dropped keys recognised after the crash: \
         {recognised}, up to {max_partitions} partitions, {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert!(log_runs > 0, "no crash struck in a sync of the log");
    assert!(in_recovery > 0, "no crash struck inside recovery");
    assert!(replayed > 0, "no reopen replayed a log frame");
    assert!(points >= 20, "the workload synced only {points} times");
    assert!(in_drops > 0, "no crash struck during a partition drop");
    assert!(recognised > 0, "no dropped key was checked after a crash");
}
