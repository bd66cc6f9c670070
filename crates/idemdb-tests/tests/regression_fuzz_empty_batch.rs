//! A hang found by the `crash_recovery` fuzz target (fuzz/fuzz_targets/crash_recovery.rs): a
//! group of calls queued together with nothing to queue (a batch step whose keys were all
//! left in progress) took the writer's leadership and never gave it back, so the next write
//! waited forever for a leader. Through the public API the same group is an inbox poll that
//! came back empty, or one whose every message id is refused before anything is queued.

use std::sync::Arc;
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use idemdb::{Consumed, Error, IdemDb, Key, Outcome, ReserveOutcome, Scope, Tx};

type Handler = fn(&mut Tx<'_>) -> Result<(), String>;

fn nothing(_: &mut Tx<'_>) -> Result<(), String> {
    Ok(())
}

/// A fresh key's reservation on another thread answers within 20 s (a hang fails the test
/// instead of stalling the suite).
fn next_write_is_answered(db: &Arc<IdemDb>, key: &str) {
    let (tx, rx) = mpsc::channel();
    let (db, key) = (Arc::clone(db), key.to_string());
    thread::spawn(move || {
        let out = db.reserve(
            &Scope::new("op", "p"),
            &Key::new(&key),
            b"payload",
            Duration::from_secs(60),
        );
        let _ = tx.send(out.map(|o| matches!(o, ReserveOutcome::Acquired(_))));
    });
    match rx.recv_timeout(Duration::from_secs(20)) {
        Ok(Ok(acquired)) => assert!(acquired, "a fresh key was not acquired"),
        Ok(Err(e)) => panic!("the write after the empty group failed: {e}"),
        Err(_) => panic!("the write after the empty group was never answered: writer stalled"),
    }
}

fn open() -> (tempfile::TempDir, Arc<IdemDb>) {
    let dir = tempfile::tempdir().unwrap();
    let db = IdemDb::open(dir.path().join("db.idemdb")).unwrap();
    (dir, Arc::new(db))
}

#[test]
fn an_empty_poll_leaves_the_writer_free() {
    let (_dir, db) = open();
    let answers = db
        .consume_batch("orders", Vec::<(&str, Handler)>::new())
        .unwrap();
    assert!(answers.is_empty());
    next_write_is_answered(&db, "after-empty");
    // And again: the writer is not left in any state by the first.
    let answers = db
        .consume_batch("orders", Vec::<(&str, Handler)>::new())
        .unwrap();
    assert!(answers.is_empty());
    next_write_is_answered(&db, "after-second-empty");
}

#[test]
fn a_poll_of_refused_ids_only_leaves_the_writer_free() {
    let (_dir, db) = open();
    // Longer than the default key limit: refused before anything is queued.
    let too_long = "m".repeat(64 << 10);
    let poll: Vec<(&str, Handler)> = vec![(too_long.as_str(), nothing), ("", nothing)];
    let answers = db.consume_batch("orders", poll).unwrap();
    assert_eq!(answers.len(), 2);
    assert!(answers.iter().all(Result::is_err), "{answers:?}");
    next_write_is_answered(&db, "after-refused");
    // A poll with one good message among them still commits it.
    let poll: Vec<(&str, Handler)> = vec![(too_long.as_str(), nothing), ("m-1", nothing)];
    let answers = db.consume_batch("orders", poll).unwrap();
    assert!(matches!(answers[1], Ok(Consumed::Processed)), "{answers:?}");
    next_write_is_answered(&db, "after-mixed");
    // A one-shot execute after them too.
    let out = db.execute(
        &Scope::new("op", "p"),
        &Key::new("exec"),
        b"payload",
        |_tx| -> Result<Outcome, Error> { Ok(Outcome::Completed(b"ok".to_vec())) },
    );
    assert!(out.is_ok());
}
