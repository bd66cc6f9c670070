//! The log grown ahead of its frames by the applier thread (docs/design.md §5.6, wal/space.rs):
//! no batch waits for a zero-fill and the durable commit that records the new length; a
//! crash between the fill and that commit leaves a log longer than the file records, which
//! opens with every acknowledged outcome; a fill that fails poisons nothing, and a batch then
//! grows the log itself, as without the applier.

mod common;

use std::time::{Duration, Instant};

use common::{LEASE, T0, acquired, power_loss_now};
use idemdb::{IdemDb, Key, ManualClock, RecordState, ReserveOutcome, Scope, Stats};
use idemdb_testkit::{Fault, FaultBackend};

/// The log's size at creation and its growth unit in these tests.
const STEP: u64 = 64 << 10;
/// Each completion's response: a few of them fill a 64 KiB log.
const RESPONSE: usize = 4 << 10;

fn scope() -> Scope {
    Scope::new("grow", "u1")
}

/// A small log, and no checkpoint by size or age while a test runs: the only checkpoints are
/// the ones that record a log grown ahead, or a batch's own when its frame did not fit.
fn open(disk: &FaultBackend) -> IdemDb {
    IdemDb::builder()
        .clock(ManualClock::new(T0))
        .checkpoint_interval(Duration::from_secs(3600))
        .checkpoint_bytes(1 << 30)
        .log_step(STEP)
        .open_with_backend(disk.clone(), disk.log())
        .unwrap()
}

fn lifecycle(db: &IdemDb, i: usize) {
    assert!(try_lifecycle(db, i), "k{i} refused");
}

/// Reserves and completes `k{i}`; false once the writer refuses (poisoned), which it may
/// after the reserve: `k{i}` is then not acknowledged as completed.
fn try_lifecycle(db: &IdemDb, i: usize) -> bool {
    let Ok(outcome) = db.reserve(&scope(), &Key::new(format!("k{i}")), b"p", LEASE) else {
        return false;
    };
    db.complete(&acquired(outcome), vec![b'r'; RESPONSE])
        .is_ok()
}

/// Where the next frame would go, over the length of the file.
fn fill_ratio(s: &Stats) -> f64 {
    (s.log_bytes_since_checkpoint + 1024) as f64 / s.log_bytes_on_disk as f64
}

/// Polls `db`'s stats until `done` says so, for up to 20 s (the applier runs every few ms).
fn wait_for(db: &IdemDb, done: impl Fn(&Stats) -> bool) -> bool {
    let until = Instant::now() + Duration::from_secs(20);
    while Instant::now() < until {
        if done(&db.stats()) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    false
}

/// Keys `k0` … `k{n-1}` answer as completed.
fn assert_completed(db: &IdemDb, n: usize) {
    for k in 0..n {
        assert_eq!(state(db, k), Some(RecordState::Completed), "k{k}");
    }
}

fn state(db: &IdemDb, i: usize) -> Option<RecordState> {
    match db
        .reserve(&scope(), &Key::new(format!("k{i}")), b"p", LEASE)
        .unwrap()
    {
        ReserveOutcome::Completed(_) => Some(RecordState::Completed),
        ReserveOutcome::Acquired(_) => None,
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn the_applier_grows_the_log_ahead_and_no_batch_waits_for_it() {
    let backend = FaultBackend::new();
    let db = open(&backend);
    assert_eq!(db.stats().log_bytes_on_disk, STEP);
    let mut i = 0;
    // Three doublings, each once the frames pass three quarters of the log: the test holds
    // its writes at 85% until the applier grew the file and a checkpoint recorded it.
    while db.stats().log_bytes_on_disk < STEP << 3 {
        lifecycle(&db, i);
        i += 1;
        if fill_ratio(&db.stats()) >= 0.85 {
            assert!(
                wait_for(&db, |s| fill_ratio(s) < 0.5),
                "the log was not grown ahead: {:?}",
                db.stats()
            );
        }
    }
    // The third fill's checkpoint may still be running.
    assert!(wait_for(&db, |s| s.checkpoints >= 3), "{:?}", db.stats());
    let s = db.stats();
    // Every checkpoint was taken on its own (timed): none was a batch's, which a frame that
    // did not fit would have taken.
    assert_eq!(s.checkpoints, s.checkpoint_latency_us.count, "{s:?}");
    let disk = power_loss_now(&backend, db);
    let db = open(&disk);
    assert_completed(&db, i);
}

#[test]
fn a_crash_after_the_log_grew_ahead_but_before_a_commit_recorded_it_loses_nothing() {
    let backend = FaultBackend::new();
    let db = open(&backend);
    let mut i = 0;
    while fill_ratio(&db.stats()) < 0.6 {
        lifecycle(&db, i);
        i += 1;
    }
    // The checkpoint that would record the grown length fails: the database file's syncs fail
    // from now on (the batches sync only the log).
    backend.inject(Fault::FileSync {
        log: false,
        after: 0,
    });
    // The fill and the failing checkpoint may come while these run: a refused lifecycle
    // ends them, and the keys before it are the acknowledged ones.
    while fill_ratio(&db.stats()) < 0.8 && try_lifecycle(&db, i) {
        i += 1;
    }
    assert!(
        wait_for(&db, |s| s.log_bytes_on_disk > STEP),
        "the log was not grown ahead: {:?}",
        db.stats()
    );
    // The failed checkpoint poisoned the writer; what it covered is in the log.
    let refused = (0..1000).any(|_| {
        std::thread::sleep(Duration::from_millis(5));
        db.reserve(&scope(), &Key::new("after"), b"p", LEASE)
            .is_err()
    });
    assert!(refused, "the failed checkpoint did not poison the writer");
    let disk = power_loss_now(&backend, db);
    let log_len = disk.log().durable_image().len() as u64;
    assert!(log_len > STEP, "{log_len}");
    let db = open(&disk);
    assert_eq!(db.stats().log_bytes_on_disk, log_len);
    assert_completed(&db, i);
}

#[test]
fn a_fill_ahead_on_a_full_disk_poisons_nothing_and_a_batch_grows_the_log_itself() {
    let backend = FaultBackend::new();
    let db = open(&backend);
    // Writes within the log's length (the frames) succeed; the fill past it fails.
    backend.inject(Fault::Full { log: true });
    let mut i = 0;
    while fill_ratio(&db.stats()) < 0.8 {
        lifecycle(&db, i);
        i += 1;
    }
    let until = Instant::now() + Duration::from_secs(20);
    while backend.full_refusals() == 0 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(backend.full_refusals() > 0, "no fill was tried");
    // One try: a full disk is not written to again on every pass.
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(backend.full_refusals(), 1);
    assert_eq!(db.stats().log_bytes_on_disk, STEP);
    backend.clear_faults();
    // Not poisoned; the batch whose frame does not fit grows the log and takes the durable
    // commit itself, which records the new length: the power goes right after it.
    let checkpoints = db.stats().checkpoints;
    while db.stats().checkpoints == checkpoints {
        lifecycle(&db, i);
        i += 1;
    }
    let s = db.stats();
    assert!(s.log_bytes_on_disk > STEP, "{s:?}");
    assert!(s.checkpoints > s.checkpoint_latency_us.count, "{s:?}");
    let disk = power_loss_now(&backend, db);
    let db = open(&disk);
    assert_completed(&db, i);
}
