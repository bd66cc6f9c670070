//! Group commit, made observable with a backend whose syncs can be held: while one commit is
//! stuck in its fsync, the ops that arrive form the next batch.

mod common;

use common::{LEASE, on_backend};
use idemdb::Refusal;

use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use idemdb::redb::{ReadableTableMetadata, TableDefinition};
use idemdb::testing::queued_ops;
use idemdb::{Error, ExecuteOutcome, IdemDb, Key, Outcome, ReserveOutcome, Scope};
use idemdb_testkit::{Fate, Fault, FaultBackend};

const WAIT: Duration = Duration::from_secs(10);
const ROWS: TableDefinition<&str, u64> = TableDefinition::new("rows");

fn open(backend: &FaultBackend) -> Arc<IdemDb> {
    Arc::new(on_backend(backend))
}

fn scope() -> Scope {
    Scope::new("op", "p")
}

fn reserve_in_thread(db: &Arc<IdemDb>, key: &str) -> JoinHandle<Result<ReserveOutcome, Error>> {
    let (db, key) = (Arc::clone(db), Key::new(key));
    thread::spawn(move || db.reserve(&scope(), &key, b"p", LEASE))
}

/// Waits until `n` ops wait in the writer's queue.
fn queued(db: &IdemDb, n: usize) {
    let deadline = std::time::Instant::now() + WAIT;
    while queued_ops(db) < n {
        assert!(std::time::Instant::now() < deadline, "{n} ops never queued");
        thread::sleep(Duration::from_millis(1));
    }
}

/// Gives blocked threads time to block (for what no counter shows).
fn settle() {
    thread::sleep(Duration::from_millis(80));
}

/// Holds syncs and starts a commit that gets stuck in its fsync: later ops queue behind it.
fn stuck_leader(
    backend: &FaultBackend,
    db: &Arc<IdemDb>,
) -> JoinHandle<Result<ReserveOutcome, Error>> {
    backend.hold_syncs(true);
    let leader = reserve_in_thread(db, "leader");
    assert!(
        backend.wait_for_held(1, WAIT),
        "the leader's commit never synced"
    );
    leader
}

/// Syncs one durable redb commit takes on this backend: that of a batch running caller code
/// (a closure's writes are not logged).
fn syncs_per_durable_commit(backend: &FaultBackend, db: &IdemDb) -> u64 {
    let before = backend.syncs();
    let _ = db
        .execute(&scope(), &Key::new("durable-probe"), b"p", |_| {
            Ok::<_, Error>(Outcome::Completed(Vec::new()))
        })
        .unwrap();
    backend.syncs() - before
}

/// Syncs one commit of a single reservation takes on this backend (a log append).
fn syncs_per_commit(backend: &FaultBackend, db: &IdemDb) -> u64 {
    let before = backend.syncs();
    let _ = db
        .reserve(&scope(), &Key::new("probe"), b"p", LEASE)
        .unwrap();
    backend.syncs() - before
}

#[test]
fn a_lone_caller_pays_one_commit() {
    let backend = FaultBackend::new();
    let db = open(&backend);
    let per_commit = syncs_per_commit(&backend, &db);
    assert!(per_commit >= 1);
    let before = backend.syncs();
    for i in 0..10 {
        let _ = db
            .reserve(&scope(), &Key::new(format!("k{i}")), b"p", LEASE)
            .unwrap();
    }
    assert_eq!(backend.syncs() - before, 10 * per_commit);
}

#[test]
fn duplicates_in_one_batch_see_each_other() {
    let backend = FaultBackend::new();
    let db = open(&backend);
    let per_commit = syncs_per_commit(&backend, &db);
    let leader = stuck_leader(&backend, &db);
    let first = reserve_in_thread(&db, "k");
    queued(&db, 1);
    let second = reserve_in_thread(&db, "k");
    queued(&db, 2);
    let before = backend.syncs();
    backend.hold_syncs(false);
    backend.release_held();
    assert!(matches!(
        leader.join().unwrap().unwrap(),
        ReserveOutcome::Acquired(_)
    ));
    assert!(matches!(
        first.join().unwrap().unwrap(),
        ReserveOutcome::Acquired(_)
    ));
    assert!(matches!(
        second.join().unwrap().unwrap(),
        ReserveOutcome::InProgress { .. }
    ));
    // The leader's commit plus one commit for both duplicates.
    assert_eq!(backend.syncs() - before, 2 * per_commit);
}

