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

/// A database at `path` on `clock` with `retention` (no background compactor unless the
/// retention asks for one).
pub fn open_retained(
    path: &std::path::Path,
    clock: &ManualClock,
    retention: idemdb::Retention,
) -> IdemDb {
    IdemDb::builder()
        .clock(clock.clone())
        .retention(retention)
        .open(path)
        .unwrap()
}

/// Minute-scale retention for tests: 1-minute partitions, the given default TTL, no
/// background compactor.
pub fn minutes(ttl_minutes: u64) -> idemdb::Retention {
    idemdb::Retention::default()
        .ttl(std::time::Duration::from_secs(60 * ttl_minutes))
        .partition_width(std::time::Duration::from_secs(60))
        .compact_interval(None)
}
