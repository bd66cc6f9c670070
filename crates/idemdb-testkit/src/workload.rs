//! A scripted crash workload and the model it is checked against.
//!
//! Each key lives through one [`Script`]. Every call either returns (acknowledged: its effect
//! must survive any later crash) or fails (the crash struck: the call is *in flight* and may
//! have happened entirely or not at all). After reopen, every key's record and business row
//! must equal the acknowledged state or, for the in-flight call, the state it would have left.

use idemdb::Refusal;
use std::sync::Arc;
use std::time::Duration;

use idemdb::redb::{self, ReadableTable, TableDefinition};

use crate::backend::FaultBackend;

use idemdb::Error;
use idemdb::IdemDb;
use idemdb::Reservation;
use idemdb::Retention;
use idemdb::testing::{HORIZON, INFLIGHT, partition_tables};
use idemdb::{Clock, ManualClock};
use idemdb::{ExecuteOutcome, Outcome, ReserveOutcome};
use idemdb::{Key, Scope};
use idemdb::{Record, RecordState};

/// The business table the scripts write in the same commit as their records.
pub const ROWS: TableDefinition<&str, &[u8]> = TableDefinition::new("crash_rows");

/// Not registered on the builder: `Script::FailWith` also writes here, so that its batch
/// takes the durable-commit path while every other closure's batch is logged.
const UNLOGGED: TableDefinition<&str, u64> = TableDefinition::new("crash_unlogged");
pub(super) const LONG_LEASE: Duration = Duration::from_secs(86_400);
const SHORT_LEASE: Duration = Duration::from_secs(5);

/// One key's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Script {
    /// reserve, complete
    Complete,
    /// reserve, fail
    Fail,
    /// reserve, release, reserve, complete
    ReleaseThenComplete,
    /// reserve, extend, complete_with (business row)
    ExtendThenCompleteWith,
    /// reserve, fail_with (business row)
    FailWith,
    /// execute (business row), then a duplicate execute that must replay
    Execute,
    /// execute whose closure fails (nothing may commit), then execute
    ExecuteErrThenExecute,
    /// reserve with a short lease, the clock passes it, a takeover, the stale owner is
    /// fenced, the new owner completes
    Takeover,
    /// under the short-TTL operation (see [`open_workload`]): reserve, complete, and twice
    /// more after the clock passed the TTL (acquired flagged beyond the horizon: three
    /// partitions hold the key), a duplicate that must replay the newest; then the clock
    /// passes the TTL, `compact_now` drops the partitions, the key comes back and is acquired
    /// flagged beyond the horizon, and completes again
    Expire,
}

impl Script {
    /// Every script, for mapping fuzz bytes or indices.
    pub const ALL: [Script; 9] = [
        Script::Complete,
        Script::Fail,
        Script::ReleaseThenComplete,
        Script::ExtendThenCompleteWith,
        Script::FailWith,
        Script::Execute,
        Script::ExecuteErrThenExecute,
        Script::Takeover,
        Script::Expire,
    ];
}

/// The operation whose records expire in the workload: TTL 1 s.
const EXPIRING_OP: &str = "crash-expire";

/// Opens a workload database over `backend` on `clock`, with the workload's retention (below).
pub fn open_workload(backend: FaultBackend, clock: &ManualClock) -> Result<IdemDb, Error> {
    open_workload_as(backend, clock, Checkpoints::AlsoBySizeAndAge)
}

/// Who takes a workload database's checkpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checkpoints {
    /// The committer thread too, by size (every 64 KiB of frames) and age: the engine as it
    /// runs, but when a checkpoint happens depends on thread scheduling.
    AlsoBySizeAndAge,
    /// Only the writer itself, in the batches that take a durable commit (a raised token
    /// ceiling, an unregistered table, a log that grows), and compaction: a run is the same
    /// every time, as a fuzz target needs. No committer thread is started (the workload's
    /// callers are sync: nothing needs one).
    WriterOnly,
}

