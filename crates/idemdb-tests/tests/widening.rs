//! Widening (src/widen.rs, docs/design.md §8.8): once the window of a wide partition closed, a
//! compaction pass merges the narrow partitions in it into one table written in key order and
//! drops them. Every record answers as before, byte for byte, across the switch, a reopen and
//! a drop; a record placed in a narrow partition while the wide one was built leaves them as
//! they were; a build left behind is deleted; two copies of a key are never merged.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use common::{
    LEASE, T0, acquired, each_write_failure, finish, minutes, open_retained, partition_tables,
    reopenable, tables_named,
};
use idemdb::redb::{self, ReadableTable, TableDefinition};
use idemdb::{IdemDb, Key, ManualClock, RecordState, ReserveOutcome, Scope};
use idemdb_testkit::{FaultBackend, TearMode};

/// 1-minute partitions under a 60-minute TTL: wide partitions of 3 minutes.
const WIDE: u64 = 180_000;
const TTL: u64 = 3_600_000;

/// The first wide window that starts at or after T0.
const S: u64 = T0 - T0 % WIDE + WIDE;

fn scope() -> Scope {
    Scope::new("op", "p")
}

fn open(path: &Path, clock: &ManualClock) -> IdemDb {
    open_retained(path, clock, minutes(60))
}

fn wide_table(start: u64) -> String {
    format!("idemdb_p_{start:020}_{WIDE}_{TTL}")
}

/// Completes `count` keys `{prefix}-{i}` at the clock's time, every other one failed.
fn fill(db: &IdemDb, prefix: &str, count: usize) {
    for i in 0..count {
        let key = format!("{prefix}-{i}");
        if i.is_multiple_of(2) {
            finish(db, &scope(), &key, format!("r-{key}"));
        } else {
            let r = acquired(db.reserve(&scope(), &Key::new(&key), b"x", LEASE).unwrap());
            db.fail(&r, format!("f-{key}").into_bytes()).unwrap();
        }
    }
}

/// The stored answer of `{prefix}-{i}`, byte for byte, or what the reserve said instead.
fn answers(db: &IdemDb, prefix: &str, i: usize) -> Result<(), String> {
    let key = format!("{prefix}-{i}");
    let expected = if i.is_multiple_of(2) {
        ReserveOutcome::Completed(format!("r-{key}").into_bytes())
    } else {
        ReserveOutcome::Failed(format!("f-{key}").into_bytes())
    };
    match db.reserve(&scope(), &Key::new(&key), b"x", LEASE).unwrap() {
        got if got == expected => Ok(()),
        other => Err(format!("{key}: {other:?}")),
    }
}

/// Three narrow partitions of 100 records in the wide window starting at `S`, and one
/// IN_PROGRESS record.
fn three_narrow(path: &Path, clock: &ManualClock) -> IdemDb {
    clock.set(S);
    let db = open(path, clock);
    for (i, prefix) in ["a", "b", "c"].iter().enumerate() {
        clock.set(S + i as u64 * 60_000 + 5_000);
        fill(&db, prefix, 100);
    }
    acquired(
        db.reserve(&scope(), &Key::new("held"), b"x", LEASE)
            .unwrap(),
    );
    db
}

fn all_answer(db: &IdemDb) {
    for prefix in ["a", "b", "c"] {
        for i in 0..100 {
            answers(db, prefix, i).unwrap();
        }
    }
}

