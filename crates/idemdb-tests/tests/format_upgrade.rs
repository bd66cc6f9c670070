//! Files of older formats are upgraded on open: version 1 (IN_PROGRESS records in the records
//! table, no in-flight table), version 2 (finished records in one table, records without
//! expiry), version 3 (no log) and version 4 (a log the file did not record, whose header
//! had no identity) up to version 7 (no outbox). Their reservations keep working and their
//! owners can still finish them.

mod common;

use std::time::Duration;

use common::{acquired, format_version};
use idemdb::redb::{
    ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition, TableHandle,
};
use idemdb::{IdemDb, Key, RecordState, ReserveOutcome, Scope};

const META: TableDefinition<&str, &[u8]> = TableDefinition::new("idemdb_meta");
const RECORDS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("idemdb_records");
const INFLIGHT: TableDefinition<&[u8], &[u8]> = TableDefinition::new("idemdb_inflight");
const HORIZON: TableDefinition<&[u8], &[u8]> = TableDefinition::new("idemdb_horizon");
const LEASE: Duration = Duration::from_secs(3600);

/// A current record (version 3) in the version-2 record encoding of formats 3 to 5: no
/// checksum (its last 8 bytes).
fn to_record_v2(current: &[u8]) -> Vec<u8> {
    assert_eq!(current[0], 3, "record version");
    let mut v2 = current[..current.len() - 8].to_vec();
    v2[0] = 2;
    v2
}

/// A current record in the version-1 record encoding: no `expires_at` (bytes 54..62).
fn to_record_v1(current: &[u8]) -> Vec<u8> {
    let mut v1 = to_record_v2(current);
    v1.drain(54..62);
    v1[0] = 1;
    v1
}

fn table_names(read: &idemdb::redb::ReadTransaction) -> Vec<String> {
    read.list_tables()
        .unwrap()
        .map(|t| t.name().to_string())
        .collect()
}

/// Rewrites a current file into the layout of format `version` (1 or 2).
fn downgrade(path: &std::path::Path, version: u32) {
    let db = idemdb::redb::Database::open(path).unwrap();
    let partitions: Vec<String> = table_names(&db.begin_read().unwrap())
        .into_iter()
        .filter(|n| n.starts_with("idemdb_p_"))
        .collect();
    let txn = db.begin_write().unwrap();
    {
        let read_all = |t: TableDefinition<&[u8], &[u8]>| -> Vec<(Vec<u8>, Vec<u8>)> {
            let table = txn.open_table(t).unwrap();
            table
                .iter()
                .unwrap()
                .map(|e| {
                    let (k, v) = e.unwrap();
                    (k.value().to_vec(), to_record_v1(v.value()))
                })
                .collect()
        };
        let in_flight = read_all(INFLIGHT);
        let finished: Vec<_> = partitions
            .iter()
            .flat_map(|n| read_all(TableDefinition::new(n)))
            .collect();
        let mut records = txn.open_table(RECORDS).unwrap();
        for (k, v) in &finished {
            records.insert(k.as_slice(), v.as_slice()).unwrap();
        }
        if version == 1 {
            for (k, v) in &in_flight {
                records.insert(k.as_slice(), v.as_slice()).unwrap();
            }
        } else {
            let mut table = txn.open_table(INFLIGHT).unwrap();
            for (k, v) in &in_flight {
                table.insert(k.as_slice(), v.as_slice()).unwrap();
            }
        }
        let mut meta = txn.open_table(META).unwrap();
        meta.insert("format_version", &version.to_le_bytes()[..])
            .unwrap();
        // Formats before 5 did not record their log.
        meta.remove("log").unwrap();
    }
    for n in &partitions {
        assert!(
            txn.delete_table(TableDefinition::<&[u8], &[u8]>::new(n))
                .unwrap()
        );
    }
    assert!(txn.delete_table(HORIZON).unwrap());
    if version == 1 {
        assert!(txn.delete_table(INFLIGHT).unwrap());
    }
    txn.commit().unwrap();
}

