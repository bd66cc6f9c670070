//! Every state the two files can be in after a real process was SIGKILLed (or closed
//! cleanly), each row of docs/design.md §5.6's table: the database file in use (killed),
//! closed cleanly, rolled back, or missing, against the log intact, missing, emptied, cut,
//! rolled back, replaced, foreign or damaged. An open either refuses, naming the log and what
//! is missing and changing nothing (put the log back and it opens with every acknowledged
//! outcome), or opens with every acknowledged outcome intact; where a loss cannot be told
//! from a crash (the rows marked undetectable), it opens without it, and tokens still start
//! above every token issued.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::worker::{Acks, Worker, open_worker_db};
use idemdb::{Error, IdemDb, LogProblem};
use tempfile::TempDir;

/// Where a log's frames start: after its header and its cycle sector (docs/design.md §5.6).
const FRAMES: usize = 1024;

/// One database file and its log, and what the killed workers on it were told.
struct Files {
    _dir: TempDir,
    path: PathBuf,
    log: PathBuf,
    acks: Acks,
    worker: Worker,
    runs: usize,
}

impl Files {
    fn new() -> Files {
        let dir = tempfile::tempdir().unwrap();
        // Errors name the log by the path it resolves to.
        let home = fs::canonicalize(dir.path()).unwrap();
        let path = home.join("shop.idemdb");
        let log = home.join("shop.idemdb-wal");
        let mut worker = Worker::new();
        // No checkpoint while a worker runs unless a test asks for them: rows that depend on
        // the checkpoint staying put hold however slowly the machine runs.
        worker.checkpoint_ms = Some(3_600_000);
        // Nor one for a log that fills up (the growth's durable commit is a checkpoint): at
        // most 4 × 40 operations, under a fifth of the log's first MiB, however fast the machine.
        worker.ops_per_thread = Some(40);
        Files {
            _dir: dir,
            path,
            log,
            acks: Acks::default(),
            worker,
            runs: 0,
        }
    }

    /// Runs the worker for `ms` and SIGKILLs it: the database is left in use.
    fn kill_after(&mut self, ms: u64) -> &mut Self {
        self.runs += 1;
        let run = format!("r{}", self.runs);
        self.worker
            .run_and_kill(&self.path, &run, ms, &mut self.acks);
        assert!(self.acks.lines > 0, "the worker acknowledged nothing");
        self
    }

    /// Opens and closes the database (replaying its log): closed cleanly.
    fn close_cleanly(&mut self) -> &mut Self {
        let db = open_worker_db(&self.path).unwrap();
        self.acks.check_outcomes(&db);
        drop(db);
        self
    }

    fn open(&self) -> Result<IdemDb, Error> {
        open_worker_db(&self.path)
    }

    /// The open succeeds with every acknowledged outcome, and tokens above all issued.
    fn opens_intact(&mut self) -> IdemDb {
        let db = self.open().unwrap_or_else(|e| panic!("open: {e}"));
        self.acks.check_outcomes(&db);
        self.runs += 1;
        self.acks.check_tokens(&db, &format!("probe-{}", self.runs));
        db
    }

    fn log_bytes(&self) -> Option<Vec<u8>> {
        fs::read(&self.log).ok()
    }

    /// The open is refused with `expected`, naming the log, and changes nothing: the log
    /// is as it was (or still missing).
    fn refused(&self, expected: impl Fn(&LogProblem) -> bool) -> LogProblem {
        let log_before = self.log_bytes();
        let problem = match self.open() {
            Err(e @ Error::LogRefused { .. }) => {
                let text = e.to_string();
                assert!(
                    text.contains(&self.log.display().to_string()),
                    "the error does not name the log: {text}"
                );
                let Error::LogRefused { log, problem } = e else {
                    unreachable!()
                };
                assert_eq!(log.as_deref(), Some(self.log.as_path()));
                problem
            }
            Err(e) => panic!("expected LogRefused, got {e}"),
            Ok(_) => panic!("the open was not refused"),
        };
        assert!(expected(&problem), "unexpected problem: {problem}");
        assert!(
            self.log_bytes() == log_before,
            "the refused open changed the log"
        );
        problem
    }
}

fn copy(from: &Path, to: &Path) {
    fs::copy(from, to).unwrap();
}

fn cut(path: &Path, len: u64) {
    fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(len)
        .unwrap();
}

fn patch(path: &Path, f: impl FnOnce(&mut Vec<u8>)) {
    let mut bytes = fs::read(path).unwrap();
    f(&mut bytes);
    fs::write(path, bytes).unwrap();
}

