//! The default partition width (10 s, `Builder::DEFAULT_PARTITION_WIDTH`): records go to the
//! partition of their own 10 s window unless a width is set, and a store that ran for hours
//! holds thousands of partitions, which answer, survive a reopen and drop whole; a key
//! written in many of them is looked up in those alone.

mod common;

use std::time::Duration;

use common::{LEASE, T0, acquired, finish, open_retained, partition_tables};
use idemdb::testing::partitions_probed;
use idemdb::{Builder, IdemDb, Key, ManualClock, ReserveOutcome, Retention, Scope};

const WIDTH_MS: u64 = 10_000;

/// How many partitions the key index names for a key: those a lookup reads beyond the false
/// "maybe" of a wide partition's filter (about 1 in 256 keys, docs/design.md §8.3).
fn named(db: &IdemDb, scope: &Scope, key: &Key) -> usize {
    partitions_probed(db, scope, key).unwrap().0
}

fn response(i: u64) -> Vec<u8> {
    format!("201 order {i}").into_bytes()
}

#[test]
fn an_unset_width_is_ten_seconds_and_a_set_one_wins() {
    assert_eq!(Builder::DEFAULT_PARTITION_WIDTH, Duration::from_secs(10));
    let dir = tempfile::tempdir().unwrap();
    let scope = Scope::new("op", "p");
    let start = T0 - T0 % WIDTH_MS;

    let path = dir.path().join("default");
    let clock = ManualClock::new(start);
    let retention = Retention::default().compact_interval(None);
    assert_eq!(retention.partition_width, None);
    let db = open_retained(&path, &clock, retention);
    finish(&db, &scope, "a", b"a");
    clock.set(start + WIDTH_MS - 1);
    finish(&db, &scope, "b", b"b");
    assert_eq!(db.stats().partitions, 1);
    clock.set(start + WIDTH_MS);
    finish(&db, &scope, "c", b"c");
    assert_eq!(db.stats().partitions, 2);
    db.close();
    let mut tables = partition_tables(&path);
    tables.sort();
    // idemdb_p_{start}_{width}_{ttl}, all in ms; the default TTL is 24 h.
    let name = |s: u64| format!("idemdb_p_{s:020}_{WIDTH_MS}_86400000");
    assert_eq!(tables, [name(start), name(start + WIDTH_MS)]);

    let path = dir.path().join("set");
    let clock = ManualClock::new(start);
    let retention = Retention::default()
        .partition_width(Duration::from_secs(60))
        .compact_interval(None);
    let db = open_retained(&path, &clock, retention);
    finish(&db, &scope, "a", b"a");
    clock.set(start + WIDTH_MS);
    finish(&db, &scope, "b", b"b");
    assert_eq!(
        db.stats().partitions,
        1 + u64::from(start % 60_000 >= 50_000)
    );
}

