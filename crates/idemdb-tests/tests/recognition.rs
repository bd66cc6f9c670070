//! Beyond-horizon recognition by whole 64-bit key hashes (records/horizon.rs): a dropped key
//! is recognised by its hash, not by 32 bits of it; rows of 32-bit tags that older builds
//! wrote (`idemdb_horizon`) are still read, recognised by the upper half, and retired.

mod common;

use std::path::Path;

use common::{LEASE, T0, acquired, finish, minutes, open_retained, reopenable};
use idemdb::redb::{self, ReadableDatabase, ReadableTable, TableDefinition};
use idemdb::{IdemDb, Key, ManualClock, Scope};

const RECOGNISED: TableDefinition<&[u8], &[u8]> = TableDefinition::new("idemdb_recognised");
const LEGACY: TableDefinition<&[u8], &[u8]> = TableDefinition::new("idemdb_horizon");

/// 1-minute partitions, a 60-minute TTL, keys recognised for 4 TTLs past their partition.
fn open(path: &Path, clock: &ManualClock) -> IdemDb {
    open_retained(path, clock, minutes(60))
}

/// Stores `k` and drops its partition (the clock is left after the drop).
fn store_and_drop(path: &Path, clock: &ManualClock) {
    let db = open(path, clock);
    finish(&db, &Scope::new("op", "p"), "k", "done");
    clock.set(T0 + 2 * 3_600_000);
    assert_eq!(db.compact_now().unwrap().partitions_dropped, 1);
}

/// The one recognition row of the closed database at `path`: its key and hashes.
fn the_row(path: &Path) -> (Vec<u8>, Vec<u64>) {
    let db = redb::Database::open(path).unwrap();
    let txn = db.begin_read().unwrap();
    let rows: Vec<(Vec<u8>, Vec<u8>)> = txn
        .open_table(RECOGNISED)
        .unwrap()
        .iter()
        .unwrap()
        .map(|r| {
            let (k, v) = r.unwrap();
            (k.value().to_vec(), v.value().to_vec())
        })
        .collect();
    assert_eq!(rows.len(), 1, "one dropped partition, one row");
    let (key, value) = rows.into_iter().next().unwrap();
    let hashes = value
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    (key, hashes)
}

/// Whether a reserve of `k` is acquired beyond horizon; the reservation is released, so that
/// nothing of it stays.
fn beyond_horizon(db: &IdemDb) -> bool {
    let r = acquired(
        db.reserve(&Scope::new("op", "p"), &Key::new("k"), b"x", LEASE)
            .unwrap(),
    );
    db.release(&r).unwrap();
    r.is_beyond_horizon()
}

#[test]
fn a_dropped_key_is_recognised_by_its_whole_hash_after_a_reopen() {
    let (_dir, path, clock) = reopenable();
    store_and_drop(&path, &clock);
    let (_, hashes) = the_row(&path);
    assert_eq!(hashes.len(), 1);
    let db = open(&path, &clock);
    assert_eq!(db.stats().horizon_keys, 1);
    assert!(beyond_horizon(&db));
}

#[test]
fn a_key_sharing_only_the_upper_half_of_a_recognised_hash_is_not_recognised() {
    let (_dir, path, clock) = reopenable();
    store_and_drop(&path, &clock);
    let (key, hashes) = the_row(&path);
    // The row now holds another key's hash: the same upper 32 bits (what a tag compared),
    // another lower half.
    {
        let db = redb::Database::open(&path).unwrap();
        let txn = db.begin_write().unwrap();
        let other: Vec<u8> = (hashes[0] ^ 1).to_le_bytes().to_vec();
        txn.open_table(RECOGNISED)
            .unwrap()
            .insert(key.as_slice(), other.as_slice())
            .unwrap();
        txn.commit().unwrap();
    }
    let db = open(&path, &clock);
    assert_eq!(db.stats().horizon_keys, 1);
    assert!(!beyond_horizon(&db), "recognised by 32 bits of its hash");
}

#[test]
fn an_older_builds_row_of_32_bit_tags_is_recognised_then_retired() {
    let (_dir, path, clock) = reopenable();
    store_and_drop(&path, &clock);
    let (key, hashes) = the_row(&path);
    // As an older build wrote it: the tag (upper half) in `idemdb_horizon`, nothing in
    // `idemdb_recognised`.
    {
        let db = redb::Database::open(&path).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(RECOGNISED)
            .unwrap()
            .remove(key.as_slice())
            .unwrap();
        let tag = ((hashes[0] >> 32) as u32).to_le_bytes();
        txn.open_table(LEGACY)
            .unwrap()
            .insert(key.as_slice(), &tag[..])
            .unwrap();
        txn.commit().unwrap();
    }
    let db = open(&path, &clock);
    assert_eq!(db.stats().horizon_keys, 1);
    assert!(beyond_horizon(&db));
    // Past the row's `until` (the partition's end + 4 TTLs): retired, and forgotten.
    let until = u64::from_be_bytes(key[..8].try_into().unwrap());
    clock.set(until);
    assert_eq!(db.compact_now().unwrap().horizon_sets_retired, 1);
    assert_eq!(db.stats().horizon_keys, 0);
    drop(db);
    let db = redb::Database::open(&path).unwrap();
    let txn = db.begin_read().unwrap();
    assert_eq!(txn.open_table(LEGACY).unwrap().iter().unwrap().count(), 0);
}