/// The thread that commits the next keyed transaction.
fn next_committer_thread(db: &IdemDb) -> std::sync::mpsc::Receiver<Option<String>> {
    let (tx, rx) = std::sync::mpsc::channel();
    idemdb::testing::after_next_commit(db, move || {
        let _ = tx.send(thread::current().name().map(str::to_owned));
    });
    rx
}

#[test]
fn ops_queued_behind_a_batch_are_led_by_the_committer_thread() {
    // A sync follower handed leadership would first have to be woken for it; the committer
    // thread, awake while ops keep coming, leads them instead (design.md §5.2).
    let backend = FaultBackend::new();
    let db = open(&backend);
    let leader = stuck_leader(&backend, &db);
    let followers: Vec<_> = (0..3)
        .map(|i| {
            let f = reserve_in_thread(&db, &format!("f{i}"));
            queued(&db, i + 1);
            f
        })
        .collect();
    let led_by = next_committer_thread(&db);
    backend.hold_syncs(false);
    backend.release_held();
    assert!(matches!(
        leader.join().unwrap().unwrap(),
        ReserveOutcome::Acquired(_)
    ));
    for f in followers {
        assert!(matches!(
            f.join().unwrap().unwrap(),
            ReserveOutcome::Acquired(_)
        ));
    }
    assert_eq!(
        led_by.recv_timeout(WAIT).unwrap().as_deref(),
        Some("idemdb-committer")
    );
    // A lone caller still commits on its own thread, with no hand-off. (The committer thread
    // answers the followers before it finds the queue empty; an op queued in between is its.)
    let idle_by = std::time::Instant::now() + WAIT;
    while idemdb::testing::batch_being_led(&db) {
        assert!(std::time::Instant::now() < idle_by, "the batch never ended");
        thread::yield_now();
    }
    let led_by = next_committer_thread(&db);
    let lone = thread::Builder::new()
        .name("lone-caller".into())
        .spawn({
            let db = Arc::clone(&db);
            move || db.reserve(&scope(), &Key::new("lone"), b"p", LEASE)
        })
        .unwrap();
    assert!(matches!(
        lone.join().unwrap().unwrap(),
        ReserveOutcome::Acquired(_)
    ));
    assert_eq!(
        led_by.recv_timeout(WAIT).unwrap().as_deref(),
        Some("lone-caller")
    );
}

#[test]
fn checkpoints_by_age_are_taken_while_the_committer_thread_leads_a_steady_load() {
    // The committer thread leads batch after batch under load; a checkpoint due by age must
    // not wait for the load to stop (else the log grows past its size and recovery past its
    // bound).
    let dir = tempfile::tempdir().unwrap();
    let db = Arc::new(
        IdemDb::builder()
            .checkpoint_interval(Duration::from_millis(20))
            .open(dir.path().join("db"))
            .unwrap(),
    );
    let before = db.stats().checkpoints;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let callers: Vec<_> = (0..8)
        .map(|t| {
            let (db, stop) = (Arc::clone(&db), Arc::clone(&stop));
            thread::spawn(move || {
                let mut i = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let key = Key::new(format!("t{t}-{i}"));
                    let r = match db.reserve(&scope(), &key, b"p", LEASE).unwrap() {
                        ReserveOutcome::Acquired(r) => r,
                        other => panic!("{other:?}"),
                    };
                    db.complete(&r, b"ok".to_vec()).unwrap();
                    i += 1;
                }
            })
        })
        .collect();
    thread::sleep(Duration::from_millis(1_000));
    let during = db.stats().checkpoints - before;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for c in callers {
        c.join().unwrap();
    }
    // About 50 are due (46–47 measured); a committer that leads first took 8.
    assert!(
        during >= 20,
        "{during} checkpoints in 1 s at a 20 ms interval"
    );
}