fn upgrades_from(version: u32) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.idemdb");
    let scope = Scope::new("op", "p");
    let (held, done) = {
        let db = IdemDb::open(&path).unwrap();
        let held = acquired(db.reserve(&scope, &Key::new("held"), b"p", LEASE).unwrap());
        let done = acquired(db.reserve(&scope, &Key::new("done"), b"p", LEASE).unwrap());
        db.complete(&done, b"ok".to_vec()).unwrap();
        (held, done)
    };
    downgrade(&path, version);
    drop(IdemDb::open(&path).unwrap());
    // The upgrade put the IN_PROGRESS record in the in-flight table and the finished one in
    // a time partition, both with an expiry; the old records table is gone.
    {
        let raw = idemdb::redb::Database::open(&path).unwrap();
        let read = raw.begin_read().unwrap();
        let names = table_names(&read);
        assert!(!names.iter().any(|n| n == RECORDS.name()), "{names:?}");
        let parts: Vec<&String> = names
            .iter()
            .filter(|n| n.starts_with("idemdb_p_"))
            .collect();
        assert_eq!(parts.len(), 1, "{names:?}");
        let part = read
            .open_table(TableDefinition::<&[u8], &[u8]>::new(parts[0]))
            .unwrap();
        let inflight = read.open_table(INFLIGHT).unwrap();
        assert_eq!((part.len().unwrap(), inflight.len().unwrap()), (1, 1));
        for table in [part, inflight] {
            let (k, v) = table.iter().unwrap().next().unwrap().unwrap();
            let (k, v) = (k.value(), v.value());
            assert_eq!(v[0], 3, "rewritten as the current record version");
            let rec = idemdb::Record::decode(k, v).unwrap();
            assert!(rec.expires_at > rec.updated_at && rec.expires_at < u64::MAX);
        }
    }

    let db = IdemDb::open(&path).unwrap();
    assert_eq!(
        db.get(&scope, &Key::new("held")).unwrap().unwrap().state,
        RecordState::InProgress
    );
    assert!(matches!(
        db.reserve(&scope, &Key::new("held"), b"p", LEASE).unwrap(),
        ReserveOutcome::InProgress { .. }
    ));
    assert_eq!(
        db.reserve(&scope, &Key::new("done"), b"p", LEASE).unwrap(),
        ReserveOutcome::Completed(b"ok".to_vec())
    );
    db.complete(&held, b"late but owned".to_vec()).unwrap();
    assert_eq!(
        db.reserve(&scope, &Key::new("held"), b"p", LEASE).unwrap(),
        ReserveOutcome::Completed(b"late but owned".to_vec())
    );
    assert!(db.complete(&done, b"again".to_vec()).is_err());
    drop(db);

    // The file is version 7 now, with its in-flight and horizon tables, and its log recorded.
    assert_eq!(format_version(&path), Some(8u32.to_le_bytes().to_vec()));
    let raw = idemdb::redb::Database::open(&path).unwrap();
    let read = raw.begin_read().unwrap();
    let names = table_names(&read);
    assert!(names.iter().any(|n| n == INFLIGHT.name()));
    assert!(names.iter().any(|n| n == HORIZON.name()));
}

#[test]
fn version_1_files_are_upgraded_on_open() {
    upgrades_from(1);
}

#[test]
fn version_2_files_are_upgraded_on_open() {
    upgrades_from(2);
}

/// Version 3 had no log: its file is whole after a clean close, and only the version changes.
#[test]
fn version_3_files_are_upgraded_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v3.idemdb");
    let scope = Scope::new("op", "p");
    {
        let db = IdemDb::open(&path).unwrap();
        let done = acquired(db.reserve(&scope, &Key::new("done"), b"p", LEASE).unwrap());
        db.complete(&done, b"ok".to_vec()).unwrap();
    }
    std::fs::remove_file(dir.path().join("v3.idemdb-wal")).unwrap();
    {
        let raw = idemdb::redb::Database::open(&path).unwrap();
        let txn = raw.begin_write().unwrap();
        {
            let mut meta = txn.open_table(META).unwrap();
            meta.insert("format_version", &3u32.to_le_bytes()[..])
                .unwrap();
            meta.remove("log").unwrap();
        }
        txn.commit().unwrap();
    }
    let db = IdemDb::open(&path).unwrap();
    assert_eq!(
        db.reserve(&scope, &Key::new("done"), b"p", LEASE).unwrap(),
        ReserveOutcome::Completed(b"ok".to_vec())
    );
    drop(db);
    assert_eq!(format_version(&path), Some(8u32.to_le_bytes().to_vec()));
}

/// Version 7 had no outbox: the open sets version 8 before it returns, so before anything
/// can be staged, and a build that knows no outbox refuses the file as newer rather than
/// calling its log corrupt. Nothing else changes.
#[test]
fn version_7_files_become_8_before_anything_is_staged() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v7.idemdb");
    let scope = Scope::new("op", "p");
    {
        let db = IdemDb::open(&path).unwrap();
        let done = acquired(db.reserve(&scope, &Key::new("done"), b"p", LEASE).unwrap());
        db.complete(&done, b"ok".to_vec()).unwrap();
    }
    {
        let raw = idemdb::redb::Database::open(&path).unwrap();
        let txn = raw.begin_write().unwrap();
        txn.open_table(META)
            .unwrap()
            .insert("format_version", &7u32.to_le_bytes()[..])
            .unwrap();
        txn.commit().unwrap();
    }
    drop(IdemDb::open(&path).unwrap());
    // Set by the open alone, with nothing staged.
    assert_eq!(format_version(&path), Some(8u32.to_le_bytes().to_vec()));
    let db = IdemDb::open(&path).unwrap();
    assert_eq!(
        db.reserve(&scope, &Key::new("done"), b"p", LEASE).unwrap(),
        ReserveOutcome::Completed(b"ok".to_vec())
    );
    let staged = db
        .execute(&scope, &Key::new("staging"), b"p", |tx| {
            tx.stage(idemdb::Message::new("orders", b"m".to_vec()))?;
            Ok::<_, idemdb::Error>(idemdb::Outcome::Completed(b"201".to_vec()))
        })
        .unwrap();
    assert!(
        matches!(staged, idemdb::ExecuteOutcome::Executed(_)),
        "{staged:?}"
    );
    assert_eq!(db.outbox_stats().unwrap().backlog, 1);
}

