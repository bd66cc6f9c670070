//! Partition summaries (records/summary.rs): once a partition's window closed, a compaction
//! pass keeps its record count, first and last keys and key hashes in `idemdb_keys`; an open
//! builds the key index from the rows that still hold instead of reading those partitions,
//! and a drop takes its horizon tags from them. A row that no longer describes its table (a
//! record placed in it later, a table of the same name made again) is ignored, the table read;
//! a row that does not decode refuses the open; a drop removes its row.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{LEASE, T0, acquired, finish, minutes, open_retained, partition_tables, reopenable};
use idemdb::redb::{self, ReadableDatabase, ReadableTable, TableDefinition};
use idemdb::{Error, IdemDb, Key, ManualClock, ReserveOutcome, Scope};

const ROWS: TableDefinition<&str, &[u8]> = TableDefinition::new("idemdb_keys");

fn scope() -> Scope {
    Scope::new("op", "p")
}

/// 1-minute partitions, a 60-minute TTL, no background compactor.
fn open(path: &Path, clock: &ManualClock) -> IdemDb {
    open_retained(path, clock, minutes(60))
}

fn fill(db: &IdemDb, prefix: &str, count: usize) {
    for i in 0..count {
        finish(
            db,
            &scope(),
            &format!("{prefix}-{i}"),
            format!("r-{prefix}-{i}"),
        );
    }
}

/// A database at `path` holding `count` keys `a-…` in one partition whose window closed and
/// that a pass summarised.
fn summarized_partition(path: &Path, clock: &ManualClock, count: usize) -> IdemDb {
    let db = open(path, clock);
    fill(&db, "a", count);
    clock.advance(Duration::from_secs(120));
    assert_eq!(db.compact_now().unwrap().partitions_summarized, 1);
    db
}

fn replays(db: &IdemDb, key: &str) -> bool {
    let answer = db.reserve(&scope(), &Key::new(key), b"x", LEASE).unwrap();
    answer == ReserveOutcome::Completed(format!("r-{key}").into_bytes())
}

/// The table names that have a row in `idemdb_keys` of the closed database at `path`.
fn rows(path: &Path) -> Vec<String> {
    let db = redb::Database::open(path).unwrap();
    let txn = db.begin_read().unwrap();
    let Ok(rows) = txn.open_table(ROWS) else {
        return Vec::new();
    };
    rows.iter()
        .unwrap()
        .map(|r| r.unwrap().0.value().to_string())
        .collect()
}

#[test]
fn an_open_reads_only_the_partitions_without_a_summary_that_holds() {
    let (_dir, path, clock) = reopenable();
    let db = open(&path, &clock);
    fill(&db, "a", 300);
    clock.advance(Duration::from_secs(120));
    fill(&db, "b", 200);
    // The first window closed; the second is still open.
    assert_eq!(db.compact_now().unwrap().partitions_summarized, 1);
    assert_eq!(db.compact_now().unwrap().partitions_summarized, 0);
    drop(db);
    assert_eq!(rows(&path).len(), 1);

    let db = open(&path, &clock);
    let stats = db.stats();
    assert_eq!(stats.partitions_read_at_open, 1, "only the open window");
    assert_eq!(stats.indexed_keys, 500);
    for key in ["a-0", "a-150", "a-299", "b-0", "b-199"] {
        assert!(replays(&db, key), "{key}");
    }
    // The second window closes: both summarised, and the next open reads neither.
    clock.advance(Duration::from_secs(120));
    assert_eq!(db.compact_now().unwrap().partitions_summarized, 1);
    drop(db);
    let db = open(&path, &clock);
    assert_eq!(db.stats().partitions_read_at_open, 0);
    assert!(replays(&db, "b-100"));
}

#[test]
fn a_record_placed_in_a_summarized_partition_makes_the_open_read_it() {
    let (_dir, path, clock) = reopenable();
    let db = summarized_partition(&path, &clock, 100);
    // The clock goes back into the closed window: the record is placed in its partition,
    // after its summary was written.
    clock.set(T0 + 30_000);
    fill(&db, "late", 1);
    drop(db);

    clock.set(T0 + 240_000);
    let db = open(&path, &clock);
    assert_eq!(db.stats().partitions_read_at_open, 1);
    assert!(replays(&db, "late-0"), "the late record is found");
    assert!(replays(&db, "a-7"));
}