/// Where the log's frames end: past it, only zeros.
fn frames_end(log: &[u8]) -> usize {
    log.iter().rposition(|&b| b != 0).map_or(FRAMES, |i| i + 1)
}

/// Puts `saved` back as the log, then the open succeeds with everything acknowledged.
fn restore_and_open(files: &mut Files, saved: &[u8]) {
    fs::write(&files.log, saved).unwrap();
    drop(files.opens_intact());
}

// ---- The database file in use: the process was killed. -------------------------------------

#[test]
fn killed_then_log_intact_replays_every_acknowledged_outcome() {
    let mut files = Files::new();
    files.kill_after(150);
    let db = files.opens_intact();
    assert!(db.stats().replayed_frames > 0, "nothing was replayed");
}

#[test]
fn killed_then_log_deleted_is_refused() {
    let mut files = Files::new();
    files.kill_after(150);
    let saved = files.log_bytes().unwrap();
    fs::remove_file(&files.log).unwrap();
    files.refused(|p| matches!(p, LogProblem::Missing { .. }));
    assert!(!files.log.exists(), "the refused open created a log");
    restore_and_open(&mut files, &saved);
}

#[test]
fn killed_then_log_emptied_is_refused() {
    let mut files = Files::new();
    files.kill_after(150);
    let saved = files.log_bytes().unwrap();
    cut(&files.log, 0);
    files.refused(|p| matches!(p, LogProblem::Cut { len: 0, .. }));
    restore_and_open(&mut files, &saved);
}

#[test]
fn killed_then_log_cut_to_its_header_is_refused() {
    let mut files = Files::new();
    files.kill_after(150);
    let saved = files.log_bytes().unwrap();
    cut(&files.log, 512);
    files.refused(|p| matches!(p, LogProblem::Cut { len: 512, .. }));
    restore_and_open(&mut files, &saved);
}

#[test]
fn killed_then_log_cut_inside_its_frames_is_refused() {
    let mut files = Files::new();
    files.kill_after(150);
    let saved = files.log_bytes().unwrap();
    let end = frames_end(&saved) as u64;
    assert!(end > 4 * 512, "the run wrote few frames");
    // Inside the frames, at a sector boundary and between two, and past them in the zeros.
    for len in [1024, end / 2 / 512 * 512, end / 2 + 77, end - 1, end + 4096] {
        fs::write(&files.log, &saved).unwrap();
        cut(&files.log, len);
        files.refused(|p| matches!(p, LogProblem::Cut { len: l, .. } if *l == len));
    }
    restore_and_open(&mut files, &saved);
}

/// Cut by less than a sector (1, 100 or 511 bytes off its end, in the zeros past its
/// frames): still shorter than the length the database recorded, which no crash makes it.
/// Catches the mutant that sees only cuts of a sector or more (wal/scan.rs,
/// `examine_in_use`: `seen.len < state.len` → `seen.len + 512 <= state.len`).
#[test]
fn killed_then_log_cut_by_less_than_a_sector_is_refused() {
    let mut files = Files::new();
    files.kill_after(150);
    let saved = files.log_bytes().unwrap();
    let len = saved.len() as u64;
    for cut_by in [1, 100, 511] {
        fs::write(&files.log, &saved).unwrap();
        cut(&files.log, len - cut_by);
        let problem = files.refused(|p| matches!(p, LogProblem::Cut { .. }));
        assert_eq!(
            problem,
            LogProblem::Cut {
                len: len - cut_by,
                expected: len
            }
        );
    }
    restore_and_open(&mut files, &saved);
}

#[test]
fn killed_then_log_rolled_back_past_a_checkpoint_is_refused() {
    let mut files = Files::new();
    files.kill_after(150);
    let older = files.log_bytes().unwrap();
    // The next run replays it and takes checkpoints (every 20 ms) while it works.
    files.worker.checkpoint_ms = Some(20);
    files.worker.ops_per_thread = None;
    files.kill_after(300);
    let saved = files.log_bytes().unwrap();
    fs::write(&files.log, &older).unwrap();
    files.refused(|p| matches!(p, LogProblem::Older { .. }));
    restore_and_open(&mut files, &saved);
}

#[test]
fn killed_then_log_of_an_earlier_open_put_back_is_refused() {
    let mut files = Files::new();
    files.kill_after(150);
    let earlier = files.log_bytes().unwrap();
    // A clean close, the log removed: the next open starts a new log.
    files.close_cleanly();
    fs::remove_file(&files.log).unwrap();
    files.kill_after(150);
    let saved = files.log_bytes().unwrap();
    fs::write(&files.log, &earlier).unwrap();
    files.refused(|p| matches!(p, LogProblem::Replaced { found: Some(_), .. }));
    restore_and_open(&mut files, &saved);
}