/// [`open_workload`], with `checkpoints` taken as it says.
pub fn open_workload_as(
    backend: FaultBackend,
    clock: &ManualClock,
    checkpoints: Checkpoints,
) -> Result<IdemDb, Error> {
    let lazy = checkpoints == Checkpoints::WriterOnly;
    open_workload_with(backend, clock, true, checkpoints, lazy)
}

/// [`open_workload`], verifying every page checksum or not (a variant of a crash image whose
/// database file was verified already), and starting the committer thread at open or only
/// when needed (`lazy`: see [`Builder::lazy_committer`](idemdb::Builder::lazy_committer)).
fn open_workload_with(
    backend: FaultBackend,
    clock: &ManualClock,
    verify: bool,
    checkpoints: Checkpoints,
    lazy: bool,
) -> Result<IdemDb, Error> {
    let (bytes, age) = match checkpoints {
        // Small, so that runs cross checkpoints taken by size as well as by close,
        // compaction and caller code writing an unregistered table.
        Checkpoints::AlsoBySizeAndAge => (64 << 10, Duration::from_secs(1)),
        Checkpoints::WriterOnly => (1 << 40, Duration::from_secs(86_400)),
    };
    IdemDb::builder()
        .verify_on_open(verify)
        .lazy_committer(lazy)
        .clock(clock.clone())
        .retention(workload_retention())
        .checkpoint_bytes(bytes)
        .checkpoint_interval(age)
        // A small log: small disk images to copy, and a log that grows (a durable commit).
        .log_step(64 << 10)
        // Small, so that batches raise the durable token ceiling (a durable commit) often.
        .token_block(64)
        .table(ROWS)
        .open_with_backend(backend.clone(), backend.log())
}

/// The retention every workload database is opened with: records of [`Script::Expire`] live
/// 1 s, all others ten years (they never expire during a run); partitions are 1 s wide, so a
/// run spreads its records over dozens of them; dropped keys are recognised for a million
/// TTLs; no background compactor (the scripts compact).
fn workload_retention() -> Retention {
    Retention::default()
        .ttl(Duration::from_secs(3650 * 86_400))
        .operation_ttl(EXPIRING_OP, Duration::from_secs(1))
        .partition_width(Duration::from_secs(1))
        .horizon_factor(1_000_000)
        .compact_interval(None)
}

#[derive(Clone, PartialEq, Eq)]
pub(super) enum Expect {
    Absent,
    /// A token, or `None` for a reservation whose token was never returned.
    InProgress(Option<u64>),
    Completed {
        response: Vec<u8>,
        row: bool,
    },
    Failed {
        response: Vec<u8>,
        row: bool,
    },
    /// A COMPLETED record with this response (no business row) whose TTL may have passed:
    /// absent once expired.
    Expiring(Vec<u8>),
}

impl std::fmt::Debug for Expect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let digest =
            |b: &[u8]| format!("{} bytes #{:016x}", b.len(), xxhash_rust::xxh3::xxh3_64(b));
        match self {
            Expect::Absent => write!(f, "Absent"),
            Expect::InProgress(t) => write!(f, "InProgress(token {t:?})"),
            Expect::Completed { response, row } => {
                write!(f, "Completed({}, row {row})", digest(response))
            }
            Expect::Failed { response, row } => {
                write!(f, "Failed({}, row {row})", digest(response))
            }
            Expect::Expiring(response) => write!(f, "Expiring({})", digest(response)),
        }
    }
}

/// What one key's caller was told, and what was in flight when the crash struck.
#[derive(Debug, Clone)]
pub struct KeyLog {
    pub(super) key: String,
    acked: Expect,
    in_flight: Option<Expect>,
    max_token: u64,
    acked_calls: u64,
    /// A compaction that dropped this key's partition was acknowledged: once absent, the
    /// key must still be recognised beyond the horizon.
    dropped: bool,
    /// The call in flight is a compaction (partition drops).
    compacting: bool,
    /// A message id of the inbox consumer [`INBOX`] rather than a key of the workload's scope.
    pub(super) inbox: bool,
}

