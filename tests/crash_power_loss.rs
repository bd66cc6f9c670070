//! Power loss at every sync point: a concurrent scripted workload (every operation, group
//! commit forming real batches) is crashed inside its n-th sync for every n, with the pending
//! writes dropped, kept, or torn at random; the image is reopened and checked against what was
//! acknowledged (invariants I1–I5 in docs/design.md).

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
    image: Vec<u8>,
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
    let crashed = backend.crashed_image();
    Run {
        crashed: crashed.is_some(),
        image: crashed.unwrap_or_else(|| backend.durable_image()),
        logs,
        clock,
    }
}

#[test]
fn every_sync_point_with_dropped_kept_and_torn_writes() {
    let started = Instant::now();
    let scripts = 4 * Script::ALL.len();
    let baseline = run(None, scripts);
    assert!(!baseline.crashed);
    let summary = check_recovered(baseline.image, baseline.clock, &baseline.logs).unwrap();
    assert_eq!(summary.in_flight, 0);

    let (mut points, mut runs, mut torn, mut acked, mut in_flight) = (0u64, 0u64, 0u64, 0u64, 0u64);
    let (mut in_drops, mut recognised, mut max_partitions) = (0u64, 0u64, 0u64);
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
            let check = check_recovered(r.image, r.clock, &r.logs)
                .unwrap_or_else(|e| panic!("crash in sync {n} with {mode:?}: {e}"));
            acked += check.acked_calls;
            in_flight += check.in_flight;
            in_drops += check.compactions_in_flight;
            recognised += check.recognised_after_crash;
            max_partitions = max_partitions.max(check.partitions);
        }
        if !reached {
            break;
        }
        points += 1;
        n += 1;
    }
    eprintln!(
        "crash points: {points}, crashed runs: {runs} ({torn} with random tear patterns), \
         acknowledged calls verified: {acked}, in-flight calls resolved: {in_flight} \
         ({in_drops} of them partition drops), dropped keys recognised after the crash: \
         {recognised}, up to {max_partitions} partitions, {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert!(points >= 20, "the workload synced only {points} times");
    assert!(in_drops > 0, "no crash struck during a partition drop");
    assert!(recognised > 0, "no dropped key was checked after a crash");
}
