//! Refused input and refused files: exact errors, and nothing written.

mod common;

use common::{LEASE, T0, acquired, format_version};
use idemdb::Refusal;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use idemdb::redb::{self, MultimapTableDefinition, ReadableDatabase, TableDefinition, TableHandle};
use idemdb::{
    Error, ExecuteError, IdemDb, InputError, Key, Limits, ManualClock, Outcome, RecordState,
    ReserveOutcome, Scope,
};

const ORDERS: TableDefinition<&str, u64> = TableDefinition::new("orders");
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("idemdb_meta");

fn open_with(path: &Path, limits: Limits) -> IdemDb {
    IdemDb::builder()
        .clock(ManualClock::new(T0))
        .limits(limits)
        .open(path)
        .unwrap()
}

/// How many records the database holds, counted from its tables (in-flight and partitions).
fn record_count(db: &IdemDb) -> u64 {
    db.stats().stored_records
}

fn order_row(db: &IdemDb, key: &str) -> Option<u64> {
    common::business_row(db, ORDERS, key)
}

fn is_empty(e: &Error, want: &str) -> bool {
    matches!(e, Error::Refused(Refusal::InvalidInput(InputError::Empty { what })) if *what == want)
}

fn is_too_long(e: &Error, want: &str, want_len: usize, want_max: usize) -> bool {
    matches!(
        e,
        Error::Refused(Refusal::InvalidInput(InputError::TooLong { what, len, max }))
            if *what == want && *len == want_len && *max == want_max
    )
}

#[test]
fn empty_operation_or_key_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let db = open_with(&dir.path().join("db"), Limits::default());
    let ok_scope = Scope::new("op", "p");

    let e = db
        .reserve(&Scope::new("", "p"), &Key::new("k"), b"x", LEASE)
        .unwrap_err();
    assert!(is_empty(&e, "operation"), "{e:?}");
    let e = db
        .reserve(&ok_scope, &Key::new(""), b"x", LEASE)
        .unwrap_err();
    assert!(is_empty(&e, "key"), "{e:?}");
    let e = db
        .reserve(&ok_scope, &Key::from_parts(Vec::<&str>::new()), b"x", LEASE)
        .unwrap_err();
    assert!(is_empty(&e, "key"), "{e:?}");
    let e = db
        .reserve_or_wait(&ok_scope, &Key::new(""), b"x", LEASE, LEASE)
        .unwrap_err();
    assert!(is_empty(&e, "key"), "{e:?}");
    let e = db.get(&Scope::new("", ""), &Key::new("k")).unwrap_err();
    assert!(is_empty(&e, "operation"), "{e:?}");

    let ran = Arc::new(AtomicBool::new(false));
    let r2 = Arc::clone(&ran);
    match db.execute(&ok_scope, &Key::new(""), b"x", move |_tx| {
        r2.store(true, Ordering::SeqCst);
        Ok::<_, Error>(Outcome::Completed(Vec::new()))
    }) {
        Err(ExecuteError::Db(e)) => assert!(is_empty(&e, "key"), "{e:?}"),
        other => panic!("expected InvalidInput, got {other:?}"),
    }
    assert!(!ran.load(Ordering::SeqCst));
    assert_eq!(record_count(&db), 0, "nothing written");

    // An empty principal is allowed (an anonymous caller), and a key of one empty part is
    // not empty once encoded.
    let _ = acquired(
        db.reserve(&Scope::new("op", ""), &Key::new("k"), b"x", LEASE)
            .unwrap(),
    );
    let _ = acquired(
        db.reserve(&ok_scope, &Key::from_parts([""]), b"x", LEASE)
            .unwrap(),
    );
    assert_eq!(record_count(&db), 2);
}

