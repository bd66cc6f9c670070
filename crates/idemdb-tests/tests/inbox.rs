//! Inbox dedupe: a redelivery does not run the handler, a handler error commits nothing, and a
//! poll of many messages shares one commit with each message isolated.

mod common;

use common::fresh;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use idemdb::redb::{ReadableTable, TableDefinition};
use idemdb::{Consumed, Error, ExecuteError, IdemDb};

const SEEN: TableDefinition<&str, u64> = TableDefinition::new("seen");

fn count(db: &IdemDb, id: &str) -> u64 {
    let read = db.begin_read().unwrap();
    match read.open_table(SEEN) {
        Ok(t) => t.get(id).unwrap().map(|v| v.value()).unwrap_or(0),
        Err(_) => 0,
    }
}

fn bump(id: &'static str) -> impl FnOnce(&mut idemdb::Tx<'_>) -> Result<(), Error> + Send {
    move |tx| {
        let mut t = tx.open_table(SEEN)?;
        let n = t.get(id)?.map(|v| v.value()).unwrap_or(0);
        t.insert(id, n + 1)?;
        Ok(())
    }
}

#[test]
fn redelivery_is_a_duplicate_and_a_failure_is_retried() {
    let (_dir, db) = fresh();
    assert_eq!(
        db.consume("billing", "m1", bump("m1")).unwrap(),
        Consumed::Processed
    );
    assert_eq!(
        db.consume("billing", "m1", bump("m1")).unwrap(),
        Consumed::Duplicate
    );
    // Another consumer of the same message is another inbox.
    assert_eq!(
        db.consume("audit", "m1", bump("m1")).unwrap(),
        Consumed::Processed
    );
    assert_eq!(count(&db, "m1"), 2);
    let failed = db.consume("billing", "m2", |tx| {
        bump("m2")(tx)?;
        Err::<(), Error>(Error::Closed)
    });
    assert!(matches!(failed, Err(ExecuteError::Closure(Error::Closed))));
    assert_eq!(count(&db, "m2"), 0, "nothing committed");
    assert_eq!(
        db.consume("billing", "m2", bump("m2")).unwrap(),
        Consumed::Processed
    );
    assert_eq!(count(&db, "m2"), 1);
}

#[test]
fn a_poll_shares_one_commit_and_isolates_each_message() {
    let (_dir, db) = fresh();
    let ids: Vec<&'static str> = (0..50).map(|i| &*format!("p{i}").leak()).collect();
    let ran = Arc::new(AtomicUsize::new(0));
    let before = db.stats().commits;
    let poll = ids.iter().enumerate().map(|(i, &id)| {
        let ran = Arc::clone(&ran);
        let handler = move |tx: &mut idemdb::Tx<'_>| {
            ran.fetch_add(1, Ordering::SeqCst);
            bump(id)(tx)?;
            if i == 7 {
                return Err(Error::Closed); // this message alone rolls back
            }
            Ok(())
        };
        (id, handler)
    });
    let answers = db.consume_batch("billing", poll).unwrap();
    let commits = db.stats().commits - before;
    assert!(commits <= 2, "{commits} commits for one poll");
    for (i, answer) in answers.iter().enumerate() {
        match (i, answer) {
            (7, Err(ExecuteError::Closure(Error::Closed))) => {}
            (7, other) => panic!("message 7: {other:?}"),
            (_, Ok(Consumed::Processed)) => {}
            (_, other) => panic!("message {i}: {other:?}"),
        }
    }
    assert_eq!(
        (count(&db, "p6"), count(&db, "p7"), count(&db, "p8")),
        (1, 0, 1)
    );
    // The same poll redelivered: only the failed message runs again.
    ran.store(0, Ordering::SeqCst);
    let again = ids.iter().map(|&id| {
        let ran = Arc::clone(&ran);
        (id, move |tx: &mut idemdb::Tx<'_>| {
            ran.fetch_add(1, Ordering::SeqCst);
            bump(id)(tx)
        })
    });
    let answers = db.consume_batch("billing", again).unwrap();
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    assert_eq!(
        answers
            .iter()
            .filter(|a| matches!(a, Ok(Consumed::Duplicate)))
            .count(),
        49
    );
    assert!(ids.iter().all(|id| count(&db, id) == 1));
}