/// Six hours at one record per window: 2,160 partitions.
#[test]
fn thousands_of_partitions_answer_reopen_and_drop_whole() {
    const WINDOWS: u64 = 6 * 360;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let start = T0 - T0 % WIDTH_MS;
    let clock = ManualClock::new(start);
    let scope = Scope::new("op", "p");
    let retention = || Retention::default().compact_interval(None);
    let db = open_retained(&path, &clock, retention());
    for i in 0..WINDOWS {
        clock.set(start + i * WIDTH_MS + i % WIDTH_MS);
        finish(&db, &scope, &format!("k{i}"), response(i));
    }
    let stats = db.stats();
    assert_eq!((stats.partitions, stats.stored_records), (WINDOWS, WINDOWS));
    let replays_all = |db: &IdemDb| {
        for i in 0..WINDOWS {
            let key = Key::new(format!("k{i}"));
            assert_eq!(
                db.reserve(&scope, &key, b"x", LEASE).unwrap(),
                ReserveOutcome::Completed(response(i)),
                "key {i}"
            );
        }
    };
    replays_all(&db);
    // Nothing is due before the first window's end + the TTL; the closed 1-hour windows (five
    // of the six or seven the six hours touch) are widened (docs/design.md §8.8).
    let report = db.compact_now().unwrap();
    assert_eq!(report.partitions_dropped, 0);
    assert!(report.wide_partitions_built >= 5, "{report:?}");
    let partitions = WINDOWS - report.partitions_widened + report.wide_partitions_built;
    replays_all(&db);
    db.close();

    let db = open_retained(&path, &clock, retention());
    let stats = db.stats();
    // The wide partitions' keys are found through their filters; each narrow one holds one.
    assert_eq!(
        (stats.partitions, stats.indexed_keys),
        (partitions, partitions - report.wide_partitions_built)
    );
    let wide_keys = WINDOWS - stats.indexed_keys;
    assert!(stats.memory.key_filters > 0, "{stats:?}");
    assert!(stats.memory.key_filters < wide_keys * 3, "{stats:?}");
    assert_eq!(stats.partitions_read_at_open, 1, "the open window's alone");
    replays_all(&db);

    // Past the last window's drop time (start + width + TTL): every partition goes, whole.
    let ttl = Duration::from_secs(24 * 3600).as_millis() as u64;
    clock.set(start + WINDOWS * WIDTH_MS + ttl);
    let report = db.compact_now().unwrap();
    assert_eq!(
        (report.partitions_dropped, report.records_expired),
        (partitions, WINDOWS)
    );
    let stats = db.stats();
    assert_eq!((stats.partitions, stats.stored_records), (0, 0));
    // Each drop took its keys out of the key index (in steps of up to 64 partitions).
    assert_eq!(stats.indexed_keys, 0);
    assert_eq!(stats.horizon_keys, WINDOWS);
    // Their keys are still recognised: a redrive runs again, flagged.
    for i in [0, WINDOWS / 2, WINDOWS - 1] {
        let key = Key::new(format!("k{i}"));
        let r = acquired(db.reserve(&scope, &key, b"x", LEASE).unwrap());
        assert!(r.is_beyond_horizon(), "key {i}");
    }
    db.close();
    assert!(partition_tables(&path).is_empty());
}

/// A key of an operation with a short TTL, acquired again each time its record expired, is
/// written in a new window every time, and its older partitions stay until they are dropped.
/// Among thousands of partitions its lookups read the ones it was written in, and only those
/// (before its key index entry held two ids and then probed every partition: 12–18 ms per
/// lifecycle under the writer's lock at 8,640 partitions), through a reopen and as its older
/// partitions drop.
#[test]
fn a_key_written_in_many_windows_is_looked_up_in_those_alone() {
    const WINDOWS: u64 = 2_000;
    const ROUNDS: u64 = 5;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let start = T0 - T0 % WIDTH_MS;
    let clock = ManualClock::new(start);
    let scope = Scope::new("op", "p");
    let retention = || {
        Retention::default()
            .operation_ttl("poll", Duration::from_secs(15))
            .compact_interval(None)
    };
    let db = open_retained(&path, &clock, retention());
    for i in 0..WINDOWS {
        clock.set(start + i * WIDTH_MS);
        finish(&db, &scope, &format!("k{i}"), response(i));
    }
    let poll = Scope::new("poll", "p");
    let key = Key::new("tick");
    let answer = |db: &IdemDb| db.get(&poll, &key).unwrap().map(|r| r.response);
    // Every 20 s: the last record (15 s TTL) has expired, its partition is not dropped.
    let base = start + WINDOWS * WIDTH_MS;
    for round in 0..ROUNDS {
        clock.set(base + round * 20_000);
        let r = acquired(db.reserve(&poll, &key, b"x", LEASE).unwrap());
        assert_eq!(r.is_beyond_horizon(), round > 0, "round {round}");
        db.complete(&r, format!("tick {round}")).unwrap();
        assert_eq!(named(&db, &poll, &key), round as usize + 1);
        assert_eq!(answer(&db), Some(format!("tick {round}").into_bytes()));
        // A duplicate through the writer replays the newest too.
        assert_eq!(
            db.reserve(&poll, &key, b"x", LEASE).unwrap(),
            ReserveOutcome::Completed(format!("tick {round}").into_bytes()),
            "round {round}"
        );
    }
    assert_eq!(db.stats().partitions, WINDOWS + ROUNDS);
    assert_eq!(named(&db, &scope, &Key::new("k7")), 1);
    db.close();

    let db = open_retained(&path, &clock, retention());
    assert_eq!(named(&db, &poll, &key), 5);
    assert_eq!(answer(&db), Some(b"tick 4".to_vec()));
    // A poll partition is due 25 s after its window starts (width + TTL): at the last
    // round, those of rounds 0 to 2 are; the other operation's are not.
    // The other operation's closed 1-hour windows are widened by the same pass (a 15 s TTL
    // has none): it still reads one partition.
    let report = db.compact_now().unwrap();
    assert_eq!((report.partitions_dropped, report.records_expired), (3, 3));
    assert!(report.wide_partitions_built >= 4, "{report:?}");
    let partitions = WINDOWS - report.partitions_widened + report.wide_partitions_built;
    assert_eq!(named(&db, &poll, &key), 2);
    // k7's window was widened: its wide partition's filter admits it (and, about 1 in 256,
    // another's does falsely).
    let (named_k7, admitted_k7) = partitions_probed(&db, &scope, &Key::new("k7")).unwrap();
    assert_eq!(named_k7, 0);
    assert!((1..=3).contains(&admitted_k7), "{admitted_k7}");
    assert_eq!(answer(&db), Some(b"tick 4".to_vec()));
    clock.set(base + (ROUNDS - 1) * 20_000 + 25_000);
    assert_eq!(db.compact_now().unwrap().partitions_dropped, 2);
    assert_eq!(named(&db, &poll, &key), 0);
    assert_eq!(answer(&db), None);
    assert_eq!(db.stats().partitions, partitions);
}

