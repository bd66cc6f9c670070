//! `IdemDb::scan` visits exactly the records its filter selects, streamed, and `IdemDb::verify`
//! finds damaged and misplaced entries written behind idemdb's back.

mod common;

use std::ops::ControlFlow;
use std::path::Path;
use std::time::Duration;

use common::{
    LEASE, T0, acquired, first_partition, minutes, open_retained, reopenable, setup_retained,
};
use idemdb::redb::{self, TableDefinition};
use idemdb::{Error, IdemDb, Key, RecordState, ScanFilter, ScannedRecord, Scope, StoredIn};

/// Records: "order"/u1: a (completed), b (failed), c (in progress); "orders"/u2: d
/// (completed, binary response); "refund"/"": e (completed).
fn populated(db: &IdemDb) {
    let order = Scope::new("order", "u1");
    let r = acquired(db.reserve(&order, &Key::new("a"), b"pa", LEASE).unwrap());
    db.complete(&r, b"done a".to_vec()).unwrap();
    let r = acquired(db.reserve(&order, &Key::new("b"), b"pb", LEASE).unwrap());
    db.fail(&r, b"declined".to_vec()).unwrap();
    acquired(db.reserve(&order, &Key::new("c"), b"pc", LEASE).unwrap());
    let orders = Scope::new("orders", "u2");
    let r = acquired(db.reserve(&orders, &Key::new("d"), b"pd", LEASE).unwrap());
    db.complete(&r, vec![0, 255, 1]).unwrap();
    let refund = Scope::new("refund", "");
    let r = acquired(db.reserve(&refund, &Key::new("e"), b"pe", LEASE).unwrap());
    db.complete(&r, b"refunded".to_vec()).unwrap();
}

fn collect(db: &IdemDb, filter: &ScanFilter) -> Vec<ScannedRecord> {
    let mut out = Vec::new();
    db.scan(filter, |rec| {
        out.push(rec);
        ControlFlow::Continue(())
    })
    .unwrap();
    out
}

fn names(recs: &[ScannedRecord]) -> Vec<String> {
    recs.iter()
        .map(|r| String::from_utf8_lossy(r.key.as_bytes()).into_owned())
        .collect()
}

#[test]
fn scan_filters_by_state_operation_and_expiry() {
    let (_dir, clock, db) = setup_retained(minutes(10));
    populated(&db);

    let all = collect(&db, &ScanFilter::default());
    // In-flight table first, then the partitions, each in record key order.
    assert_eq!(names(&all), ["c", "a", "b", "d", "e"]);
    assert_eq!(all[0].stored_in, StoredIn::InFlight);
    assert!(matches!(all[1].stored_in, StoredIn::Partition { .. }));
    let d = &all[3];
    assert_eq!(
        (d.scope.operation(), d.scope.principal()),
        (&b"orders"[..], &b"u2"[..])
    );
    assert_eq!(d.record.response, [0, 255, 1]);
    assert_eq!(d.record.fingerprint, db.fingerprint(b"pd"));
    assert_eq!(all[4].scope.principal(), b"");
    assert!(all.iter().all(|r| !r.expired));

    let in_progress = collect(&db, &ScanFilter::default().state(RecordState::InProgress));
    assert_eq!(names(&in_progress), ["c"]);
    let failed = collect(&db, &ScanFilter::default().state(RecordState::Failed));
    assert_eq!(names(&failed), ["b"]);
    // "order" is not a prefix match of "orders": the operation's length is part of the key.
    let order = collect(&db, &ScanFilter::default().operation("order"));
    assert_eq!(names(&order), ["c", "a", "b"]);
    let done_orders = ScanFilter::default()
        .operation("orders")
        .state(RecordState::Completed);
    assert_eq!(names(&collect(&db, &done_orders)), ["d"]);
    assert!(collect(&db, &ScanFilter::default().operation("nope")).is_empty());
    let too_long = "x".repeat(70_000);
    assert!(collect(&db, &ScanFilter::default().operation(too_long)).is_empty());

    // Past every TTL: nothing counts, but everything is still stored until compaction.
    clock.advance(Duration::from_secs(3600));
    assert!(collect(&db, &ScanFilter::default()).is_empty());
    let expired = collect(&db, &ScanFilter::default().include_expired(true));
    assert_eq!(names(&expired), ["c", "a", "b", "d", "e"]);
    assert!(expired.iter().all(|r| r.expired));
    db.compact_now().unwrap();
    assert!(
        collect(&db, &ScanFilter::default().include_expired(true)).is_empty(),
        "dropped and swept"
    );
}