/// The inbox consumer of the fuzzed workload's polls (steps.rs).
pub(super) const INBOX: &str = "crash-inbox";

impl KeyLog {
    pub(super) fn scope(&self) -> Scope {
        if self.inbox {
            Scope::new(INBOX, "")
        } else if self.key.ends_with(&format!("{:?}", Script::Expire)) {
            expiring_scope()
        } else {
            scope()
        }
    }

    /// A log for a key that has no record yet.
    pub fn new(key: impl Into<String>) -> Self {
        KeyLog {
            key: key.into(),
            acked: Expect::Absent,
            in_flight: None,
            max_token: 0,
            acked_calls: 0,
            dropped: false,
            compacting: false,
            inbox: false,
        }
    }

    /// Calls acknowledged for this key.
    pub fn acked_calls(&self) -> u64 {
        self.acked_calls
    }

    /// Whether a call was in flight when the crash struck.
    pub fn had_call_in_flight(&self) -> bool {
        self.in_flight.is_some()
    }

    /// Runs one call: `predicted` is the state it leaves if it happens. `Ok(None)` means the
    /// call failed (the crash): stop the script.
    fn call<T>(&mut self, predicted: Expect, f: impl FnOnce() -> Result<T, String>) -> Option<T> {
        self.in_flight = Some(predicted.clone());
        match f() {
            Ok(v) => {
                self.acked = predicted;
                self.in_flight = None;
                self.acked_calls += 1;
                Some(v)
            }
            Err(_) => None,
        }
    }

    fn acquired(&mut self, r: &Reservation) {
        self.acked = Expect::InProgress(Some(r.token().get()));
        self.max_token = self.max_token.max(r.token().get());
    }

    /// A call that shares its commit with others is under way: `predicted` if it happens.
    pub(super) fn begin(&mut self, predicted: Expect) {
        self.in_flight = Some(predicted);
    }

    /// The call begun was answered: its predicted state is acknowledged.
    pub(super) fn answered(&mut self) {
        if let Some(state) = self.in_flight.take() {
            self.acked = state;
            self.acked_calls += 1;
        }
    }

    /// The reservation begun was answered `Acquired(r)`.
    pub(super) fn answered_acquired(&mut self, r: &Reservation) {
        self.in_flight = None;
        self.acquired(r);
        self.acked_calls += 1;
    }
}

pub(super) fn scope() -> Scope {
    Scope::new("crash", "workload")
}

fn expiring_scope() -> Scope {
    Scope::new(EXPIRING_OP, "workload")
}

/// A response long enough to span several sectors, different for every key and step.
pub(super) fn response(key: &str, step: &str) -> Vec<u8> {
    let seed = xxhash_rust::xxh3::xxh3_64(format!("{key}/{step}").as_bytes());
    let len = 200 + (seed % 1800) as usize;
    (0..len)
        .map(|i| (seed.rotate_left(i as u32 % 64) as u8) ^ (i as u8))
        .collect()
}

/// Runs `script` for `log`'s key. Returns false when a call failed (the crash struck). A
/// wrong answer before the crash is a bug and panics.
pub fn run_script(db: &IdemDb, clock: &ManualClock, script: Script, log: &mut KeyLog) -> bool {
    run(db, clock, script, log).is_some()
}

/// Runs `scripts_per_thread` keys on each of `threads` threads at once, so that group commit
/// forms real batches. Thread `t` rotates through [`Script::ALL`] from `3 t`; a thread stops at
/// its first failed call (the crash or fault struck). Returns every key's log.
pub fn run_workload(
    db: &Arc<IdemDb>,
    clock: &ManualClock,
    threads: usize,
    scripts_per_thread: usize,
) -> Vec<KeyLog> {
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (db, clock) = (Arc::clone(db), clock.clone());
            std::thread::spawn(move || {
                let mut logs = Vec::new();
                for i in 0..scripts_per_thread {
                    let script = Script::ALL[(t * 3 + i) % Script::ALL.len()];
                    let mut log = KeyLog::new(format!("t{t}-k{i}-{script:?}"));
                    let finished = run_script(&db, &clock, script, &mut log);
                    logs.push(log);
                    if !finished {
                        break;
                    }
                }
                logs
            })
        })
        .collect();
    handles
        .into_iter()
        // A panic is a wrong answer before the crash: the bug the workload looks for.
        .flat_map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
        .collect()
}