/// A file written under 1-hour partitions (the default before 10 s) and opened with the
/// default: its partitions stay and answer, new records go to 10 s windows beside them, and
/// each partition drops at its own time.
#[test]
fn a_file_of_hour_partitions_opened_with_the_default_keeps_both() {
    const HOUR_MS: u64 = 3_600_000;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let start = T0 - T0 % HOUR_MS;
    let clock = ManualClock::new(start);
    let scope = Scope::new("op", "p");
    let ttl = Duration::from_secs(3600);
    let hours = Retention::default()
        .ttl(ttl)
        .partition_width(Duration::from_secs(3600))
        .compact_interval(None);
    let db = open_retained(&path, &clock, hours);
    finish(&db, &scope, "old-a", b"old a");
    clock.set(start + 20 * 60_000);
    finish(&db, &scope, "old-b", b"old b");
    db.close();

    let default = || Retention::default().ttl(ttl).compact_interval(None);
    let db = open_retained(&path, &clock, default());
    finish(&db, &scope, "new-a", b"new a");
    clock.set(start + 20 * 60_000 + WIDTH_MS);
    finish(&db, &scope, "new-b", b"new b");
    assert_eq!(db.stats().partitions, 3);
    for (key, answer) in [("old-a", "old a"), ("old-b", "old b"), ("new-a", "new a")] {
        assert_eq!(
            db.get(&scope, &Key::new(key)).unwrap().map(|r| r.response),
            Some(answer.as_bytes().to_vec()),
            "{key}"
        );
    }
    db.close();

    // The 10 s windows drop first: at their end + the TTL, while the hour is still due later.
    let db = open_retained(&path, &clock, default());
    clock.set(start + 20 * 60_000 + 2 * WIDTH_MS + HOUR_MS);
    let report = db.compact_now().unwrap();
    assert_eq!((report.partitions_dropped, report.records_expired), (2, 2));
    assert_eq!(db.stats().partitions, 1);
    // The hour partition: at the hour's end + the TTL, and not a ms before.
    clock.set(start + 2 * HOUR_MS - 1);
    assert_eq!(db.compact_now().unwrap().partitions_dropped, 0);
    clock.set(start + 2 * HOUR_MS);
    let report = db.compact_now().unwrap();
    assert_eq!((report.partitions_dropped, report.records_expired), (1, 2));
    assert_eq!(db.stats().partitions, 0);
}