/// Version 4 did not record its log, and the log's header (version 1) had no identity of its
/// own: a version-4 file killed with frames in its log replays them all, and is upgraded to
/// version 5 with a fresh log it records.
#[test]
fn version_4_files_replay_their_log_and_are_upgraded() {
    use common::worker::{Acks, Worker, open_worker_db};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v4.idemdb");
    let log_path = dir.path().join("v4.idemdb-wal");
    let mut acks = Acks::default();
    let mut worker = Worker::new();
    // No checkpoint while it runs (by age, or by the log filling up): frames stay to replay.
    worker.checkpoint_ms = Some(3_600_000);
    worker.ops_per_thread = Some(40);
    worker.run_and_kill(&path, "v4", 150, &mut acks);
    // The file as version 4 left it: no record of its log.
    {
        let raw = idemdb::redb::Database::open(&path).unwrap();
        let txn = raw.begin_write().unwrap();
        {
            let mut meta = txn.open_table(META).unwrap();
            meta.insert("format_version", &4u32.to_le_bytes()[..])
                .unwrap();
            assert!(meta.remove("log").unwrap().is_some());
        }
        txn.commit().unwrap();
    }
    // The log as version 4 wrote it (docs/design.md §5.6): its header had magic, version 1,
    // the database's identity and xxh3 of the first 24 bytes, and no cycle sector: frames
    // followed the header at 512.
    let mut log = std::fs::read(&log_path).unwrap();
    let len = log.len();
    let frames = log[1024..].to_vec();
    log.truncate(512);
    log.extend(frames);
    log.resize(len, 0);
    let identity: [u8; 8] = log[16..24].try_into().unwrap();
    log[..512].fill(0);
    log[0..8].copy_from_slice(b"idemwal\0");
    log[8..12].copy_from_slice(&1u32.to_le_bytes());
    log[16..24].copy_from_slice(&identity);
    let sum = xxhash_rust::xxh3::xxh3_64(&log[0..24]);
    log[24..32].copy_from_slice(&sum.to_le_bytes());
    std::fs::write(&log_path, &log).unwrap();

    let db = open_worker_db(&path).unwrap();
    assert!(db.stats().replayed_frames > 0);
    acks.check_outcomes(&db);
    acks.check_tokens(&db, "probe-v4");
    drop(db);
    assert_eq!(format_version(&path), Some(8u32.to_le_bytes().to_vec()));
    let log = std::fs::read(&log_path).unwrap();
    assert_eq!(u32::from_le_bytes(log[8..12].try_into().unwrap()), 2);
    let db = open_worker_db(&path).unwrap();
    acks.check_outcomes(&db);
}

/// Version 5 stored records without a checksum (record version 2). A version-5 file killed
/// with frames in its log (whose records are of either version) replays them, then every
/// record is rewritten as version 3 and the file becomes version 7; what was acknowledged is
/// all there, and tokens still never repeat.
#[test]
fn version_5_records_are_checksummed_on_open() {
    use common::worker::{Acks, Worker, open_worker_db};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v5.idemdb");
    let mut acks = Acks::default();
    let mut worker = Worker::new();
    worker.ops_per_thread = Some(40);
    // A first run's records reach the file (the next open's commit and its clean close), a
    // second run's stay in its log (no checkpoint while it runs).
    worker.run_and_kill(&path, "v5-file", 150, &mut acks);
    drop(open_worker_db(&path).unwrap());
    worker.checkpoint_ms = Some(3_600_000);
    worker.run_and_kill(&path, "v5-log", 150, &mut acks);
    // Every record in the file as version 5 stored it.
    let rewritten = {
        let raw = idemdb::redb::Database::open(&path).unwrap();
        let txn = raw.begin_write().unwrap();
        let rewritten = common::records_as_version_2(&txn);
        txn.open_table(META)
            .unwrap()
            .insert("format_version", &5u32.to_le_bytes()[..])
            .unwrap();
        txn.commit().unwrap();
        rewritten
    };
    assert!(rewritten > 0, "the checkpoints left records in the file");

    let db = open_worker_db(&path).unwrap();
    assert!(db.stats().replayed_frames > 0);
    acks.check_outcomes(&db);
    acks.check_tokens(&db, "probe-v5");
    let report = db.verify(10, |_| {}).unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
    drop(db);
    assert_eq!(format_version(&path), Some(8u32.to_le_bytes().to_vec()));
    let raw = idemdb::redb::Database::open(&path).unwrap();
    let read = raw.begin_read().unwrap();
    for name in table_names(&read)
        .into_iter()
        .filter(|n| n.starts_with("idemdb_p_") || n == INFLIGHT.name())
    {
        let table = read
            .open_table(TableDefinition::<&[u8], &[u8]>::new(&name))
            .unwrap();
        for entry in table.iter().unwrap() {
            let (k, v) = entry.unwrap();
            assert_eq!(v.value()[0], 3, "{name}");
            idemdb::Record::decode(k.value(), v.value()).unwrap();
        }
    }
}