fn reserve(db: &IdemDb, log: &mut KeyLog, lease: Duration, takeover: bool) -> Option<Reservation> {
    reserve_in(db, &scope(), log, lease, takeover, false)
}

fn reserve_in(
    db: &IdemDb,
    scope: &Scope,
    log: &mut KeyLog,
    lease: Duration,
    takeover: bool,
    beyond_horizon: bool,
) -> Option<Reservation> {
    let key = Key::new(&log.key);
    let r = log.call(Expect::InProgress(None), || {
        match db.reserve(scope, &key, log_payload(), lease) {
            Ok(ReserveOutcome::Acquired(r)) => {
                assert_eq!(r.is_takeover(), takeover, "takeover flag");
                assert_eq!(r.is_beyond_horizon(), beyond_horizon, "beyond-horizon flag");
                Ok(r)
            }
            Ok(other) => panic!("reserve: expected Acquired, got {other:?}"),
            Err(e) => Err(e.to_string()),
        }
    })?;
    log.acquired(&r);
    Some(r)
}

pub(super) fn log_payload() -> &'static [u8] {
    b"crash-workload-payload"
}

fn owner_call(r: Result<(), Error>) -> Result<(), String> {
    match r {
        Ok(()) => Ok(()),
        Err(
            e @ (Error::Refused(Refusal::Fenced { .. })
            | Error::Refused(Refusal::UnknownRecord)
            | Error::Refused(Refusal::NotInProgress { .. })),
        ) => {
            panic!("owner call refused before the crash: {e}")
        }
        Err(e) => Err(e.to_string()),
    }
}

