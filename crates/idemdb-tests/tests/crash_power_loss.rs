//! Power loss at every sync point of both files, the database and its log: a concurrent
//! scripted workload (every operation, group commit forming real batches, checkpoints by
//! size, caller code, compaction and close) is crashed inside its n-th sync for every n, with
//! the pending writes of both files dropped, kept, or torn at random; the image is reopened
//! and checked against what was acknowledged (invariants I1–I5 in docs/design.md). Each
//! crash image is then crashed again inside every sync of its own recovery, and that image
//! is checked the same way. And the log of each crash image is lost the ways an operator
//! loses it (deleted, cut at each sector boundary after its header, rolled back to an earlier
//! image of itself): each open must be refused, or keep every acknowledged outcome with
//! tokens above all issued.

use std::sync::Arc;
use std::time::Instant;

use idemdb::ManualClock;
use idemdb::testing::{LogLayout, recorded_log};
use idemdb_testkit::{
    FaultBackend, KeyLog, SECTOR, Script, TearMode, check_recovered, check_recovered_or_refused,
    check_tokens_after_loss, open_workload, run_workload,
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
    /// The log's durable image after each of its syncs before the crash.
    log_history: Vec<Vec<u8>>,
}

/// Runs the workload with a power loss armed inside the `sync`-th sync after open.
fn run(sync: Option<(u64, TearMode)>, scripts_per_thread: usize) -> Run {
    let backend = FaultBackend::new();
    let clock = ManualClock::new(START_MS);
    let db = Arc::new(open_workload(backend.clone(), &clock).unwrap());
    backend.keep_log_history();
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
        log_history: backend.log_history(),
    }
}

/// How the lost logs of one crash image were answered.
#[derive(Default)]
struct Losses {
    refused: u64,
    opened: u64,
    /// Rolled back within the checkpoint's cycle: undetectable, tokens checked.
    undetectable: u64,
}

/// Opens the crash image of `r` with its log deleted, cut at every sector boundary from the
/// header to the end of its frames, and rolled back to earlier images of itself (four, spread
/// over the run). A deleted or cut log, and a log rolled back to before the checkpoint's cycle,
/// must be refused or open with every acknowledged outcome intact (it opens only when the
/// database was closed cleanly). A log rolled back within the checkpoint's cycle cannot be
/// told from a crash: it must open with tokens above all issued (design.md §5.6, the
/// undetectable rows).
fn check_log_losses(r: &Run) -> Losses {
    let db = r.disk.live_image();
    let log = r.disk.log().live_image();
    let (checkpoint, in_use) = recorded_log(&db).unwrap();
    let frames_end = log.iter().rposition(|&b| b != 0).map_or(SECTOR, |i| i + 1);
    // (what, log, must hold every acknowledged outcome)
    let mut variants: Vec<(String, Vec<u8>, bool)> = vec![("deleted".into(), Vec::new(), true)];
    for at in (SECTOR..=frames_end.div_ceil(SECTOR) * SECTOR).step_by(SECTOR) {
        variants.push((
            format!("cut at {at}"),
            log[..at.min(log.len())].to_vec(),
            true,
        ));
    }
    let history = &r.log_history;
    let picks = [
        0,
        history.len() / 3,
        2 * history.len() / 3,
        history.len().saturating_sub(2),
    ];
    for i in picks.into_iter().filter(|&i| i < history.len()) {
        if history[i] != log {
            // From before the checkpoint's cycle: its cycle sector is behind the checkpoint,
            // and its run does not reach it (as it would at a crash between a checkpoint's
            // commit and the cycle sector's rewrite).
            let image = &history[i];
            let layout = LogLayout::read(image);
            let detectable =
                layout.cycle.is_some_and(|h| h < checkpoint) && layout.last() != Some(checkpoint);
            variants.push((
                format!("rolled back to sync {i}"),
                image.clone(),
                detectable || !in_use,
            ));
        }
    }
    // (opened, must hold every acknowledged outcome)
    let results: Vec<(bool, bool)> = std::thread::scope(|s| {
        let chunks: Vec<_> = variants
            .chunks(variants.len().div_ceil(2))
            .map(|chunk| {
                let db = &db;
                s.spawn(move || {
                    chunk
                        .iter()
                        .map(|(what, log, intact)| {
                            let disk = FaultBackend::from_images(db.clone(), log.clone());
                            let checked = if *intact {
                                check_recovered_or_refused(disk, r.clock.clone(), &r.logs)
                            } else {
                                check_tokens_after_loss(disk, r.clock.clone(), &r.logs)
                            };
                            let opened = checked
                                .unwrap_or_else(|e| panic!("log {what}: {e}"))
                                .is_some();
                            assert!(
                                !(opened && *intact && in_use),
                                "log {what} opened beside a database in use"
                            );
                            (opened, *intact)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        chunks.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    let mut losses = Losses::default();
    for (opened, intact) in results {
        match (opened, intact) {
            (false, _) => losses.refused += 1,
            (true, true) => losses.opened += 1,
            (true, false) => losses.undetectable += 1,
        }
    }
    losses
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
    let (mut lost_refused, mut lost_opened, mut lost_undetectable) = (0u64, 0u64, 0u64);
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
                let losses = check_log_losses(&r);
                lost_refused += losses.refused;
                lost_opened += losses.opened;
                lost_undetectable += losses.undetectable;
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
         {recognised}, up to {max_partitions} partitions, lost logs refused: {lost_refused}, \
         opened intact (closed cleanly): {lost_opened}, rolled back undetectably and opened \
         with tokens above: {lost_undetectable}, {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert!(log_runs > 0, "no crash struck in a sync of the log");
    assert!(in_recovery > 0, "no crash struck inside recovery");
    assert!(replayed > 0, "no reopen replayed a log frame");
    assert!(points >= 20, "the workload synced only {points} times");
    assert!(in_drops > 0, "no crash struck during a partition drop");
    assert!(recognised > 0, "no dropped key was checked after a crash");
    assert!(lost_refused > 0, "no lost log was refused");
    assert!(
        lost_undetectable > 0,
        "no log was rolled back within a checkpoint's cycle"
    );
}
