//! Set-up shared by the scenario tests.

#![allow(dead_code)] // each test file uses its own subset

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use idemdb::redb::{ReadableTableMetadata, TableDefinition, TableError};
use idemdb::{Error, IdemDb, ManualClock, Reservation, ReserveOutcome, Retention};
use idemdb_testkit::{Fault, FaultBackend, TearMode};
use tempfile::TempDir;

/// The manual clock's start: a fixed instant, so lease arithmetic in assertions is exact.
pub const T0: u64 = 1_700_000_000_000;

/// The scenario tests' usual lease: assertions spell it out as `T0 + 30_000`.
pub const LEASE: Duration = Duration::from_secs(30);

/// The file [`setup`] and [`setup_retained`] open in their directory.
pub fn db_path(dir: &TempDir) -> PathBuf {
    dir.path().join("test.idemdb")
}

/// A temporary directory, the database file's path in it (not opened yet) and a manual clock
/// at [`T0`]: for tests that close and reopen the file.
pub fn reopenable() -> (TempDir, PathBuf, ManualClock) {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    (dir, path, ManualClock::new(T0))
}

/// A fresh database in a temporary directory on a manual clock at [`T0`].
pub fn setup() -> (TempDir, ManualClock, IdemDb) {
    let (dir, path, clock) = reopenable();
    let db = open_on(&path, &clock);
    (dir, clock, db)
}

/// [`setup`] with `retention`.
pub fn setup_retained(retention: Retention) -> (TempDir, ManualClock, IdemDb) {
    let (dir, path, clock) = reopenable();
    let db = open_retained(&path, &clock, retention);
    (dir, clock, db)
}

/// A fresh database in a temporary directory on the system clock, with the defaults.
pub fn fresh() -> (TempDir, IdemDb) {
    let dir = tempfile::tempdir().unwrap();
    let db = IdemDb::open(db_path(&dir)).unwrap();
    (dir, db)
}

/// [`fresh`], shared between threads or tasks.
pub fn fresh_shared() -> (TempDir, Arc<IdemDb>) {
    let (dir, db) = fresh();
    (dir, Arc::new(db))
}

/// A database with the defaults over `backend` (one handle of it: the test keeps another to
/// inject faults or read the image).
pub fn on_backend(backend: &FaultBackend) -> IdemDb {
    IdemDb::builder()
        .open_with_backend(backend.clone(), backend.log())
        .unwrap()
}

/// The database at `path` on `clock`, with the default retention.
pub fn open_on(path: &Path, clock: &ManualClock) -> IdemDb {
    IdemDb::builder().clock(clock.clone()).open(path).unwrap()
}

/// The reservation of an `Acquired` outcome; panics on any other.
pub fn acquired(outcome: ReserveOutcome) -> Reservation {
    match outcome {
        ReserveOutcome::Acquired(r) => r,
        other => panic!("expected Acquired, got {other:?}"),
    }
}

/// Reserves `key` (fresh, payload `x`) and completes it with `response`.
pub fn finish(db: &IdemDb, scope: &idemdb::Scope, key: &str, response: impl AsRef<[u8]>) {
    let r = acquired(
        db.reserve(scope, &idemdb::Key::new(key), b"x", LEASE)
            .unwrap(),
    );
    db.complete(&r, response.as_ref().to_vec()).unwrap();
}

/// A database at `path` on `clock` with `retention` (no background compactor unless the
/// retention asks for one).
pub fn open_retained(path: &Path, clock: &ManualClock, retention: Retention) -> IdemDb {
    IdemDb::builder()
        .clock(clock.clone())
        .retention(retention)
        .open(path)
        .unwrap()
}

/// Minute-scale retention for tests: 1-minute partitions, the given default TTL, no
/// background compactor.
pub fn minutes(ttl_minutes: u64) -> Retention {
    Retention::default()
        .ttl(Duration::from_secs(60 * ttl_minutes))
        .partition_width(Duration::from_secs(60))
        .compact_interval(None)
}

/// The partition tables of the closed database at `path`, read through redb alone.
pub fn partition_tables(path: &Path) -> Vec<String> {
    tables_named(path, "idemdb_p_")
}

/// The tables of the closed database at `path` whose names start with `prefix`.
pub fn tables_named(path: &Path, prefix: &str) -> Vec<String> {
    use idemdb::redb::{ReadableDatabase, TableHandle};
    let db = idemdb::redb::Database::open(path).unwrap();
    let read = db.begin_read().unwrap();
    read.list_tables()
        .unwrap()
        .map(|t| t.name().to_string())
        .filter(|n| n.starts_with(prefix))
        .collect()
}