#[test]
fn failing_closures_do_not_undo_their_neighbours() {
    let backend = FaultBackend::new();
    let db = open(&backend);
    let per_commit = syncs_per_durable_commit(&backend, &db);
    let leader = stuck_leader(&backend, &db);
    let mut callers = Vec::new();
    for i in 0..12u64 {
        let caller_db = Arc::clone(&db);
        callers.push(thread::spawn(move || {
            let key = format!("k{i}");
            caller_db.execute(&scope(), &Key::new(&key), b"p", move |tx| {
                tx.open_table(ROWS)?.insert(key.as_str(), i)?;
                if i % 3 == 1 {
                    return Err(Error::Refused(Refusal::InvalidInput(
                        idemdb::InputError::ZeroLease,
                    )));
                }
                Ok(Outcome::Completed(i.to_le_bytes().to_vec()))
            })
        }));
        queued(&db, i as usize + 1);
    }
    let before = backend.syncs();
    backend.hold_syncs(false);
    backend.release_held();
    assert!(matches!(
        leader.join().unwrap().unwrap(),
        ReserveOutcome::Acquired(_)
    ));
    for (i, c) in callers.into_iter().enumerate() {
        let result = c.join().unwrap();
        if i % 3 == 1 {
            assert!(
                matches!(result, Err(idemdb::ExecuteError::Closure(_))),
                "{i}: {result:?}"
            );
        } else {
            assert!(
                matches!(result, Ok(ExecuteOutcome::Executed(_))),
                "{i}: {result:?}"
            );
        }
    }
    // The leader's log append, then all twelve shared one durable commit (which may take a
    // second sync after non-durable ones, plus at most one cover), and the log's cycle sector
    // rewritten after it (the checkpoint moved past the leader's frame): twelve commits would
    // take at least twelve.
    let took = backend.syncs() - before;
    assert!(
        took <= 2 + 3 * per_commit,
        "{took} syncs, {per_commit} per durable commit"
    );
    let read = db.begin_read().unwrap();
    let rows = read.open_table(ROWS).unwrap();
    assert_eq!(rows.len().unwrap(), 8);
    for i in 0..12u64 {
        let key = format!("k{i}");
        let row = rows.get(key.as_str()).unwrap().map(|v| v.value());
        let rec = db.get(&scope(), &Key::new(&key)).unwrap();
        if i % 3 == 1 {
            assert_eq!(row, None, "{key}");
            assert!(rec.is_none(), "{key}");
        } else {
            assert_eq!(row, Some(i), "{key}");
            assert_eq!(rec.unwrap().response, i.to_le_bytes());
        }
    }
}

type Reserving = JoinHandle<Result<ReserveOutcome, Error>>;
type Executing = JoinHandle<Result<ExecuteOutcome, idemdb::ExecuteError<Error>>>;

/// A batch [execute k1, reserve k2]: k1's transaction commits without fsync and is visible
/// before the batch's durable commit. Nobody may answer from it until that commit returns.
fn batch_with_a_non_durable_commit(
    backend: &FaultBackend,
    db: &Arc<IdemDb>,
) -> (Reserving, Executing, Reserving) {
    let leader = stuck_leader(backend, db);
    let exec = {
        let db = Arc::clone(db);
        thread::spawn(move || {
            db.execute(&scope(), &Key::new("k1"), b"p", |tx| {
                tx.open_table(ROWS)?.insert("k1", 1)?;
                Ok(Outcome::Completed(b"done".to_vec()))
            })
        })
    };
    queued(db, 1);
    let plain = reserve_in_thread(db, "k2");
    queued(db, 2);
    backend.release_held();
    assert!(leader.join().unwrap().is_ok());
    // The next batch is now stuck in its durable commit's sync.
    assert!(backend.wait_for_held(1, WAIT));
    (reserve_in_thread(db, "leader"), exec, plain)
}

/// A caller's own read transaction, opened while a non-durable commit is visible.
fn read_row_in_thread(db: &Arc<IdemDb>) -> JoinHandle<Result<Option<u64>, Error>> {
    let db = Arc::clone(db);
    thread::spawn(move || {
        let read = db.begin_read()?;
        let rows = read
            .open_table(ROWS)
            .map_err(|e| Error::Storage(Arc::new(e.into())))?;
        let row = rows
            .get("k1")
            .map_err(|e| Error::Storage(Arc::new(e.into())))?;
        Ok(row.map(|v| v.value()))
    })
}