#[test]
fn closed_narrow_partitions_are_merged_into_one_wide_partition_that_answers_the_same() {
    let (_dir, path, clock) = reopenable();
    let db = three_narrow(&path, &clock);
    // The window is still open at S + 179 s: nothing is widened.
    clock.set(S + WIDE - 1_000);
    let report = db.compact_now().unwrap();
    assert_eq!(report.wide_partitions_built, 0);
    all_answer(&db);
    clock.set(S + WIDE + 1_000);
    let report = db.compact_now().unwrap();
    // The narrow partitions were retired by the switch (renamed out of the catalog), and their
    // pages freed by the same pass's reclaim steps (docs/design.md §8.9).
    assert_eq!(
        (
            report.wide_partitions_built,
            report.partitions_widened,
            report.tables_reclaimed
        ),
        (1, 3, 3)
    );
    all_answer(&db);
    let held = db.get(&scope(), &Key::new("held")).unwrap().unwrap();
    assert_eq!(
        held.state,
        RecordState::InProgress,
        "in the in-flight table, untouched"
    );
    // Found through the wide partition's filter (docs/design.md §8.3): the key index holds
    // none of its keys.
    let stats = db.stats();
    assert_eq!(stats.indexed_keys, 0);
    let filters = stats.memory.key_filters;
    assert!(
        (300..=1_200).contains(&filters),
        "{filters} bytes for 300 keys"
    );
    // A second pass finds nothing more to do.
    assert_eq!(db.compact_now().unwrap().wide_partitions_built, 0);
    drop(db);
    assert_eq!(partition_tables(&path), vec![wide_table(S)]);
    assert_eq!(
        tables_named(&path, "idemdb_filters"),
        vec!["idemdb_filters"]
    );

    let db = open(&path, &clock);
    let stats = db.stats();
    assert_eq!(
        (stats.partitions_read_at_open, stats.indexed_keys),
        (0, 0),
        "the wide one has its filter"
    );
    assert_eq!(stats.memory.key_index, 0);
    assert_eq!(stats.memory.key_filters, filters);
    all_answer(&db);
    // A key never stored is acquired, whichever filter admits it falsely.
    for i in 0..1_000 {
        let r = acquired(
            db.reserve(&scope(), &Key::new(format!("new-{i}")), b"x", LEASE)
                .unwrap(),
        );
        assert!(!r.is_beyond_horizon());
    }
    let report = db.verify(10, |_| {}).unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
}

#[test]
fn a_wide_partition_drops_whole_once_its_last_record_expired_and_its_keys_are_recognised() {
    let (_dir, path, clock) = reopenable();
    let db = three_narrow(&path, &clock);
    clock.set(S + WIDE + 1_000);
    assert_eq!(db.compact_now().unwrap().wide_partitions_built, 1);
    // c's records (written at S + 125 s) are live until S + 125 s + TTL; the partition is due
    // at S + 180 s + TTL.
    clock.set(S + 125_000 + TTL - 1);
    assert_eq!(db.compact_now().unwrap().partitions_dropped, 0);
    answers(&db, "c", 3).unwrap();
    clock.set(S + WIDE + TTL);
    let report = db.compact_now().unwrap();
    assert_eq!(
        (report.partitions_dropped, report.records_expired),
        (1, 300)
    );
    for key in ["a-0", "b-51", "c-99"] {
        let r = acquired(db.reserve(&scope(), &Key::new(key), b"x", LEASE).unwrap());
        assert!(r.is_beyond_horizon(), "{key} recognised");
    }
    drop(db);
    assert!(!partition_tables(&path).contains(&wide_table(S)));
}

#[test]
fn a_record_placed_in_a_narrow_partition_while_the_wide_one_was_built_leaves_them_as_they_were() {
    let (_dir, path, clock) = reopenable();
    let db = Arc::new(three_narrow(&path, &clock));
    let writer = Arc::clone(&db);
    let writer_clock = clock.clone();
    let ran = Arc::new(AtomicBool::new(false));
    let hook_ran = Arc::clone(&ran);
    idemdb::testing::before_next_widening_switch(&db, move || {
        // The clock goes back into the window: the record goes to b's narrow partition.
        writer_clock.set(S + 65_000);
        fill(&writer, "late", 1);
        writer_clock.set(S + WIDE + 1_000);
        hook_ran.store(true, Ordering::SeqCst);
    });
    clock.set(S + WIDE + 1_000);
    let report = db.compact_now().unwrap();
    assert!(ran.load(Ordering::SeqCst));
    assert_eq!(
        report.wide_partitions_built, 0,
        "the switch found b changed"
    );
    all_answer(&db);
    answers(&db, "late", 0).unwrap();
    // The next pass reads them again, the late record with them.
    let report = db.compact_now().unwrap();
    assert_eq!(
        (report.wide_partitions_built, report.partitions_widened),
        (1, 3)
    );
    all_answer(&db);
    answers(&db, "late", 0).unwrap();
    drop(db);
    let tables = partition_tables(&path);
    assert_eq!(tables, vec![wide_table(S)]);
    assert!(
        build_tables(&path).is_empty(),
        "the failed build was deleted"
    );
}