#[test]
fn default_limits_refuse_oversized_parts_and_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = open_with(&dir.path().join("db"), Limits::default());
    assert_eq!(db.limits(), &Limits::default());
    let op_max = "o".repeat(256);
    let principal_max = "p".repeat(256);
    let key_max = vec![b'k'; 1024];

    let e = db
        .reserve(
            &Scope::new("o".repeat(257), "p"),
            &Key::new("k"),
            b"x",
            LEASE,
        )
        .unwrap_err();
    assert!(is_too_long(&e, "operation", 257, 256), "{e:?}");
    let e = db
        .reserve(
            &Scope::new("op", "p".repeat(257)),
            &Key::new("k"),
            b"x",
            LEASE,
        )
        .unwrap_err();
    assert!(is_too_long(&e, "principal", 257, 256), "{e:?}");
    let e = db
        .reserve(
            &Scope::new("op", "p"),
            &Key::new(vec![b'k'; 1025]),
            b"x",
            LEASE,
        )
        .unwrap_err();
    assert!(is_too_long(&e, "key", 1025, 1024), "{e:?}");
    assert_eq!(record_count(&db), 0, "nothing written");

    // Exactly at the limits is fine.
    let r = acquired(
        db.reserve(
            &Scope::new(&op_max, &principal_max),
            &Key::new(&key_max),
            b"x",
            LEASE,
        )
        .unwrap(),
    );
    let before = db
        .get(&Scope::new(&op_max, &principal_max), &Key::new(&key_max))
        .unwrap();

    let too_big = vec![7u8; (1 << 20) + 1];
    let e = db.complete(&r, too_big.clone()).unwrap_err();
    assert!(is_too_long(&e, "response", (1 << 20) + 1, 1 << 20), "{e:?}");
    let e = db.fail(&r, too_big).unwrap_err();
    assert!(is_too_long(&e, "response", (1 << 20) + 1, 1 << 20), "{e:?}");
    let after = db
        .get(&Scope::new(&op_max, &principal_max), &Key::new(&key_max))
        .unwrap();
    assert_eq!(after, before, "still IN_PROGRESS, unchanged");
    assert_eq!(after.unwrap().state, RecordState::InProgress);

    let exactly = vec![9u8; 1 << 20];
    db.complete(&r, exactly.clone()).unwrap();
    assert_eq!(
        db.reserve(
            &Scope::new(&op_max, &principal_max),
            &Key::new(&key_max),
            b"x",
            LEASE
        )
        .unwrap(),
        ReserveOutcome::Completed(exactly)
    );
}

fn small_limits() -> Limits {
    let mut limits = Limits::default();
    limits.max_operation_len = 8;
    limits.max_principal_len = 4;
    limits.max_key_len = 16;
    limits.max_response_len = 10;
    limits
}

#[test]
fn custom_limits_are_enforced() {
    let dir = tempfile::tempdir().unwrap();
    let db = open_with(&dir.path().join("db"), small_limits());
    assert_eq!(db.limits(), &small_limits());
    let s = Scope::new("op", "p");

    let e = db
        .reserve(&Scope::new("123456789", "p"), &Key::new("k"), b"x", LEASE)
        .unwrap_err();
    assert!(is_too_long(&e, "operation", 9, 8), "{e:?}");
    let e = db
        .reserve(&Scope::new("op", "12345"), &Key::new("k"), b"x", LEASE)
        .unwrap_err();
    assert!(is_too_long(&e, "principal", 5, 4), "{e:?}");
    let e = db
        .reserve(&s, &Key::new("0123456789abcdefX"), b"x", LEASE)
        .unwrap_err();
    assert!(is_too_long(&e, "key", 17, 16), "{e:?}");
    // The key limit counts from_parts' encoding: 2 × (4 + 5) = 18 bytes.
    let e = db
        .reserve(&s, &Key::from_parts(["abcde", "fghij"]), b"x", LEASE)
        .unwrap_err();
    assert!(is_too_long(&e, "key", 18, 16), "{e:?}");
    let e = db.get(&s, &Key::new("0123456789abcdefX")).unwrap_err();
    assert!(is_too_long(&e, "key", 17, 16), "{e:?}");
    assert_eq!(record_count(&db), 0, "nothing written");

    // At the limits.
    let r = acquired(
        db.reserve(
            &Scope::new("12345678", "1234"),
            &Key::new("0123456789abcdef"),
            b"x",
            LEASE,
        )
        .unwrap(),
    );
    let e = db.complete(&r, b"01234567890".to_vec()).unwrap_err();
    assert!(is_too_long(&e, "response", 11, 10), "{e:?}");
    assert_eq!(
        db.get(
            &Scope::new("12345678", "1234"),
            &Key::new("0123456789abcdef")
        )
        .unwrap()
        .unwrap()
        .state,
        RecordState::InProgress
    );
    db.complete(&r, b"0123456789".to_vec()).unwrap();
    assert_eq!(record_count(&db), 1);
}