/// The first partition table of the closed database at `path`; panics if it has none.
pub fn first_partition(path: &Path) -> String {
    partition_tables(path).into_iter().next().unwrap()
}

/// The `format_version` meta entry of the closed database at `path`.
pub fn format_version(path: &Path) -> Option<Vec<u8>> {
    use idemdb::redb::ReadableDatabase;
    const META: TableDefinition<&str, &[u8]> = TableDefinition::new("idemdb_meta");
    let db = idemdb::redb::Database::open(path).unwrap();
    let read = db.begin_read().unwrap();
    let meta = read.open_table(META).unwrap();
    meta.get("format_version")
        .unwrap()
        .map(|v| v.value().to_vec())
}

/// The business row `key` of `table`, read through a durable snapshot; `None` if absent (or
/// if the table was never created).
pub fn business_row(db: &IdemDb, table: TableDefinition<&str, u64>, key: &str) -> Option<u64> {
    let txn = db.begin_read().unwrap();
    match txn.open_table(table) {
        Ok(table) => table.get(key).unwrap().map(|v| v.value()),
        Err(TableError::TableDoesNotExist(_)) => None,
        Err(e) => panic!("unexpected table error: {e}"),
    }
}

/// How many business rows `table` holds; 0 if the table was never created.
pub fn business_row_count(db: &IdemDb, table: TableDefinition<&str, u64>) -> u64 {
    let txn = db.begin_read().unwrap();
    match txn.open_table(table) {
        Ok(table) => table.len().unwrap(),
        Err(TableError::TableDoesNotExist(_)) => 0,
        Err(e) => panic!("unexpected table error: {e}"),
    }
}

/// A business closure's own error type: a refusal of its own, or a database error.
#[derive(Debug, PartialEq)]
pub enum AppError {
    Rejected(u32),
    Db(String),
}

impl From<Error> for AppError {
    fn from(e: Error) -> Self {
        AppError::Db(e.to_string())
    }
}

impl From<idemdb::redb::StorageError> for AppError {
    fn from(e: idemdb::redb::StorageError) -> Self {
        AppError::Db(e.to_string())
    }
}

/// Builds the example `name` in this test's profile (a no-op when it is fresh) and finds it.
pub fn example_binary(name: &str) -> PathBuf {
    built().join("examples").join(name)
}

/// Builds the operator CLI (package idemdb-cli, binary `idemdb`) in this test's profile and
/// finds it: an integration test of another package gets no `CARGO_BIN_EXE_` for it.
pub fn cli_binary() -> PathBuf {
    built().join("idemdb")
}

/// Builds the CLI and the examples the tests run, once per test process, and returns the
/// profile's directory. It builds as `cargo test --workspace --all-features` does (the whole
/// workspace's features, dev-dependencies included), so that after that command it is a
/// no-op, not a second build of the engine with other features.
fn built() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            // Tests run from target/<profile>/deps.
            let exe = std::env::current_exe().unwrap();
            let profile_dir = exe.parent().unwrap().parent().unwrap().to_path_buf();
            let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.toml");
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let mut build = std::process::Command::new(cargo);
            build
                .args(["build", "--workspace", "--all-features", "--bin", "idemdb"])
                .args(["--example", "crash_worker", "--example", "edge_service"])
                .args([
                    "--example",
                    "outbox_worker",
                    "--example",
                    "pg_outbox_worker",
                ])
                .arg("--manifest-path")
                .arg(workspace);
            if profile_dir.ends_with("release") {
                build.arg("--release");
            }
            assert!(
                build.status().unwrap().success(),
                "building the CLI and the examples failed"
            );
            profile_dir
        })
        .clone()
}

/// The disk as a power loss right after the last acknowledged call on `db` leaves it: both
/// files as their last syncs left them. `db` is dropped on the dead disk.
pub fn power_loss_now(backend: &FaultBackend, db: IdemDb) -> FaultBackend {
    let disk = backend.durable_disk();
    backend.kill();
    drop(db);
    disk
}
pub mod chaos;
pub mod outbox_kills;
pub mod stores;
pub mod worker;