#[test]
fn a_build_left_by_a_crash_is_deleted_and_never_read() {
    let (_dir, path, clock) = reopenable();
    drop(three_narrow(&path, &clock));
    // As a process killed between two build steps leaves them: build tables holding a record
    // that is not the stored one, of this window and of one that no pass will build again
    // (its narrow partitions are gone).
    let builds = [S, S + 10 * WIDE].map(|start| format!("idemdb_b_{start:020}_{WIDE}_{TTL}"));
    {
        let redb = redb::Database::open(&path).unwrap();
        let txn = redb.begin_write().unwrap();
        for build in &builds {
            let def = TableDefinition::<&[u8], &[u8]>::new(build);
            txn.open_table(def)
                .unwrap()
                .insert(&b"junk"[..], &b"not a record"[..])
                .unwrap();
        }
        txn.commit().unwrap();
    }
    let db = open(&path, &clock);
    all_answer(&db);
    let report = db.verify(10, |_| {}).unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
    clock.set(S + WIDE + 1_000);
    assert_eq!(db.compact_now().unwrap().wide_partitions_built, 1);
    all_answer(&db);
    drop(db);
    assert_eq!(build_tables(&path), Vec::<String>::new());
    assert_eq!(partition_tables(&path), vec![wide_table(S)]);
}

#[test]
fn a_key_in_two_narrow_partitions_of_one_window_is_never_merged() {
    let (_dir, path, clock) = reopenable();
    let db = three_narrow(&path, &clock);
    drop(db);
    // A copy of a-0 in c's partition, as a clock that went back past a-0's expiry and then
    // forward again could leave it.
    let tables = partition_tables(&path);
    {
        let redb = redb::Database::open(&path).unwrap();
        let txn = redb.begin_write().unwrap();
        let a = TableDefinition::<&[u8], &[u8]>::new(&tables[0]);
        let c = TableDefinition::<&[u8], &[u8]>::new(&tables[2]);
        let (k, v) = {
            use idemdb::redb::ReadableTable;
            let t = txn.open_table(a).unwrap();
            let (k, v) = t.first().unwrap().unwrap();
            (k.value().to_vec(), v.value().to_vec())
        };
        txn.open_table(c)
            .unwrap()
            .insert(k.as_slice(), v.as_slice())
            .unwrap();
        txn.commit().unwrap();
    }
    let db = open(&path, &clock);
    clock.set(S + WIDE + 1_000);
    assert_eq!(db.compact_now().unwrap().wide_partitions_built, 0);
    all_answer(&db);
    // Not tried again by this process: the window stays as it is until it drops.
    assert_eq!(db.compact_now().unwrap().wide_partitions_built, 0);
    drop(db);
    assert_eq!(partition_tables(&path), tables);
    assert_eq!(build_tables(&path), Vec::<String>::new());
}

/// The build tables of the closed database at `path`.
fn build_tables(path: &Path) -> Vec<String> {
    tables_named(path, "idemdb_b_")
}

