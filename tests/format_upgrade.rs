//! A version-1 file (IN_PROGRESS records in the records table, no in-flight table) is upgraded
//! on open: its reservations keep working, and its owners can still finish them.

mod common;

use std::time::Duration;

use common::acquired;
use idemdb::redb::{
    ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition, TableHandle,
};
use idemdb::{IdemDb, Key, RecordState, ReserveOutcome, Scope};

const META: TableDefinition<&str, &[u8]> = TableDefinition::new("idemdb_meta");
const RECORDS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("idemdb_records");
const INFLIGHT: TableDefinition<&[u8], &[u8]> = TableDefinition::new("idemdb_inflight");
const LEASE: Duration = Duration::from_secs(3600);

/// Rewrites a current file into the version-1 layout.
fn downgrade_to_v1(path: &std::path::Path) {
    let db = idemdb::redb::Database::open(path).unwrap();
    let txn = db.begin_write().unwrap();
    {
        let inflight = txn.open_table(INFLIGHT).unwrap();
        let moving: Vec<(Vec<u8>, Vec<u8>)> = inflight
            .iter()
            .unwrap()
            .map(|e| {
                let (k, v) = e.unwrap();
                (k.value().to_vec(), v.value().to_vec())
            })
            .collect();
        drop(inflight);
        let mut records = txn.open_table(RECORDS).unwrap();
        for (k, v) in &moving {
            records.insert(k.as_slice(), v.as_slice()).unwrap();
        }
        txn.open_table(META)
            .unwrap()
            .insert("format_version", &1u32.to_le_bytes()[..])
            .unwrap();
    }
    assert!(txn.delete_table(INFLIGHT).unwrap());
    txn.commit().unwrap();
}

#[test]
fn version_1_files_are_upgraded_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v1.idemdb");
    let scope = Scope::new("op", "p");
    let (held, done) = {
        let db = IdemDb::open(&path).unwrap();
        let held = acquired(db.reserve(&scope, &Key::new("held"), b"p", LEASE).unwrap());
        let done = acquired(db.reserve(&scope, &Key::new("done"), b"p", LEASE).unwrap());
        db.complete(&done, b"ok".to_vec()).unwrap();
        (held, done)
    };
    downgrade_to_v1(&path);
    drop(IdemDb::open(&path).unwrap());
    // The upgrade moved the IN_PROGRESS record, and only it, to the in-flight table.
    {
        let raw = idemdb::redb::Database::open(&path).unwrap();
        let read = raw.begin_read().unwrap();
        let count = |t| read.open_table(t).unwrap().len().unwrap();
        assert_eq!((count(RECORDS), count(INFLIGHT)), (1, 1));
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

    // The file is version 2 now, with its in-flight table.
    let raw = idemdb::redb::Database::open(&path).unwrap();
    let read = raw.begin_read().unwrap();
    let version = read
        .open_table(META)
        .unwrap()
        .get("format_version")
        .unwrap()
        .map(|v| v.value().to_vec());
    assert_eq!(version, Some(2u32.to_le_bytes().to_vec()));
    assert!(
        read.list_tables()
            .unwrap()
            .any(|t| t.name() == INFLIGHT.name())
    );
}