#[test]
fn killed_then_log_of_another_database_is_refused() {
    let mut files = Files::new();
    files.kill_after(150);
    let saved = files.log_bytes().unwrap();
    let mut other = Files::new();
    other.kill_after(100);
    copy(&other.log, &files.log);
    let problem = files.refused(|p| matches!(p, LogProblem::Foreign { .. }));
    assert!(!problem.can_accept());
    // Even accepting losses does not take another database's log.
    let refused = IdemDb::builder()
        .table(common::worker::ORDERS)
        .accept_log_loss(true)
        .open(&files.path);
    assert!(matches!(refused, Err(Error::LogRefused { .. })));
    restore_and_open(&mut files, &saved);
}

#[test]
fn killed_then_a_frame_damaged_mid_log_is_refused() {
    let mut files = Files::new();
    files.kill_after(150);
    let saved = files.log_bytes().unwrap();
    // Inside the first frame's payload (frames start after the header and the cycle sector):
    // later frames are intact.
    patch(&files.log, |b| b[FRAMES + 100] ^= 0x40);
    files.refused(|p| matches!(p, LogProblem::FrameDamaged { offset: 1024, .. }));
    restore_and_open(&mut files, &saved);
}

#[test]
fn killed_then_log_header_damaged_is_refused() {
    let mut files = Files::new();
    files.kill_after(150);
    let saved = files.log_bytes().unwrap();
    patch(&files.log, |b| b[20] ^= 0x01);
    files.refused(|p| matches!(p, LogProblem::HeaderDamaged));
    patch(&files.log, |b| b[..512].fill(0));
    files.refused(|p| matches!(p, LogProblem::HeaderDamaged));
    restore_and_open(&mut files, &saved);
}

/// The cycle sector damaged (a flipped bit) while the run after it starts above the
/// checkpoint: not the torn rewrite a crash between a checkpoint's commit and the sector's
/// rewrite leaves (the run would pass through the checkpoint), so refused. Catches the
/// mutant that takes any frame at or above the checkpoint as reaching it (wal/scan.rs,
/// `examine_in_use`: `f.seq == c` → `f.seq >= c`).
#[test]
fn killed_then_log_cycle_sector_damaged_is_refused() {
    let mut files = Files::new();
    files.kill_after(150);
    let saved = files.log_bytes().unwrap();
    // Byte 9 of the cycle sector: its checkpoint, under its checksum.
    patch(&files.log, |b| b[512 + 9] ^= 0x01);
    files.refused(|p| matches!(p, LogProblem::HeaderDamaged));
    restore_and_open(&mut files, &saved);
}

#[test]
fn killed_then_log_zeroed_after_its_header_is_refused() {
    let mut files = Files::new();
    files.kill_after(150);
    let saved = files.log_bytes().unwrap();
    patch(&files.log, |b| b[512..].fill(0));
    files.refused(|p| matches!(p, LogProblem::Erased { .. }));
    restore_and_open(&mut files, &saved);
}

/// Undetectable: the frames of the current cycle zeroed (the header and the cycle sector
/// kept) look like a cycle whose first append was torn. The outcomes are lost, but no token
/// is issued twice.
#[test]
fn killed_then_frames_of_the_cycle_zeroed_opens_with_tokens_above() {
    let mut files = Files::new();
    files.kill_after(150);
    patch(&files.log, |b| b[FRAMES..].fill(0));
    let db = files.open().unwrap();
    assert_eq!(db.stats().replayed_frames, 0);
    files.acks.check_tokens(&db, "probe-after-zeroing");
}

/// Undetectable: a copy of the log taken when the database's checkpoint was its newest frame,
/// put back after more frames followed, looks like a crash right after that checkpoint.
#[test]
fn killed_then_log_rolled_back_to_the_checkpoint_opens_with_tokens_above() {
    let mut files = Files::new();
    files.kill_after(150);
    // Replayed and checkpointed: the log's run now ends exactly at the checkpoint.
    drop(files.opens_intact());
    let at_checkpoint = files.log_bytes().unwrap();
    files.kill_after(150);
    let max_before = files.acks.max_token;
    fs::write(&files.log, &at_checkpoint).unwrap();
    let db = files.open().unwrap();
    assert_eq!(db.stats().replayed_frames, 0);
    files.acks.check_tokens(&db, "probe-after-rollback");
    assert!(max_before > 0);
}

// ---- The database file closed cleanly: the log holds nothing it needs. ------------------

