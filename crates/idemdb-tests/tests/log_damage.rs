//! What opening does with a damaged, foreign or orphaned write-ahead log (docs/design.md §5.6),
//! through the fault-injecting backend: a torn last frame is dropped (its callers were never
//! answered), damage to a frame that was once durable is refused, zeroed frames are refused
//! once a frame was synced where the zeros are (and undetectable before: tokens still start
//! above all issued), and a log that is not this database's, or has lost its database file,
//! is refused without being touched. tests/log_loss.rs has every row through a killed process.

mod common;

use std::time::Duration;

use common::{LEASE, T0, acquired, power_loss_now};
use idemdb::{Error, IdemDb, Key, LogProblem, ManualClock, RecordState, ReserveOutcome, Scope};
use idemdb_testkit::{FaultBackend, SECTOR};

fn scope() -> Scope {
    Scope::new("pay", "u1")
}

/// A database that takes no checkpoint while the test runs: every acknowledged outcome after
/// the open lives in the log alone until close.
fn open_unchecked(disk: &FaultBackend) -> Result<IdemDb, Error> {
    IdemDb::builder()
        .clock(ManualClock::new(T0))
        .checkpoint_interval(Duration::from_secs(3600))
        .checkpoint_bytes(1 << 30)
        .open_with_backend(disk.clone(), disk.log())
}

struct Logged {
    /// Both files just before the last frame was appended.
    before: FaultBackend,
    /// Both files just after (the last frame durable).
    after: FaultBackend,
    /// The highest token the run was given.
    max_token: u64,
}

/// Three keys completed (six frames), then `k3` reserved and completed with a response
/// large enough that its last frame spans several sectors.
fn logged_run() -> Logged {
    let backend = FaultBackend::new();
    let db = open_unchecked(&backend).unwrap();
    for i in 0..4 {
        let r = acquired(
            db.reserve(&scope(), &Key::new(format!("k{i}")), b"p", LEASE)
                .unwrap(),
        );
        if i < 3 {
            db.complete(&r, format!("done {i}").into_bytes()).unwrap();
        } else {
            let before = backend.durable_disk();
            db.complete(&r, vec![b'x'; 3000]).unwrap();
            return Logged {
                before,
                after: power_loss_now(&backend, db),
                max_token: r.token().get(),
            };
        }
    }
    unreachable!()
}

/// A token issued by `db` now is above `max`: no token is issued twice, whatever was lost.
fn assert_tokens_above(db: &IdemDb, max: u64) {
    let r = acquired(
        db.reserve(&scope(), &Key::new("token-probe"), b"p", LEASE)
            .unwrap(),
    );
    assert!(r.token().get() > max, "token {} after {max}", r.token());
}

fn refused(result: Result<IdemDb, Error>) -> LogProblem {
    match result {
        Err(Error::LogRefused { log: None, problem }) => problem,
        Err(e) => panic!("expected LogRefused, got {e}"),
        Ok(_) => panic!("expected LogRefused, the open succeeded"),
    }
}

/// The byte range in which two images differ, widened to whole sectors.
fn changed_sectors(a: &[u8], b: &[u8]) -> std::ops::Range<usize> {
    let first = (0..a.len().max(b.len()))
        .find(|&i| a.get(i) != b.get(i))
        .unwrap();
    let last = (0..a.len().max(b.len()))
        .rev()
        .find(|&i| a.get(i) != b.get(i))
        .unwrap();
    first / SECTOR * SECTOR..(last / SECTOR + 1) * SECTOR
}

/// Checkpoints by size only, every 64 KiB of frames, on a manual clock.
fn small_checkpoints() -> idemdb::Builder {
    IdemDb::builder()
        .clock(ManualClock::new(T0))
        .checkpoint_interval(Duration::from_secs(3600))
        .checkpoint_bytes(64 << 10)
}

fn state(db: &IdemDb, key: &str) -> Option<RecordState> {
    db.get(&scope(), &Key::new(key)).unwrap().map(|r| r.state)
}

/// The first three keys are completed, whatever happened to the last frame.
fn assert_first_three_completed(db: &IdemDb) {
    for i in 0..3 {
        assert_eq!(
            db.reserve(&scope(), &Key::new(format!("k{i}")), b"p", LEASE)
                .unwrap(),
            ReserveOutcome::Completed(format!("done {i}").into_bytes())
        );
    }
}

