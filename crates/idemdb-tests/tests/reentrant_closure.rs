//! A closure that calls back into the database from inside its own commit gets an error
//! instead of waiting for itself forever.

mod common;

use common::fresh_shared;

use std::sync::Arc;
use std::time::Duration;

use idemdb::{Error, ExecuteError, Key, Outcome, ReserveOutcome, Scope};

#[test]
fn a_closure_calling_the_database_is_refused_not_deadlocked() {
    let (_dir, db) = fresh_shared();
    let scope = Scope::new("op", "p");
    let inner = Arc::clone(&db);
    let result = db.execute(&scope, &Key::new("outer"), b"p", move |_tx| {
        match inner.reserve(
            &Scope::new("op", "p"),
            &Key::new("inner"),
            b"p",
            Duration::from_secs(5),
        ) {
            Err(Error::Reentrant) => Err("refused"),
            other => panic!("expected Reentrant, got {other:?}"),
        }
    });
    assert!(matches!(result, Err(ExecuteError::Closure("refused"))));
    // Nothing committed, and the database still works.
    assert!(db.get(&scope, &Key::new("outer")).unwrap().is_none());
    assert!(matches!(
        db.reserve(&scope, &Key::new("inner"), b"p", Duration::from_secs(5))
            .unwrap(),
        ReserveOutcome::Acquired(_)
    ));
    let ok = db
        .execute(&scope, &Key::new("outer"), b"p", |_tx| {
            Ok::<_, Error>(Outcome::Completed(b"ok".to_vec()))
        })
        .unwrap();
    assert_eq!(
        ok,
        idemdb::ExecuteOutcome::Executed(Outcome::Completed(b"ok".to_vec()))
    );
}

/// `begin_read` first writes the overlay's records into redb, which needs redb's write lock,
/// and a closure's thread holds it: from inside a closure it is refused, as semantics.md §11
/// says, instead of waiting for itself (design.md §5.7).
#[test]
fn begin_read_inside_a_closure_is_refused_instead_of_waiting_for_itself() {
    let (_dir, db) = fresh_shared();
    let scope = Scope::new("op", "p");
    // A record in the overlay, so that `settle` would have something to write.
    assert!(matches!(
        db.reserve(&scope, &Key::new("before"), b"p", Duration::from_secs(5))
            .unwrap(),
        ReserveOutcome::Acquired(_)
    ));
    let inner = Arc::clone(&db);
    let (sent, seen) = std::sync::mpsc::channel();
    let worker = std::thread::spawn(move || {
        let outcome = db.execute(&scope, &Key::new("outer"), b"p", move |_tx| {
            let read = inner.begin_read().map(|_| ());
            Ok::<_, Error>(Outcome::Completed(format!("{read:?}").into_bytes()))
        });
        sent.send(outcome).unwrap();
    });
    let outcome = seen
        .recv_timeout(Duration::from_secs(20))
        .expect("begin_read inside a closure waited for the closure's own commit");
    worker.join().unwrap();
    assert_eq!(
        outcome.unwrap(),
        idemdb::ExecuteOutcome::Executed(Outcome::Completed(b"Err(Reentrant)".to_vec()))
    );
}
