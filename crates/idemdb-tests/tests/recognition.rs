//! Beyond-horizon recognition by whole 64-bit key hashes (records/horizon.rs,
//! records/recognised.rs): a dropped key is recognised by its hash, not by 32 bits of it, from
//! a table on disk keyed by hash, so that memory holds none of them once the pass that dropped
//! them has entered them; a power loss between the drop and those steps forgets none; a key
//! kept by two rows stays recognised until the later one's horizon; rows of 32-bit tags that
//! older builds wrote (`idemdb_horizon`) are still read, recognised by the upper half, and
//! retired.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::{LEASE, T0, acquired, finish, minutes, open_retained, reopenable};
use idemdb::redb::{self, ReadableDatabase, ReadableTable, TableDefinition};
use idemdb::{IdemDb, Key, ManualClock, Scope};
use idemdb_testkit::{Fault, FaultBackend, TearMode};

const RECOGNISED: TableDefinition<&[u8], &[u8]> = TableDefinition::new("idemdb_recognised");
const KEYS: TableDefinition<u64, u64> = TableDefinition::new("idemdb_recognised_keys");
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

/// Whether a reserve of `key` is acquired beyond horizon; the reservation is released, so
/// that nothing of it stays.
fn beyond_horizon_of(db: &IdemDb, key: &str) -> bool {
    let r = acquired(
        db.reserve(&Scope::new("op", "p"), &Key::new(key), b"x", LEASE)
            .unwrap(),
    );
    db.release(&r).unwrap();
    r.is_beyond_horizon()
}