#[test]
fn a_record_placed_in_a_widened_window_goes_to_a_narrow_partition_beside_it() {
    let (_dir, path, clock) = reopenable();
    let db = three_narrow(&path, &clock);
    clock.set(S + WIDE + 1_000);
    assert_eq!(db.compact_now().unwrap().wide_partitions_built, 1);
    // The clock goes back into the widened window.
    clock.set(S + 65_000);
    fill(&db, "late", 2);
    clock.set(S + WIDE + 2_000);
    // The window has a wide partition: its new narrow one stays beside it.
    assert_eq!(db.compact_now().unwrap().wide_partitions_built, 0);
    all_answer(&db);
    answers(&db, "late", 0).unwrap();
    answers(&db, "late", 1).unwrap();
    drop(db);
    let narrow = format!("idemdb_p_{:020}_60000_{TTL}", S + 60_000);
    assert_eq!(partition_tables(&path), vec![wide_table(S), narrow]);
    let db = open(&path, &clock);
    all_answer(&db);
    answers(&db, "late", 1).unwrap();
}

/// Readers replaying every key through the snapshot (no replay cache) while a pass widens ten
/// windows: each answer is the stored one, before, during and after each switch.
#[test]
fn replays_racing_the_switch_always_find_the_record() {
    const WINDOWS: u64 = 10;
    const PER_NARROW: usize = 200;
    let (_dir, path, clock) = reopenable();
    clock.set(S);
    let db = Arc::new(
        IdemDb::builder()
            .clock(clock.clone())
            .retention(minutes(60))
            .replay_cache(0)
            .open(&path)
            .unwrap(),
    );
    let mut prefixes = Vec::new();
    for w in 0..WINDOWS {
        for n in 0..3 {
            clock.set(S + w * WIDE + n * 60_000 + 1_000);
            let prefix = format!("w{w}n{n}");
            fill(&db, &prefix, PER_NARROW);
            prefixes.push(prefix);
        }
    }
    let prefixes = Arc::new(prefixes);
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..4)
        .map(|t| {
            let (db, prefixes, stop) = (Arc::clone(&db), Arc::clone(&prefixes), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut checked = 0u64;
                let mut i = t;
                while !stop.load(Ordering::SeqCst) {
                    let prefix = &prefixes[i % prefixes.len()];
                    answers(&db, prefix, (i * 7) % PER_NARROW).unwrap();
                    i += 1;
                    checked += 1;
                }
                checked
            })
        })
        .collect();
    clock.set(S + WINDOWS * WIDE + 1_000);
    let report = db.compact_now().unwrap();
    stop.store(true, Ordering::SeqCst);
    let checked: u64 = readers.into_iter().map(|r| r.join().unwrap()).sum();
    assert_eq!(report.wide_partitions_built, WINDOWS);
    assert!(
        checked > 1_000,
        "the readers checked only {checked} answers"
    );
    for prefix in prefixes.iter() {
        for i in 0..PER_NARROW {
            answers(&db, prefix, i).unwrap();
        }
    }
}

/// The database on `disk`, at `clock`, with 1-minute partitions under a 60-minute TTL.
fn open_on_disk(disk: &FaultBackend, clock: &ManualClock) -> Result<IdemDb, idemdb::Error> {
    IdemDb::builder()
        .clock(clock.clone())
        .retention(minutes(60))
        .open_with_backend(disk.clone(), disk.log())
}

/// A disk holding three narrow partitions of 100 records with big responses in the wide window
/// starting at `S`, and their keys.
fn big_window(clock: &ManualClock) -> (FaultBackend, Vec<String>) {
    let keys: Vec<String> = (0..3)
        .flat_map(|n| (0..100).map(move |i| format!("n{n}-{i}")))
        .collect();
    let disk = FaultBackend::new();
    {
        let db = open_on_disk(&disk, clock).unwrap();
        for n in 0..3u64 {
            clock.set(S + n * 60_000 + 5_000);
            for key in keys.iter().filter(|k| k.starts_with(&format!("n{n}-"))) {
                finish(&db, &scope(), key, big_response(key));
            }
        }
    }
    (disk.durable_disk(), keys)
}

fn all_big_answer(db: &IdemDb, keys: &[String]) {
    for key in keys {
        let got = db.reserve(&scope(), &Key::new(key), b"x", LEASE).unwrap();
        assert_eq!(got, ReserveOutcome::Completed(big_response(key)), "{key}");
    }
}