#[test]
fn acknowledged_outcomes_that_live_only_in_the_log_are_replayed_at_open() {
    let run = logged_run();
    let db = open_unchecked(&run.after).unwrap();
    assert_eq!(db.stats().replayed_frames, 8);
    assert_first_three_completed(&db);
    assert_eq!(
        db.reserve(&scope(), &Key::new("k3"), b"p", LEASE).unwrap(),
        ReserveOutcome::Completed(vec![b'x'; 3000])
    );
    // Replayed and checkpointed at open: a second crash replays nothing.
    let disk = power_loss_now(&run.after, db);
    let db = open_unchecked(&disk).unwrap();
    assert_eq!(db.stats().replayed_frames, 0);
    assert_eq!(state(&db, "k3"), Some(RecordState::Completed));
}

#[test]
fn a_frame_torn_at_every_sector_boundary_is_dropped_and_the_frames_before_it_replay() {
    let run = logged_run();
    let old = run.before.log().durable_image();
    let new = run.after.log().durable_image();
    let frame = changed_sectors(&old, &new);
    let sectors = frame.len() / SECTOR;
    assert!(sectors >= 6, "the last frame spans {sectors} sectors");
    // Every prefix of the frame's sectors reached the disk, and every single sector alone.
    let mut patterns: Vec<Vec<bool>> = (0..sectors)
        .map(|n| (0..sectors).map(|s| s < n).collect())
        .collect();
    patterns.extend((0..sectors).map(|only| (0..sectors).map(|s| s == only).collect()));
    patterns.extend((0..sectors).map(|lost| (0..sectors).map(|s| s != lost).collect()));
    for kept in patterns {
        let mut log = old.clone();
        for (s, keep) in kept.iter().enumerate() {
            if *keep {
                let at = frame.start + s * SECTOR;
                log[at..at + SECTOR].copy_from_slice(&new[at..at + SECTOR]);
            }
        }
        let disk = FaultBackend::from_images(run.after.durable_image(), log);
        let db = open_unchecked(&disk).unwrap_or_else(|e| panic!("{kept:?}: {e}"));
        assert_eq!(db.stats().replayed_frames, 7, "{kept:?}");
        assert_first_three_completed(&db);
        // The torn completion was never acknowledged: k3 is still reserved.
        assert_eq!(state(&db, "k3"), Some(RecordState::InProgress), "{kept:?}");
    }
}

#[test]
fn a_flipped_bit_in_the_last_frame_is_a_torn_tail_and_in_an_earlier_one_is_corruption() {
    let run = logged_run();
    let old = run.before.log().durable_image();
    let new = run.after.log().durable_image();
    let last = changed_sectors(&old, &new);

    // Undetectable: a damaged last frame looks like a torn one. Its outcome (k3's
    // completion) is lost, but no token is issued twice.
    let mut log = new.clone();
    log[last.start + 100] ^= 0x10;
    let disk = FaultBackend::from_images(run.after.durable_image(), log);
    let db = open_unchecked(&disk).unwrap();
    assert_eq!(db.stats().replayed_frames, 7);
    assert_eq!(state(&db, "k3"), Some(RecordState::InProgress));
    assert_tokens_above(&db, run.max_token);
    drop(db);

    // The first frame (k0's reservation) starts after the header and the cycle sector.
    let mut log = new.clone();
    log[2 * SECTOR + 40] ^= 0x01;
    let disk = FaultBackend::from_images(run.after.durable_image(), log.clone());
    assert!(matches!(
        refused(open_unchecked(&disk)),
        LogProblem::FrameDamaged {
            offset: 1024,
            intact: 2,
            ..
        }
    ));
    // Refused without touching the log.
    assert!(disk.log().live_image() == log, "the log was changed");
}

/// Undetectable: the frames of the current cycle zeroed, the header and the cycle sector kept,
/// look like a cycle whose first append was torn. What the frames held is lost; tokens still
/// start above every token issued.
#[test]
fn zeroed_frames_of_the_cycle_replay_nothing_and_tokens_stay_above() {
    let run = logged_run();
    let mut log = run.after.log().durable_image();
    log[2 * SECTOR..].fill(0);
    let disk = FaultBackend::from_images(run.after.durable_image(), log);
    let db = open_unchecked(&disk).unwrap();
    assert_eq!(db.stats().replayed_frames, 0);
    assert_eq!(state(&db, "k0"), None);
    assert_tokens_above(&db, run.max_token);
    let r = acquired(db.reserve(&scope(), &Key::new("new"), b"p", LEASE).unwrap());
    db.complete(&r, b"ok".to_vec()).unwrap();
    // The log works again, crash and all: the probe's, new's reservation and completion.
    let disk = power_loss_now(&disk, db);
    let db = open_unchecked(&disk).unwrap();
    assert_eq!(db.stats().replayed_frames, 3);
    assert_eq!(state(&db, "new"), Some(RecordState::Completed));
}