/// Whether a reserve of `k` is acquired beyond horizon.
fn beyond_horizon(db: &IdemDb) -> bool {
    beyond_horizon_of(db, "k")
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
        let mut keys = txn.open_table(KEYS).unwrap();
        let until = keys.remove(hashes[0]).unwrap().unwrap().value();
        keys.insert(hashes[0] ^ 1, until).unwrap();
        drop(keys);
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
        txn.open_table(KEYS).unwrap().remove(hashes[0]).unwrap();
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

/// Keys dropped in one pass: three steps of entering them on disk (4,096 a step).
const MANY: usize = 10_000;

fn many_key(i: usize) -> String {
    format!("m-{i}")
}

/// Completes [`MANY`] keys at `T0` from 8 threads.
fn fill_many(db: &Arc<IdemDb>) {
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let db = Arc::clone(db);
            std::thread::spawn(move || {
                for i in (t..MANY).step_by(8) {
                    finish(&db, &Scope::new("op", "p"), &many_key(i), "done");
                }
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
}

/// Every 97th of the dropped keys is acquired beyond horizon (and released).
fn sample_recognised(db: &IdemDb, what: &str) {
    for i in (0..MANY).step_by(97) {
        assert!(
            beyond_horizon_of(db, &many_key(i)),
            "{what}: key {i} not recognised"
        );
    }
}

#[test]
fn dropped_keys_are_recognised_from_disk_and_memory_holds_none() {
    let (_dir, path, clock) = reopenable();
    let db = Arc::new(open(&path, &clock));
    fill_many(&db);
    clock.set(T0 + 2 * 3_600_000);
    assert_eq!(db.compact_now().unwrap().records_expired, MANY as u64);
    let stats = db.stats();
    assert_eq!((stats.horizon_keys, stats.memory.horizon), (MANY as u64, 0));
    sample_recognised(&db, "after the pass");
    // A fresh key is not recognised.
    assert!(!beyond_horizon_of(&db, "fresh"));
    drop(db);
    let db = open(&path, &clock);
    let stats = db.stats();
    assert_eq!((stats.horizon_keys, stats.memory.horizon), (MANY as u64, 0));
    sample_recognised(&db, "after a reopen");
    let report = db.verify(10, |_| {}).unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
}

fn open_on_disk(disk: &FaultBackend, clock: &ManualClock) -> Result<IdemDb, idemdb::Error> {
    IdemDb::builder()
        .clock(clock.clone())
        .retention(minutes(60))
        .open_with_backend(disk.clone(), disk.log())
}

/// A disk holding [`MANY`] keys completed at `T0`, the clock left where their partition is
/// due.
fn many_due(clock: &ManualClock) -> FaultBackend {
    let disk = FaultBackend::new();
    let db = Arc::new(open_on_disk(&disk, clock).unwrap());
    fill_many(&db);
    drop(db);
    clock.set(T0 + 2 * 3_600_000);
    disk.durable_disk()
}

/// A store reopened after a pass that was cut short: `verify` finds every row not named
/// unindexed entered in full, every sampled key is recognised (by its expired record, its
/// held row or the table), and its next pass drops what is due and enters the rest, leaving
/// memory holding none of them.
fn recovers_in_full(db: &IdemDb, what: &str) {
    let report = db.verify(10, |_| {}).unwrap();
    assert!(report.is_ok(), "{what}: {:?}", report.problems);
    sample_recognised(db, what);
    db.compact_now().unwrap();
    let stats = db.stats();
    assert_eq!(
        (stats.partitions, stats.horizon_keys, stats.memory.horizon),
        (0, MANY as u64, 0),
        "{what}"
    );
    sample_recognised(db, what);
}

/// Power lost inside each sync of the pass that drops [`MANY`] keys and enters them on disk in
/// steps, with the pending writes dropped, kept or torn: every image opens, `verify` finds
/// every row not named unindexed entered in full, every sampled key is recognised, and the
/// next pass leaves memory holding none of them.
#[test]
fn power_lost_inside_each_sync_of_a_drop_and_its_steps_forgets_no_key() {
    let clock = ManualClock::new(T0);
    let before = many_due(&clock);
    let syncs = {
        let disk = before.durable_disk();
        let db = open_on_disk(&disk, &clock).unwrap();
        let from = disk.syncs_begun();
        assert_eq!(db.compact_now().unwrap().partitions_dropped, 1);
        disk.syncs_begun() - from
    };
    assert!(syncs >= 3, "a drop and two steps: {syncs} syncs");
    let mut pending_after_loss = 0;
    for n in 0..syncs {
        for mode in [
            TearMode::DropAll,
            TearMode::KeepAll,
            TearMode::Random(n + 1),
        ] {
            let what = format!("sync {n} {mode:?}");
            let disk = before.durable_disk();
            let db = open_on_disk(&disk, &clock).unwrap();
            disk.crash_at_sync(n, mode);
            let _ = db.compact_now();
            drop(db);
            let image = disk.crashed_disk().expect("the power loss struck");
            let db = open_on_disk(&image, &clock).unwrap_or_else(|e| panic!("{what}: {e}"));
            if db.stats().partitions == 0 {
                pending_after_loss += usize::from(db.stats().memory.horizon > 0);
            }
            recovers_in_full(&db, &what);
        }
    }
    assert!(
        pending_after_loss > 0,
        "no loss struck between the drop and its last step"
    );
}

/// A write that fails inside the pass that drops [`MANY`] keys and enters them (a full disk,
/// an I/O error), at writes spread over the drop and its steps: the pass fails, writes are
/// refused until a reopen, and the reopened file recognises every sampled key, `verify`
/// finds nothing wrong, and its next pass enters what was left.
#[test]
fn a_write_failing_inside_a_drop_or_its_steps_poisons_and_forgets_no_key() {
    let clock = ManualClock::new(T0);
    let before = many_due(&clock);
    let mut failed = 0;
    let mut failed_after_the_drop = 0;
    for after in [0, 1, 2, 4, 8, 16, 32, 64, 128, 256] {
        let what = format!("after {after} writes");
        let disk = before.durable_disk();
        let db = open_on_disk(&disk, &clock).unwrap();
        disk.inject(Fault::Write { after });
        let Err(e) = db.compact_now() else {
            continue; // The pass wrote fewer pages: nothing failed.
        };
        failed += 1;
        assert!(
            matches!(
                db.reserve(&Scope::new("op", "p"), &Key::new("fresh"), b"x", LEASE),
                Err(idemdb::Error::WritesRefused | idemdb::Error::Poisoned(_))
            ),
            "{what}: {e}"
        );
        drop(db);
        disk.clear_faults();
        let db = open_on_disk(&disk.durable_disk(), &clock).unwrap();
        failed_after_the_drop += usize::from(db.stats().partitions == 0);
        recovers_in_full(&db, &what);
    }
    assert!(failed >= 5, "the pass failed at only {failed} fault points");
    assert!(
        failed_after_the_drop > 0,
        "no fault struck after the drop committed"
    );
}

/// A key dropped, acquired again beyond horizon and dropped again is kept by two rows: the
/// first row's retirement leaves it recognised until the second's horizon.
#[test]
fn a_key_kept_by_two_rows_is_recognised_until_the_later_horizon() {
    let (_dir, path, clock) = reopenable();
    store_and_drop(&path, &clock);
    let db = open(&path, &clock);
    let r = acquired(
        db.reserve(&Scope::new("op", "p"), &Key::new("k"), b"x", LEASE)
            .unwrap(),
    );
    assert!(r.is_beyond_horizon());
    db.complete(&r, b"again".to_vec()).unwrap();
    let first_until = T0 - T0 % 60_000 + 60_000 + 4 * 3_600_000;
    // Its second partition drops at its end + the TTL.
    clock.set(T0 + 4 * 3_600_000);
    assert_eq!(db.compact_now().unwrap().partitions_dropped, 1);
    let second_until =
        (T0 + 2 * 3_600_000) - (T0 + 2 * 3_600_000) % 60_000 + 60_000 + 4 * 3_600_000;
    // The first row retires; the key stays.
    clock.set(first_until);
    assert_eq!(db.compact_now().unwrap().horizon_sets_retired, 1);
    assert_eq!(db.stats().horizon_keys, 1);
    assert!(beyond_horizon(&db), "forgotten at the first row's horizon");
    clock.set(second_until - 1);
    assert!(beyond_horizon(&db));
    clock.set(second_until);
    assert_eq!(db.compact_now().unwrap().horizon_sets_retired, 1);
    assert_eq!(db.stats().horizon_keys, 0);
    assert!(!beyond_horizon(&db));
}

/// Reserves between the steps that enter a dropped row's keys on disk (the writer runs
/// batches between them): every dropped key is recognised, those entered and those not yet.
#[test]
fn reserves_between_the_steps_that_enter_a_drop_recognise_every_key() {
    let (_dir, path, clock) = reopenable();
    let db = Arc::new(open(&path, &clock));
    fill_many(&db);
    clock.set(T0 + 2 * 3_600_000);
    let checked = Arc::new(std::sync::atomic::AtomicBool::new(false));
    {
        let (db2, checked) = (Arc::clone(&db), Arc::clone(&checked));
        idemdb::testing::between_next_recognition_steps(&db, move || {
            sample_recognised(&db2, "between the steps");
            checked.store(true, std::sync::atomic::Ordering::SeqCst);
        });
    }
    assert_eq!(db.compact_now().unwrap().records_expired, MANY as u64);
    assert!(
        checked.load(std::sync::atomic::Ordering::SeqCst),
        "no second step"
    );
    sample_recognised(&db, "after the steps");
}

/// A file of format 6 (every recognised key held in memory from its rows, no table of them by
/// hash): the open names every row unindexed and holds their keys, recognising them; the next
/// pass enters them on disk and memory lets them go.
#[test]
fn a_version_6_file_keeps_its_recognised_keys_through_the_upgrade() {
    let (_dir, path, clock) = reopenable();
    store_and_drop(&path, &clock);
    {
        let db = redb::Database::open(&path).unwrap();
        let txn = db.begin_write().unwrap();
        assert!(txn.delete_table(KEYS).unwrap());
        txn.delete_table(TableDefinition::<&[u8], ()>::new(
            "idemdb_recognised_unindexed",
        ))
        .unwrap();
        txn.open_table(TableDefinition::<&str, &[u8]>::new("idemdb_meta"))
            .unwrap()
            .insert("format_version", &6u32.to_le_bytes()[..])
            .unwrap();
        txn.commit().unwrap();
    }
    let db = open(&path, &clock);
    let stats = db.stats();
    assert_eq!(stats.horizon_keys, 1);
    assert!(stats.memory.horizon > 0, "held in memory until entered");
    assert!(beyond_horizon(&db));
    db.compact_now().unwrap();
    let stats = db.stats();
    assert_eq!((stats.horizon_keys, stats.memory.horizon), (1, 0));
    assert!(beyond_horizon(&db));
    drop(db);
    assert_eq!(
        common::format_version(&path),
        Some(8u32.to_le_bytes().to_vec())
    );
    let db = open(&path, &clock);
    assert!(beyond_horizon(&db));
    let report = db.verify(10, |_| {}).unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
}