/// Responses big enough that a window's records take more than one build step (2 MiB each).
fn big_response(key: &str) -> Vec<u8> {
    let mut out = key.as_bytes().to_vec();
    out.resize(16 << 10, b'.');
    out
}

/// Power lost inside each sync of a pass that widens (every build step and the switch is a
/// durable commit of its own), with the pending writes dropped, kept or torn: the image opens,
/// every record answers as stored, and the next pass widens the window.
#[test]
fn power_lost_inside_each_sync_of_a_widening_pass_loses_nothing() {
    let clock = ManualClock::new(S);
    let open_on = |disk: &FaultBackend| open_on_disk(disk, &clock);
    let (before, keys) = big_window(&clock);
    let all_answer = |db: &IdemDb| all_big_answer(db, &keys);
    // The syncs of a whole pass, counted on a copy.
    clock.set(S + WIDE + 1_000);
    let syncs = {
        let disk = before.durable_disk();
        let db = open_on(&disk).unwrap();
        let from = disk.syncs_begun();
        let report = db.compact_now().unwrap();
        assert_eq!(
            (report.wide_partitions_built, report.partitions_widened),
            (1, 3)
        );
        disk.syncs_begun() - from
    };
    assert!(syncs >= 3, "two build steps and a switch: {syncs} syncs");
    let mut switched = 0;
    for n in 0..syncs {
        for mode in [
            TearMode::DropAll,
            TearMode::KeepAll,
            TearMode::Random(n + 1),
        ] {
            let disk = before.durable_disk();
            let db = open_on(&disk).unwrap();
            disk.crash_at_sync(n, mode);
            let _ = db.compact_now();
            drop(db);
            let image = disk.crashed_disk().expect("the power loss struck");
            let db = open_on(&image).unwrap_or_else(|e| panic!("sync {n} {mode:?}: {e}"));
            all_answer(&db);
            let report = db.verify(10, |_| {}).unwrap();
            assert!(report.is_ok(), "sync {n} {mode:?}: {:?}", report.problems);
            let built = db.compact_now().unwrap().wide_partitions_built;
            switched += usize::from(built == 0);
            assert_eq!(db.stats().partitions, 1, "sync {n} {mode:?}");
            all_answer(&db);
        }
    }
    eprintln!("{syncs} syncs, switched before the loss in {switched} images");
}

/// A write that fails inside a widening pass (a full disk, an I/O error) at each of its first
/// writes: the pass fails, the database refuses writes until it is reopened, and the reopened
/// file answers every record and widens at its next pass.
#[test]
fn a_write_failing_inside_a_widening_pass_poisons_and_loses_nothing() {
    let clock = ManualClock::new(S);
    let (before, keys) = big_window(&clock);
    clock.set(S + WIDE + 1_000);
    let failed = each_write_failure(
        &before,
        &[0, 1, 2, 5, 20, 100, 400],
        |disk| open_on_disk(disk, &clock).unwrap(),
        |db| db.compact_now(),
        |after, image| {
            let db = open_on_disk(&image, &clock).unwrap();
            all_big_answer(&db, &keys);
            assert_eq!(
                db.compact_now().unwrap().wide_partitions_built,
                1,
                "after {after}"
            );
            all_big_answer(&db, &keys);
        },
    );
    assert!(
        failed >= 5,
        "the pass failed for only {failed} of 7 fault points"
    );
}