#[test]
fn readers_wait_for_the_durable_commit_that_covers_what_they_saw() {
    let backend = FaultBackend::new();
    let db = open(&backend);
    let (_, exec, plain) = batch_with_a_non_durable_commit(&backend, &db);
    let dup = reserve_in_thread(&db, "k1");
    queued(&db, 1);
    let reader = read_row_in_thread(&db);
    settle();
    assert!(
        !dup.is_finished(),
        "a duplicate was answered from non-durable state"
    );
    assert!(
        !reader.is_finished(),
        "a read transaction showed non-durable state"
    );
    backend.hold_syncs(false);
    backend.release_held();
    assert!(matches!(
        exec.join().unwrap(),
        Ok(ExecuteOutcome::Executed(_))
    ));
    assert!(matches!(
        plain.join().unwrap(),
        Ok(ReserveOutcome::Acquired(_))
    ));
    assert_eq!(
        dup.join().unwrap().unwrap(),
        ReserveOutcome::Completed(b"done".to_vec())
    );
    assert_eq!(reader.join().unwrap().unwrap(), Some(1));
}

#[test]
fn a_crash_between_the_non_durable_and_the_durable_commit_takes_back_nothing_answered() {
    let backend = FaultBackend::new();
    let db = open(&backend);
    let (leader_again, exec, plain) = batch_with_a_non_durable_commit(&backend, &db);
    let dup = reserve_in_thread(&db, "k1");
    queued(&db, 1);
    let reader = read_row_in_thread(&db);
    settle();
    assert!(
        !dup.is_finished(),
        "a duplicate was answered from non-durable state"
    );
    assert!(
        !reader.is_finished(),
        "a read transaction showed non-durable state"
    );
    // Power loss while the durable commit is in its fsync: its pending writes are lost.
    let disk = backend.crash_disk(|_| Fate::Drop);
    backend.kill();
    assert!(exec.join().unwrap().is_err());
    assert!(plain.join().unwrap().unwrap_err().is_outcome_unknown());
    assert!(dup.join().unwrap().is_err(), "the duplicate got an outcome");
    assert!(reader.join().unwrap().is_err(), "the reader saw lost state");
    let _ = leader_again.join().unwrap();
    drop(db);

    let db = IdemDb::builder()
        .open_with_backend(disk.clone(), disk.log())
        .unwrap();
    let leader = db.get(&scope(), &Key::new("leader")).unwrap().unwrap();
    assert_eq!(
        leader.state,
        idemdb::RecordState::InProgress,
        "acknowledged before the crash"
    );
    assert!(db.get(&scope(), &Key::new("k1")).unwrap().is_none());
    assert!(db.get(&scope(), &Key::new("k2")).unwrap().is_none());
    let read = db.begin_read().unwrap();
    assert!(
        read.open_table(ROWS).is_err(),
        "the business table never became durable"
    );
}

#[test]
fn an_io_error_in_a_commit_answers_the_batch_outcome_unknown_and_refuses_writes() {
    let backend = FaultBackend::new();
    let db = open(&backend);
    let acknowledged = db.execute(&scope(), &Key::new("before"), b"p", |_tx| {
        Ok::<_, Error>(Outcome::Completed(b"kept".to_vec()))
    });
    assert!(acknowledged.is_ok());
    let leader = stuck_leader(&backend, &db);
    let callers: Vec<_> = (0..6)
        .map(|i| {
            let c = reserve_in_thread(&db, &format!("k{i}"));
            queued(&db, i + 1);
            c
        })
        .collect();
    backend.inject(Fault::Sync { after: 1 });
    backend.hold_syncs(false);
    backend.release_held();
    assert!(
        leader.join().unwrap().is_ok(),
        "its sync was within the budget"
    );
    for c in callers {
        let e = c.join().unwrap().unwrap_err();
        assert!(e.is_outcome_unknown(), "{e:?}");
        assert!(e.to_string().contains("outcome unknown"), "{e}");
    }
    assert!(matches!(
        db.reserve(&scope(), &Key::new("later"), b"p", LEASE),
        Err(Error::WritesRefused)
    ));
    // Replays of durable state still work.
    assert_eq!(
        db.reserve(&scope(), &Key::new("before"), b"p", LEASE)
            .unwrap(),
        ReserveOutcome::Completed(b"kept".to_vec())
    );
    drop(db);
    backend.clear_faults();
    let db = on_backend(&backend);
    assert_eq!(
        db.reserve(&scope(), &Key::new("before"), b"p", LEASE)
            .unwrap(),
        ReserveOutcome::Completed(b"kept".to_vec())
    );
    assert!(matches!(
        db.reserve(&scope(), &Key::new("after-reopen"), b"p", LEASE)
            .unwrap(),
        ReserveOutcome::Acquired(_)
    ));
}