/// Zeros in the cycle sector (synced when the log was created) prove the log was erased; a
/// zeroed header is damage.
#[test]
fn a_zeroed_cycle_sector_or_header_is_refused() {
    let run = logged_run();
    // Reopened: the 8 frames replay, the checkpoint moves to 8; then one more frame.
    let db = open_unchecked(&run.after).unwrap();
    let r = acquired(db.reserve(&scope(), &Key::new("k4"), b"p", LEASE).unwrap());
    db.complete(&r, b"ok".to_vec()).unwrap();
    let disk = power_loss_now(&run.after, db);
    let mut log = disk.log().durable_image();
    log[SECTOR..].fill(0);
    let zeroed = FaultBackend::from_images(disk.durable_image(), log.clone());
    assert!(matches!(
        refused(open_unchecked(&zeroed)),
        LogProblem::Erased { checkpoint: 8 }
    ));
    log[..SECTOR].fill(0);
    let zeroed = FaultBackend::from_images(disk.durable_image(), log);
    assert_eq!(refused(open_unchecked(&zeroed)), LogProblem::HeaderDamaged);
    // The log as it was: everything is there.
    let db = open_unchecked(&disk).unwrap();
    assert_eq!(state(&db, "k4"), Some(RecordState::Completed));
    assert_first_three_completed(&db);
}

#[test]
fn a_log_of_another_database_is_refused_and_left_alone() {
    let run = logged_run();
    let other = FaultBackend::new();
    drop(open_unchecked(&other).unwrap());
    let foreign_log = run.after.log().durable_image();
    let disk = FaultBackend::from_images(other.durable_image(), foreign_log.clone());
    let problem = refused(open_unchecked(&disk));
    assert!(matches!(problem, LogProblem::Foreign { .. }), "{problem}");
    assert!(
        problem.to_string().contains("another database"),
        "{problem}"
    );
    assert!(
        disk.log().live_image() == foreign_log,
        "the log was changed"
    );
}

#[test]
fn a_log_whose_database_file_is_missing_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("orders.idemdb");
    let log_path = dir.path().join("orders.idemdb-wal");
    {
        let db = IdemDb::open(&path).unwrap();
        let r = acquired(db.reserve(&scope(), &Key::new("k"), b"p", LEASE).unwrap());
        db.complete(&r, b"ok".to_vec()).unwrap();
    }
    let log = std::fs::read(&log_path).unwrap();
    std::fs::remove_file(&path).unwrap();
    match IdemDb::open(&path) {
        Err(Error::LogRefused {
            log: Some(log),
            problem: LogProblem::DatabaseMissing { .. },
        }) => assert_eq!(log, log_path.canonicalize().unwrap()),
        other => panic!("expected LogRefused, got {other:?}"),
    }
    assert!(!path.exists(), "no empty database was created");
    assert!(
        std::fs::read(&log_path).unwrap() == log,
        "the log was changed"
    );
    // The same over backends: an empty database storage beside a log.
    let disk = FaultBackend::from_images(Vec::new(), log);
    assert!(matches!(
        refused(open_unchecked(&disk)),
        LogProblem::DatabaseMissing { .. }
    ));
    // Deleting the log is the documented way to start afresh.
    std::fs::remove_file(&log_path).unwrap();
    let db = IdemDb::open(&path).unwrap();
    assert_eq!(db.get(&scope(), &Key::new("k")).unwrap(), None);
}

#[test]
fn the_log_is_reused_from_its_start_after_each_checkpoint() {
    let backend = FaultBackend::new();
    let db = small_checkpoints()
        .open_with_backend(backend.clone(), backend.log())
        .unwrap();
    let initial = db.stats().log_bytes_on_disk;
    // 2,000 frames of a sector each: 1 MiB of frames, 16 times the threshold.
    for i in 0..1000 {
        let r = acquired(
            db.reserve(&scope(), &Key::new(format!("k{i}")), b"p", LEASE)
                .unwrap(),
        );
        db.complete(&r, vec![1; 100]).unwrap();
    }
    let stats = db.stats();
    // By size: the applier thread takes them past 64 KiB, and a leader that finds 128 KiB
    // of frames (the thread starved of CPU) takes one itself, so at least 7 over 1 MiB.
    assert!(stats.checkpoints >= 7, "{} checkpoints", stats.checkpoints);
    assert_eq!(stats.log_bytes_on_disk, initial, "the log grew");
    assert_eq!(backend.log().live_image().len() as u64, initial);
    let disk = power_loss_now(&backend, db);
    let db = open_unchecked(&disk).unwrap();
    // Only what followed the last checkpoint is replayed, and every key is there: at most the
    // 128 KiB (256 frames of a sector) at which a leader takes a checkpoint itself.
    let replayed = db.stats().replayed_frames;
    assert!(replayed <= 256, "{replayed} frames replayed");
    for i in 0..1000 {
        assert_eq!(
            state(&db, &format!("k{i}")),
            Some(RecordState::Completed),
            "k{i}"
        );
    }
}