/// Rewrites every record of the in-flight table and of the partitions in `txn` as format 5
/// stored it: record version 2, without the checksum (docs/design.md §3). Returns how many.
pub fn records_as_version_2(txn: &idemdb::redb::WriteTransaction) -> usize {
    use idemdb::redb::{ReadableTable, TableHandle};
    let mut tables: Vec<String> = txn
        .list_tables()
        .unwrap()
        .map(|t| t.name().to_string())
        .filter(|n| n.starts_with("idemdb_p_"))
        .collect();
    tables.push("idemdb_inflight".to_string());
    let mut rewritten = 0;
    for name in &tables {
        let mut table = txn
            .open_table(TableDefinition::<&[u8], &[u8]>::new(name))
            .unwrap();
        let all: Vec<(Vec<u8>, Vec<u8>)> = table
            .iter()
            .unwrap()
            .map(|e| {
                let (k, v) = e.unwrap();
                let v = v.value();
                assert_eq!(v[0], 3, "record version");
                let mut v2 = v[..v.len() - 8].to_vec();
                v2[0] = 2;
                (k.value().to_vec(), v2)
            })
            .collect();
        for (k, v) in &all {
            table.insert(k.as_slice(), v.as_slice()).unwrap();
        }
        rewritten += all.len();
    }
    rewritten
}

/// Power lost inside each sync of `act`: runs `act` once on a database opened over a copy of
/// `before`, counting the syncs it begins; then, for each of those syncs `n` and each of
/// `modes(n)`, runs it again on a fresh copy with the power lost inside sync `n`, and calls
/// `check(n, mode, image)` with the disk the loss left. Returns the sync count and what the
/// first run of `act` returned.
pub fn each_power_loss<R>(
    before: &FaultBackend,
    modes: impl Fn(u64) -> Vec<TearMode>,
    open: impl Fn(&FaultBackend) -> IdemDb,
    act: impl Fn(&IdemDb) -> Result<R, Error>,
    mut check: impl FnMut(u64, TearMode, FaultBackend),
) -> (u64, R) {
    let (syncs, first) = {
        let disk = before.durable_disk();
        let db = open(&disk);
        let from = disk.syncs_begun();
        let first = act(&db).unwrap();
        (disk.syncs_begun() - from, first)
    };
    for n in 0..syncs {
        for mode in modes(n) {
            let disk = before.durable_disk();
            let db = open(&disk);
            disk.crash_at_sync(n, mode);
            let _ = act(&db);
            drop(db);
            check(n, mode, disk.crashed_disk().expect("the power loss struck"));
        }
    }
    (syncs, first)
}

/// A write failing inside `act` (a full disk, an I/O error) after each of `afters` pages: for
/// each, runs `act` on a database opened over a copy of `before` with the fault injected; if
/// it failed, checks that the database now refuses writes, and calls `check(after, image)`
/// with the durable image, the fault cleared. Returns how many of `afters` made `act` fail
/// (a run that wrote fewer pages than `after` does not).
pub fn each_write_failure<R>(
    before: &FaultBackend,
    afters: &[u64],
    open: impl Fn(&FaultBackend) -> IdemDb,
    act: impl Fn(&IdemDb) -> Result<R, Error>,
    mut check: impl FnMut(u64, FaultBackend),
) -> usize {
    let mut failed = 0;
    for &after in afters {
        let disk = before.durable_disk();
        let db = open(&disk);
        disk.inject(Fault::Write { after });
        let Err(e) = act(&db) else {
            continue;
        };
        failed += 1;
        let scope = idemdb::Scope::new("op", "p");
        assert!(
            matches!(
                db.reserve(&scope, &idemdb::Key::new("fresh"), b"x", LEASE),
                Err(Error::WritesRefused | Error::Poisoned(_))
            ),
            "after {after}: {e}"
        );
        drop(db);
        disk.clear_faults();
        check(after, disk.durable_disk());
    }
    failed
}

/// A debugging recorder's metrics by name (feature `metrics`).
pub struct Metrics(Vec<(String, metrics_util::debugging::DebugValue)>);

impl Metrics {
    pub fn of(snapshotter: &metrics_util::debugging::Snapshotter) -> Metrics {
        Metrics(
            snapshotter
                .snapshot()
                .into_vec()
                .into_iter()
                .map(|(key, _, _, value)| (key.key().name().to_string(), value))
                .collect(),
        )
    }

    pub fn counter(&self, name: &str) -> Option<u64> {
        self.0.iter().find_map(|(n, v)| match v {
            metrics_util::debugging::DebugValue::Counter(c) if n == name => Some(*c),
            _ => None,
        })
    }

    pub fn gauge(&self, name: &str) -> Option<f64> {
        self.0.iter().find_map(|(n, v)| match v {
            metrics_util::debugging::DebugValue::Gauge(g) if n == name => Some(g.into_inner()),
            _ => None,
        })
    }

    /// How many values the histogram `name` holds.
    pub fn histogram_len(&self, name: &str) -> Option<usize> {
        self.0.iter().find_map(|(n, v)| match v {
            metrics_util::debugging::DebugValue::Histogram(h) if n == name => Some(h.len()),
            _ => None,
        })
    }
}