#[test]
fn a_full_queue_makes_callers_wait_and_loses_nothing() {
    let backend = FaultBackend::new();
    let db = Arc::new(
        IdemDb::builder()
            .max_queue(2)
            .max_batch(2)
            .open_with_backend(backend.clone(), backend.log())
            .unwrap(),
    );
    let leader = stuck_leader(&backend, &db);
    let callers: Vec<_> = (0..16)
        .map(|i| reserve_in_thread(&db, &format!("k{i}")))
        .collect();
    queued(&db, 2);
    settle();
    assert!(callers.iter().all(|c| !c.is_finished()));
    backend.hold_syncs(false);
    backend.release_held();
    assert!(matches!(
        leader.join().unwrap().unwrap(),
        ReserveOutcome::Acquired(_)
    ));
    for c in callers {
        assert!(matches!(
            c.join().unwrap().unwrap(),
            ReserveOutcome::Acquired(_)
        ));
    }
    for i in 0..16 {
        assert!(
            db.get(&scope(), &Key::new(format!("k{i}")))
                .unwrap()
                .is_some()
        );
    }
}

/// `ROWS` registered: a batch writing it is made durable by a log append, whose `fdatasync`
/// (held by the tests below) runs outside redb, so readers can begin while it is held. (While
/// a durable redb commit's sync is held, redb itself holds `begin_read` back.)
fn open_logged(backend: &FaultBackend) -> Arc<IdemDb> {
    Arc::new(
        IdemDb::builder()
            .table(ROWS)
            .open_with_backend(backend.clone(), backend.log())
            .unwrap(),
    )
}

/// A database whose readers take the fallback path (the shared snapshot fails to refresh),
/// with `k1` reserved.
fn on_the_fallback_path_with_k1(backend: &FaultBackend) -> (Arc<IdemDb>, idemdb::Reservation) {
    let db = open_logged(backend);
    idemdb::testing::fail_snapshot_refresh(&db);
    match db.reserve(&scope(), &Key::new("k1"), b"p", LEASE).unwrap() {
        ReserveOutcome::Acquired(r) => (db, r),
        other => panic!("{other:?}"),
    }
}

/// With the shared read snapshot failing to refresh, readers open read transactions of their
/// own, which show a batch's commit before its durability point: the durability tracker alone
/// keeps a duplicate, a `get` and a caller's read transaction from answering it.
#[test]
fn on_the_fallback_read_path_nobody_answers_from_a_commit_not_yet_durable() {
    let backend = FaultBackend::new();
    let (db, r) = on_the_fallback_path_with_k1(&backend);
    // The completion commits (visible) and then waits in its durability point's sync.
    backend.hold_syncs(true);
    let completing = {
        let db = Arc::clone(&db);
        thread::spawn(move || {
            db.complete_with(&r, b"done".to_vec(), |tx| {
                tx.open_table(ROWS)?.insert("k1", 1)?;
                Ok::<_, Error>(())
            })
        })
    };
    assert!(backend.wait_for_held(1, WAIT));
    let dup = reserve_in_thread(&db, "k1");
    let getter = {
        let db = Arc::clone(&db);
        thread::spawn(move || db.get(&scope(), &Key::new("k1")))
    };
    let reader = read_row_in_thread(&db);
    settle();
    assert!(
        !dup.is_finished(),
        "a duplicate answered a commit not yet durable"
    );
    assert!(
        !getter.is_finished(),
        "get answered a commit not yet durable"
    );
    assert!(
        !reader.is_finished(),
        "a read transaction showed a commit not yet durable"
    );
    backend.hold_syncs(false);
    backend.release_held();
    completing.join().unwrap().unwrap();
    assert_eq!(
        dup.join().unwrap().unwrap(),
        ReserveOutcome::Completed(b"done".to_vec())
    );
    let record = getter.join().unwrap().unwrap().unwrap();
    assert_eq!(record.response, b"done");
    assert_eq!(reader.join().unwrap().unwrap(), Some(1));
    // Still on the fallback path: later answers are read the same way.
    assert_eq!(
        db.reserve(&scope(), &Key::new("k1"), b"p", LEASE).unwrap(),
        ReserveOutcome::Completed(b"done".to_vec())
    );
}

