//! Every stored record ends with a checksum of its key and its bytes (docs/design.md §3): a
//! record damaged on disk, moved under another key, or turned into an older record version
//! is `Corrupted` for the caller that reads it, never a replay of bytes nobody stored.

mod common;

use std::path::Path;

use common::{acquired, first_partition, reopenable};
use idemdb::redb::{ReadableDatabase, ReadableTable, TableDefinition};
use idemdb::{Error, IdemDb, Key, ManualClock, ReserveOutcome, Scope};

const RESPONSE: &[u8] = b"HTTP/1.1 201 Created\r\n\r\n{\"order\":17}";

/// idemdb's stored key of `key` under `scope`: length-prefixed operation and principal, then
/// the key (docs/design.md §2).
fn stored_key(operation: &str, principal: &str, key: &str) -> Vec<u8> {
    let mut k = Vec::new();
    for part in [operation, principal] {
        k.extend_from_slice(&(part.len() as u16).to_be_bytes());
        k.extend_from_slice(part.as_bytes());
    }
    k.extend_from_slice(key.as_bytes());
    k
}

/// A closed database with `keys` completed under `op`/`p`, each answered with `RESPONSE`.
fn completed(keys: &[&str]) -> (tempfile::TempDir, std::path::PathBuf) {
    // Opened again later on a clock at the same instant (`open`).
    let (dir, path, clock) = reopenable();
    let db = common::open_on(&path, &clock);
    let scope = Scope::new("op", "p");
    for key in keys {
        let r = acquired(
            db.reserve(&scope, &Key::new(*key), b"x", common::LEASE)
                .unwrap(),
        );
        db.complete(&r, RESPONSE.to_vec()).unwrap();
    }
    drop(db);
    (dir, path)
}

/// Applies `change` to the stored value of each key in `keys` in the partition `table`, through
/// redb alone (its own checksums stay valid: the damage is the record's).
fn rewrite(path: &Path, table: &str, change: impl Fn(&[u8], Vec<u8>) -> Vec<u8>, keys: &[&[u8]]) {
    let db = idemdb::redb::Database::open(path).unwrap();
    let txn = db.begin_write().unwrap();
    {
        let mut t = txn
            .open_table(TableDefinition::<&[u8], &[u8]>::new(table))
            .unwrap();
        for key in keys {
            let value = t.get(*key).unwrap().unwrap().value().to_vec();
            let changed = change(key, value);
            t.insert(*key, changed.as_slice()).unwrap();
        }
    }
    txn.commit().unwrap();
}

fn value_of(path: &Path, table: &str, key: &[u8]) -> Vec<u8> {
    let db = idemdb::redb::Database::open(path).unwrap();
    let read = db.begin_read().unwrap();
    let t = read
        .open_table(TableDefinition::<&[u8], &[u8]>::new(table))
        .unwrap();
    t.get(key).unwrap().unwrap().value().to_vec()
}

/// The database at `path` on a clock at the instant its records were written.
fn open(path: &Path) -> IdemDb {
    common::open_on(path, &ManualClock::new(common::T0))
}

/// `key`'s reserve and get both answer `Corrupted` with `what` in the message, and `verify`
/// reports it; another key still replays.
fn refused(path: &Path, key: &str, what: &str) {
    let db = open(path);
    let scope = Scope::new("op", "p");
    match db.reserve(&scope, &Key::new(key), b"x", common::LEASE) {
        Err(Error::Corrupted(why)) => assert!(why.contains(what), "{why}"),
        other => panic!("a damaged record answered {other:?}"),
    }
    match db.get(&scope, &Key::new(key)) {
        Err(Error::Corrupted(why)) => assert!(why.contains(what), "{why}"),
        other => panic!("a damaged record was read as {other:?}"),
    }
    let report = db.verify(10, |_| {}).unwrap();
    assert_eq!(report.problem_count, 1, "{:?}", report.problems);
    assert!(
        report.problems[0].what.contains(what),
        "{:?}",
        report.problems
    );
    assert_eq!(
        db.reserve(&scope, &Key::new("intact"), b"x", common::LEASE)
            .unwrap(),
        ReserveOutcome::Completed(RESPONSE.to_vec())
    );
}

#[test]
fn every_damaged_byte_of_a_stored_record_is_corrupted_not_replayed() {
    let (_dir, path) = completed(&["k", "intact"]);
    let table = first_partition(&path);
    let key = stored_key("op", "p", "k");
    let good = value_of(&path, &table, &key);
    for at in 0..good.len() {
        rewrite(
            &path,
            &table,
            |_, mut v| {
                v[at] ^= 0x10;
                v
            },
            &[&key],
        );
        let db = open(&path);
        let scope = Scope::new("op", "p");
        assert!(
            matches!(
                db.reserve(&scope, &Key::new("k"), b"x", common::LEASE),
                Err(Error::Corrupted(_))
            ),
            "byte {at} damaged"
        );
        drop(db);
        rewrite(&path, &table, |_, _| good.clone(), &[&key]);
    }
    // A damaged checksum, in full.
    rewrite(
        &path,
        &table,
        |_, mut v| {
            let n = v.len();
            v[n - 1] ^= 1;
            v
        },
        &[&key],
    );
    refused(&path, "k", "checksum");
}