fn run(db: &IdemDb, clock: &ManualClock, script: Script, log: &mut KeyLog) -> Option<()> {
    let key = log.key.clone();
    let done = |step: &str, row: bool| Expect::Completed {
        response: response(&key, step),
        row,
    };
    match script {
        Script::Complete => {
            let r = reserve(db, log, LONG_LEASE, false)?;
            log.call(done("c", false), || {
                owner_call(db.complete(&r, response(&key, "c")))
            })
        }
        Script::Fail => {
            let r = reserve(db, log, LONG_LEASE, false)?;
            let failed = Expect::Failed {
                response: response(&key, "f"),
                row: false,
            };
            log.call(failed, || owner_call(db.fail(&r, response(&key, "f"))))
        }
        Script::ReleaseThenComplete => {
            let r = reserve(db, log, LONG_LEASE, false)?;
            log.call(Expect::Absent, || owner_call(db.release(&r)))?;
            let r = reserve(db, log, LONG_LEASE, false)?;
            log.call(done("c", false), || {
                owner_call(db.complete(&r, response(&key, "c")))
            })
        }
        Script::ExtendThenCompleteWith => {
            let mut r = reserve(db, log, LONG_LEASE, false)?;
            let same = log.acked.clone();
            log.call(same, || owner_call(db.extend(&mut r, LONG_LEASE)))?;
            let (row_key, bytes) = (key.clone(), response(&key, "cw"));
            log.call(done("cw", true), || {
                let body = move |tx: &mut idemdb::Tx<'_>| -> Result<(), Error> {
                    tx.open_table(ROWS)?
                        .insert(row_key.as_str(), bytes.as_slice())?;
                    Ok(())
                };
                owner_call(
                    db.complete_with(&r, response(&key, "cw"), body)
                        .map_err(Error::from),
                )
            })
        }
        Script::FailWith => {
            let r = reserve(db, log, LONG_LEASE, false)?;
            let (row_key, bytes) = (key.clone(), response(&key, "fw"));
            let failed = Expect::Failed {
                response: response(&key, "fw"),
                row: true,
            };
            log.call(failed, || {
                let body = move |tx: &mut idemdb::Tx<'_>| -> Result<(), Error> {
                    tx.open_table(ROWS)?
                        .insert(row_key.as_str(), bytes.as_slice())?;
                    tx.open_table(UNLOGGED)?.insert(row_key.as_str(), 1)?;
                    Ok(())
                };
                owner_call(
                    db.fail_with(&r, response(&key, "fw"), body)
                        .map_err(Error::from),
                )
            })
        }
        Script::Execute => {
            execute(db, log, &key, "x")?;
            let same = log.acked.clone();
            log.call(same, || {
                match db.execute(&scope(), &Key::new(&key), log_payload(), |_tx| {
                    Err::<Outcome, _>("a duplicate must not run")
                }) {
                    Ok(ExecuteOutcome::Completed(b)) if b == response(&key, "x") => Ok(()),
                    Ok(other) => panic!("duplicate execute: {other:?}"),
                    Err(idemdb::ExecuteError::Closure(e)) => panic!("duplicate ran: {e}"),
                    Err(idemdb::ExecuteError::Db(e)) => Err(e.to_string()),
                }
            })
        }
        Script::ExecuteErrThenExecute => {
            let row_key = key.clone();
            log.call(Expect::Absent, || {
                match db.execute(&scope(), &Key::new(&key), log_payload(), move |tx| {
                    tx.open_table(ROWS)
                        .map_err(|e| e.to_string())?
                        .insert(row_key.as_str(), &b"must not commit"[..])
                        .map_err(|e| e.to_string())?;
                    Err::<Outcome, String>("transient".into())
                }) {
                    Err(idemdb::ExecuteError::Closure(_)) => Ok(()),
                    Ok(other) => panic!("failing execute: {other:?}"),
                    Err(idemdb::ExecuteError::Db(e)) => Err(e.to_string()),
                }
            })?;
            execute(db, log, &key, "x")
        }
        Script::Takeover => {
            let stale = reserve(db, log, SHORT_LEASE, false)?;
            clock.advance(SHORT_LEASE + Duration::from_secs(1));
            let fresh = reserve(db, log, LONG_LEASE, true)?;
            let same = log.acked.clone();
            log.call(same, || match db.complete(&stale, b"late".to_vec()) {
                Err(Error::Refused(Refusal::Fenced { .. })) => Ok(()),
                Ok(()) => panic!("a stale owner completed"),
                Err(e) => Err(e.to_string()),
            })?;
            log.call(done("c", false), || {
                owner_call(db.complete(&fresh, response(&key, "c")))
            })
        }
        Script::Expire => {
            let scope = expiring_scope();
            let r = reserve_in(db, &scope, log, LONG_LEASE, false, false)?;
            let first = response(&key, "e1");
            log.call(Expect::Expiring(first.clone()), || {
                owner_call(db.complete(&r, first.clone()))
            })?;
            // Acquired again after each expiry, before any drop: the key is written in three
            // partitions, and its lookups must name the newest (key_index.rs, mutant K1).
            let mut completed_at = 0;
            for step in ["e2", "e3"] {
                clock.advance(Duration::from_secs(3));
                let r = reserve_in(db, &scope, log, LONG_LEASE, false, true)?;
                let again = response(&key, step);
                completed_at = clock.now_ms();
                log.call(Expect::Expiring(again.clone()), || {
                    owner_call(db.complete(&r, again.clone()))
                })?;
            }
            let found = db.get(&scope, &Key::new(&key)).ok()?;
            // Unless another caller's script moved the clock past its TTL meanwhile.
            if clock.now_ms() == completed_at {
                assert_eq!(
                    found.map(|r| r.response),
                    Some(response(&key, "e3")),
                    "a key in three partitions: the newest must answer"
                );
            }
            clock.advance(Duration::from_secs(3));
            let same = log.acked.clone();
            log.compacting = true;
            log.call(same, || db.compact_now().map_err(|e| e.to_string()))?;
            log.compacting = false;
            log.dropped = true;
            let r = reserve_in(db, &scope, log, LONG_LEASE, false, true)?;
            let last = response(&key, "e4");
            log.call(Expect::Expiring(last.clone()), || {
                owner_call(db.complete(&r, last.clone()))
            })
        }
    }
}

