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

/// The partition tables of the closed database at `path`, read through redb alone.
pub fn partition_tables(path: &std::path::Path) -> Vec<String> {
    use idemdb::redb::{ReadableDatabase, TableHandle};
    let db = idemdb::redb::Database::open(path).unwrap();
    let read = db.begin_read().unwrap();
    read.list_tables()
        .unwrap()
        .map(|t| t.name().to_string())
        .filter(|n| n.starts_with("idemdb_p_"))
        .collect()
}

/// The `format_version` meta entry of the closed database at `path`.
pub fn format_version(path: &std::path::Path) -> Option<Vec<u8>> {
    use idemdb::redb::{ReadableDatabase, TableDefinition};
    const META: TableDefinition<&str, &[u8]> = TableDefinition::new("idemdb_meta");
    let db = idemdb::redb::Database::open(path).unwrap();
    let read = db.begin_read().unwrap();
    let meta = read.open_table(META).unwrap();
    meta.get("format_version")
        .unwrap()
        .map(|v| v.value().to_vec())
}