/// As above, with the second copy of the key exactly where a build step ends (the first step
/// ends at the record that brings it to 2 MiB of keys and values): the next step starts after
/// that key, so only the step's look at the heads it leaves can see the copy.
#[test]
fn a_key_twice_across_a_build_step_boundary_is_never_merged() {
    use idemdb::redb::ReadableTable;
    let clock = ManualClock::new(S);
    let (disk, keys) = big_window(&clock);
    let db_image = {
        let backend = FaultBackend::from_images(disk.durable_image(), disk.log().durable_image());
        let raw = redb::Database::builder()
            .create_with_backend(backend.clone())
            .unwrap();
        let txn = raw.begin_write().unwrap();
        let names: Vec<String> = {
            use idemdb::redb::TableHandle;
            txn.list_tables()
                .unwrap()
                .map(|t| t.name().to_string())
                .filter(|n| n.starts_with("idemdb_p_"))
                .collect()
        };
        let mut all: Vec<(Vec<u8>, Vec<u8>, usize)> = Vec::new();
        for (i, name) in names.iter().enumerate() {
            let t = txn
                .open_table(TableDefinition::<&[u8], &[u8]>::new(name))
                .unwrap();
            for e in t.iter().unwrap() {
                let (k, v) = e.unwrap();
                all.push((k.value().to_vec(), v.value().to_vec(), i));
            }
        }
        all.sort();
        let mut bytes = 0;
        let (k, v, from) = all
            .into_iter()
            .find(|(k, v, _)| {
                bytes += k.len() + v.len();
                bytes >= 2 << 20
            })
            .unwrap();
        let other = &names[(from + 1) % names.len()];
        txn.open_table(TableDefinition::<&[u8], &[u8]>::new(other))
            .unwrap()
            .insert(k.as_slice(), v.as_slice())
            .unwrap();
        txn.commit().unwrap();
        drop(raw);
        backend.durable_image()
    };
    let disk = FaultBackend::from_images(db_image, disk.log().durable_image());
    let db = open_on_disk(&disk, &clock).unwrap();
    clock.set(S + WIDE + 1_000);
    assert_eq!(db.compact_now().unwrap().wide_partitions_built, 0);
    all_big_answer(&db, &keys);
    assert_eq!(db.stats().partitions, 3);
}

/// The window at `S` widened (three narrow partitions of 100 records merged).
fn widened(path: &Path, clock: &ManualClock) -> IdemDb {
    let db = three_narrow(path, clock);
    clock.set(S + WIDE + 1_000);
    assert_eq!(db.compact_now().unwrap().wide_partitions_built, 1);
    db
}

const FILTERS: TableDefinition<&str, &[u8]> = TableDefinition::new("idemdb_filters");

/// Replaces the filter row of the wide partition at `S` in the closed database at `path` by
/// what `change` makes of it.
fn change_filter_row(path: &Path, change: impl FnOnce(&mut Vec<u8>)) {
    let redb = redb::Database::open(path).unwrap();
    let txn = redb.begin_write().unwrap();
    {
        let mut rows = txn.open_table(FILTERS).unwrap();
        let table = wide_table(S);
        let mut row = rows.get(table.as_str()).unwrap().unwrap().value().to_vec();
        change(&mut row);
        rows.insert(table.as_str(), row.as_slice()).unwrap();
    }
    txn.commit().unwrap();
}

#[test]
fn a_filter_row_that_no_longer_describes_its_table_is_not_used() {
    let (_dir, path, clock) = reopenable();
    drop(widened(&path, &clock));
    // Opened with partitions as wide as the wide one, the clock back in its window: a record
    // is placed in the wide partition, after its filter was built.
    clock.set(S + 10_000);
    let as_wide = minutes(60).partition_width(std::time::Duration::from_millis(WIDE));
    let db = open_retained(&path, &clock, as_wide);
    fill(&db, "late", 1);
    answers(&db, "late", 0).unwrap();
    drop(db);

    clock.set(S + WIDE + 2_000);
    let db = open(&path, &clock);
    let stats = db.stats();
    assert_eq!(
        (stats.partitions_read_at_open, stats.indexed_keys),
        (1, 301),
        "the filter and the summary no longer hold: the table is read"
    );
    assert_eq!(stats.memory.key_filters, 0);
    answers(&db, "late", 0).unwrap();
    all_answer(&db);
}