#[test]
fn closed_cleanly_then_log_deleted_opens_with_a_new_log() {
    let mut files = Files::new();
    files.kill_after(150).close_cleanly();
    fs::remove_file(&files.log).unwrap();
    drop(files.opens_intact());
    assert!(files.log.exists());
}

#[test]
fn closed_cleanly_then_log_cut_opens_with_a_new_log() {
    let mut files = Files::new();
    files.kill_after(150).close_cleanly();
    let saved = files.log_bytes().unwrap();
    for len in [0, 512, frames_end(&saved) as u64 / 2] {
        fs::write(&files.log, &saved).unwrap();
        cut(&files.log, len);
        drop(files.opens_intact());
    }
}

#[test]
fn closed_cleanly_then_older_or_damaged_log_opens() {
    let mut files = Files::new();
    files.kill_after(150);
    let older = files.log_bytes().unwrap();
    files.close_cleanly();
    fs::write(&files.log, &older).unwrap();
    drop(files.opens_intact());
    patch(&files.log, |b| {
        b[20] ^= 1;
        b[FRAMES + 100] ^= 1;
    });
    drop(files.opens_intact());
}

#[test]
fn closed_cleanly_then_log_of_another_database_is_refused() {
    let mut files = Files::new();
    files.kill_after(100).close_cleanly();
    let mut other = Files::new();
    other.kill_after(100);
    copy(&other.log, &files.log);
    files.refused(|p| matches!(p, LogProblem::Foreign { .. }));
}

// ---- The database file rolled back: a copy from before the log's frames. ----------------

#[test]
fn database_rolled_back_to_the_checkpoint_before_the_log_replays_the_log() {
    let mut files = Files::new();
    files.kill_after(100).close_cleanly();
    let backup = fs::read(&files.path).unwrap();
    files.kill_after(150);
    fs::write(&files.path, &backup).unwrap();
    // The log's frames start right after the copy's checkpoint: nothing is missing.
    drop(files.opens_intact());
}

#[test]
fn database_rolled_back_past_the_log_is_refused() {
    let mut files = Files::new();
    files.kill_after(150);
    let backup = fs::read(&files.path).unwrap();
    let backup_log = files.log_bytes().unwrap();
    // The next run replays and checkpoints, then more frames follow.
    files.kill_after(150);
    let current = fs::read(&files.path).unwrap();
    fs::write(&files.path, &backup).unwrap();
    files.refused(|p| matches!(p, LogProblem::FramesMissing { .. }));
    // The database file as it was: everything is there.
    fs::write(&files.path, &current).unwrap();
    drop(files.opens_intact());
    drop(backup_log);
}

#[test]
fn database_rolled_back_beside_a_newer_log_is_refused() {
    let mut files = Files::new();
    files.kill_after(150);
    let backup = fs::read(&files.path).unwrap();
    files.close_cleanly();
    fs::remove_file(&files.log).unwrap();
    files.kill_after(150);
    let current = fs::read(&files.path).unwrap();
    fs::write(&files.path, &backup).unwrap();
    files.refused(|p| matches!(p, LogProblem::Replaced { .. }));
    fs::write(&files.path, &current).unwrap();
    drop(files.opens_intact());
}

// ---- The database file missing or empty. ------------------------------------------------

#[test]
fn database_deleted_or_emptied_beside_its_log_is_refused() {
    let mut files = Files::new();
    files.kill_after(150);
    let saved = fs::read(&files.path).unwrap();
    for empty in [false, true] {
        if empty {
            fs::write(&files.path, b"").unwrap();
        } else {
            fs::remove_file(&files.path).unwrap();
        }
        let problem = files.refused(|p| matches!(p, LogProblem::DatabaseMissing { .. }));
        assert!(!problem.can_accept());
        assert_eq!(
            files.path.exists(),
            empty,
            "the refused open created a file"
        );
    }
    fs::write(&files.path, &saved).unwrap();
    drop(files.opens_intact());
}

#[test]
fn database_and_log_deleted_start_afresh() {
    let mut files = Files::new();
    files.kill_after(100);
    fs::remove_file(&files.path).unwrap();
    fs::remove_file(&files.log).unwrap();
    let db = files.open().unwrap();
    assert_eq!(db.stats().stored_records, 0);
}

// ---- Accepting a loss knowingly. ---------------------------------------------------------