#[test]
fn oversized_response_from_execute_commits_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = open_with(&dir.path().join("db"), small_limits());
    let s = Scope::new("op", "p");
    let key = Key::new("k");
    let result = db.execute(&s, &key, b"x", |tx| {
        tx.open_table(ORDERS)?.insert("k", 1)?;
        Ok::<_, Error>(Outcome::Completed(b"01234567890".to_vec()))
    });
    match result {
        Err(ExecuteError::Db(e)) => assert!(is_too_long(&e, "response", 11, 10), "{e:?}"),
        other => panic!("expected TooLong, got {other:?}"),
    }
    assert_eq!(db.get(&s, &key).unwrap(), None);
    assert_eq!(order_row(&db, "k"), None);
    assert_eq!(record_count(&db), 0);

    // The same with a failure outcome.
    let result = db.execute(&s, &key, b"x", |tx| {
        tx.open_table(ORDERS)?.insert("k", 2)?;
        Ok::<_, Error>(Outcome::Failed(vec![0; 11]))
    });
    assert!(
        matches!(&result, Err(ExecuteError::Db(e)) if is_too_long(e, "response", 11, 10)),
        "{result:?}"
    );
    assert_eq!(db.get(&s, &key).unwrap(), None);
    assert_eq!(order_row(&db, "k"), None);
}

#[test]
fn oversized_response_for_complete_with_does_not_run_the_closure() {
    let dir = tempfile::tempdir().unwrap();
    let db = open_with(&dir.path().join("db"), small_limits());
    let s = Scope::new("op", "p");
    let key = Key::new("k");
    let r = acquired(db.reserve(&s, &key, b"x", LEASE).unwrap());
    let before = db.get(&s, &key).unwrap();
    let ran = Arc::new(AtomicBool::new(false));
    let r2 = Arc::clone(&ran);
    let result = db.complete_with(&r, vec![1u8; 11], move |tx| {
        r2.store(true, Ordering::SeqCst);
        tx.open_table(ORDERS)?.insert("k", 1)?;
        Ok::<(), Error>(())
    });
    assert!(
        matches!(&result, Err(ExecuteError::Db(e)) if is_too_long(e, "response", 11, 10)),
        "{result:?}"
    );
    assert!(!ran.load(Ordering::SeqCst));
    assert_eq!(db.get(&s, &key).unwrap(), before);
    assert_eq!(order_row(&db, "k"), None);
}

#[test]
fn zero_lease_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let db = open_with(&dir.path().join("db"), Limits::default());
    let s = Scope::new("op", "p");
    assert!(matches!(
        db.reserve(&s, &Key::new("k"), b"x", Duration::ZERO),
        Err(Error::Refused(Refusal::InvalidInput(InputError::ZeroLease)))
    ));
    assert!(matches!(
        db.reserve_or_wait(&s, &Key::new("k"), b"x", Duration::ZERO, LEASE),
        Err(Error::Refused(Refusal::InvalidInput(InputError::ZeroLease)))
    ));
    assert_eq!(db.get(&s, &Key::new("k")).unwrap(), None);
    assert_eq!(record_count(&db), 0);

    let mut r = acquired(db.reserve(&s, &Key::new("k"), b"x", LEASE).unwrap());
    let before = db.get(&s, &Key::new("k")).unwrap();
    let r_before = r.clone();
    assert!(matches!(
        db.extend(&mut r, Duration::ZERO),
        Err(Error::Refused(Refusal::InvalidInput(InputError::ZeroLease)))
    ));
    assert_eq!(r, r_before);
    assert_eq!(db.get(&s, &Key::new("k")).unwrap(), before);
}

