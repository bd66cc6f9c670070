//! A checkpoint whose durable commit fails: the frames it was to cover stay counted and in the
//! log, and a reopen of the durable image replays them (the log is recycled only after a
//! checkpoint's commit returned: invariant I21).

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{LEASE, T0, acquired, minutes};
use idemdb::redb::TableDefinition;
use idemdb::testing::LogLayout;
use idemdb::{Error, ExecuteError, IdemDb, Key, ManualClock, Outcome, RecordState, Scope};
use idemdb_testkit::{Fault, FaultBackend};

/// Not registered: a batch writing it takes a durable commit as its durability point.
const UNLOGGED: TableDefinition<&str, u64> = TableDefinition::new("unlogged");

fn scope() -> Scope {
    Scope::new("op", "p")
}

fn open(backend: &FaultBackend, interval: Duration) -> IdemDb {
    IdemDb::builder()
        .checkpoint_interval(interval)
        .open_with_backend(backend.clone(), backend.log())
        .unwrap()
}

/// Three lifecycles, each logged: six frames since the open's checkpoint.
fn logged_lifecycles(db: &IdemDb) {
    for i in 0..3 {
        let r = acquired(
            db.reserve(&scope(), &Key::new(format!("k{i}")), b"p", LEASE)
                .unwrap(),
        );
        db.complete(&r, format!("done {i}").into_bytes()).unwrap();
    }
}

fn assert_replayed(disk: &FaultBackend) {
    let db = open(disk, Duration::from_secs(3600));
    assert!(
        db.stats().replayed_frames >= 6,
        "{}",
        db.stats().replayed_frames
    );
    for i in 0..3 {
        let rec = db
            .get(&scope(), &Key::new(format!("k{i}")))
            .unwrap()
            .unwrap();
        assert_eq!(rec.state, RecordState::Completed);
        assert_eq!(rec.response, format!("done {i}").into_bytes());
    }
}

#[test]
fn a_batch_whose_durable_commit_fails_is_outcome_unknown_and_the_frames_stay() {
    let backend = FaultBackend::new();
    let db = open(&backend, Duration::from_secs(3600));
    logged_lifecycles(&db);
    let frames = db.stats().log_bytes_since_checkpoint;
    assert!(frames > 0);
    backend.inject(Fault::FileSync {
        log: false,
        after: 0,
    });
    let out = db.execute(&scope(), &Key::new("unlogged"), b"p", |tx| {
        tx.open_table(UNLOGGED)?.insert("row", 1)?;
        Ok::<_, Error>(Outcome::Completed(b"x".to_vec()))
    });
    match out {
        Err(ExecuteError::Db(e)) => assert!(e.is_outcome_unknown(), "{e}"),
        other => panic!("expected OutcomeUnknown, got {other:?}"),
    }
    // The checkpoint did not happen: its frames are still what a crash would replay.
    assert_eq!(db.stats().log_bytes_since_checkpoint, frames);
    assert!(matches!(
        db.reserve(&scope(), &Key::new("later"), b"p", LEASE),
        Err(Error::WritesRefused)
    ));
    let disk = backend.durable_disk();
    backend.kill();
    drop(db);
    assert_replayed(&disk);
}

#[test]
fn a_checkpoint_by_age_that_fails_poisons_and_the_frames_stay() {
    let backend = FaultBackend::new();
    let db = open(&backend, Duration::from_millis(50));
    backend.inject(Fault::FileSync {
        log: false,
        after: 0,
    });
    logged_lifecycles(&db);
    // The committer thread's checkpoint by age fails: later writes are refused.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    for i in 0.. {
        // A fresh key each time: it goes to the writer (a duplicate answers from a snapshot).
        match db.reserve(&scope(), &Key::new(format!("later{i}")), b"p", LEASE) {
            Err(Error::WritesRefused) => break,
            Ok(_) => {}
            Err(e) => panic!("{e}"),
        }
        assert!(std::time::Instant::now() < deadline, "no checkpoint failed");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(db.stats().log_bytes_since_checkpoint > 0);
    assert_eq!(db.stats().checkpoints, 0);
    let disk = backend.durable_disk();
    backend.kill();
    drop(db);
    assert_replayed(&disk);
}

/// A batch that passed the poisoning check and then waited for the leader lock, held by a
/// compaction step whose durable commit fails meanwhile, is refused under the lock and appends
/// no frame after the failed commit (design.md §12: the check again under the leader lock; a
/// plain batch never meets redb's own refusal to write). Without that check it answered
/// `Acquired` from a frame that followed the failed commit.
#[test]
fn a_batch_that_waited_for_a_failing_compaction_commit_is_refused_and_logs_nothing() {
    let backend = FaultBackend::new();
    let clock = ManualClock::new(T0);
    let db = Arc::new(
        IdemDb::builder()
            .clock(clock.clone())
            .retention(minutes(5))
            // No checkpoint of the applier's between the held sync and the batch.
            .without_applier()
            .open_with_backend(backend.clone(), backend.log())
            .unwrap(),
    );
    let r = acquired(db.reserve(&scope(), &Key::new("old"), b"p", LEASE).unwrap());
    db.complete(&r, b"done".to_vec()).unwrap();
    // Its partition is due: `compact_now` drops it in a durable commit under the leader lock.
    clock.advance(Duration::from_secs(10 * 60));
    backend.hold_syncs(true);
    let compaction = {
        let db = Arc::clone(&db);
        std::thread::spawn(move || db.compact_now())
    };
    assert!(
        backend.wait_for_held(1, Duration::from_secs(10)),
        "the drop's commit never reached its sync"
    );
    let frames = LogLayout::read(&backend.log().live_image()).last();
    let batch = {
        let db = Arc::clone(&db);
        std::thread::spawn(move || db.reserve(&scope(), &Key::new("new"), b"p", LEASE))
    };
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        !batch.is_finished(),
        "the batch did not wait for the leader lock"
    );
    backend.inject(Fault::FileSync {
        log: false,
        after: 0,
    });
    backend.hold_syncs(false);
    let compacted = compaction.join().unwrap();
    assert!(compacted.is_err(), "{compacted:?}");
    match batch.join().unwrap() {
        Err(Error::WritesRefused) => {}
        other => panic!("the waiting batch was not refused: {other:?}"),
    }
    assert_eq!(
        LogLayout::read(&backend.log().live_image()).last(),
        frames,
        "a frame followed the failed commit"
    );
    // What a crash now leaves opens, with the acknowledged record (read before it expires).
    let disk = backend.durable_disk();
    backend.kill();
    drop(db);
    let db = IdemDb::builder()
        .clock(ManualClock::new(T0))
        .retention(minutes(5))
        .open_with_backend(disk.clone(), disk.log())
        .unwrap();
    let rec = db.get(&scope(), &Key::new("old")).unwrap().unwrap();
    assert_eq!(rec.response, b"done".to_vec());
}
