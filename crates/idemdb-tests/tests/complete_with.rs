//! The two-step flow's second step with business writes: complete_with / fail_with.

mod common;

use common::{AppError, LEASE, T0, acquired, setup};
use idemdb::Refusal;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use idemdb::redb::TableDefinition;
use idemdb::{
    Error, ExecuteError, IdemDb, InputError, Key, RecordState, ReserveOutcome, Scope, Tx,
};

const LEDGER: TableDefinition<&str, u64> = TableDefinition::new("ledger");

fn scope() -> Scope {
    Scope::new("POST /charges", "tenant-7")
}

fn ledger_row(db: &IdemDb, key: &str) -> Option<u64> {
    common::business_row(db, LEDGER, key)
}

/// A business closure that records that it ran and writes one ledger row.
fn ledger_write(
    ran: &Arc<AtomicBool>,
    row: &'static str,
    value: u64,
) -> impl FnOnce(&mut Tx<'_>) -> Result<(), AppError> + Send + 'static {
    let ran = Arc::clone(ran);
    move |tx| {
        ran.store(true, Ordering::SeqCst);
        tx.open_table(LEDGER)?.insert(row, value)?;
        Ok(())
    }
}

#[test]
fn complete_with_commits_the_business_row_and_completed_together() {
    let (_dir, clock, db) = setup();
    let key = Key::new("charge-1");
    let r = acquired(db.reserve(&scope(), &key, b"req", LEASE).unwrap());
    assert_eq!(ledger_row(&db, "charge-1"), None);

    clock.advance(Duration::from_secs(2));
    let ran = Arc::new(AtomicBool::new(false));
    db.complete_with(
        &r,
        b"201 \x00charged".to_vec(),
        ledger_write(&ran, "charge-1", 500),
    )
    .unwrap();
    assert!(ran.load(Ordering::SeqCst));

    let rec = db.get(&scope(), &key).unwrap().unwrap();
    assert_eq!(rec.state, RecordState::Completed);
    assert_eq!(rec.response, b"201 \x00charged".to_vec());
    assert_eq!(rec.token, r.token());
    assert_eq!(rec.updated_at, T0 + 2_000);
    assert_eq!(ledger_row(&db, "charge-1"), Some(500));
    assert_eq!(
        db.reserve(&scope(), &key, b"req", LEASE).unwrap(),
        ReserveOutcome::Completed(b"201 \x00charged".to_vec())
    );
    // Finished: a second complete_with is refused without running.
    let again = Arc::new(AtomicBool::new(false));
    match db.complete_with(&r, b"x".to_vec(), ledger_write(&again, "charge-1", 1)) {
        Err(ExecuteError::Db(Error::Refused(Refusal::NotInProgress {
            state: RecordState::Completed,
        }))) => {}
        other => panic!("expected NotInProgress, got {other:?}"),
    }
    assert!(!again.load(Ordering::SeqCst));
    assert_eq!(ledger_row(&db, "charge-1"), Some(500));
}

#[test]
fn closure_error_leaves_the_record_in_progress_and_writes_nothing() {
    let (_dir, _clock, db) = setup();
    let key = Key::new("charge-2");
    let r = acquired(db.reserve(&scope(), &key, b"req", LEASE).unwrap());
    let before = db.get(&scope(), &key).unwrap();

    let result = db.complete_with(&r, b"201".to_vec(), |tx| {
        tx.open_table(LEDGER)?.insert("charge-2", 77)?;
        Err(AppError::Rejected(503))
    });
    match result {
        Err(ExecuteError::Closure(e)) => assert_eq!(e, AppError::Rejected(503)),
        other => panic!("expected the closure's error, got {other:?}"),
    }
    assert_eq!(db.get(&scope(), &key).unwrap(), before, "still IN_PROGRESS");
    assert_eq!(ledger_row(&db, "charge-2"), None);
    assert_eq!(
        db.reserve(&scope(), &key, b"req", LEASE).unwrap(),
        ReserveOutcome::InProgress { retry_after: LEASE }
    );

    // The owner still holds it and may retry.
    let ran = Arc::new(AtomicBool::new(false));
    db.complete_with(
        &r,
        b"201 second".to_vec(),
        ledger_write(&ran, "charge-2", 78),
    )
    .unwrap();
    assert_eq!(ledger_row(&db, "charge-2"), Some(78));
    assert_eq!(
        db.reserve(&scope(), &key, b"req", LEASE).unwrap(),
        ReserveOutcome::Completed(b"201 second".to_vec())
    );
}

#[test]
fn closure_error_then_release_frees_the_key() {
    let (_dir, _clock, db) = setup();
    let key = Key::new("charge-3");
    let r = acquired(db.reserve(&scope(), &key, b"req", LEASE).unwrap());
    let result = db.fail_with(&r, b"402".to_vec(), |_tx| Err(AppError::Rejected(1)));
    assert!(matches!(
        result,
        Err(ExecuteError::Closure(AppError::Rejected(1)))
    ));
    assert_eq!(
        db.get(&scope(), &key).unwrap().unwrap().state,
        RecordState::InProgress
    );
    db.release(&r).unwrap();
    assert_eq!(db.get(&scope(), &key).unwrap(), None);
}

#[test]
fn fenced_owner_is_refused_and_its_closure_does_not_run() {
    let (_dir, clock, db) = setup();
    let key = Key::new("charge-4");
    let a = acquired(db.reserve(&scope(), &key, b"req", LEASE).unwrap());
    clock.advance(LEASE);
    let b = acquired(db.reserve(&scope(), &key, b"req", LEASE).unwrap());
    assert!(b.is_takeover());
    let before = db.get(&scope(), &key).unwrap();

    let ran = Arc::new(AtomicBool::new(false));
    match db.complete_with(&a, b"late".to_vec(), ledger_write(&ran, "charge-4", 1)) {
        Err(ExecuteError::Db(Error::Refused(Refusal::Fenced { presented, current }))) => {
            assert_eq!(presented, a.token());
            assert_eq!(current, b.token());
        }
        other => panic!("expected Fenced, got {other:?}"),
    }
    assert!(!ran.load(Ordering::SeqCst), "the closure did not run");

    match db.fail_with(&a, b"late".to_vec(), ledger_write(&ran, "charge-4", 2)) {
        Err(ExecuteError::Db(Error::Refused(Refusal::Fenced { presented, current }))) => {
            assert_eq!(presented, a.token());
            assert_eq!(current, b.token());
        }
        other => panic!("expected Fenced, got {other:?}"),
    }
    assert!(!ran.load(Ordering::SeqCst), "the closure did not run");
    assert_eq!(db.get(&scope(), &key).unwrap(), before);
    assert_eq!(ledger_row(&db, "charge-4"), None);

    // The current owner's complete_with works.
    db.complete_with(&b, b"b".to_vec(), ledger_write(&ran, "charge-4", 3))
        .unwrap();
    assert!(ran.load(Ordering::SeqCst));
    assert_eq!(ledger_row(&db, "charge-4"), Some(3));
}

#[test]
fn released_reservation_is_unknown_and_its_closure_does_not_run() {
    let (_dir, _clock, db) = setup();
    let key = Key::new("charge-5");
    let r = acquired(db.reserve(&scope(), &key, b"req", LEASE).unwrap());
    db.release(&r).unwrap();
    let ran = Arc::new(AtomicBool::new(false));
    match db.complete_with(&r, b"x".to_vec(), ledger_write(&ran, "charge-5", 1)) {
        Err(ExecuteError::Db(Error::Refused(Refusal::UnknownRecord))) => {}
        other => panic!("expected UnknownRecord, got {other:?}"),
    }
    assert!(!ran.load(Ordering::SeqCst));
    assert_eq!(db.get(&scope(), &key).unwrap(), None);
    assert_eq!(ledger_row(&db, "charge-5"), None);
}

#[test]
fn fail_with_stores_failed_with_its_business_row() {
    let (_dir, clock, db) = setup();
    let key = Key::new("charge-6");
    let r = acquired(db.reserve(&scope(), &key, b"req", LEASE).unwrap());
    clock.advance(Duration::from_millis(10));
    let ran = Arc::new(AtomicBool::new(false));
    db.fail_with(
        &r,
        b"402 \xffdeclined".to_vec(),
        ledger_write(&ran, "declined-6", 6),
    )
    .unwrap();
    assert!(ran.load(Ordering::SeqCst));
    let rec = db.get(&scope(), &key).unwrap().unwrap();
    assert_eq!(rec.state, RecordState::Failed);
    assert_eq!(rec.response, b"402 \xffdeclined".to_vec());
    assert_eq!(rec.updated_at, T0 + 10);
    assert_eq!(ledger_row(&db, "declined-6"), Some(6));
    assert_eq!(
        db.reserve(&scope(), &key, b"req", LEASE).unwrap(),
        ReserveOutcome::Failed(b"402 \xffdeclined".to_vec())
    );
}

#[test]
fn a_lapsed_owner_not_taken_over_may_still_complete_with() {
    let (_dir, clock, db) = setup();
    let key = Key::new("charge-7");
    let r = acquired(db.reserve(&scope(), &key, b"req", LEASE).unwrap());
    clock.advance(Duration::from_secs(300));
    let ran = Arc::new(AtomicBool::new(false));
    db.complete_with(&r, b"late ok".to_vec(), ledger_write(&ran, "charge-7", 7))
        .unwrap();
    assert_eq!(ledger_row(&db, "charge-7"), Some(7));
    assert_eq!(
        db.reserve(&scope(), &key, b"req", LEASE).unwrap(),
        ReserveOutcome::Completed(b"late ok".to_vec())
    );
}

#[test]
fn reserved_table_name_is_refused_in_complete_with() {
    let (_dir, _clock, db) = setup();
    let key = Key::new("charge-8");
    let r = acquired(db.reserve(&scope(), &key, b"req", LEASE).unwrap());
    let before = db.get(&scope(), &key).unwrap();
    let result = db.complete_with(&r, b"x".to_vec(), |tx| {
        tx.open_table(LEDGER)?.insert("charge-8", 8)?;
        tx.open_table(TableDefinition::<&str, &[u8]>::new("idemdb_meta"))?;
        Ok::<(), Error>(())
    });
    match result {
        Err(ExecuteError::Closure(Error::Refused(Refusal::InvalidInput(
            InputError::ReservedTableName { name },
        )))) => {
            assert_eq!(name, "idemdb_meta")
        }
        other => panic!("expected ReservedTableName, got {other:?}"),
    }
    assert_eq!(db.get(&scope(), &key).unwrap(), before);
    assert_eq!(ledger_row(&db, "charge-8"), None);
}

#[test]
fn a_panicking_business_closure_reaches_the_caller_and_commits_nothing() {
    let (_dir, _clock, db) = setup();
    let key = Key::new("charge-9");
    let r = acquired(db.reserve(&scope(), &key, b"req", LEASE).unwrap());
    let before = db.get(&scope(), &key).unwrap();
    let result = catch_unwind(AssertUnwindSafe(|| {
        db.complete_with(&r, b"x".to_vec(), |tx| {
            tx.open_table(LEDGER)
                .unwrap()
                .insert("charge-9", 9)
                .unwrap();
            if tx.now_ms() > 0 {
                panic!("ledger exploded");
            }
            Ok::<(), Error>(())
        })
    }));
    let payload = result.expect_err("the panic reaches the caller");
    assert_eq!(
        payload.downcast_ref::<&str>().copied(),
        Some("ledger exploded")
    );
    assert_eq!(db.get(&scope(), &key).unwrap(), before);
    assert_eq!(ledger_row(&db, "charge-9"), None);

    // The owner still holds the record and the database still works.
    let ran = Arc::new(AtomicBool::new(false));
    db.complete_with(
        &r,
        b"after panic".to_vec(),
        ledger_write(&ran, "charge-9", 10),
    )
    .unwrap();
    assert_eq!(ledger_row(&db, "charge-9"), Some(10));
}
