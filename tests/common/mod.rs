//! Set-up shared by the scenario tests.

#![allow(dead_code)] // each test file uses its own subset

use idemdb::{IdemDb, ManualClock, Reservation, ReserveOutcome};
use tempfile::TempDir;

/// The manual clock's start: a fixed instant, so lease arithmetic in assertions is exact.
pub const T0: u64 = 1_700_000_000_000;

/// A fresh database in a temporary directory on a manual clock at [`T0`].
pub fn setup() -> (TempDir, ManualClock, IdemDb) {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let db = IdemDb::builder()
        .clock(clock.clone())
        .open(dir.path().join("test.idemdb"))
        .unwrap();
    (dir, clock, db)
}

/// The reservation of an `Acquired` outcome; panics on any other.
pub fn acquired(outcome: ReserveOutcome) -> Reservation {
    match outcome {
        ReserveOutcome::Acquired(r) => r,
        other => panic!("expected Acquired, got {other:?}"),
    }
}