#[test]
fn a_table_of_the_same_name_and_length_made_again_is_read_not_trusted() {
    let (_dir, path, clock) = reopenable();
    drop(summarized_partition(&path, &clock, 50));
    // As a build that keeps no rows would leave it: the partition dropped and made again
    // under its name with as many records, other keys, and the row left behind.
    let table = partition_tables(&path).remove(0);
    {
        let redb = redb::Database::open(&path).unwrap();
        let txn = redb.begin_write().unwrap();
        let def = TableDefinition::<&[u8], &[u8]>::new(&table);
        let old: Vec<(Vec<u8>, Vec<u8>)> = {
            let t = txn.open_table(def).unwrap();
            t.iter()
                .unwrap()
                .map(|e| {
                    let (k, v) = e.unwrap();
                    (k.value().to_vec(), v.value().to_vec())
                })
                .collect()
        };
        txn.delete_table(def).unwrap();
        let mut t = txn.open_table(def).unwrap();
        for (old_key, v) in &old {
            // The stored key ends with the caller's key: "a-…" becomes "z-…", its record
            // checksummed under its new key (docs/design.md §3).
            let mut k = old_key.clone();
            let at = k.len() - k.iter().rev().position(|&b| b == b'-').unwrap() - 2;
            k[at] = b'z';
            let record = idemdb::Record::decode(old_key, v).unwrap();
            t.insert(k.as_slice(), record.encode(&k).as_slice())
                .unwrap();
        }
        drop(t);
        txn.commit().unwrap();
    }
    assert_eq!(rows(&path), vec![table]);

    let db = open(&path, &clock);
    assert_eq!(db.stats().partitions_read_at_open, 1);
    let answer = db.reserve(&scope(), &Key::new("z-3"), b"x", LEASE).unwrap();
    assert_eq!(answer, ReserveOutcome::Completed(b"r-a-3".to_vec()));
    // The old keys are gone with their table.
    assert!(matches!(
        db.reserve(&scope(), &Key::new("a-3"), b"x", LEASE).unwrap(),
        ReserveOutcome::Acquired(_)
    ));
}

#[test]
fn a_drop_removes_the_summary_and_recognises_keys_placed_after_it() {
    let (_dir, path, clock) = reopenable();
    let db = summarized_partition(&path, &clock, 100);
    clock.set(T0 + 30_000);
    fill(&db, "late", 1);
    // Past the TTL and the window: the partition is dropped, its keys recognised, the late
    // one too (its row did not hold: the table was read).
    clock.set(T0 + 60_000 + 3_600_000 + 1_000);
    let report = db.compact_now().unwrap();
    assert_eq!(
        (report.partitions_dropped, report.records_expired),
        (1, 101)
    );
    for key in ["a-0", "a-99", "late-0"] {
        let r = acquired(db.reserve(&scope(), &Key::new(key), b"x", LEASE).unwrap());
        assert!(r.is_beyond_horizon(), "{key} recognised");
    }
    drop(db);
    assert_eq!(
        rows(&path),
        Vec::<String>::new(),
        "the dropped partition's row is gone"
    );
}

#[test]
fn a_summary_that_does_not_decode_refuses_the_open_naming_it() {
    let (_dir, path, clock) = reopenable();
    drop(summarized_partition(&path, &clock, 10));
    let table = partition_tables(&path).remove(0);
    {
        let redb = redb::Database::open(&path).unwrap();
        let txn = redb.begin_write().unwrap();
        txn.open_table(ROWS)
            .unwrap()
            .insert(table.as_str(), &[1u8, 2, 3][..])
            .unwrap();
        txn.commit().unwrap();
    }
    match IdemDb::builder()
        .clock(clock.clone())
        .retention(minutes(60))
        .open(&path)
    {
        Err(Error::Corrupted(why)) => {
            assert!(
                why.contains(&format!("idemdb_keys: the row of {table}")),
                "{why}"
            )
        }
        other => panic!("{other:?}"),
    }
}
