//! I/O errors: a disk whose writes, or whose syncs, start failing after N operations, for every
//! N the workload reaches. Every caller of the failing batch is told the outcome is unknown,
//! the database refuses writes until reopened, nothing acknowledged is lost, and reopening
//! recovers.

mod common;

use common::on_backend;

use std::sync::Arc;
use std::time::Duration;

use idemdb::{Error, IdemDb, Key, ManualClock, ReserveOutcome, Scope};
use idemdb_testkit::{
    Fault, FaultBackend, KeyLog, Script, check_recovered, open_workload, run_workload,
};

const THREADS: usize = 3;

/// Runs the workload with `fault` armed; returns whether the fault struck.
fn run_with(fault: Fault) -> bool {
    let backend = FaultBackend::new();
    let clock = ManualClock::new(1_767_225_600_000);
    let db = Arc::new(open_workload(backend.clone(), &clock).unwrap());
    backend.inject(fault);
    let logs = run_workload(&db, &clock, THREADS, Script::ALL.len());
    let failed = logs.iter().any(KeyLog::had_call_in_flight);
    if !failed {
        // The workload ended before the fault: the probe below must not be the one to hit it.
        backend.clear_faults();
    }
    // After a failed commit, writes are refused with a clear error until reopen.
    let probe = db.reserve(
        &Scope::new("crash", "workload"),
        &Key::new("after-the-error"),
        b"p",
        Duration::from_secs(5),
    );
    if failed {
        assert!(
            matches!(probe, Err(Error::WritesRefused)),
            "{fault:?}: a write after the failure got {probe:?}"
        );
    } else {
        assert!(
            matches!(probe, Ok(ReserveOutcome::Acquired(_))),
            "{probe:?}"
        );
    }
    drop(db);
    // The process did not die: what it wrote is in the OS cache. Reopen on a healthy disk.
    backend.clear_faults();
    check_recovered(backend.live_disk(), clock, &logs).unwrap_or_else(|e| panic!("{fault:?}: {e}"));
    failed
}

/// Runs the workload with the fault after 0, 1, 2, … operations until one run never hits it;
/// returns how many runs failed.
fn sweep(make: fn(u64) -> Fault) -> u64 {
    let mut points = 0;
    while run_with(make(points)) {
        points += 1;
    }
    points
}

#[test]
fn failing_writes_at_every_point() {
    let points = sweep(|n| Fault::Write { after: n });
    eprintln!("write failures injected at {points} points");
    assert!(points >= 20, "the workload wrote only {points} times");
}

#[test]
fn failing_syncs_at_every_point() {
    let points = sweep(|n| Fault::Sync { after: n });
    eprintln!("sync failures injected at {points} points");
    assert!(points >= 10, "the workload synced only {points} times");
}

/// The error callers of the failing batch get says the outcome is unknown.
#[test]
fn callers_of_the_failing_batch_are_told_the_outcome_is_unknown() {
    let backend = FaultBackend::new();
    let db = on_backend(&backend);
    let scope = Scope::new("op", "p");
    backend.inject(Fault::Write { after: 0 });
    let e = db
        .reserve(&scope, &Key::new("k"), b"p", Duration::from_secs(5))
        .unwrap_err();
    assert!(e.is_outcome_unknown(), "{e:?}");
    assert!(e.to_string().contains("outcome unknown"), "{e}");
    assert!(matches!(
        db.reserve(&scope, &Key::new("k2"), b"p", Duration::from_secs(5)),
        Err(Error::WritesRefused)
    ));
    assert!(Error::WritesRefused.to_string().contains("reopen"));
    drop(db);
    backend.clear_faults();
    let db = IdemDb::builder()
        .open_with_backend(backend.clone(), backend.log())
        .unwrap();
    // The unknown reservation either happened or not; either way the database works again.
    let again = db
        .reserve(&scope, &Key::new("k"), b"p", Duration::from_secs(5))
        .unwrap();
    assert!(matches!(
        again,
        ReserveOutcome::Acquired(_) | ReserveOutcome::InProgress { .. }
    ));
}