#[test]
fn a_record_moved_under_another_key_is_corrupted() {
    let (_dir, path) = completed(&["k", "other", "intact"]);
    let table = first_partition(&path);
    let other = value_of(&path, &table, &stored_key("op", "p", "other"));
    rewrite(
        &path,
        &table,
        |_, _| other.clone(),
        &[&stored_key("op", "p", "k")],
    );
    refused(&path, "k", "not the value of this key");
}

/// One bit turns version 3 into version 2, whose records had no checksum: a current file
/// holds none, so such a record is damage, not a record to trust unchecked.
#[test]
fn an_older_record_version_in_a_current_file_is_corrupted() {
    let (_dir, path) = completed(&["k", "intact"]);
    let table = first_partition(&path);
    rewrite(
        &path,
        &table,
        |_, mut v| {
            v[0] = 2;
            v
        },
        &[&stored_key("op", "p", "k")],
    );
    refused(&path, "k", "version 2");
}

/// A key and its response (`None`: in flight).
type Stored = (String, Option<Vec<u8>>);

/// Forty records (one in flight) over three partitions, closed, then rewritten as a
/// version-5 file left them: every record of version 2, without its checksum. The images of
/// the database and of its log, and the response of each key (`None`: in flight).
fn version_5_images(clock: &ManualClock) -> ((Vec<u8>, Vec<u8>), Vec<Stored>) {
    use idemdb::redb::TableHandle;
    let scope = Scope::new("op", "p");
    let backend = idemdb_testkit::FaultBackend::new();
    let mut keys = Vec::new();
    {
        let db = open_on(&backend, clock).unwrap();
        for i in 0..40 {
            // Three partitions (10 s wide by default).
            clock.advance(std::time::Duration::from_millis(500));
            let key = format!("k{i}");
            let r = acquired(
                db.reserve(&scope, &Key::new(&key), b"x", common::LEASE)
                    .unwrap(),
            );
            let response = (i != 0).then(|| format!("answer {i}").into_bytes());
            if let Some(response) = &response {
                db.complete(&r, response.clone()).unwrap();
            }
            keys.push((key, response));
        }
    }
    {
        let raw = idemdb::redb::Builder::new()
            .create_with_backend(backend.clone())
            .unwrap();
        let txn = raw.begin_write().unwrap();
        let partitions = txn
            .list_tables()
            .unwrap()
            .filter(|t| t.name().starts_with("idemdb_p_"))
            .count();
        assert!(partitions >= 2, "{partitions} partitions");
        assert_eq!(common::records_as_version_2(&txn), 40);
        txn.open_table(TableDefinition::<&str, &[u8]>::new("idemdb_meta"))
            .unwrap()
            .insert("format_version", &5u32.to_le_bytes()[..])
            .unwrap();
        txn.commit().unwrap();
    }
    ((backend.live_image(), backend.log().live_image()), keys)
}

fn open_on(backend: &idemdb_testkit::FaultBackend, clock: &ManualClock) -> Result<IdemDb, Error> {
    IdemDb::builder()
        .clock(clock.clone())
        .open_with_backend(backend.clone(), backend.log())
}

/// The file on `backend` opens, every record is checksummed and answers as stored.
fn upgraded_in_full(
    backend: &idemdb_testkit::FaultBackend,
    clock: &ManualClock,
    keys: &[Stored],
    what: &str,
) {
    let scope = Scope::new("op", "p");
    let db = open_on(backend, clock).unwrap_or_else(|e| panic!("{what}: {e}"));
    let report = db.verify(10, |_| {}).unwrap();
    assert!(report.is_ok(), "{what}: {:?}", report.problems);
    assert_eq!(report.finished_records + report.in_flight_records, 40);
    for (key, response) in keys {
        let answer = db
            .reserve(&scope, &Key::new(key), b"x", common::LEASE)
            .unwrap();
        match response {
            Some(r) => assert_eq!(answer, ReserveOutcome::Completed(r.clone()), "{what}"),
            None => assert!(
                matches!(answer, ReserveOutcome::InProgress { .. }),
                "{what}"
            ),
        }
    }
}

