//! The one-shot flow: record and business writes commit together, or not at all.

mod common;

use common::{AppError, T0, setup};
use idemdb::Refusal;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::Duration;

use idemdb::redb::{MultimapTableDefinition, MultimapTableHandle, TableDefinition, TableHandle};
use idemdb::{
    Error, ExecuteError, ExecuteOutcome, IdemDb, InputError, Key, Outcome, RecordState,
    Reservation, ReserveOutcome, Scope,
};

const ORDERS: TableDefinition<&str, u64> = TableDefinition::new("orders");

fn scope() -> Scope {
    Scope::new("POST /orders", "user-1")
}

/// The business row for `key`, read through a durable snapshot; `None` if absent (or if the
/// table was never created).
fn business_row(db: &IdemDb, key: &str) -> Option<u64> {
    common::business_row(db, ORDERS, key)
}

fn business_row_count(db: &IdemDb) -> u64 {
    common::business_row_count(db, ORDERS)
}

/// A closure that counts its runs, writes `row` into ORDERS and returns `outcome`.
fn writing(
    runs: &Arc<AtomicUsize>,
    row: &'static str,
    value: u64,
    outcome: Outcome,
) -> impl FnOnce(&mut idemdb::Tx<'_>) -> Result<Outcome, AppError> + Send + 'static {
    let runs = Arc::clone(runs);
    move |tx| {
        runs.fetch_add(1, Ordering::SeqCst);
        tx.open_table(ORDERS)?.insert(row, value)?;
        Ok(outcome)
    }
}

#[test]
fn success_commits_record_and_business_row_together() {
    let (_dir, _clock, db) = setup();
    let runs = Arc::new(AtomicUsize::new(0));
    let seen_now = Arc::new(AtomicU64::new(0));
    let seen = Arc::clone(&seen_now);
    let r = Arc::clone(&runs);
    let out = db
        .execute(&scope(), &Key::new("order-1"), b"req", move |tx| {
            r.fetch_add(1, Ordering::SeqCst);
            seen.store(tx.now_ms(), Ordering::SeqCst);
            tx.open_table(ORDERS)?.insert("order-1", 990)?;
            Ok::<_, Error>(Outcome::Completed(b"201 \x00\xff".to_vec()))
        })
        .unwrap();
    assert_eq!(
        out,
        ExecuteOutcome::Executed(Outcome::Completed(b"201 \x00\xff".to_vec()))
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(
        seen_now.load(Ordering::SeqCst),
        T0,
        "Tx::now_ms is the db clock"
    );

    let rec = db.get(&scope(), &Key::new("order-1")).unwrap().unwrap();
    assert_eq!(rec.state, RecordState::Completed);
    assert_eq!(rec.response, b"201 \x00\xff".to_vec());
    assert_eq!(rec.fingerprint, db.fingerprint(b"req"));
    assert_eq!(rec.attempts, 1);
    assert_eq!(rec.created_at, T0);
    assert_eq!(rec.updated_at, T0);
    assert_eq!(business_row(&db, "order-1"), Some(990));

    // The two-step API sees the same record.
    assert_eq!(
        db.reserve(
            &scope(),
            &Key::new("order-1"),
            b"req",
            Duration::from_secs(1)
        )
        .unwrap(),
        ReserveOutcome::Completed(b"201 \x00\xff".to_vec())
    );
}

#[test]
fn closure_error_commits_nothing_and_a_retry_runs_again() {
    let (_dir, _clock, db) = setup();
    let runs = Arc::new(AtomicUsize::new(0));
    // Another key first, so the business table exists and absence is meaningful.
    let _ = db
        .execute(
            &scope(),
            &Key::new("other"),
            b"o",
            writing(&runs, "other", 1, Outcome::Completed(b"o".to_vec())),
        )
        .unwrap();
    assert_eq!(runs.swap(0, Ordering::SeqCst), 1);

    let key = Key::new("order-2");
    let r = Arc::clone(&runs);
    let err = db
        .execute(&scope(), &key, b"req", move |tx| {
            r.fetch_add(1, Ordering::SeqCst);
            tx.open_table(ORDERS)?.insert("order-2", 5)?;
            Err::<Outcome, _>(AppError::Rejected(409))
        })
        .unwrap_err();
    match err {
        ExecuteError::Closure(e) => assert_eq!(e, AppError::Rejected(409)),
        ExecuteError::Db(e) => panic!("expected the closure's error, got {e:?}"),
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(db.get(&scope(), &key).unwrap(), None, "no record");
    assert_eq!(business_row(&db, "order-2"), None, "no business row");
    assert_eq!(
        business_row(&db, "other"),
        Some(1),
        "the neighbour is intact"
    );
    assert_eq!(business_row_count(&db), 1);

    // The retry runs the closure again.
    let out = db
        .execute(
            &scope(),
            &key,
            b"req",
            writing(&runs, "order-2", 6, Outcome::Completed(b"created".to_vec())),
        )
        .unwrap();
    assert_eq!(
        out,
        ExecuteOutcome::Executed(Outcome::Completed(b"created".to_vec()))
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert_eq!(business_row(&db, "order-2"), Some(6));

    // A duplicate replays without running.
    let dup = db
        .execute(
            &scope(),
            &key,
            b"req",
            writing(&runs, "order-2", 7, Outcome::Completed(b"again".to_vec())),
        )
        .unwrap();
    assert_eq!(dup, ExecuteOutcome::Completed(b"created".to_vec()));
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert_eq!(business_row(&db, "order-2"), Some(6));

    // Another payload is a mismatch, without running.
    let mm = db
        .execute(
            &scope(),
            &key,
            b"other req",
            writing(&runs, "order-2", 8, Outcome::Completed(b"x".to_vec())),
        )
        .unwrap();
    assert_eq!(mm, ExecuteOutcome::Mismatch);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert_eq!(business_row(&db, "order-2"), Some(6));
    assert_eq!(business_row_count(&db), 2);
}

#[test]
fn failed_outcome_is_stored_and_replayed() {
    let (_dir, _clock, db) = setup();
    let runs = Arc::new(AtomicUsize::new(0));
    let key = Key::new("order-3");
    let out = db
        .execute(
            &scope(),
            &key,
            b"req",
            writing(
                &runs,
                "declined-3",
                3,
                Outcome::Failed(b"402 \xff".to_vec()),
            ),
        )
        .unwrap();
    assert_eq!(
        out,
        ExecuteOutcome::Executed(Outcome::Failed(b"402 \xff".to_vec()))
    );
    let rec = db.get(&scope(), &key).unwrap().unwrap();
    assert_eq!(rec.state, RecordState::Failed);
    assert_eq!(rec.response, b"402 \xff".to_vec());
    assert_eq!(
        business_row(&db, "declined-3"),
        Some(3),
        "its writes committed"
    );

    let dup = db
        .execute(
            &scope(),
            &key,
            b"req",
            writing(&runs, "declined-3", 4, Outcome::Completed(b"no".to_vec())),
        )
        .unwrap();
    assert_eq!(dup, ExecuteOutcome::Failed(b"402 \xff".to_vec()));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(business_row(&db, "declined-3"), Some(3));
    assert_eq!(
        db.reserve(&scope(), &key, b"req", Duration::from_secs(1))
            .unwrap(),
        ReserveOutcome::Failed(b"402 \xff".to_vec())
    );
}

#[test]
fn empty_response_is_stored_and_replayed() {
    let (_dir, _clock, db) = setup();
    let runs = Arc::new(AtomicUsize::new(0));
    let key = Key::new("empty");
    let out = db
        .execute(
            &scope(),
            &key,
            b"req",
            writing(&runs, "empty", 0, Outcome::Completed(Vec::new())),
        )
        .unwrap();
    assert_eq!(
        out,
        ExecuteOutcome::Executed(Outcome::Completed(Vec::new()))
    );
    assert_eq!(
        db.execute(
            &scope(),
            &key,
            b"req",
            writing(&runs, "empty", 1, Outcome::Completed(b"x".to_vec()))
        )
        .unwrap(),
        ExecuteOutcome::Completed(Vec::new())
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[test]
fn execute_on_a_two_step_reservation_is_in_progress_and_does_not_run() {
    let (_dir, clock, db) = setup();
    let runs = Arc::new(AtomicUsize::new(0));
    let key = Key::new("held");
    let owner = match db
        .reserve(&scope(), &key, b"req", Duration::from_secs(30))
        .unwrap()
    {
        ReserveOutcome::Acquired(r) => r,
        other => panic!("{other:?}"),
    };
    let before = db.get(&scope(), &key).unwrap();
    clock.advance(Duration::from_secs(10));
    let out = db
        .execute(
            &scope(),
            &key,
            b"req",
            writing(&runs, "held", 1, Outcome::Completed(b"x".to_vec())),
        )
        .unwrap();
    assert_eq!(
        out,
        ExecuteOutcome::InProgress {
            retry_after: Duration::from_secs(20)
        }
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    assert_eq!(db.get(&scope(), &key).unwrap(), before);
    assert_eq!(business_row(&db, "held"), None);

    // Another payload on the held key is a mismatch, not InProgress.
    assert_eq!(
        db.execute(
            &scope(),
            &key,
            b"other",
            writing(&runs, "held", 1, Outcome::Completed(b"x".to_vec()))
        )
        .unwrap(),
        ExecuteOutcome::Mismatch
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);

    // Once the lease ran out, execute takes over and the two-step owner is fenced.
    clock.advance(Duration::from_secs(20));
    let out = db
        .execute(
            &scope(),
            &key,
            b"req",
            writing(&runs, "held", 2, Outcome::Completed(b"by execute".to_vec())),
        )
        .unwrap();
    assert_eq!(
        out,
        ExecuteOutcome::Executed(Outcome::Completed(b"by execute".to_vec()))
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let rec = db.get(&scope(), &key).unwrap().unwrap();
    assert_eq!(rec.state, RecordState::Completed);
    assert_eq!(rec.attempts, 2);
    assert!(rec.token > owner.token());
    assert_eq!(rec.created_at, T0);
    match db.complete(&owner, b"late".to_vec()) {
        Err(Error::Refused(Refusal::Fenced { presented, current })) => {
            assert_eq!(presented, owner.token());
            assert_eq!(current, rec.token);
        }
        other => panic!("expected Fenced, got {other:?}"),
    }
    assert_eq!(db.get(&scope(), &key).unwrap(), Some(rec));
}

#[test]
fn execute_on_a_two_step_completed_key_replays() {
    let (_dir, _clock, db) = setup();
    let runs = Arc::new(AtomicUsize::new(0));
    let key = Key::new("two-step");
    let r: Reservation = match db
        .reserve(&scope(), &key, b"req", Duration::from_secs(30))
        .unwrap()
    {
        ReserveOutcome::Acquired(r) => r,
        other => panic!("{other:?}"),
    };
    db.complete(&r, b"two-step answer".to_vec()).unwrap();
    assert_eq!(
        db.execute(
            &scope(),
            &key,
            b"req",
            writing(&runs, "two-step", 1, Outcome::Completed(b"x".to_vec()))
        )
        .unwrap(),
        ExecuteOutcome::Completed(b"two-step answer".to_vec())
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    assert_eq!(business_row(&db, "two-step"), None);
}

#[test]
fn reserved_table_names_are_refused_inside_the_closure() {
    let (_dir, _clock, db) = setup();
    let key = Key::new("sneaky");
    let others: Arc<Mutex<Vec<Result<(), Error>>>> = Arc::default();
    let seen = Arc::clone(&others);
    let err = db
        .execute(&scope(), &key, b"req", move |tx| {
            // A legitimate write first: it must be rolled back with the rest.
            tx.open_table(ORDERS)?.insert("sneaky", 1)?;
            let mut results = Vec::new();
            for def in [
                TableDefinition::<&str, &[u8]>::new("idemdb_meta"),
                TableDefinition::<&str, &[u8]>::new("idemdb_records"),
                TableDefinition::<&str, &[u8]>::new("idemdb_inflight"),
            ] {
                results.push(tx.open_table(def).map(|_| ()));
            }
            results.push(
                tx.open_multimap_table(MultimapTableDefinition::<&str, u64>::new("idemdb_mm"))
                    .map(|_| ()),
            );
            *seen.lock().unwrap() = results;
            tx.open_table(TableDefinition::<&str, u64>::new("idemdb_x"))?;
            Ok(Outcome::Completed(b"should not happen".to_vec()))
        })
        .unwrap_err();
    match err {
        ExecuteError::Closure(Error::Refused(Refusal::InvalidInput(
            InputError::ReservedTableName { name },
        ))) => {
            assert_eq!(name, "idemdb_x")
        }
        other => panic!("expected ReservedTableName, got {other:?}"),
    }
    let others = others.lock().unwrap();
    let expected = [
        "idemdb_meta",
        "idemdb_records",
        "idemdb_inflight",
        "idemdb_mm",
    ];
    assert_eq!(others.len(), expected.len());
    for (result, want) in others.iter().zip(expected) {
        match result {
            Err(Error::Refused(Refusal::InvalidInput(InputError::ReservedTableName { name }))) => {
                assert_eq!(name, want)
            }
            other => panic!("{want}: expected ReservedTableName, got {other:?}"),
        }
    }
    assert_eq!(db.get(&scope(), &key).unwrap(), None);
    assert_eq!(business_row(&db, "sneaky"), None);
    let txn = db.begin_read().unwrap();
    let names: Vec<String> = txn
        .list_tables()
        .unwrap()
        .map(|t| t.name().to_string())
        .collect();
    assert!(!names.iter().any(|n| n == "idemdb_x"), "{names:?}");
    let multimap: Vec<String> = txn
        .list_multimap_tables()
        .unwrap()
        .map(|t| t.name().to_string())
        .collect();
    assert!(multimap.is_empty(), "{multimap:?}");
    drop(txn);

    // The database is unharmed.
    let runs = Arc::new(AtomicUsize::new(0));
    assert_eq!(
        db.execute(
            &scope(),
            &key,
            b"req",
            writing(&runs, "sneaky", 2, Outcome::Completed(b"fine".to_vec()))
        )
        .unwrap(),
        ExecuteOutcome::Executed(Outcome::Completed(b"fine".to_vec()))
    );
}

#[test]
fn a_panicking_closure_reaches_the_caller_and_commits_nothing() {
    let (_dir, _clock, db) = setup();
    let key = Key::new("panicky");
    let result = catch_unwind(AssertUnwindSafe(|| {
        db.execute(&scope(), &key, b"req", |tx| {
            tx.open_table(ORDERS)
                .unwrap()
                .insert("panicky", 13)
                .unwrap();
            if tx.now_ms() > 0 {
                panic!("boom in closure");
            }
            Ok::<_, Error>(Outcome::Completed(b"unreachable".to_vec()))
        })
    }));
    let payload = result.expect_err("the panic reaches the caller");
    assert_eq!(
        payload.downcast_ref::<&str>().copied(),
        Some("boom in closure")
    );
    assert_eq!(db.get(&scope(), &key).unwrap(), None);
    assert_eq!(business_row(&db, "panicky"), None);

    // The database still works, and the key is free.
    let runs = Arc::new(AtomicUsize::new(0));
    assert_eq!(
        db.execute(
            &scope(),
            &key,
            b"req",
            writing(&runs, "panicky", 14, Outcome::Completed(b"ok".to_vec()))
        )
        .unwrap(),
        ExecuteOutcome::Executed(Outcome::Completed(b"ok".to_vec()))
    );
    assert_eq!(business_row(&db, "panicky"), Some(14));
}

#[test]
fn concurrent_duplicates_run_the_closure_once() {
    let (_dir, _clock, db) = setup();
    let runs = Arc::new(AtomicUsize::new(0));
    let threads = 8;
    let barrier = Barrier::new(threads);
    let outcomes: Vec<ExecuteOutcome> = thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    db.execute(
                        &scope(),
                        &Key::new("dup"),
                        b"req",
                        writing(&runs, "dup", 1, Outcome::Completed(b"once".to_vec())),
                    )
                    .unwrap()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let executed = outcomes
        .iter()
        .filter(|o| **o == ExecuteOutcome::Executed(Outcome::Completed(b"once".to_vec())))
        .count();
    assert_eq!(executed, 1, "{outcomes:?}");
    for o in &outcomes {
        assert!(
            *o == ExecuteOutcome::Executed(Outcome::Completed(b"once".to_vec()))
                || *o == ExecuteOutcome::Completed(b"once".to_vec()),
            "{o:?}"
        );
    }
}

#[test]
fn interleaved_failing_and_succeeding_closures_on_many_threads() {
    let (_dir, _clock, db) = setup();
    let threads = 8u32;
    let per_thread = 20u32;
    let barrier = Barrier::new(threads as usize);
    // i % 3 == 0: the closure writes, then errs. 1: Outcome::Failed. 2: Outcome::Completed.
    thread::scope(|s| {
        for t in 0..threads {
            let db = &db;
            let barrier = &barrier;
            s.spawn(move || {
                barrier.wait();
                for j in 0..per_thread {
                    let i = t * per_thread + j;
                    let name = format!("row-{i}");
                    let key = Key::new(&name);
                    let payload = name.clone();
                    let result = db.execute(&scope(), &key, payload.as_str(), move |tx| {
                        tx.open_table(ORDERS)?.insert(name.as_str(), u64::from(i))?;
                        match i % 3 {
                            0 => Err(AppError::Rejected(i)),
                            1 => Ok(Outcome::Failed(format!("failed-{i}").into_bytes())),
                            _ => Ok(Outcome::Completed(format!("done-{i}").into_bytes())),
                        }
                    });
                    match (i % 3, result) {
                        (0, Err(ExecuteError::Closure(e))) => {
                            assert_eq!(e, AppError::Rejected(i), "each caller gets its own error")
                        }
                        (1, Ok(ExecuteOutcome::Executed(Outcome::Failed(b)))) => {
                            assert_eq!(b, format!("failed-{i}").into_bytes())
                        }
                        (2, Ok(ExecuteOutcome::Executed(Outcome::Completed(b)))) => {
                            assert_eq!(b, format!("done-{i}").into_bytes())
                        }
                        (kind, other) => panic!("key {i} (kind {kind}): unexpected {other:?}"),
                    }
                }
            });
        }
    });

    let total = threads * per_thread;
    let mut committed = 0;
    for i in 0..total {
        let name = format!("row-{i}");
        let rec = db.get(&scope(), &Key::new(&name)).unwrap();
        let row = business_row(&db, &name);
        match i % 3 {
            0 => {
                assert_eq!(rec, None, "key {i}");
                assert_eq!(row, None, "key {i}");
            }
            kind => {
                let rec = rec.unwrap_or_else(|| panic!("key {i} has no record"));
                let (state, response) = if kind == 1 {
                    (RecordState::Failed, format!("failed-{i}"))
                } else {
                    (RecordState::Completed, format!("done-{i}"))
                };
                assert_eq!(rec.state, state, "key {i}");
                assert_eq!(rec.response, response.into_bytes(), "key {i}");
                assert_eq!(row, Some(u64::from(i)), "key {i}");
                committed += 1;
            }
        }
    }
    assert_eq!(business_row_count(&db), committed);
}
