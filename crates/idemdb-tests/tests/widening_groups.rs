//! Groups (src/widen.rs, docs/design.md §8.8): under a TTL of two days or more, the closed
//! hours are merged again into one partition per 1/24 of the TTL, so that a lookup asks a
//! bounded number of filters. The hours' records, and the narrow partitions of a group that
//! closed, answer byte for byte through the group, across a reopen, until it drops whole and
//! its keys are recognised. A power loss inside each sync of a group's build, or a write
//! failing in it, loses nothing.

mod common;

use std::path::Path;

use common::{
    LEASE, T0, acquired, each_power_loss, each_write_failure, finish, minutes, open_retained,
    partition_tables, reopenable,
};
use idemdb::{IdemDb, Key, ManualClock, ReserveOutcome, Scope};
use idemdb_testkit::{FaultBackend, TearMode};

/// 1-minute partitions under a 48-hour TTL: hours, and groups of two hours.
const HOUR: u64 = 3_600_000;
const GROUP: u64 = 2 * HOUR;
const TTL: u64 = 48 * HOUR;
const MINUTE: u64 = 60_000;

/// The first group window that starts at or after T0.
const G: u64 = T0 - T0 % GROUP + GROUP;

/// Four narrow partitions of 50 records: two in each hour of the group starting at `G`.
const FILLS: [(&str, u64); 4] = [
    ("a", 5 * MINUTE),
    ("b", 35 * MINUTE),
    ("c", 65 * MINUTE),
    ("d", 95 * MINUTE),
];

fn scope() -> Scope {
    Scope::new("op", "p")
}

fn open(path: &Path, clock: &ManualClock) -> IdemDb {
    open_retained(path, clock, minutes(TTL / MINUTE))
}

fn table(start: u64, width: u64) -> String {
    format!("idemdb_p_{start:020}_{width}_{TTL}")
}

fn filled(path: &Path, clock: &ManualClock) -> IdemDb {
    clock.set(G);
    fill(open(path, clock), clock)
}

/// Completes 50 keys `{prefix}-{i}` at each of [`FILLS`]' times.
fn fill(db: IdemDb, clock: &ManualClock) -> IdemDb {
    for (prefix, at) in FILLS {
        clock.set(G + at);
        for i in 0..50 {
            let key = format!("{prefix}-{i}");
            finish(&db, &scope(), &key, format!("r-{key}"));
        }
    }
    db
}

fn all_answer(db: &IdemDb) {
    for (prefix, _) in FILLS {
        for i in 0..50 {
            let key = format!("{prefix}-{i}");
            let got = db.reserve(&scope(), &Key::new(&key), b"x", LEASE).unwrap();
            assert_eq!(
                got,
                ReserveOutcome::Completed(format!("r-{key}").into_bytes()),
                "{key}"
            );
        }
    }
}