fn execute(db: &IdemDb, log: &mut KeyLog, key: &str, step: &str) -> Option<()> {
    let (row_key, bytes) = (key.to_string(), response(key, step));
    let stored = response(key, step);
    let predicted = Expect::Completed {
        response: response(key, step),
        row: true,
    };
    log.call(predicted, || {
        match db.execute(&scope(), &Key::new(key), log_payload(), move |tx| {
            tx.open_table(ROWS)?
                .insert(row_key.as_str(), bytes.as_slice())?;
            Ok::<_, Error>(Outcome::Completed(stored))
        }) {
            Ok(ExecuteOutcome::Executed(_)) => Ok(()),
            Ok(other) => panic!("execute: {other:?}"),
            Err(e) => Err(Error::from(e).to_string()),
        }
    })
}

/// What a check of a recovered database covered.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CrashCheck {
    /// Keys compared with the model.
    pub keys: u64,
    /// Acknowledged calls whose effect was verified.
    pub acked_calls: u64,
    /// Calls in flight at the crash (resolved either way).
    pub in_flight: u64,
    /// Records decoded in the full scan.
    pub records_scanned: u64,
    /// Of the calls in flight, compactions (the crash struck during partition drops).
    pub compactions_in_flight: u64,
    /// Partition tables found in the recovered file.
    pub partitions: u64,
    /// Dropped keys checked to be recognised beyond the horizon after the crash.
    pub recognised_after_crash: u64,
    /// Log frames the reopen replayed.
    pub replayed_frames: u64,
}

/// Checks invariants I1–I5 on a database reopened after a crash: every key holds its
/// acknowledged state or its in-flight call's (I1, I5), business rows go with their records
/// (I2), every stored record decodes (I4), and a new reservation's token is above every token
/// handed out before the crash (I3). Also runs redb's integrity check on the database file of
/// `disk` first (before the log is replayed into it).
pub fn check_recovered(
    disk: FaultBackend,
    clock: ManualClock,
    logs: &[KeyLog],
) -> Result<CrashCheck, String> {
    let copy = FaultBackend::from_image(disk.live_image());
    let mut raw = redb::Builder::new()
        .create_with_backend(copy.clone())
        .map_err(|e| format!("redb cannot open the crash image: {e}"))?;
    let clean = raw.check_integrity();
    // Checked: what a clean close of this copy would write is never read.
    copy.kill();
    drop(raw);
    match clean {
        Ok(true) => {}
        Ok(false) => return Err("redb's integrity check had to repair the file".into()),
        Err(e) => return Err(format!("redb's integrity check failed: {e}")),
    }
    // Its pages were verified just now: the open need not read them all again.
    let db = open_to_check(disk.clone(), &clock).map_err(|e| format!("reopen failed: {e}"))?;
    let checked = check_reopened(&db, &clock, logs, true);
    close_unwritten(db, &disk);
    checked
}

/// Opens a crash image to check it, without verifying its pages again (they were, or its
/// database file was checked already). The committer thread starts only if needed: the
/// checks are sync calls, and a checkpoint it would take by age (the check lasting past
/// 1 s) is read by nobody.
fn open_to_check(disk: FaultBackend, clock: &ManualClock) -> Result<IdemDb, Error> {
    open_workload_with(disk, clock, false, Checkpoints::AlsoBySizeAndAge, true)
}

