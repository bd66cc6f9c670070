//! What opening does with a damaged, foreign or orphaned write-ahead log (docs/design.md §5.6),
//! through the fault-injecting backend: a torn last frame is dropped (its callers were never
//! answered), damage to a frame that was once durable is refused, zeroed frames are refused
//! once a frame was synced where the zeros are (and undetectable before: tokens still start
//! above all issued), and a log that is not this database's, or has lost its database file,
//! is refused without being touched. tests/log_loss.rs has every row through a killed process.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{LEASE, T0, acquired, power_loss_now};
use idemdb::testing::{LogLayout, recorded_log};
use idemdb::{Error, IdemDb, Key, LogProblem, ManualClock, RecordState, ReserveOutcome, Scope};
use idemdb_testkit::{Fate, Fault, FaultBackend, SECTOR};

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

/// As [`refused`], for the state `what`; an open that succeeds fails with `what` and what
/// `shows` finds in the opened database (the loss the open let through).
fn refused_in(
    what: &str,
    result: Result<IdemDb, Error>,
    shows: impl FnOnce(&IdemDb) -> String,
) -> LogProblem {
    match result {
        Err(Error::LogRefused { problem, .. }) => problem,
        Err(e) => panic!("{what}: expected LogRefused, got {e}"),
        Ok(db) => panic!("{what}: the open was not refused; {}", shows(&db)),
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

/// No checkpoint by age or size and no applier thread: the only checkpoints are the ones each
/// open takes, and the database file has no writes of its own between them.
fn open_quiet(disk: &FaultBackend) -> Result<IdemDb, Error> {
    IdemDb::builder()
        .clock(ManualClock::new(T0))
        .checkpoint_interval(Duration::from_secs(3600))
        .checkpoint_bytes(1 << 30)
        .without_applier()
        .open_with_backend(disk.clone(), disk.log())
}

/// The database file restored from a copy taken one checkpoint before its log's cycle, the
/// checkpoint after the copy having covered exactly one frame: the cycle sector says
/// checkpoint + 1, the one evidence that the file is older than its log. Refused
/// (`FramesMissing`) with the log's frames there, and when a crash tore the first frame of
/// the new cycle over them, which leaves no frame to show the gap: then an acknowledged
/// completion lives in no file the open would read. Catches the mutant that lets a cycle
/// sector one ahead of the checkpoint through (wal/scan.rs, `examine_in_use`:
/// `Some(Cycle::After(h)) if h > c` → `h > c + 1`), which opens both with the copy's state.
#[test]
fn a_database_file_restored_one_checkpoint_behind_its_log_is_refused() {
    let backend = FaultBackend::new();
    let db = open_quiet(&backend).unwrap();
    let k1 = acquired(db.reserve(&scope(), &Key::new("k1"), b"p", LEASE).unwrap());
    let k2 = acquired(db.reserve(&scope(), &Key::new("k2"), b"p", LEASE).unwrap());
    assert_eq!(LogLayout::read(&backend.log().live_image()).last(), Some(2));
    // Reopened: frames 1 and 2 replayed, the checkpoint 2. The copy is taken here.
    let disk = power_loss_now(&backend, db);
    let db = open_quiet(&disk).unwrap();
    let copy = disk.durable_image();
    // Exactly one frame (3, k1's completion over seven sectors), then the next checkpoint.
    db.complete(&k1, vec![b'x'; 3000]).unwrap();
    let disk = power_loss_now(&disk, db);
    let db = open_quiet(&disk).unwrap();
    let at_checkpoint_3 = disk.durable_disk();
    assert_eq!(recorded_log(&copy).unwrap(), (2, true), "the copy, in use");
    assert_eq!(
        recorded_log(&at_checkpoint_3.durable_image()).unwrap(),
        (3, true)
    );
    let log = at_checkpoint_3.log().durable_image();
    assert_eq!(LogLayout::read(&log).cycle, Some(3));
    assert_eq!(
        LogLayout::read(&log).last(),
        Some(3),
        "frame 3 is still there"
    );

    // Frame 4 (k2's completion, as long) written over frame 3 and torn by a power loss inside
    // its sync: its first sector lost, the others kept. Never acknowledged; frame 3 no longer
    // reads.
    disk.hold_syncs(true);
    let db = Arc::new(db);
    let completing = {
        let db = Arc::clone(&db);
        std::thread::spawn(move || db.complete(&k2, vec![b'y'; 3000]))
    };
    assert!(disk.wait_for_held(1, Duration::from_secs(10)));
    assert_eq!(disk.log().pending(), 1, "one write pending: frame 4");
    // The database file's pending writes, if any, are lost (they come first).
    let in_database = disk.pending();
    let torn = disk.crash_disk(|i| {
        if i < in_database {
            Fate::Drop
        } else {
            Fate::Tear(!1)
        }
    });
    disk.kill();
    assert!(
        completing.join().unwrap().is_err(),
        "the torn completion was acknowledged"
    );
    drop(db);
    let torn_log = torn.log().durable_image();
    assert_eq!(LogLayout::read(&torn_log).last(), None, "no frame reads");

    for (what, log) in [
        ("frame 4 torn over frame 3", torn_log),
        ("frame 3 there", log),
    ] {
        let restored = FaultBackend::from_images(copy.clone(), log.clone());
        let problem = refused_in(what, open_quiet(&restored), |db| {
            format!("k1 {:?}, its completion acknowledged", state(db, "k1"))
        });
        assert_eq!(
            problem,
            LogProblem::FramesMissing {
                checkpoint: 2,
                resumes_at: 4
            },
            "{what}"
        );
        assert!(restored.log().live_image() == log, "the log was changed");
        // The database file as it was: everything acknowledged is there.
        let current = FaultBackend::from_images(at_checkpoint_3.durable_image(), log);
        let db = open_quiet(&current).unwrap();
        assert_eq!(
            db.reserve(&scope(), &Key::new("k1"), b"p", LEASE).unwrap(),
            ReserveOutcome::Completed(vec![b'x'; 3000]),
            "{what}"
        );
        assert_eq!(state(&db, "k2"), Some(RecordState::InProgress), "{what}");
    }
}

/// Where the header and payload of the frame at `at` end (its payload length is bytes 4..8
/// of its header, docs/design.md §5.6); past it, the zeros padding it to a sector.
fn frame_data_end(log: &[u8], at: u64) -> u64 {
    let at = at as usize;
    let payload = u32::from_le_bytes(log[at + 4..at + 8].try_into().unwrap());
    (at + 32) as u64 + u64::from(payload)
}

/// A log is never shorter than the length the database file recorded for it (it grows only
/// by a durable zero-fill and a durable commit recording the new length), so a log cut by
/// even one byte was cut, and the cut may have taken the end of an acknowledged frame: here
/// a completion's frame ends at the log's last byte, and a cut of 1, 100 or 511 bytes makes
/// it read as a torn frame. Refused (`Cut`). Catches the mutant that sees only cuts of a
/// sector or more (wal/scan.rs, `examine_in_use`: `seen.len < state.len` →
/// `seen.len + 512 <= state.len`), which opens without the acknowledged completion.
#[test]
fn a_log_cut_by_less_than_a_sector_is_refused() {
    // A log of 4 KiB: its header, its cycle sector and six sectors of frames.
    let open = |disk: &FaultBackend| {
        IdemDb::builder()
            .clock(ManualClock::new(T0))
            .checkpoint_interval(Duration::from_secs(3600))
            .checkpoint_bytes(1 << 30)
            .log_step(4096)
            .open_with_backend(disk.clone(), disk.log())
    };
    let len = 4096;
    // `k` reserved, then completed with `response_len` bytes: the completion's frame (its size
    // grows with the response byte for byte) measured on a probe, then sized to end at the
    // log's last byte.
    let run = |response_len: usize| {
        let backend = FaultBackend::new();
        let db = open(&backend).unwrap();
        let r = acquired(db.reserve(&scope(), &Key::new("k"), b"p", LEASE).unwrap());
        db.complete(&r, vec![b'x'; response_len]).unwrap();
        let log = backend.log().live_image();
        assert_eq!(log.len(), len, "the log grew");
        let (at, _, seq) = *LogLayout::read(&log).run.last().unwrap();
        assert_eq!(seq, 2);
        (backend, db, frame_data_end(&log, at))
    };
    let (_, _, probe_end) = run(1000);
    let response_len = 1000 + len - probe_end as usize;
    let (backend, db, end) = run(response_len);
    assert_eq!(
        end, len as u64,
        "the completion's frame ends before the log's end"
    );
    let disk = power_loss_now(&backend, db);
    let log = disk.log().durable_image();
    for cut in [1, 100, 511] {
        let short = log[..len - cut].to_vec();
        let cut_disk = FaultBackend::from_images(disk.durable_image(), short.clone());
        let what = format!("cut by {cut} bytes");
        let problem = refused_in(&what, open(&cut_disk), |db| {
            format!("k {:?}, its completion acknowledged", state(db, "k"))
        });
        assert_eq!(
            problem,
            LogProblem::Cut {
                len: (len - cut) as u64,
                expected: len as u64
            },
            "{what}"
        );
        assert!(cut_disk.log().live_image() == short, "the log was changed");
    }
    // Whole, it holds the completion.
    let db = open(&disk).unwrap();
    assert_eq!(
        db.reserve(&scope(), &Key::new("k"), b"p", LEASE).unwrap(),
        ReserveOutcome::Completed(vec![b'x'; response_len])
    );
}

/// A damaged cycle sector is accepted only in the state a crash leaves between a checkpoint's
/// commit and the sector's rewrite, where the run at the log's start passes through the
/// checkpoint (its old cycle is whole up to it). Refused (`HeaderDamaged`) when the run's
/// frames all follow the checkpoint, none equal to it: a sector damaged after the cycle
/// began, or one older than the frames behind it (a cycle it never announced). Catches the
/// mutant that takes any frame at or above the checkpoint as reaching it (wal/scan.rs,
/// `examine_in_use`: `f.seq == c` → `f.seq >= c`), which opens both refused states.
#[test]
fn a_damaged_or_older_cycle_sector_is_refused_unless_the_run_passes_through_the_checkpoint() {
    // The file's checkpoint 0, the cycle sector 0, frames 1 to 8.
    let run = logged_run();
    let (first, log) = (run.after.durable_image(), run.after.log().durable_image());
    assert_eq!(LogLayout::read(&log).cycle, Some(0));
    let mut damaged = log.clone();
    damaged[SECTOR + 9] ^= 0x01;
    assert_eq!(LogLayout::read(&damaged).cycle, None);
    assert_eq!(LogLayout::read(&damaged).last(), Some(8));

    // Reopened (checkpoint 8, the cycle sector says so), then frames 9 and 10 from the log's
    // start; the cycle sector put back as it was before (0), or damaged.
    let db = open_unchecked(&run.after).unwrap();
    let r = acquired(db.reserve(&scope(), &Key::new("k4"), b"p", LEASE).unwrap());
    db.complete(&r, b"ok".to_vec()).unwrap();
    let next = power_loss_now(&run.after, db);
    let next_log = next.log().durable_image();
    assert_eq!(LogLayout::read(&next_log).cycle, Some(8));
    let mut older = next_log.clone();
    older[SECTOR..2 * SECTOR].copy_from_slice(&log[SECTOR..2 * SECTOR]);
    let mut next_damaged = next_log.clone();
    next_damaged[SECTOR + 9] ^= 0x01;
    for layout in [LogLayout::read(&older), LogLayout::read(&next_damaged)] {
        let seqs: Vec<u64> = layout.run.iter().map(|(_, _, s)| *s).collect();
        assert_eq!(seqs, [9, 10]);
    }
    for (what, db_image, log) in [
        (
            "damaged, frames 1.. after checkpoint 0",
            first.clone(),
            damaged,
        ),
        (
            "older (0), frames 9.. after checkpoint 8",
            next.durable_image(),
            older,
        ),
        (
            "damaged, frames 9.. after checkpoint 8",
            next.durable_image(),
            next_damaged,
        ),
    ] {
        let disk = FaultBackend::from_images(db_image, log.clone());
        let problem = refused_in(what, open_unchecked(&disk), |db| {
            format!("{} frames replayed", db.stats().replayed_frames)
        });
        assert_eq!(problem, LogProblem::HeaderDamaged, "{what}");
        assert!(
            disk.log().live_image() == log,
            "{what}: the log was changed"
        );
    }

    // A crash between the checkpoint of an open (8) and the cycle sector's rewrite: the log's
    // sync fails, so the rewrite never reaches the disk. The run passes through 8: it opens,
    // the rewrite damaged or not, with everything.
    let crashing = FaultBackend::from_images(first, log);
    crashing.inject(Fault::FileSync {
        log: true,
        after: 0,
    });
    assert!(open_unchecked(&crashing).is_err());
    let crashed = crashing.durable_disk();
    let mut log = crashed.log().durable_image();
    assert_eq!(
        LogLayout::read(&log).cycle,
        Some(0),
        "the rewrite reached the disk"
    );
    assert_eq!(recorded_log(&crashed.durable_image()).unwrap(), (8, true));
    for damage in [false, true] {
        if damage {
            log[SECTOR + 9] ^= 0x01;
        }
        let disk = FaultBackend::from_images(crashed.durable_image(), log.clone());
        let db = open_unchecked(&disk).unwrap_or_else(|e| panic!("damaged {damage}: {e}"));
        assert_eq!(db.stats().replayed_frames, 0);
        assert_first_three_completed(&db);
        assert_eq!(
            db.reserve(&scope(), &Key::new("k3"), b"p", LEASE).unwrap(),
            ReserveOutcome::Completed(vec![b'x'; 3000])
        );
    }
}
