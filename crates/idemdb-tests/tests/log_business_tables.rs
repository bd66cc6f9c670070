//! A closure's writes to caller tables: a table registered with `Builder::table` rides in the
//! log (no durable redb commit) and is replayed typed after a crash; an unregistered table, a
//! table opened with other types than registered, or a multimap table takes a durable commit
//! (a checkpoint) instead. Both are atomic with the record.

mod common;

use std::time::Duration;

use common::{LEASE, T0, acquired, power_loss_now};
use idemdb::redb::{MultimapTableDefinition, ReadableTable, TableDefinition};
use idemdb::{Builder, Error, ExecuteOutcome, IdemDb, Key, ManualClock, Outcome, Scope};
use idemdb_testkit::FaultBackend;

const ORDERS: TableDefinition<&str, u64> = TableDefinition::new("orders");
const ORDERS_AS_BYTES: TableDefinition<&str, &[u8]> = TableDefinition::new("orders");
const AUDIT: TableDefinition<u64, &str> = TableDefinition::new("audit");
const TAGS: MultimapTableDefinition<&str, &str> = MultimapTableDefinition::new("tags");

fn builder() -> Builder {
    IdemDb::builder()
        .clock(ManualClock::new(T0))
        .checkpoint_interval(Duration::from_secs(3600))
        .checkpoint_bytes(1 << 30)
}

fn scope() -> Scope {
    Scope::new("order", "u1")
}

/// Executes `key`, whose closure inserts `key → cents` into ORDERS; returns the checkpoints
/// that execute took.
fn order(db: &IdemDb, key: &str, cents: u64) -> u64 {
    let before = db.stats().checkpoints;
    let row = key.to_string();
    let out = db
        .execute(&scope(), &Key::new(key), b"req", move |tx| {
            tx.open_table(ORDERS)?.insert(row.as_str(), cents)?;
            Ok::<_, Error>(Outcome::Completed(b"201".to_vec()))
        })
        .unwrap();
    assert!(matches!(out, ExecuteOutcome::Executed(_)));
    db.stats().checkpoints - before
}

fn rows(db: &IdemDb) -> Vec<(String, u64)> {
    let read = db.begin_read().unwrap();
    let table = read.open_table(ORDERS).unwrap();
    table
        .iter()
        .unwrap()
        .map(|e| {
            let (k, v) = e.unwrap();
            (k.value().to_string(), v.value())
        })
        .collect()
}

#[test]
fn a_registered_tables_rows_are_logged_and_replayed_typed_after_a_crash() {
    let backend = FaultBackend::new();
    let db = builder()
        .table(ORDERS)
        .open_with_backend(backend.clone(), backend.log())
        .unwrap();
    for (i, key) in ["b", "a", "c"].iter().enumerate() {
        assert_eq!(
            order(&db, key, 100 + i as u64),
            0,
            "{key}: no durable commit"
        );
    }
    // A later closure removes a row: the removal is logged too.
    let r = acquired(
        db.reserve(&scope(), &Key::new("cancel"), b"r", LEASE)
            .unwrap(),
    );
    db.complete_with(&r, b"200".to_vec(), |tx| {
        tx.open_table(ORDERS)?.remove("b")?;
        Ok::<_, Error>(())
    })
    .unwrap();
    assert_eq!(db.stats().checkpoints, 0);
    let disk = power_loss_now(&backend, db);

    let db = builder()
        .table(ORDERS)
        .open_with_backend(disk.clone(), disk.log())
        .unwrap();
    assert_eq!(db.stats().replayed_frames, 5);
    // In the table's own order, with its own types.
    assert_eq!(rows(&db), [("a".to_string(), 101), ("c".to_string(), 102)]);
}

#[test]
fn a_log_holding_a_tables_writes_is_refused_when_the_table_is_not_registered() {
    let backend = FaultBackend::new();
    let db = builder()
        .table(ORDERS)
        .open_with_backend(backend.clone(), backend.log())
        .unwrap();
    order(&db, "a", 1);
    let disk = power_loss_now(&backend, db);
    match builder().open_with_backend(disk.clone(), disk.log()) {
        Err(Error::Corrupted(why)) => {
            assert!(
                why.contains("\"orders\"") && why.contains("Builder::table"),
                "{why}"
            );
        }
        other => panic!("expected Corrupted, got {other:?}"),
    }
    // Registered again, it opens and has the row.
    let db = builder()
        .table(ORDERS)
        .open_with_backend(disk.clone(), disk.log())
        .unwrap();
    assert_eq!(rows(&db), [("a".to_string(), 1)]);
}

#[test]
fn unregistered_mistyped_and_multimap_tables_take_a_durable_commit_and_survive_a_crash() {
    let backend = FaultBackend::new();
    let db = builder()
        .table(ORDERS_AS_BYTES)
        .open_with_backend(backend.clone(), backend.log())
        .unwrap();
    // Registered as &str → &[u8], opened as &str → u64: not logged.
    assert_eq!(order(&db, "a", 7), 1);
    // Unregistered.
    let before = db.stats().checkpoints;
    db.run(|tx| {
        tx.open_table(AUDIT)?.insert(1, "a ordered")?;
        Ok::<_, Error>(())
    })
    .unwrap();
    assert_eq!(db.stats().checkpoints - before, 1);
    // A multimap table.
    let before = db.stats().checkpoints;
    db.run(|tx| {
        tx.open_multimap_table(TAGS)?.insert("a", "gift")?;
        Ok::<_, Error>(())
    })
    .unwrap();
    assert_eq!(db.stats().checkpoints - before, 1);
    let disk = power_loss_now(&backend, db);

    let db = builder()
        .table(ORDERS_AS_BYTES)
        .open_with_backend(disk.clone(), disk.log())
        .unwrap();
    assert_eq!(db.stats().replayed_frames, 0);
    assert_eq!(rows(&db), [("a".to_string(), 7)]);
    let read = db.begin_read().unwrap();
    let audit = read.open_table(AUDIT).unwrap();
    assert_eq!(audit.get(1).unwrap().unwrap().value(), "a ordered");
    let tags = read.open_multimap_table(TAGS).unwrap();
    assert_eq!(tags.get("a").unwrap().count(), 1);
}

#[test]
fn a_closure_that_fails_leaves_nothing_in_the_log() {
    let backend = FaultBackend::new();
    let db = builder()
        .table(ORDERS)
        .open_with_backend(backend.clone(), backend.log())
        .unwrap();
    let failed = db.execute(&scope(), &Key::new("x"), b"req", |tx| {
        tx.open_table(ORDERS)?.insert("x", 1)?;
        Err::<Outcome, Error>(Error::Internal("declined before commit".into()))
    });
    assert!(matches!(failed, Err(idemdb::ExecuteError::Closure(_))));
    order(&db, "y", 2);
    let disk = power_loss_now(&backend, db);
    let db = builder()
        .table(ORDERS)
        .open_with_backend(disk.clone(), disk.log())
        .unwrap();
    assert_eq!(db.stats().replayed_frames, 1);
    assert_eq!(rows(&db), [("y".to_string(), 2)]);
}