/// Drops `db`, checked already, without the writes of a clean close: `disk` (its disk) dies
/// first, so the close's checkpoint and redb's allocator state are never written (nothing
/// reads them).
fn close_unwritten(db: IdemDb, disk: &FaultBackend) {
    disk.kill();
    drop(db);
}

/// As [`check_recovered`], for a disk whose log was altered after the crash (deleted, cut,
/// rolled back; the database file was checked already): the open must be refused with
/// [`Error::LogRefused`] (`Ok(None)`), or open with every acknowledged outcome intact and
/// tokens above all issued. The database file is not verified again.
pub fn check_recovered_or_refused(
    disk: FaultBackend,
    clock: ManualClock,
    logs: &[KeyLog],
) -> Result<Option<CrashCheck>, String> {
    reopen_unless_refused(disk, clock, logs, true)
}

/// For a disk whose log lost frames in a way no open can tell from a crash (rolled back to an
/// earlier image of itself within one checkpoint's cycle): refused (`Ok(None)`), or opened
/// with every stored record decoding, drops atomic (I4, I6) and every token issued after
/// above every token issued before (I3); acknowledged outcomes after the image may be gone.
/// The database file is not verified again.
pub fn check_tokens_after_loss(
    disk: FaultBackend,
    clock: ManualClock,
    logs: &[KeyLog],
) -> Result<Option<CrashCheck>, String> {
    reopen_unless_refused(disk, clock, logs, false)
}

/// Opens `disk` without verifying its pages again and checks it (`intact` as in
/// [`check_reopened`]); a refusal with [`Error::LogRefused`] is `Ok(None)`.
fn reopen_unless_refused(
    disk: FaultBackend,
    clock: ManualClock,
    logs: &[KeyLog],
    intact: bool,
) -> Result<Option<CrashCheck>, String> {
    match open_to_check(disk.clone(), &clock) {
        Ok(db) => {
            let checked = check_reopened(&db, &clock, logs, intact).map(Some);
            close_unwritten(db, &disk);
            checked
        }
        Err(Error::LogRefused { .. }) => Ok(None),
        Err(e) => Err(format!("reopen failed: {e}")),
    }
}