/// A power loss at any sync of the open that upgrades a version-5 file (records of version 2)
/// leaves a file that the next open upgrades in full: never version 6 with a record left
/// unchecksummed, never a record lost.
#[test]
fn a_power_loss_inside_the_upgrade_to_checksummed_records_is_finished_by_the_next_open() {
    use idemdb_testkit::{FaultBackend, TearMode};
    let clock = ManualClock::new(common::T0);
    let ((db_image, log_image), keys) = version_5_images(&clock);
    let mut crashes = 0;
    for n in 0.. {
        let disk = FaultBackend::from_images(db_image.clone(), log_image.clone());
        disk.crash_at_sync(n, TearMode::Random(n));
        let _ = open_on(&disk, &clock).map(drop);
        let Some(after) = disk.crashed_disk() else {
            break;
        };
        crashes += 1;
        upgraded_in_full(&after, &clock, &keys, &format!("a loss at sync {n}"));
    }
    assert!(crashes >= 4, "the upgrade's syncs: {crashes}");
}

/// A write that fails inside the upgrade (a full disk, an I/O error) fails the open; what is
/// durable then is upgraded in full by the next open.
#[test]
fn a_write_failure_inside_the_upgrade_fails_the_open_and_the_next_open_finishes_it() {
    use idemdb_testkit::{Fault, FaultBackend};
    let clock = ManualClock::new(common::T0);
    let ((db_image, log_image), keys) = version_5_images(&clock);
    let mut failed = 0;
    for n in 0.. {
        let disk = FaultBackend::from_images(db_image.clone(), log_image.clone());
        disk.inject(Fault::Write { after: n });
        if open_on(&disk, &clock).is_ok() {
            break;
        }
        failed += 1;
        upgraded_in_full(
            &disk.durable_disk(),
            &clock,
            &keys,
            &format!("write {n} failed"),
        );
    }
    assert!(failed >= 4, "the upgrade's writes: {failed}");
}

/// A record that does not decode refuses the upgrade, as it would a read: the open is
/// `Corrupted` and the file stays at version 5.
#[test]
fn a_record_that_does_not_decode_refuses_the_upgrade() {
    use idemdb::redb::ReadableDatabase;
    use idemdb_testkit::FaultBackend;
    let clock = ManualClock::new(common::T0);
    let ((db_image, log_image), _) = version_5_images(&clock);
    let disk = FaultBackend::from_images(db_image, log_image);
    {
        let raw = idemdb::redb::Builder::new()
            .create_with_backend(disk.clone())
            .unwrap();
        let txn = raw.begin_write().unwrap();
        {
            let mut t = txn
                .open_table(TableDefinition::<&[u8], &[u8]>::new("idemdb_inflight"))
                .unwrap();
            let key = stored_key("op", "p", "k0");
            let mut v = t.get(key.as_slice()).unwrap().unwrap().value().to_vec();
            v[1] = 9;
            t.insert(key.as_slice(), v.as_slice()).unwrap();
        }
        txn.commit().unwrap();
    }
    match open_on(&disk, &clock) {
        Err(Error::Corrupted(why)) => assert!(why.contains("unknown record state 9"), "{why}"),
        other => panic!("expected Corrupted, got {:?}", other.map(drop)),
    }
    let raw = idemdb::redb::Builder::new()
        .create_with_backend(disk.durable_disk())
        .unwrap();
    let read = raw.begin_read().unwrap();
    let meta = read
        .open_table(TableDefinition::<&str, &[u8]>::new("idemdb_meta"))
        .unwrap();
    let version = meta
        .get("format_version")
        .unwrap()
        .unwrap()
        .value()
        .to_vec();
    assert_eq!(version, 5u32.to_le_bytes());
}

/// The damage no read sees: a stored *key* damaged. A lookup of the original key finds
/// nothing and the intent is taken as new (docs/design.md §10 says so); `verify` reports the
/// damaged key's record, whose checksum no longer matches it.
#[test]
fn a_damaged_key_is_missed_by_lookups_and_reported_by_verify() {
    let (_dir, path) = completed(&["k", "intact"]);
    let table = first_partition(&path);
    let key = stored_key("op", "p", "k");
    let mut damaged = key.clone();
    *damaged.last_mut().unwrap() ^= 0x20;
    {
        let db = idemdb::redb::Database::open(&path).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut t = txn
                .open_table(TableDefinition::<&[u8], &[u8]>::new(&table))
                .unwrap();
            let value = t.remove(key.as_slice()).unwrap().unwrap().value().to_vec();
            t.insert(damaged.as_slice(), value.as_slice()).unwrap();
        }
        txn.commit().unwrap();
    }
    let db = open(&path);
    let report = db.verify(10, |_| {}).unwrap();
    assert_eq!(report.problem_count, 1, "{:?}", report.problems);
    assert_eq!(report.problems[0].key.as_deref(), Some(damaged.as_slice()));
    assert!(
        report.problems[0].what.contains("checksum"),
        "{:?}",
        report.problems
    );
    let scope = Scope::new("op", "p");
    assert!(matches!(
        db.reserve(&scope, &Key::new("k"), b"x", common::LEASE)
            .unwrap(),
        ReserveOutcome::Acquired(_)
    ));
}
