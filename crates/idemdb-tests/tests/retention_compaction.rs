//! Records live in time partitions and expire by whole partitions: `compact_now` drops a
//! partition once every record in it expired, never one with a live record, and reopening
//! keeps the partitions, the index over them and what was dropped.

mod common;

use std::time::Duration;

use common::{LEASE, T0, acquired, finish, minutes, open_retained, partition_tables, reopenable};
use idemdb::{Key, ManualClock, ReserveOutcome, Scope};

const MIN: u64 = 60_000;

#[test]
fn partitions_follow_the_last_change_and_drop_whole_when_all_expired() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let clock = ManualClock::new(T0 - T0 % MIN);
    let scope = Scope::new("op", "p");
    let db = open_retained(&path, &clock, minutes(5));
    // Three one-minute windows, 10 records each.
    for w in 0..3 {
        for i in 0..10 {
            finish(&db, &scope, &format!("w{w}-{i}"), format!("r{w}-{i}"));
        }
        clock.advance(Duration::from_secs(60));
    }
    // A record reserved in window 0 and finished in window 3 belongs to window 3.
    clock.set(T0 - T0 % MIN);
    let late = acquired(db.reserve(&scope, &Key::new("late"), b"x", LEASE).unwrap());
    clock.set(T0 - T0 % MIN + 3 * MIN + 1);
    db.complete(&late, b"late".to_vec()).unwrap();
    let stats = db.stats();
    assert_eq!((stats.partitions, stats.stored_records), (4, 31));
    assert_eq!(stats.indexed_keys, 31);

    // Window 0 drops at start + width + TTL = 6 min: not a ms before.
    clock.set(T0 - T0 % MIN + 6 * MIN - 1);
    assert_eq!(db.compact_now().unwrap().partitions_dropped, 0);
    clock.set(T0 - T0 % MIN + 6 * MIN);
    let report = db.compact_now().unwrap();
    assert_eq!((report.partitions_dropped, report.records_expired), (1, 10));
    assert_eq!(db.get(&scope, &Key::new("w0-0")).unwrap(), None);
    // Windows 1 and 2 are still there, expired or not: w1 expired (6 min > 1 + 5) yet is
    // only dropped with its window.
    assert_eq!(db.get(&scope, &Key::new("w1-3")).unwrap(), None);
    assert_eq!(
        db.reserve(&scope, &Key::new("w2-3"), b"x", LEASE).unwrap(),
        ReserveOutcome::Completed(b"r2-3".to_vec())
    );
    assert_eq!(
        db.reserve(&scope, &Key::new("late"), b"x", LEASE).unwrap(),
        ReserveOutcome::Completed(b"late".to_vec())
    );
    let stats = db.stats();
    assert_eq!((stats.partitions, stats.stored_records), (3, 21));
    assert_eq!((stats.partitions_dropped, stats.expired_records), (1, 10));
    assert_eq!(
        stats.indexed_keys, 21,
        "the dropped partition's keys left the index"
    );
    drop(db);
    assert_eq!(partition_tables(&path).len(), 3);

    // Reopen: partitions, index and horizon come back.
    let db = open_retained(&path, &clock, minutes(5));
    assert_eq!(db.stats().indexed_keys, 21);
    assert_eq!(
        db.reserve(&scope, &Key::new("w2-9"), b"x", LEASE).unwrap(),
        ReserveOutcome::Completed(b"r2-9".to_vec())
    );
    assert!(
        acquired(db.reserve(&scope, &Key::new("w0-1"), b"x", LEASE).unwrap()).is_beyond_horizon()
    );
    clock.set(T0 - T0 % MIN + 60 * MIN);
    let report = db.compact_now().unwrap();
    assert_eq!((report.partitions_dropped, report.records_expired), (3, 21));
    assert_eq!(
        report.in_flight_expired, 1,
        "the reservation of w0-1 was abandoned"
    );
    let stats = db.stats();
    assert_eq!(
        (stats.partitions, stats.stored_records, stats.indexed_keys),
        (0, 0, 0)
    );
    drop(db);
    assert!(partition_tables(&path).is_empty());
}

#[test]
fn a_partition_with_a_live_record_is_never_dropped() {
    let (_dir, path, clock) = reopenable();
    let scope = Scope::new("op", "p");
    // Two TTLs in the same window: two partitions, dropped at different times.
    let db = open_retained(
        &path,
        &clock,
        minutes(5).operation_ttl("long", Duration::from_secs(3600)),
    );
    finish(&db, &scope, "short", "s");
    finish(&db, &Scope::new("long", "p"), "long", "l");
    assert_eq!(db.stats().partitions, 2);
    clock.advance(Duration::from_secs(7 * 60));
    assert_eq!(db.compact_now().unwrap().partitions_dropped, 1);
    assert_eq!(
        db.reserve(&Scope::new("long", "p"), &Key::new("long"), b"x", LEASE)
            .unwrap(),
        ReserveOutcome::Completed(b"l".to_vec())
    );
    for _ in 0..3 {
        assert_eq!(db.compact_now().unwrap().partitions_dropped, 0);
    }
    clock.advance(Duration::from_secs(3600));
    assert_eq!(db.compact_now().unwrap().records_expired, 1);
}

#[test]
fn a_clock_that_goes_back_writes_into_its_own_windows_partition() {
    let (_dir, path, clock) = reopenable();
    let scope = Scope::new("op", "p");
    let db = open_retained(&path, &clock, minutes(5));
    finish(&db, &scope, "a", "a");
    clock.advance(Duration::from_secs(120));
    finish(&db, &scope, "b", "b");
    assert_eq!(db.stats().partitions, 2);
    // Back by two minutes: "c" joins the partition of its own window (a's), not the newest:
    // every partition's drop time bounds what is in it, and a clock that had jumped ahead
    // would hold back only what was written then (issue 11).
    clock.set(T0);
    finish(&db, &scope, "c", "c");
    assert_eq!(db.stats().partitions, 2);
    assert_eq!(
        db.reserve(&scope, &Key::new("c"), b"x", LEASE).unwrap(),
        ReserveOutcome::Completed(b"c".to_vec())
    );
    // a's partition, holding c, is due (its window + 1 min + 5 min); b's is not yet.
    clock.set(T0 - T0 % MIN + 6 * MIN);
    assert_eq!(
        db.compact_now().unwrap().records_expired,
        2,
        "a's partition, with c"
    );
    assert_eq!(db.stats().stored_records, 1);
    assert_eq!(
        db.get(&scope, &Key::new("c")).unwrap(),
        None,
        "c's own TTL ran out"
    );
}