/// A caller's read transaction begun while a batch's log frame waits in its `fdatasync` is
/// returned only once the frame is durable: it shows the batch's rows, which a power loss
/// before that point takes back.
#[test]
fn a_read_transaction_waits_for_the_log_frame_that_covers_what_it_shows() {
    let backend = FaultBackend::new();
    let db = open_logged(&backend);
    backend.hold_syncs(true);
    let executing = {
        let db = Arc::clone(&db);
        thread::spawn(move || {
            db.execute(&scope(), &Key::new("k1"), b"p", |tx| {
                tx.open_table(ROWS)?.insert("k1", 1)?;
                Ok::<_, Error>(Outcome::Completed(b"done".to_vec()))
            })
        })
    };
    assert!(backend.wait_for_held(1, WAIT));
    assert_eq!(backend.log().pending(), 1, "the held sync is the log's");
    let reader = read_row_in_thread(&db);
    settle();
    assert!(
        !reader.is_finished(),
        "a read transaction showed a commit not yet durable"
    );
    backend.hold_syncs(false);
    backend.release_held();
    assert!(matches!(
        executing.join().unwrap(),
        Ok(ExecuteOutcome::Executed(_))
    ));
    assert_eq!(reader.join().unwrap().unwrap(), Some(1));
}

/// I13: a batch's records are visible to nobody before its durability point: a reader on the
/// fallback path (a read transaction of its own) that reads while the completion is applied and
/// not yet durable answers the record as it was before, never the completion.
#[test]
fn a_batch_is_invisible_on_the_fallback_read_path_before_its_durability_point() {
    let backend = FaultBackend::new();
    let (db, r) = on_the_fallback_path_with_k1(&backend);
    let (sent, seen) = std::sync::mpsc::channel();
    let reader = Arc::clone(&db);
    idemdb::testing::after_next_commit(&db, move || {
        // The completion is applied and not yet durable: this thread leads its batch.
        let seen_then = reader.get(&scope(), &Key::new("k1"));
        sent.send(seen_then).unwrap();
    });
    db.complete(&r, b"done".to_vec()).unwrap();
    let seen_then = seen
        .recv_timeout(WAIT)
        .unwrap()
        .unwrap()
        .expect("the reserved record");
    assert_eq!(
        seen_then.state,
        idemdb::RecordState::InProgress,
        "{seen_then:?}"
    );
    assert!(seen_then.response.is_empty());
    let record = db.get(&scope(), &Key::new("k1")).unwrap().unwrap();
    assert_eq!(record.response, b"done");
}

/// I23 under load: 64 sync callers, each running its own number of reserve + complete
/// lifecycles, so that they stop one by one as the end of a fill does, while the rest keep the
/// committer thread leading batches of sync followers woken as a tree. Every caller must
/// finish: a follower left asleep with its answer set would hang here, so the test waits with
/// a deadline instead of joining blindly.
#[test]
fn sync_callers_that_stop_one_by_one_are_all_answered() {
    const CALLERS: usize = 64;
    let backend = FaultBackend::new();
    let db = open(&backend);
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    for t in 0..CALLERS {
        let (db, done_tx) = (Arc::clone(&db), done_tx.clone());
        thread::spawn(move || {
            let scope = scope();
            // 40..=670 lifecycles: one caller stops about every 10.
            for i in 0..40 + 10 * t {
                let key = Key::new(format!("{t}-{i}"));
                let ReserveOutcome::Acquired(r) = db.reserve(&scope, &key, b"p", LEASE).unwrap()
                else {
                    panic!("a fresh key was not acquired");
                };
                db.complete(&r, b"done").unwrap();
            }
            done_tx.send(t).unwrap();
        });
    }
    drop(done_tx);
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let mut finished = [false; CALLERS];
    for _ in 0..CALLERS {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match done_rx.recv_timeout(left) {
            Ok(t) => finished[t] = true,
            Err(e) => {
                let stuck: Vec<usize> = (0..CALLERS).filter(|t| !finished[*t]).collect();
                panic!(
                    "callers {stuck:?} never got their answers ({e}); {} ops queued, leader \
                     active: {}",
                    queued_ops(&db),
                    idemdb::testing::batch_being_led(&db)
                );
            }
        }
    }
    assert_eq!(queued_ops(&db), 0);
}