#[test]
fn closed_hours_are_merged_into_their_group_which_answers_the_same_and_drops_whole() {
    let (_dir, path, clock) = reopenable();
    let db = filled(&path, &clock);
    // The first hour closed: its two narrow partitions are merged into it.
    clock.set(G + HOUR + 1_000);
    let report = db.compact_now().unwrap();
    assert_eq!(
        (report.wide_partitions_built, report.partitions_widened),
        (1, 2)
    );
    all_answer(&db);
    // The group closed: the first hour and the second hour's narrow partitions go into it
    // (the second hour is never built on its own).
    clock.set(G + GROUP + 1_000);
    let report = db.compact_now().unwrap();
    assert_eq!(
        (report.wide_partitions_built, report.partitions_widened),
        (1, 3)
    );
    // The narrow partitions' keys left the key index; the group is found through its filter.
    let stats = db.stats();
    assert_eq!(stats.indexed_keys, 0);
    let filters = stats.memory.key_filters;
    assert!(
        (200..=800).contains(&filters),
        "{filters} bytes for 200 keys"
    );
    all_answer(&db);
    assert_eq!(db.compact_now().unwrap().wide_partitions_built, 0);
    drop(db);
    assert_eq!(partition_tables(&path), vec![table(G, GROUP)]);

    let db = open(&path, &clock);
    let stats = db.stats();
    assert_eq!((stats.partitions_read_at_open, stats.indexed_keys), (0, 0));
    assert_eq!(stats.memory.key_filters, filters);
    all_answer(&db);
    for i in 0..500 {
        let r = acquired(
            db.reserve(&scope(), &Key::new(format!("new-{i}")), b"x", LEASE)
                .unwrap(),
        );
        assert!(!r.is_beyond_horizon());
    }
    // d's records (written at G + 95 min) live until then + TTL; the group is due at its
    // end + TTL, and drops whole.
    clock.set(G + 95 * MINUTE + TTL - 1);
    assert_eq!(db.compact_now().unwrap().partitions_dropped, 0);
    let d = db.reserve(&scope(), &Key::new("d-7"), b"x", LEASE).unwrap();
    assert_eq!(d, ReserveOutcome::Completed(b"r-d-7".to_vec()));
    clock.set(G + GROUP + TTL);
    let report = db.compact_now().unwrap();
    assert_eq!(
        (report.partitions_dropped, report.records_expired),
        (1, 200)
    );
    for key in ["a-0", "b-1", "c-2", "d-3"] {
        let r = acquired(db.reserve(&scope(), &Key::new(key), b"x", LEASE).unwrap());
        assert!(r.is_beyond_horizon(), "{key} recognised");
    }
    let report = db.verify(10, |_| {}).unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
}

#[test]
fn the_narrow_partitions_of_a_group_that_closed_go_into_it_straight() {
    let (_dir, path, clock) = reopenable();
    let db = filled(&path, &clock);
    // No pass ran while the group was open (a compactor off, or a store reopened later).
    clock.set(G + GROUP + 1_000);
    let report = db.compact_now().unwrap();
    assert_eq!(
        (report.wide_partitions_built, report.partitions_widened),
        (1, 4)
    );
    assert_eq!(db.stats().indexed_keys, 0);
    all_answer(&db);
    drop(db);
    assert_eq!(partition_tables(&path), vec![table(G, GROUP)]);
    let db = open(&path, &clock);
    all_answer(&db);
}

#[test]
fn under_a_ttl_of_a_day_hours_are_not_grouped() {
    let (_dir, path, clock) = reopenable();
    clock.set(G);
    let db = fill(open_retained(&path, &clock, minutes(24 * 60)), &clock);
    clock.set(G + GROUP + 1_000);
    let report = db.compact_now().unwrap();
    assert_eq!(
        (report.wide_partitions_built, report.partitions_widened),
        (2, 4)
    );
    assert_eq!(db.compact_now().unwrap().wide_partitions_built, 0);
    drop(db);
    let day = 24 * HOUR;
    assert_eq!(
        partition_tables(&path),
        vec![
            format!("idemdb_p_{G:020}_{HOUR}_{day}"),
            format!("idemdb_p_{:020}_{HOUR}_{day}", G + HOUR),
        ]
    );
}

/// The database on `disk`, at `clock`, with 1-minute partitions under a 48-hour TTL.
fn open_on_disk(disk: &FaultBackend, clock: &ManualClock) -> Result<IdemDb, idemdb::Error> {
    IdemDb::builder()
        .clock(clock.clone())
        .retention(minutes(TTL / MINUTE))
        .open_with_backend(disk.clone(), disk.log())
}

/// Responses big enough that a group's 200 records take more than one build step (2 MiB).
fn big_response(key: &str) -> Vec<u8> {
    let mut out = key.as_bytes().to_vec();
    out.resize(16 << 10, b'.');
    out
}