#[test]
fn an_accepted_loss_opens_raises_tokens_and_is_noted_durably() {
    let mut files = Files::new();
    files.kill_after(150);
    fs::remove_file(&files.log).unwrap();
    let db = IdemDb::builder()
        .table(common::worker::ORDERS)
        .accept_log_loss(true)
        .open(&files.path)
        .unwrap();
    assert!(matches!(
        db.accepted_log_loss(),
        Some(LogProblem::Missing { .. })
    ));
    let stats = db.stats();
    assert_eq!(stats.log_losses_accepted, 1);
    let loss = stats.last_log_loss.clone().unwrap();
    assert!(loss.what.contains("is missing"), "{}", loss.what);
    let token = files.acks.check_tokens(&db, "probe-accepted");
    drop(db);
    // The note is in the file: every later open shows it, and the open needs no acceptance.
    let db = files.open().unwrap();
    assert_eq!(db.stats().log_losses_accepted, 1);
    assert_eq!(db.stats().last_log_loss, Some(loss));
    assert!(db.accepted_log_loss().is_none());
    assert!(files.acks.check_tokens(&db, "probe-later") > token);
}

#[test]
fn an_accepted_loss_keeps_every_intact_frame() {
    let mut files = Files::new();
    files.kill_after(150);
    // The header damaged: refused, though every frame is intact.
    patch(&files.log, |b| b[20] ^= 1);
    files.refused(|p| matches!(p, LogProblem::HeaderDamaged));
    let db = IdemDb::builder()
        .table(common::worker::ORDERS)
        .accept_log_loss(true)
        .open(&files.path)
        .unwrap();
    assert!(db.stats().replayed_frames > 0);
    // Nothing acknowledged was in fact lost.
    files.acks.check_outcomes(&db);
    files.acks.check_tokens(&db, "probe-kept");
}

#[test]
fn accepting_a_loss_on_a_complete_log_changes_nothing() {
    let mut files = Files::new();
    files.kill_after(150);
    let db = IdemDb::builder()
        .table(common::worker::ORDERS)
        .accept_log_loss(true)
        .open(&files.path)
        .unwrap();
    assert!(db.accepted_log_loss().is_none());
    assert_eq!(db.stats().log_losses_accepted, 0);
    files.acks.check_outcomes(&db);
}

/// The CLI: a refused open is exit code 6 (corrupt) with the engine's words; `accept-log-loss`
/// opens it, and `stats` shows the note.
#[test]
fn the_cli_refuses_as_corrupt_and_accepts_with_accept_log_loss() {
    let mut files = Files::new();
    files.kill_after(150);
    // Let the CLI open it once (the worker's table registered there), closed cleanly again.
    drop(files.opens_intact());
    files.kill_after(100);
    // A run of the CLI cannot replay the worker's table; this row needs no replay: the log
    // is gone.
    fs::remove_file(&files.log).unwrap();
    let cli = |args: &[&str]| {
        let out = Command::new(common::cli_binary())
            .args(args)
            .arg(&files.path)
            .output()
            .unwrap();
        (
            out.status.code().unwrap(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, _, err) = cli(&["stats"]);
    assert_eq!(code, 6, "{err}");
    assert!(err.contains(&files.log.display().to_string()), "{err}");
    assert!(err.contains("is missing"), "{err}");
    let (code, _, err) = cli(&["--json", "stats"]);
    assert_eq!(code, 6);
    assert!(err.contains("\"error\":\"corrupt\""), "{err}");
    assert!(!files.log.exists(), "the refused CLI open created a log");

    let (code, out, err) = cli(&["accept-log-loss"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("accepted: the write-ahead log"), "{out}");
    let (code, out, err) = cli(&["stats"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("log losses accepted 1"), "{out}");
    let (code, out, _) = cli(&["accept-log-loss"]);
    assert_eq!(code, 0);
    assert!(out.contains("nothing to accept"), "{out}");
    let db = files.open().unwrap();
    files.acks.check_tokens(&db, "probe-cli");
}

/// The one loss no file can bound: a database file restored from a copy, its log lost too. An
/// accepted loss raises the ceiling far enough (2^40) above everything the files show that the
/// later run's tokens, which neither file knows, are never issued again.
#[test]
fn an_accepted_loss_of_a_rolled_back_database_issues_tokens_above_the_later_runs() {
    let mut files = Files::new();
    files.kill_after(100);
    let backup = fs::read(&files.path).unwrap();
    files.kill_after(100).kill_after(100);
    fs::write(&files.path, &backup).unwrap();
    fs::remove_file(&files.log).unwrap();
    files.refused(|p| matches!(p, LogProblem::Missing { .. }));
    let db = IdemDb::builder()
        .table(common::worker::ORDERS)
        .accept_log_loss(true)
        .open(&files.path)
        .unwrap();
    files.acks.check_tokens(&db, "probe-rolled-back");
}