#[test]
fn scan_stops_when_told_and_reports_progress() {
    let (_dir, _clock, db) = setup_retained(minutes(10));
    let scope = Scope::new("bulk", "p");
    let n = 10_000u64;
    // 16 writers, so that commits are shared: the fill takes a fraction of 10,000 fsyncs.
    std::thread::scope(|s| {
        for t in 0..16 {
            let (db, scope) = (&db, &scope);
            s.spawn(move || {
                for i in (t..n).step_by(16) {
                    let key = Key::from_parts([i.to_be_bytes()]);
                    let done = db.execute(scope, &key, b"x", |_tx| {
                        Ok::<_, Error>(idemdb::Outcome::Completed(b"ok".to_vec()))
                    });
                    assert!(matches!(done, Ok(idemdb::ExecuteOutcome::Executed(_))));
                }
            });
        }
    });
    let mut seen = 0;
    let summary = db
        .scan(&ScanFilter::default(), |_| {
            seen += 1;
            if seen == 3 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })
        .unwrap();
    assert_eq!((seen, summary.visited, summary.stopped), (3, 3, true));

    let mut reports = Vec::new();
    let summary = db
        .scan_with_progress(
            &ScanFilter::default().state(RecordState::Failed),
            |read| reports.push(read),
            |_| ControlFlow::Continue(()),
        )
        .unwrap();
    assert_eq!((summary.entries_read, summary.visited), (n, 0));
    assert_eq!(reports.last(), Some(&n), "the final count: {reports:?}");
    assert!(reports.len() >= 3, "periodic reports: {reports:?}");
    assert_eq!(db.stats().stored_records, n);
}

#[test]
fn a_second_open_of_the_same_file_is_refused_as_already_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let db = IdemDb::open(&path).unwrap();
    match IdemDb::open(&path) {
        Err(Error::Storage(e)) => {
            assert!(matches!(*e, redb::Error::DatabaseAlreadyOpen), "{e:?}")
        }
        other => panic!("expected DatabaseAlreadyOpen, got {other:?}"),
    }
    drop(db);
    IdemDb::open(&path).unwrap();
}

/// Writes `entries` into `table` of the closed database at `path`, through redb alone.
fn write_raw(path: &Path, table: &str, entries: &[(&[u8], &[u8])]) {
    let db = redb::Database::open(path).unwrap();
    let txn = db.begin_write().unwrap();
    {
        let mut t = txn
            .open_table(TableDefinition::<&[u8], &[u8]>::new(table))
            .unwrap();
        for (k, v) in entries {
            t.insert(*k, *v).unwrap();
        }
    }
    txn.commit().unwrap();
}

/// A stored record value, as idemdb encodes it (docs/design.md §3).
/// A record of the current version (3) stored under `key`, its checksum valid whatever the
/// fields say (docs/design.md §3).
fn record_bytes(
    key: &[u8],
    state: u8,
    token: u64,
    updated: u64,
    expires: u64,
    response: &[u8],
) -> Vec<u8> {
    use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};
    let mut v = vec![3, state];
    v.extend_from_slice(&7u128.to_le_bytes());
    for n in [token, updated + 1000, updated, updated] {
        v.extend_from_slice(&n.to_le_bytes());
    }
    v.extend_from_slice(&1u32.to_le_bytes());
    v.extend_from_slice(&expires.to_le_bytes());
    v.extend_from_slice(response);
    let sum = xxh3_64_with_seed(&v, xxh3_64(key));
    v.extend_from_slice(&sum.to_le_bytes());
    v
}