/// A limit set beyond its cap: its name, how to set it, the value set, the cap.
type LimitCase = (&'static str, fn(&mut Limits), usize, usize);

#[test]
fn limits_beyond_the_hard_caps_are_refused_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [LimitCase; 3] = [
        (
            "max_operation_len",
            |l| l.max_operation_len = 65_536,
            65_536,
            65_535,
        ),
        (
            "max_principal_len",
            |l| l.max_principal_len = 70_000,
            70_000,
            65_535,
        ),
        (
            "max_response_len",
            |l| l.max_response_len = (1 << 30) + 1,
            (1 << 30) + 1,
            1 << 30,
        ),
    ];
    for (i, (what, set, len, max)) in cases.into_iter().enumerate() {
        let path = dir.path().join(format!("refused-{i}"));
        let mut limits = Limits::default();
        set(&mut limits);
        match IdemDb::builder().limits(limits).open(&path) {
            Err(e) => assert!(is_too_long(&e, what, len, max), "{what}: {e:?}"),
            Ok(_) => panic!("{what}: opened with limits beyond the cap"),
        }
        assert!(!path.exists(), "{what}: no file was created");
    }
    assert_eq!(Limits::MAX_PART_LEN, 65_535);

    // Exactly at the cap is allowed, and works.
    let mut limits = Limits::default();
    limits.max_operation_len = Limits::MAX_PART_LEN;
    limits.max_principal_len = Limits::MAX_PART_LEN;
    let db = open_with(&dir.path().join("at-cap"), limits);
    let long_op = "o".repeat(Limits::MAX_PART_LEN);
    let r = acquired(
        db.reserve(&Scope::new(&long_op, "p"), &Key::new("k"), b"x", LEASE)
            .unwrap(),
    );
    db.complete(&r, b"ok".to_vec()).unwrap();
    assert_eq!(
        db.reserve(&Scope::new(&long_op, "p"), &Key::new("k"), b"x", LEASE)
            .unwrap(),
        ReserveOutcome::Completed(b"ok".to_vec())
    );
}

/// Deterministic noise.
fn noise(len: usize, mut seed: u64) -> Vec<u8> {
    (0..len)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed as u8
        })
        .collect()
}

#[test]
fn a_file_of_random_bytes_is_not_idemdb_and_is_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    for (name, bytes) in [
        ("noise-4k", noise(4096, 0x9e37_79b9_7f4a_7c15)),
        ("noise-64k", noise(65_536, 42)),
        ("text", b"hello, this is not a database\n".to_vec()),
    ] {
        let path = dir.path().join(name);
        std::fs::write(&path, &bytes).unwrap();
        match IdemDb::open(&path) {
            Err(Error::NotIdemdb(_)) => {}
            other => panic!("{name}: expected NotIdemdb, got {other:?}"),
        }
        assert_eq!(
            std::fs::read(&path).unwrap(),
            bytes,
            "{name}: file untouched"
        );
    }
}

#[test]
fn an_empty_file_becomes_a_new_database() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("empty");
    std::fs::write(&path, b"").unwrap();
    let db = IdemDb::open(&path).unwrap();
    let r = acquired(
        db.reserve(&Scope::new("op", ""), &Key::new("k"), b"x", LEASE)
            .unwrap(),
    );
    db.complete(&r, b"ok".to_vec()).unwrap();
}

fn table_names(path: &Path) -> (Vec<String>, Vec<String>) {
    let db = redb::Database::open(path).unwrap();
    let txn = db.begin_read().unwrap();
    let tables = txn
        .list_tables()
        .unwrap()
        .map(|t| t.name().to_string())
        .collect();
    let multimap = txn
        .list_multimap_tables()
        .unwrap()
        .map(|t| redb::MultimapTableHandle::name(&t).to_string())
        .collect();
    (tables, multimap)
}

#[test]
fn a_redb_file_with_a_foreign_table_is_not_idemdb() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("foreign.redb");
    {
        let db = redb::Database::create(&path).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(TableDefinition::<u64, u64>::new("users"))
            .unwrap()
            .insert(1, 2)
            .unwrap();
        txn.commit().unwrap();
    }
    match IdemDb::open(&path) {
        Err(Error::NotIdemdb(_)) => {}
        other => panic!("expected NotIdemdb, got {other:?}"),
    }
    assert_eq!(
        table_names(&path),
        (vec!["users".to_string()], Vec::new()),
        "the foreign file was not modified"
    );
}