#[test]
fn a_damaged_filter_row_refuses_the_open_naming_it() {
    let (_dir, path, clock) = reopenable();
    drop(widened(&path, &clock));
    change_filter_row(&path, |row| row[44] ^= 0x10);
    match open_retained_result(&path, &clock) {
        Err(idemdb::Error::Corrupted(why)) => {
            let named = format!("idemdb_filters: the row of {}", wide_table(S));
            assert!(why.contains(&named), "{why}");
            assert!(why.contains("checksum mismatch"), "{why}");
        }
        other => panic!("{other:?}"),
    }
}

/// Rows left by tables no longer there (an older build's, or damage) are never used, so the
/// open skips them without decoding them, however malformed.
#[test]
fn filter_rows_of_tables_no_longer_there_are_skipped() {
    let (_dir, path, clock) = reopenable();
    drop(widened(&path, &clock));
    {
        let redb = redb::Database::open(&path).unwrap();
        let txn = redb.begin_write().unwrap();
        {
            let mut rows = txn.open_table(FILTERS).unwrap();
            let gone = wide_table(S + 10 * WIDE);
            rows.insert(gone.as_str(), &b"not a filter row"[..])
                .unwrap();
            rows.insert("a", &[0u8; 3][..]).unwrap();
            rows.insert("zzz", &[0xffu8; 100][..]).unwrap();
        }
        txn.commit().unwrap();
    }
    let db = open_retained_result(&path, &clock).unwrap();
    let stats = db.stats();
    assert_eq!(
        stats.partitions_read_at_open, 0,
        "the wide partition's own row holds"
    );
    assert!(stats.memory.key_filters > 0);
    all_answer(&db);
}

fn open_retained_result(path: &Path, clock: &ManualClock) -> Result<IdemDb, idemdb::Error> {
    IdemDb::builder()
        .clock(clock.clone())
        .retention(minutes(60))
        .open(path)
}

/// A row whose checksum matches but whose filter lacks keys of its table (written so by a
/// faulty build, or damaged and its checksum recomputed) hides those records from every
/// lookup: `verify` says so.
#[test]
fn verify_lists_a_filter_that_lacks_keys_of_its_table() {
    let (_dir, path, clock) = reopenable();
    drop(widened(&path, &clock));
    change_filter_row(&path, |row| {
        let body = row.len() - 8;
        row[40..body].fill(0x5a);
        let sum = xxhash_rust::xxh3::xxh3_64(&row[..body]);
        row[body..].copy_from_slice(&sum.to_le_bytes());
    });
    let db = open(&path, &clock);
    let report = db.verify(10, |_| {}).unwrap();
    assert_eq!(report.problem_count, 1, "{:?}", report.problems);
    let problem = &report.problems[0];
    assert_eq!(problem.table, "idemdb_filters");
    assert_eq!(problem.key.as_deref(), Some(wide_table(S).as_bytes()));
    assert!(
        problem.what.contains("the filter lacks"),
        "{}",
        problem.what
    );
}

/// The budget an open checks counts a wide partition's filter, not a key index entry per
/// record (docs/design.md §8.7).
#[test]
fn the_memory_budget_counts_a_wide_partitions_filter_not_its_records() {
    let (_dir, path, clock) = reopenable();
    let filters = {
        let db = widened(&path, &clock);
        db.stats().memory.key_filters
    };
    let caches = (4 << 20) + (1 << 20);
    let open_within = |budget: u64| {
        IdemDb::builder()
            .clock(clock.clone())
            .retention(minutes(60))
            .cache_size(4 << 20)
            .replay_cache(1 << 20)
            .memory_budget(budget)
            .open(&path)
    };
    match open_within(caches + filters - 1) {
        Err(idemdb::Error::MemoryBudget {
            needed, records, ..
        }) => {
            assert_eq!(
                (needed.key_filters, needed.key_index, records),
                (filters, 0, 0)
            );
        }
        other => panic!("{other:?}"),
    }
    let db = open_within(caches + filters).unwrap();
    assert_eq!(db.stats().memory.total(), caches + filters);
    all_answer(&db);
}