#[test]
fn verify_passes_a_healthy_file_and_lists_every_damaged_entry() {
    let (_dir, path, clock) = reopenable();
    {
        let db = open_retained(&path, &clock, minutes(10));
        populated(&db);
        let report = db.verify(10, |_| {}).unwrap();
        assert!(report.is_ok(), "{report:?}");
        assert_eq!(
            (
                report.partitions,
                report.in_flight_records,
                report.finished_records
            ),
            (1, 1, 4)
        );
    }
    let part = first_partition(&path);
    let key = |op: &str, k: &str| {
        let mut b = (op.len() as u16).to_be_bytes().to_vec();
        b.extend_from_slice(op.as_bytes());
        b.extend_from_slice(&[0, 1, b'p']);
        b.extend_from_slice(k.as_bytes());
        b
    };
    let ttl = 600_000;
    let (k1, k2, k3, k4) = (
        key("op", "1"),
        key("op", "2"),
        key("op", "3"),
        key("op", "4"),
    );
    let unknown_state = record_bytes(&k1, 9, 1, T0, T0 + ttl, b"x");
    let in_progress = record_bytes(&k2, 1, 1, T0, T0 + ttl, b"");
    let wrong_expiry = record_bytes(&k3, 2, 1, T0, T0 + 5, b"x");
    let token_too_high = record_bytes(&k4, 2, 1 << 40, T0, T0 + ttl, b"x");
    let unsplit: &[u8] = &[0, 9, b'x'];
    write_raw(
        &path,
        &part,
        &[
            (&k1, &unknown_state),
            (&k2, &in_progress),
            (&k3, &wrong_expiry),
            (&k4, &token_too_high),
            (unsplit, &record_bytes(unsplit, 2, 1, T0, T0 + ttl, b"x")),
        ],
    );
    let finished = record_bytes(&k1, 2, 1, T0, T0 + ttl, b"x");
    write_raw(&path, "idemdb_inflight", &[(&k1, &finished)]);
    // A row whose horizon ended (open skips it) but that names nothing and holds no whole tag.
    let mut row = 1u64.to_be_bytes().to_vec();
    row.extend_from_slice(b"somewhere");
    write_raw(&path, "idemdb_horizon", &[(&row, &[1, 2, 3])]);
    write_raw(&path, "idemdb_mystery", &[]);
    write_raw(&path, "business", &[]);

    let db = open_retained(&path, &clock, minutes(10));
    let report = db.verify(3, |_| {}).unwrap();
    assert!(!report.is_ok());
    assert_eq!(report.problems.len(), 3, "capped");
    assert_eq!(report.other_tables, 1);
    let all = db.verify(100, |_| {}).unwrap();
    let whats: Vec<String> = all
        .problems
        .iter()
        .map(|p| format!("{}: {}", p.table, p.what))
        .collect();
    let expect = [
        "idemdb_mystery: unknown table",
        "idemdb_inflight: completed record in the in-flight table",
        ": record does not decode: corrupted data: unknown record state 9",
        ": in_progress record in a partition",
        ": expires_at",
        ": token 1099511627776 is not below next_token",
        ": record key does not split",
        "idemdb_horizon: row key names \"somewhere\", not a partition or a sweep",
        "idemdb_horizon: set of 3 bytes is not whole 4-byte tags",
    ];
    for want in expect {
        assert!(
            whats.iter().any(|w| w.contains(want)),
            "{want:?} missing from {whats:#?}"
        );
    }
    assert_eq!(all.problem_count, expect.len() as u64, "{whats:#?}");
    assert_eq!(all.problem_count, report.problem_count);

    // A plain scan stops at the first entry that does not decode.
    match db.scan(&ScanFilter::default(), |_| ControlFlow::Continue(())) {
        Err(Error::Corrupted(why)) => assert!(why.contains(&part), "{why}"),
        other => panic!("{other:?}"),
    }
}