#[test]
fn a_redb_file_with_only_a_foreign_multimap_table_is_not_idemdb() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("foreign-multimap.redb");
    {
        let db = redb::Database::create(&path).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_multimap_table(MultimapTableDefinition::<u64, u64>::new("tags"))
            .unwrap()
            .insert(1, 2)
            .unwrap();
        txn.commit().unwrap();
    }
    match IdemDb::open(&path) {
        Err(Error::NotIdemdb(_)) => {}
        other => panic!("expected NotIdemdb, got {other:?}"),
    }
    assert_eq!(
        table_names(&path),
        (Vec::new(), vec!["tags".to_string()]),
        "the foreign file was not modified"
    );
}

#[test]
fn a_meta_table_that_is_not_ours_is_not_idemdb() {
    let dir = tempfile::tempdir().unwrap();

    // Our table name, foreign types.
    let path = dir.path().join("wrong-types.redb");
    {
        let db = redb::Database::create(&path).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(TableDefinition::<u64, u64>::new("idemdb_meta"))
            .unwrap()
            .insert(1, 1)
            .unwrap();
        txn.commit().unwrap();
    }
    match IdemDb::open(&path) {
        Err(Error::NotIdemdb(_)) => {}
        other => panic!("wrong types: expected NotIdemdb, got {other:?}"),
    }

    // Our types, but no magic.
    let path = dir.path().join("no-magic.redb");
    {
        let db = redb::Database::create(&path).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(META)
            .unwrap()
            .insert("something", &b"else"[..])
            .unwrap();
        txn.commit().unwrap();
    }
    match IdemDb::open(&path) {
        Err(Error::NotIdemdb(_)) => {}
        other => panic!("no magic: expected NotIdemdb, got {other:?}"),
    }

    // A real idemdb file whose magic was overwritten.
    let path = dir.path().join("bad-magic.idemdb");
    drop(IdemDb::open(&path).unwrap());
    {
        let db = redb::Database::open(&path).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(META)
            .unwrap()
            .insert("magic", &b"notours!"[..])
            .unwrap();
        txn.commit().unwrap();
    }
    match IdemDb::open(&path) {
        Err(Error::NotIdemdb(_)) => {}
        other => panic!("bad magic: expected NotIdemdb, got {other:?}"),
    }
}

#[test]
fn a_future_format_version_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("future.idemdb");
    {
        let db = IdemDb::open(&path).unwrap();
        let r = acquired(
            db.reserve(&Scope::new("op", ""), &Key::new("k"), b"x", LEASE)
                .unwrap(),
        );
        db.complete(&r, b"v1".to_vec()).unwrap();
    }
    assert_eq!(format_version(&path), Some(8u32.to_le_bytes().to_vec()));
    {
        let db = redb::Database::open(&path).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(META)
            .unwrap()
            .insert("format_version", &9u32.to_le_bytes()[..])
            .unwrap();
        txn.commit().unwrap();
    }
    match IdemDb::open(&path) {
        Err(Error::UnsupportedFormat { found, supported }) => {
            assert_eq!((found, supported), (9, 8));
        }
        other => panic!("expected UnsupportedFormat, got {other:?}"),
    }
    // The refusal did not rewrite the version.
    assert_eq!(format_version(&path), Some(9u32.to_le_bytes().to_vec()));
}

#[test]
fn opening_the_same_file_twice_at_once_fails_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("twice.idemdb");
    let first = IdemDb::open(&path).unwrap();
    let second =
        std::panic::catch_unwind(|| IdemDb::open(&path)).expect("opening twice must not panic");
    match second {
        Err(Error::Storage(_)) => {}
        Err(other) => panic!("expected a storage error, got {other:?}"),
        Ok(_) => panic!("the file was opened twice"),
    }
    // The first handle is unharmed.
    let r = acquired(
        first
            .reserve(&Scope::new("op", ""), &Key::new("k"), b"x", LEASE)
            .unwrap(),
    );
    first.complete(&r, b"first".to_vec()).unwrap();
    drop(first);
    // Once it is closed the file opens again.
    let again = IdemDb::open(&path).unwrap();
    assert_eq!(
        again
            .reserve(&Scope::new("op", ""), &Key::new("k"), b"x", LEASE)
            .unwrap(),
        ReserveOutcome::Completed(b"first".to_vec())
    );
}