fn all_big_answer(db: &IdemDb) {
    for (prefix, _) in FILLS {
        for i in 0..50 {
            let key = format!("{prefix}-{i}");
            let got = db.reserve(&scope(), &Key::new(&key), b"x", LEASE).unwrap();
            assert_eq!(got, ReserveOutcome::Completed(big_response(&key)), "{key}");
        }
    }
}

/// A disk whose group starting at `G` closed: its first hour built, its second hour's two
/// narrow partitions not, all 200 records with big responses. The clock is left after the
/// group's end.
fn closed_group(clock: &ManualClock) -> FaultBackend {
    let disk = FaultBackend::new();
    {
        clock.set(G);
        let db = open_on_disk(&disk, clock).unwrap();
        for (prefix, at) in FILLS {
            clock.set(G + at);
            for i in 0..50 {
                let key = format!("{prefix}-{i}");
                finish(&db, &scope(), &key, big_response(&key));
            }
        }
        clock.set(G + HOUR + 1_000);
        let report = db.compact_now().unwrap();
        assert_eq!(
            (report.wide_partitions_built, report.partitions_widened),
            (1, 2)
        );
    }
    clock.set(G + GROUP + 1_000);
    disk.durable_disk()
}

/// Power lost inside each sync of the pass that builds a group (its build steps and the
/// switch, each a durable commit), the pending writes dropped, kept or torn: the image opens,
/// every record answers as stored, and the next pass leaves the group alone.
#[test]
fn power_lost_inside_each_sync_of_a_group_build_loses_nothing() {
    let clock = ManualClock::new(G);
    let before = closed_group(&clock);
    let open = |disk: &FaultBackend| open_on_disk(disk, &clock).unwrap();
    let mut switched = 0;
    let (syncs, report) = each_power_loss(
        &before,
        |n| {
            vec![
                TearMode::DropAll,
                TearMode::KeepAll,
                TearMode::Random(n + 1),
            ]
        },
        open,
        |db| db.compact_now(),
        |n, mode, image| {
            let db =
                open_on_disk(&image, &clock).unwrap_or_else(|e| panic!("sync {n} {mode:?}: {e}"));
            all_big_answer(&db);
            let report = db.verify(10, |_| {}).unwrap();
            assert!(report.is_ok(), "sync {n} {mode:?}: {:?}", report.problems);
            let built = db.compact_now().unwrap().wide_partitions_built;
            switched += usize::from(built == 0);
            let stats = db.stats();
            assert_eq!(
                (stats.partitions, stats.indexed_keys),
                (1, 0),
                "sync {n} {mode:?}"
            );
            all_big_answer(&db);
        },
    );
    assert_eq!(
        (report.wide_partitions_built, report.partitions_widened),
        (1, 3)
    );
    assert!(syncs >= 3, "two build steps and a switch: {syncs} syncs");
    assert!(switched > 0, "no power loss struck after the switch");
    eprintln!("{syncs} syncs, switched before the loss in {switched} images");
}

/// A write that fails inside the pass that builds a group (a full disk, an I/O error): the
/// pass fails, writes are refused until a reopen, and the reopened file answers every record
/// and builds the group at its next pass.
#[test]
fn a_write_failing_inside_a_group_build_poisons_and_loses_nothing() {
    let clock = ManualClock::new(G);
    let before = closed_group(&clock);
    let failed = each_write_failure(
        &before,
        &[0, 1, 2, 5, 20, 100, 400],
        |disk| open_on_disk(disk, &clock).unwrap(),
        |db| db.compact_now(),
        |after, image| {
            let db = open_on_disk(&image, &clock).unwrap();
            all_big_answer(&db);
            let report = db.compact_now().unwrap();
            assert_eq!(
                (report.wide_partitions_built, db.stats().partitions),
                (1, 1),
                "after {after}"
            );
            all_big_answer(&db);
        },
    );
    assert!(
        failed >= 5,
        "the pass failed for only {failed} of 7 fault points"
    );
}