/// I21: a batch whose frame brings the log to twice `checkpoint_bytes` takes a checkpoint
/// itself (no applier thread here to take one sooner), and that checkpoint records the batch's
/// frame as covered: so it must hold the batch's records too, which were only in memory. A
/// power loss right after it loses nothing.
#[test]
fn a_batch_that_takes_a_checkpoint_itself_is_in_that_checkpoint() {
    let backend = FaultBackend::new();
    let db = small_checkpoints()
        .without_applier()
        .open_with_backend(backend.clone(), backend.log())
        .unwrap();
    let checkpoints = |db: &IdemDb| db.stats().checkpoints;
    let mut last = None;
    for i in 0..2_000 {
        let before = checkpoints(&db);
        let r = acquired(
            db.reserve(&scope(), &Key::new(format!("k{i}")), b"p", LEASE)
                .unwrap(),
        );
        if checkpoints(&db) > before {
            last = Some((i, RecordState::InProgress));
            break;
        }
        db.complete(&r, vec![1; 100]).unwrap();
        if checkpoints(&db) > before {
            last = Some((i, RecordState::Completed));
            break;
        }
    }
    let (last, last_state) = last.expect("no batch took a checkpoint");
    let disk = power_loss_now(&backend, db);
    let db = open_unchecked(&disk).unwrap();
    for i in 0..last {
        assert_eq!(
            state(&db, &format!("k{i}")),
            Some(RecordState::Completed),
            "k{i}"
        );
    }
    assert_eq!(state(&db, &format!("k{last}")), Some(last_state), "k{last}");
}

#[test]
fn a_frame_larger_than_the_log_grows_it_and_survives_a_crash() {
    let backend = FaultBackend::new();
    let mut limits = idemdb::Limits::default();
    limits.max_response_len = 3 << 20;
    let db = IdemDb::builder()
        .clock(ManualClock::new(T0))
        .limits(limits)
        .checkpoint_interval(Duration::from_secs(3600))
        .open_with_backend(backend.clone(), backend.log())
        .unwrap();
    let initial = db.stats().log_bytes_on_disk;
    let r = acquired(db.reserve(&scope(), &Key::new("big"), b"p", LEASE).unwrap());
    let body: Vec<u8> = (0..(2 << 20)).map(|i| (i % 251) as u8).collect();
    db.complete(&r, body.clone()).unwrap();
    assert!(db.stats().log_bytes_on_disk > initial);
    let disk = power_loss_now(&backend, db);
    let db = IdemDb::builder()
        .clock(ManualClock::new(T0))
        .limits({
            let mut l = idemdb::Limits::default();
            l.max_response_len = 3 << 20;
            l
        })
        .open_with_backend(disk.clone(), disk.log())
        .unwrap();
    assert_eq!(
        db.reserve(&scope(), &Key::new("big"), b"p", LEASE).unwrap(),
        ReserveOutcome::Completed(body)
    );
}

/// A log that grew for a large frame: the growth is durable and recorded (the batch took a
/// durable commit), so cutting the log back to its old length is refused, not a silent loss of
/// what followed.
#[test]
fn a_grown_log_cut_back_to_its_old_length_is_refused() {
    let backend = FaultBackend::new();
    let mut limits = idemdb::Limits::default();
    limits.max_response_len = 3 << 20;
    let open = |disk: &FaultBackend| {
        IdemDb::builder()
            .clock(ManualClock::new(T0))
            .limits(limits.clone())
            .checkpoint_interval(Duration::from_secs(3600))
            .open_with_backend(disk.clone(), disk.log())
    };
    let db = open(&backend).unwrap();
    let initial = db.stats().log_bytes_on_disk as usize;
    let r = acquired(db.reserve(&scope(), &Key::new("big"), b"p", LEASE).unwrap());
    db.complete(&r, vec![7; 2 << 20]).unwrap();
    // Frames written into the grown part after it.
    for i in 0..3 {
        let r = acquired(
            db.reserve(&scope(), &Key::new(format!("k{i}")), b"p", LEASE)
                .unwrap(),
        );
        db.complete(&r, vec![b'x'; 2 << 20]).unwrap();
    }
    let disk = power_loss_now(&backend, db);
    let mut log = disk.log().durable_image();
    assert!(log.len() > initial);
    log.truncate(initial);
    let cut = FaultBackend::from_images(disk.durable_image(), log);
    assert!(matches!(
        refused(open(&cut)),
        LogProblem::Cut { len, .. } if len as usize == initial
    ));
    let db = open(&disk).unwrap();
    assert_eq!(state(&db, "k2"), Some(RecordState::Completed));
}