/// `intact`: every key must hold its acknowledged state or its in-flight call's.
fn check_reopened(
    db: &IdemDb,
    clock: &ManualClock,
    logs: &[KeyLog],
    intact: bool,
) -> Result<CrashCheck, String> {
    let mut summary = CrashCheck {
        replayed_frames: db.stats().replayed_frames,
        ..CrashCheck::default()
    };
    let read = db.begin_read().map_err(|e| e.to_string())?;
    let rows = match read.open_table(ROWS) {
        Ok(t) => Some(t),
        Err(redb::TableError::TableDoesNotExist(_)) => None,
        Err(e) => return Err(e.to_string()),
    };
    let mut max_token = 0;
    let mut dropped_absent = Vec::new();
    for log in logs {
        let log_scope = log.scope();
        let rec = db
            .get(&log_scope, &Key::new(&log.key))
            .map_err(|e| format!("{}: {e}", log.key))?;
        let row = match &rows {
            Some(t) => t
                .get(log.key.as_str())
                .map_err(|e| e.to_string())?
                .map(|v| v.value().to_vec()),
            None => None,
        };
        let actual = observed(rec.as_ref(), row.as_deref(), &log.key)?;
        let ok = matches(&log.acked, &actual)
            || log.in_flight.as_ref().is_some_and(|f| matches(f, &actual));
        if !ok && intact {
            return Err(format!(
                "{}: recovered {actual:?}, acknowledged {:?}, in flight {:?}",
                log.key, log.acked, log.in_flight
            ));
        }
        if log.dropped && actual == Expect::Absent && intact {
            dropped_absent.push(log);
        }
        max_token = max_token.max(log.max_token);
        if let Some(r) = &rec {
            max_token = max_token.max(r.token.get());
        }
        summary.keys += 1;
        summary.acked_calls += log.acked_calls;
        summary.in_flight += u64::from(log.in_flight.is_some());
        summary.compactions_in_flight += u64::from(log.in_flight.is_some() && log.compacting);
    }
    let partitions = partition_tables(&read).map_err(|e| e.to_string())?;
    let tables = std::iter::once((INFLIGHT, true)).chain(
        partitions
            .iter()
            .map(|n| (TableDefinition::<&[u8], &[u8]>::new(n), false)),
    );
    for (table, in_progress) in tables {
        let all = read.open_table(table).map_err(|e| e.to_string())?;
        for entry in all.iter().map_err(|e| e.to_string())? {
            let (k, v) = entry.map_err(|e| e.to_string())?;
            let rec = idemdb::testing::decode_record(k.value(), v.value())
                .map_err(|e| format!("a stored record fails to decode: {e}"))?;
            if (rec.state == RecordState::InProgress) != in_progress {
                return Err(format!("a {:?} record in the wrong table", rec.state));
            }
            summary.records_scanned += 1;
        }
    }
    check_drops_atomic(&read, &partitions)?;
    summary.partitions = partitions.len() as u64;
    drop((rows, read));
    // A dropped key is still recognised after the crash: its horizon set was durable with
    // the drop (or its expired record is still there).
    for log in dropped_absent {
        match db.reserve(&log.scope(), &Key::new(&log.key), log_payload(), LONG_LEASE) {
            Ok(ReserveOutcome::Acquired(r)) if r.is_beyond_horizon() => {
                max_token = max_token.max(r.token().get());
                summary.recognised_after_crash += 1;
            }
            other => {
                return Err(format!(
                    "{}: dropped key not recognised after reopen: {other:?}",
                    log.key
                ));
            }
        }
    }
    let probe = Key::new(format!("probe-{}", clock.now_ms()));
    match db.reserve(&scope(), &probe, b"probe", LONG_LEASE) {
        Ok(ReserveOutcome::Acquired(r)) if r.token().get() > max_token => Ok(summary),
        Ok(ReserveOutcome::Acquired(r)) => Err(format!(
            "token {} issued after reopen is not above {max_token}",
            r.token()
        )),
        other => Err(format!("probe reservation after reopen: {other:?}")),
    }
}

/// I6: a partition drop is atomic with its horizon set: no horizon row names a partition
/// table that still exists.
fn check_drops_atomic(read: &redb::ReadTransaction, partitions: &[String]) -> Result<(), String> {
    let horizon = read.open_table(HORIZON).map_err(|e| e.to_string())?;
    for row in horizon.iter().map_err(|e| e.to_string())? {
        let (k, _) = row.map_err(|e| e.to_string())?;
        let name = String::from_utf8_lossy(k.value().get(8..).unwrap_or_default()).to_string();
        if partitions.contains(&name) {
            return Err(format!(
                "partition {name} has a horizon set but was not dropped"
            ));
        }
    }
    Ok(())
}

fn observed(rec: Option<&Record>, row: Option<&[u8]>, key: &str) -> Result<Expect, String> {
    let has_row = match row {
        None => false,
        Some(bytes) => {
            if rec.is_none_or(|r| r.state == RecordState::InProgress || bytes != r.response) {
                return Err(format!("{key}: business row without its record: {rec:?}"));
            }
            true
        }
    };
    Ok(match rec {
        None => Expect::Absent,
        Some(r) => match r.state {
            RecordState::InProgress => Expect::InProgress(Some(r.token.get())),
            RecordState::Completed => Expect::Completed {
                response: r.response.clone(),
                row: has_row,
            },
            RecordState::Failed => Expect::Failed {
                response: r.response.clone(),
                row: has_row,
            },
        },
    })
}

fn matches(expected: &Expect, actual: &Expect) -> bool {
    match (expected, actual) {
        (Expect::InProgress(None), Expect::InProgress(Some(_))) => true,
        (Expect::Expiring(_), Expect::Absent) => true,
        (Expect::Expiring(e), Expect::Completed { response, row }) => e == response && !row,
        _ => expected == actual,
    }
}
