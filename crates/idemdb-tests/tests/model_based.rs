//! Model-based test of the whole public API (issue 11, part 4).
//!
//! Random, seeded sequences of every operation (reserve, reserve_or_wait with timeout 0,
//! complete, fail, release, extend, execute with closures that succeed, fail and panic,
//! complete_with / fail_with, get, manual clock advances across leases and TTLs, compact_now,
//! close + reopen, and power losses through the fault-injecting backend) run against the
//! engine and against a reference model written from docs/semantics.md alone
//! (`model_based/model.rs`). After every step:
//!
//! - the engine's answer equals the model's;
//! - `get` of every key and the business rows the closures wrote equal the model's state;
//! - `stats()` counts the records and partitions the model holds;
//! - every token issued is above every token issued before, across reopen and power loss.
//!
//! Power loss: every acknowledged outcome is durable; an operation in flight when the power
//! went either happened entirely or not at all.
//!
//! The clock also steps back now and then (reads and writes must still agree, §6 "Clock
//! steps").
//!
//! `IDEMDB_MODEL_SEED=<n>` replays one seed; `IDEMDB_MODEL_SEEDS=<count>` runs more seeds;
//! `IDEMDB_MODEL_STEPS=<n>` changes the steps per seed; `IDEMDB_MODEL_CLOCK_BACK=0` keeps the
//! clock monotone; `IDEMDB_MODEL_SURVEY=1` runs every seed and lists every failure. A failure
//! prints the seed, the step and the last steps.

#[path = "model_based/model.rs"]
mod model;

use std::collections::{BTreeMap, VecDeque};
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use idemdb::redb::TableDefinition;
use idemdb::{
    BeyondHorizonPolicy, Error, ExecuteError, ExecuteOutcome, IdemDb, InputError, Key, Limits,
    ManualClock, Outcome, Payload, Record, RecordState, Reservation, ReserveOutcome, Retention,
    Scope, Tx,
};
use idemdb_testkit::{FaultBackend, TearMode};

use model::{Config, Decision, Effect, Id, Model, Refusal, St, all_ids};

const DEFAULT_SEEDS: u64 = 400;
const DEFAULT_STEPS: usize = 200;
const START_MS: u64 = 1_767_225_600_000;
/// The business table the closures write (one row per identity: the step that wrote it).
const ROWS: TableDefinition<&str, u64> = TableDefinition::new("model_rows");
const OPERATIONS: [&str; model::SCOPES] = ["pay", "ship"];
const PRINCIPALS: [&str; model::SCOPES] = ["alice", "bob"];
const KEY_NAMES: [&str; model::KEYS] = ["k0", "k1", "k2"];
const PAYLOADS: [&[u8]; 2] = [b"payload-a", b"payload-b"];
/// Reservations kept for later use (stale ones included).
const HELD: usize = 24;
const HISTORY: usize = 60;

/// The payload of the panics the test's closures raise on purpose.
struct PlannedPanic;

/// splitmix64: a tiny deterministic generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0).
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// An index drawn with the given weights.
    fn weighted(&mut self, weights: &[u64]) -> usize {
        let mut x = self.below(weights.iter().sum());
        for (i, w) in weights.iter().enumerate() {
            if x < *w {
                return i;
            }
            x -= w;
        }
        weights.len() - 1
    }
}

/// An answer, normalised so that engine and model answers compare with `==`. Acquired
/// tokens are checked apart (they are only known to increase).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Ans {
    Acquired {
        lease_expires_at: u64,
        attempt: u32,
        takeover: bool,
        beyond: bool,
    },
    Mismatch,
    Completed(Vec<u8>),
    Failed(Vec<u8>),
    InProgress(u64),
    BeyondHorizon,
    Executed {
        completed: bool,
        response: Vec<u8>,
    },
    Ok,
    Fenced {
        presented: u64,
        current: u64,
    },
    UnknownRecord,
    NotInProgress(St),
    TooLong {
        len: usize,
        max: usize,
    },
    ZeroLease,
    Closure,
    Panicked,
    Other(String),
}

impl Ans {
    fn of_error(e: &Error) -> Ans {
        match e {
            Error::Refused(idemdb::Refusal::InvalidInput(InputError::TooLong {
                what: "response",
                len,
                max,
            })) => Ans::TooLong {
                len: *len,
                max: *max,
            },
            Error::Refused(idemdb::Refusal::InvalidInput(InputError::ZeroLease)) => Ans::ZeroLease,
            Error::Refused(idemdb::Refusal::Fenced { presented, current }) => Ans::Fenced {
                presented: presented.get(),
                current: current.get(),
            },
            Error::Refused(idemdb::Refusal::UnknownRecord) => Ans::UnknownRecord,
            Error::Refused(idemdb::Refusal::NotInProgress { state }) => {
                Ans::NotInProgress(st(*state))
            }
            other => Ans::Other(format!("{other:?}")),
        }
    }

    fn of_execute_error(e: &ExecuteError<String>) -> Ans {
        match e {
            ExecuteError::Closure(_) => Ans::Closure,
            ExecuteError::Db(e) => Ans::of_error(e),
        }
    }

    fn of_refusal(r: Refusal) -> Ans {
        match r {
            Refusal::Unknown => Ans::UnknownRecord,
            Refusal::Fenced { presented, current } => Ans::Fenced { presented, current },
            Refusal::NotInProgress(s) => Ans::NotInProgress(s),
        }
    }

    fn of_decision(d: Decision) -> Ans {
        match d {
            Decision::Mismatch => Ans::Mismatch,
            Decision::Completed(b) => Ans::Completed(b),
            Decision::Failed(b) => Ans::Failed(b),
            Decision::InProgress { retry_after_ms } => Ans::InProgress(retry_after_ms),
            Decision::Acquire { .. } | Decision::TakeOver { .. } => {
                unreachable!("acquisitions are answered by the caller")
            }
        }
    }
}

fn st(s: RecordState) -> St {
    match s {
        RecordState::InProgress => St::InProgress,
        RecordState::Completed => St::Completed,
        RecordState::Failed => St::Failed,
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A lease as the engine takes it: zero refused, else rounded up to whole ms (§8).
fn lease_ms(d: Duration) -> Option<u64> {
    match d.as_nanos() {
        0 => None,
        n => Some(u64::try_from(n.div_ceil(1_000_000)).unwrap_or(u64::MAX)),
    }
}

/// What a closure does when it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Body {
    /// Returns `Ok` (for execute: `Completed` or `Failed`).
    Ok(St),
    Err,
    Panic,
}

/// What a closure saw: not run, or run with `Tx::is_beyond_horizon()` false / true.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ran {
    No,
    Yes { beyond: bool },
}

#[derive(Default)]
struct Probe(AtomicU8);

impl Probe {
    fn ran(&self, beyond: bool) {
        self.0.store(1 + u8::from(beyond), Ordering::SeqCst);
    }

    fn get(&self) -> Ran {
        match self.0.load(Ordering::SeqCst) {
            0 => Ran::No,
            n => Ran::Yes { beyond: n == 2 },
        }
    }
}

/// The closure every execute / complete_with / fail_with runs: it writes its row, then does
/// what `body` says.
fn closure_work(
    tx: &mut Tx<'_>,
    probe: &Probe,
    row: &str,
    step: u64,
    body: Body,
) -> Result<(), String> {
    probe.ran(tx.is_beyond_horizon());
    let mut table = tx.open_table(ROWS).map_err(|e| e.to_string())?;
    table.insert(row, step).map_err(|e| e.to_string())?;
    match body {
        Body::Ok(_) => Ok(()),
        Body::Err => Err("planned closure error".to_string()),
        Body::Panic => std::panic::panic_any(PlannedPanic),
    }
}

/// Runs `f`, turning a planned panic into `Err(())`; any other panic goes on.
fn catching<T>(f: impl FnOnce() -> T) -> Result<T, ()> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => Ok(v),
        Err(payload) if payload.is::<PlannedPanic>() => Err(()),
        Err(payload) => resume_unwind(payload),
    }
}

/// Silences the planned panics' messages (the hook is process-wide; others still print).
fn quiet_planned_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !info.payload().is::<PlannedPanic>() {
                previous(info);
            }
        }));
    });
}

fn scope(id: Id) -> Scope {
    Scope::new(OPERATIONS[id.0], PRINCIPALS[id.0])
}

fn key(id: Id) -> Key {
    Key::new(KEY_NAMES[id.1])
}

fn row_name(id: Id) -> String {
    format!("{}/{}", OPERATIONS[id.0], KEY_NAMES[id.1])
}

/// A reservation the test holds, with the identity it is for.
struct Held {
    id: Id,
    r: Reservation,
}

/// The answer counters of `Stats` since open, as semantics.md §11 defines them: answers as
/// the caller got them; nothing for a call whose transaction was rolled back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Counters {
    acquired: u64,
    takeovers: u64,
    replays_completed: u64,
    replays_failed: u64,
    mismatches: u64,
    in_progress: u64,
    fenced: u64,
    finished: u64,
    releases: u64,
    beyond_horizon: u64,
    expired_records: u64,
    partitions_dropped: u64,
}

impl Counters {
    fn of(s: &idemdb::Stats) -> Counters {
        Counters {
            acquired: s.acquired,
            takeovers: s.takeovers,
            replays_completed: s.replays_completed,
            replays_failed: s.replays_failed,
            mismatches: s.mismatches,
            in_progress: s.in_progress,
            fenced: s.fenced,
            finished: s.finished,
            releases: s.releases,
            beyond_horizon: s.beyond_horizon,
            expired_records: s.expired_records,
            partitions_dropped: s.partitions_dropped,
        }
    }

    /// Counts an acknowledged answer with its effect; `beyond`: an execute's body ran beyond
    /// horizon.
    fn count(&mut self, ans: &Ans, effect: &Effect, beyond: bool) {
        match effect {
            Effect::Finish { .. } => self.finished += 1,
            Effect::Release { .. } => self.releases += 1,
            _ => {}
        }
        match ans {
            Ans::Acquired {
                takeover, beyond, ..
            } => {
                self.acquired += 1;
                self.takeovers += u64::from(*takeover);
                self.beyond_horizon += u64::from(*beyond);
            }
            Ans::Executed { .. } => {
                self.acquired += 1;
                self.finished += 1;
                self.takeovers +=
                    u64::from(matches!(effect, Effect::Execute { takeover: true, .. }));
                self.beyond_horizon += u64::from(beyond);
            }
            Ans::BeyondHorizon => self.beyond_horizon += 1,
            Ans::Completed(_) => self.replays_completed += 1,
            Ans::Failed(_) => self.replays_failed += 1,
            Ans::Mismatch => self.mismatches += 1,
            Ans::InProgress(_) => self.in_progress += 1,
            Ans::Fenced { .. } => self.fenced += 1,
            _ => {}
        }
    }
}

/// An operation in flight when the power went: the states it may have left (the model
/// before it, after it, or after any prefix of a compaction's steps).
struct InFlight {
    candidates: Vec<Model>,
}

/// One seed's run: the engine over a fault-injecting disk, the model, and the log.
struct Run {
    seed: u64,
    rng: Rng,
    clock: ManualClock,
    backend: FaultBackend,
    db: Option<IdemDb>,
    model: Model,
    held: Vec<Held>,
    step: usize,
    history: VecDeque<String>,
    /// A power loss is armed inside the next syncs: answers may be cut short.
    armed: bool,
    in_flight: Option<InFlight>,
    /// Answer counters since the last open.
    counters: Counters,
    /// Clock steps may go back.
    clock_back: bool,
    /// How often each interesting case came up (printed at the end).
    seen: BTreeMap<&'static str, u64>,
}

impl Run {
    fn new(seed: u64) -> Run {
        let mut rng = Rng(seed);
        let cfg = Config {
            ttl: [200 + rng.below(1_000), 200 + rng.below(3_000)],
            width: 100 + rng.below(1_000),
            factor: [0, 1, 2, 4][rng.below(4) as usize],
            max_response: 4096,
        };
        let refuse = rng.chance(30);
        let clock = ManualClock::new(START_MS);
        let mut run = Run {
            seed,
            rng,
            clock,
            backend: FaultBackend::new(),
            db: None,
            model: Model::new(cfg, refuse),
            held: Vec::new(),
            step: 0,
            history: VecDeque::new(),
            armed: false,
            in_flight: None,
            counters: Counters::default(),
            clock_back: env_u64("IDEMDB_MODEL_CLOCK_BACK").is_none_or(|v| v != 0),
            seen: BTreeMap::new(),
        };
        run.open();
        run
    }

    fn db(&self) -> &IdemDb {
        self.db.as_ref().expect("the database is open")
    }

    fn now(&self) -> u64 {
        use idemdb::Clock;
        self.clock.now_ms()
    }

    fn open(&mut self) {
        let cfg = &self.model.cfg;
        let policy = if self.model.refuse {
            BeyondHorizonPolicy::Refuse
        } else {
            BeyondHorizonPolicy::Flag
        };
        let retention = Retention::default()
            .ttl(Duration::from_millis(cfg.ttl[0]))
            .operation_ttl(OPERATIONS[1], Duration::from_millis(cfg.ttl[1]))
            .partition_width(Duration::from_millis(cfg.width))
            .horizon_factor(cfg.factor as u32)
            .beyond_horizon(policy)
            .compact_interval(None);
        let mut limits = Limits::default();
        limits.max_response_len = cfg.max_response;
        let mut builder = IdemDb::builder()
            .clock(self.clock.clone())
            .limits(limits)
            .retention(retention);
        // Even seeds register the business table: closures' batches are logged. Odd seeds
        // do not: those batches end with a durable redb commit.
        if self.seed.is_multiple_of(2) {
            builder = builder.table(ROWS);
        }
        let opened = builder.open_with_backend(self.backend.clone(), self.backend.log());
        self.counters = Counters::default();
        self.model.reopened(self.now());
        match opened {
            Ok(db) => self.db = Some(db),
            Err(e) => self.fail(format!("open failed: {e:?}")),
        }
    }

    /// Panics with everything needed to replay the failure.
    fn fail(&self, what: String) -> ! {
        let mut msg = format!(
            "model test failed: seed {} at step {}: {what}\n  config: {:?}, refuse {}\n  \
             replay: IDEMDB_MODEL_SEED={} cargo test --release --all-features --test model_based\n  \
             last steps (t = ms since start):\n",
            self.seed, self.step, self.model.cfg, self.model.refuse, self.seed
        );
        for line in &self.history {
            msg.push_str("    ");
            msg.push_str(line);
            msg.push('\n');
        }
        panic!("{msg}");
    }

    fn log(&mut self, line: String) {
        if self.history.len() == HISTORY {
            self.history.pop_front();
        }
        let t = self.now() - START_MS;
        self.history
            .push_back(format!("#{} t={t}: {line}", self.step));
    }

    fn pick_id(&mut self) -> Id {
        let s = self.rng.below(model::SCOPES as u64) as usize;
        let k = self.rng.weighted(&[50, 30, 20]);
        (s, k)
    }

    fn pick_payload(&mut self) -> usize {
        usize::from(self.rng.chance(15))
    }

    fn pick_lease(&mut self) -> Duration {
        match self.rng.weighted(&[2, 2, 3, 20, 30, 25, 18]) {
            0 => Duration::ZERO,
            1 => Duration::from_micros(1),
            2 => Duration::from_micros(1_500),
            3 => Duration::from_millis(50),
            4 => Duration::from_millis(200),
            5 => Duration::from_millis(600),
            _ => Duration::from_millis(2_000),
        }
    }

    /// The request as bytes, or (a fifth of the time) as the fingerprint of those bytes,
    /// which must be the same request.
    fn payload(&mut self, payload: usize) -> Payload<'static> {
        let bytes = PAYLOADS[payload];
        if self.rng.chance(20) {
            Payload::Fingerprint(self.db().fingerprint(bytes))
        } else {
            Payload::Bytes(bytes)
        }
    }

    /// A response: usually short, often long enough that its log frame spans several sectors
    /// (so a power loss can tear it mid-payload), sometimes over the limit.
    fn pick_response(&mut self) -> Vec<u8> {
        if self.rng.chance(8) {
            vec![b'x'; self.model.cfg.max_response + 1 + self.rng.below(4) as usize]
        } else if self.rng.chance(25) {
            let len = 600 + self.rng.below(2_400) as usize;
            let tag = format!("r{}-", self.step).into_bytes();
            tag.iter().copied().cycle().take(len).collect()
        } else {
            format!("r{}", self.step).into_bytes()
        }
    }

    /// The reservation to use: often the newest, else any kept one (stale ones included).
    fn pick_held(&mut self) -> Option<usize> {
        if self.held.is_empty() {
            return None;
        }
        let n = self.held.len() as u64;
        Some(if self.rng.chance(50) {
            self.held.len() - 1
        } else {
            self.rng.below(n) as usize
        })
    }

    fn keep(&mut self, id: Id, r: Reservation) {
        if self.held.len() == HELD {
            self.held.remove(0);
        }
        self.held.push(Held { id, r });
    }

    /// Compares, then applies the effect; or, if the power went during the call and the
    /// answer is an error, notes the call as in flight.
    fn settle(&mut self, desc: String, want: Ans, got: Ans, effect: Effect, token: Option<u64>) {
        self.settle_execute(desc, want, got, effect, token, false);
    }

    /// As `settle`; `beyond`: an execute's body ran beyond horizon (for the counters).
    fn settle_execute(
        &mut self,
        desc: String,
        want: Ans,
        got: Ans,
        effect: Effect,
        token: Option<u64>,
        beyond: bool,
    ) {
        let now = self.now();
        if self.armed && got != want && self.backend.crashed_image().is_some() {
            if !matches!(got, Ans::Other(_)) {
                self.log(format!("{desc} -> {got:?} (power lost)"));
                self.fail(format!(
                    "power lost during the call, but it answered {got:?}"
                ));
            }
            let before = self.model.clone();
            let mut after = before.clone();
            after.apply(&effect, now, None);
            self.in_flight = Some(InFlight {
                candidates: vec![before, after],
            });
            self.log(format!("{desc} -> {got:?} (in flight at the power loss)"));
            return;
        }
        self.log(format!("{desc} -> {got:?}"));
        if got != want {
            self.fail(format!("engine answered {got:?}, the model {want:?}"));
        }
        if let Some(t) = token
            && let Err(e) = self.model.note_token(t)
        {
            self.fail(e);
        }
        self.counters.count(&want, &effect, beyond);
        self.note_case(&want);
        self.model.apply(&effect, now, token);
    }

    fn saw(&mut self, case: &'static str) {
        *self.seen.entry(case).or_default() += 1;
    }

    fn note_case(&mut self, ans: &Ans) {
        let case = match ans {
            Ans::Acquired { takeover: true, .. } => "takeover",
            Ans::Acquired { beyond: true, .. } => "acquired beyond horizon",
            Ans::Acquired { .. } => "acquired",
            Ans::BeyondHorizon => "refused beyond horizon",
            Ans::Executed { .. } => "executed",
            Ans::Mismatch => "mismatch",
            Ans::Completed(_) | Ans::Failed(_) => "replay",
            Ans::InProgress(_) => "in progress",
            Ans::Fenced { .. } => "fenced",
            Ans::UnknownRecord => "unknown record",
            Ans::NotInProgress(_) => "not in progress",
            Ans::Closure => "closure error",
            Ans::Panicked => "closure panic",
            Ans::TooLong { .. } | Ans::ZeroLease => "invalid input",
            Ans::Ok => "owner op applied",
            Ans::Other(_) => "other",
        };
        self.saw(case);
    }

    // ---- operations -------------------------------------------------------------------

    /// The model's answer to a reservation, and its effect.
    fn expect_reserve(&self, id: Id, payload: usize, lease: Option<u64>) -> (Ans, Effect) {
        let Some(lease_ms) = lease else {
            return (Ans::ZeroLease, Effect::None);
        };
        let now = self.now();
        let acquired = |attempt, takeover, beyond| {
            (
                Ans::Acquired {
                    lease_expires_at: now + lease_ms,
                    attempt,
                    takeover,
                    beyond,
                },
                Effect::Acquire {
                    id,
                    payload,
                    lease_ms,
                    takeover,
                },
            )
        };
        match self.model.decide(id, payload, now) {
            Decision::Acquire { beyond: true } if self.model.refuse => {
                (Ans::BeyondHorizon, Effect::None)
            }
            Decision::Acquire { beyond } => acquired(1, false, beyond),
            Decision::TakeOver { attempt } => acquired(attempt, true, false),
            other => (Ans::of_decision(other), Effect::None),
        }
    }

    fn reserve(&mut self, wait: bool) {
        let (id, payload, lease) = (self.pick_id(), self.pick_payload(), self.pick_lease());
        let (want, effect) = self.expect_reserve(id, payload, lease_ms(lease));
        let (s, k, p) = (scope(id), key(id), self.payload(payload));
        let result = if wait {
            self.db().reserve_or_wait(&s, &k, p, lease, Duration::ZERO)
        } else {
            self.db().reserve(&s, &k, p, lease)
        };
        let (got, token) = match result {
            Ok(ReserveOutcome::Acquired(r)) => {
                let ans = Ans::Acquired {
                    lease_expires_at: r.lease_expires_at(),
                    attempt: r.attempt(),
                    takeover: r.is_takeover(),
                    beyond: r.is_beyond_horizon(),
                };
                let token = r.token().get();
                self.keep(id, r);
                (ans, Some(token))
            }
            Ok(ReserveOutcome::Mismatch) => (Ans::Mismatch, None),
            Ok(ReserveOutcome::Completed(b)) => (Ans::Completed(b), None),
            Ok(ReserveOutcome::Failed(b)) => (Ans::Failed(b), None),
            Ok(ReserveOutcome::InProgress { retry_after }) => {
                (Ans::InProgress(ms(retry_after)), None)
            }
            Ok(ReserveOutcome::BeyondHorizon) => (Ans::BeyondHorizon, None),
            Err(e) => (Ans::of_error(&e), None),
        };
        let op = if wait { "reserve_or_wait" } else { "reserve" };
        let desc = format!("{op} {id:?} payload {payload} lease {lease:?}");
        self.settle(desc, want, got, effect, token);
    }

    fn pick_body(&mut self) -> Body {
        match self.rng.weighted(&[40, 20, 22, 18]) {
            0 => Body::Ok(St::Completed),
            1 => Body::Ok(St::Failed),
            2 => Body::Err,
            _ => Body::Panic,
        }
    }

    fn execute(&mut self) {
        let (id, payload, body) = (self.pick_id(), self.pick_payload(), self.pick_body());
        let response = self.pick_response();
        let now = self.now();
        let step = self.step as u64;
        let max = self.model.cfg.max_response;
        // The model's answer, what the body should have seen, and the effect.
        let (want, want_ran, effect) = match self.model.decide(id, payload, now) {
            Decision::Acquire { beyond: true } if self.model.refuse => {
                (Ans::BeyondHorizon, Ran::No, Effect::None)
            }
            d @ (Decision::Acquire { .. } | Decision::TakeOver { .. }) => {
                let beyond = matches!(d, Decision::Acquire { beyond: true });
                let takeover = matches!(d, Decision::TakeOver { .. });
                let (want, effect) = match body {
                    Body::Err => (Ans::Closure, Effect::None),
                    Body::Panic => (Ans::Panicked, Effect::None),
                    Body::Ok(_) if response.len() > max => (
                        Ans::TooLong {
                            len: response.len(),
                            max,
                        },
                        Effect::None,
                    ),
                    Body::Ok(state) => (
                        Ans::Executed {
                            completed: state == St::Completed,
                            response: response.clone(),
                        },
                        Effect::Execute {
                            id,
                            payload,
                            state,
                            response: response.clone(),
                            takeover,
                            row: step,
                        },
                    ),
                };
                (want, Ran::Yes { beyond }, effect)
            }
            other => (Ans::of_decision(other), Ran::No, Effect::None),
        };
        let probe = Arc::new(Probe::default());
        let seen = Arc::clone(&probe);
        let row = row_name(id);
        let out = response.clone();
        let closure = move |tx: &mut Tx<'_>| -> Result<Outcome, String> {
            closure_work(tx, &seen, &row, step, body)?;
            Ok(match body {
                Body::Ok(St::Failed) => Outcome::Failed(out),
                _ => Outcome::Completed(out),
            })
        };
        let (s, k) = (scope(id), key(id));
        let p = self.payload(payload);
        let result = catching(|| self.db().execute(&s, &k, p, closure));
        let got = match result {
            Err(()) => Ans::Panicked,
            Ok(Ok(ExecuteOutcome::Executed(o))) => Ans::Executed {
                completed: matches!(o, Outcome::Completed(_)),
                response: o.response().to_vec(),
            },
            Ok(Ok(ExecuteOutcome::Mismatch)) => Ans::Mismatch,
            Ok(Ok(ExecuteOutcome::Completed(b))) => Ans::Completed(b),
            Ok(Ok(ExecuteOutcome::Failed(b))) => Ans::Failed(b),
            Ok(Ok(ExecuteOutcome::InProgress { retry_after })) => Ans::InProgress(ms(retry_after)),
            Ok(Ok(ExecuteOutcome::BeyondHorizon)) => Ans::BeyondHorizon,
            Ok(Err(e)) => Ans::of_execute_error(&e),
        };
        let ran = probe.get();
        let desc = format!(
            "execute {id:?} payload {payload} body {body:?} response {:?} (body ran: {ran:?})",
            String::from_utf8_lossy(&response)
        );
        if ran != want_ran && !(self.armed && self.backend.crashed_image().is_some()) {
            self.log(format!("{desc} -> {got:?}"));
            self.fail(format!("the body ran {ran:?}, the model says {want_ran:?}"));
        }
        let beyond = want_ran == Ran::Yes { beyond: true };
        self.settle_execute(desc, want, got, effect, None, beyond);
    }

    /// Owner operations: complete, fail, release, extend, complete_with, fail_with.
    fn owner(&mut self) {
        let Some(i) = self.pick_held() else {
            return self.reserve(false);
        };
        let kind = self.rng.weighted(&[25, 15, 18, 18, 14, 10]);
        let id = self.held[i].id;
        let token = self.held[i].r.token().get();
        let response = self.pick_response();
        let lease = self.pick_lease();
        let body = match self.rng.weighted(&[70, 18, 12]) {
            0 => Body::Ok(St::Completed),
            1 => Body::Err,
            _ => Body::Panic,
        };
        let state = if matches!(kind, 1 | 5) {
            St::Failed
        } else {
            St::Completed
        };
        let now = self.now();
        let max = self.model.cfg.max_response;
        let takes_response = !matches!(kind, 2 | 3);
        // semantics.md §4: input, then the owner checks, then the closure.
        let checked: Result<(), Ans> = if takes_response && response.len() > max {
            Err(Ans::TooLong {
                len: response.len(),
                max,
            })
        } else if kind == 3 && lease_ms(lease).is_none() {
            Err(Ans::ZeroLease)
        } else {
            self.model
                .check_owner(id, token, now)
                .map_err(Ans::of_refusal)
        };
        let (want, want_ran, effect) = match checked {
            Err(refusal) => (refusal, Ran::No, Effect::None),
            Ok(()) => match kind {
                0 | 1 => (
                    Ans::Ok,
                    Ran::No,
                    Effect::Finish {
                        id,
                        state,
                        response: response.clone(),
                        row: None,
                    },
                ),
                2 => (Ans::Ok, Ran::No, Effect::Release { id }),
                3 => (
                    Ans::Ok,
                    Ran::No,
                    Effect::Extend {
                        id,
                        lease_ms: lease_ms(lease).unwrap_or(0),
                    },
                ),
                _ => match body {
                    Body::Err => (Ans::Closure, Ran::Yes { beyond: false }, Effect::None),
                    Body::Panic => (Ans::Panicked, Ran::Yes { beyond: false }, Effect::None),
                    Body::Ok(_) => (
                        Ans::Ok,
                        Ran::Yes { beyond: false },
                        Effect::Finish {
                            id,
                            state,
                            response: response.clone(),
                            row: Some(self.step as u64),
                        },
                    ),
                },
            },
        };
        let lease_before = self.held[i].r.lease_expires_at();
        let probe = Arc::new(Probe::default());
        let (got, op) = match kind {
            0 | 1 => {
                let db = self.db.as_ref().expect("open");
                let r = &self.held[i].r;
                let result = if kind == 0 {
                    db.complete(r, response.clone())
                } else {
                    db.fail(r, response.clone())
                };
                (
                    owner_ans(result),
                    if kind == 0 { "complete" } else { "fail" },
                )
            }
            2 => {
                let db = self.db.as_ref().expect("open");
                (owner_ans(db.release(&self.held[i].r)), "release")
            }
            3 => {
                let db = self.db.as_ref().expect("open");
                (owner_ans(db.extend(&mut self.held[i].r, lease)), "extend")
            }
            _ => {
                let seen = Arc::clone(&probe);
                let (row, step) = (row_name(id), self.step as u64);
                let business = move |tx: &mut Tx<'_>| closure_work(tx, &seen, &row, step, body);
                let db = self.db.as_ref().expect("open");
                let r = &self.held[i].r;
                let result = catching(|| {
                    if kind == 4 {
                        db.complete_with(r, response.clone(), business)
                    } else {
                        db.fail_with(r, response.clone(), business)
                    }
                });
                let got = match result {
                    Err(()) => Ans::Panicked,
                    Ok(Ok(())) => Ans::Ok,
                    Ok(Err(e)) => Ans::of_execute_error(&e),
                };
                let name = if kind == 4 {
                    "complete_with"
                } else {
                    "fail_with"
                };
                (got, name)
            }
        };
        let ran = probe.get();
        let desc = format!(
            "{op} {id:?} token {token} response {:?} lease {lease:?} body {body:?} (body ran: {ran:?})",
            String::from_utf8_lossy(&response)
        );
        let crashed = self.armed && self.backend.crashed_image().is_some();
        if ran != want_ran && !crashed {
            self.log(format!("{desc} -> {got:?}"));
            self.fail(format!(
                "the business closure ran {ran:?}, the model says {want_ran:?}"
            ));
        }
        // extend updates the reservation it was given on success only.
        if kind == 3 && !crashed {
            let want_lease = match (&want, lease_ms(lease)) {
                (Ans::Ok, Some(l)) => now + l,
                _ => lease_before,
            };
            let lease_now = self.held[i].r.lease_expires_at();
            if got == want && lease_now != want_lease {
                self.log(format!("{desc} -> {got:?}"));
                self.fail(format!(
                    "after extend the reservation's lease_expires_at is {lease_now}, expected {want_lease}"
                ));
            }
        }
        self.settle(desc, want, got, effect, None);
    }

    fn get(&mut self) {
        let id = self.pick_id();
        let got = self.db().get(&scope(id), &key(id));
        self.log(format!("get {id:?} -> {got:?}"));
        // The comparison itself is `check_id`, run after every step.
    }

    fn advance(&mut self, large: bool) {
        // Sometimes step the clock back (issue 11, defect 3b); IDEMDB_MODEL_CLOCK_BACK=0 keeps
        // the clock monotone.
        if self.clock_back && self.rng.chance(20) {
            let back = self.rng.below(3_000).min(self.now() - START_MS);
            self.clock.set(self.now() - back);
            self.log(format!("clock -{back} ms"));
            return;
        }
        let by = if large {
            500 + self.rng.below(20_000)
        } else {
            self.rng.below(300)
        };
        self.clock.advance(Duration::from_millis(by));
        self.log(format!("clock +{by} ms"));
    }

    fn compact(&mut self) {
        let now = self.now();
        let got = self.db().compact_now();
        if self.armed && got.is_err() && self.backend.crashed_image().is_some() {
            self.log(format!(
                "compact_now -> {got:?} (in flight at the power loss)"
            ));
            self.in_flight = Some(InFlight {
                candidates: self.model.compaction_prefixes(now),
            });
            self.saw("compaction in flight at a power loss");
            return;
        }
        let want = self.model.compact(now);
        self.log(format!("compact_now -> {got:?}"));
        match got {
            Ok(r) => {
                let got = model::Report {
                    partitions_dropped: r.partitions_dropped,
                    records_expired: r.records_expired,
                    in_flight_expired: r.in_flight_expired,
                };
                if got != want {
                    self.fail(format!("compaction removed {got:?}, the model {want:?}"));
                }
                self.counters.expired_records += want.records_expired + want.in_flight_expired;
                if want.partitions_dropped + want.in_flight_expired > 0 {
                    self.saw("compaction removed records");
                }
                self.counters.partitions_dropped += want.partitions_dropped;
            }
            Err(e) => self.fail(format!("compact_now failed: {e:?}")),
        }
    }

    fn reopen(&mut self) {
        drop(self.db.take());
        self.model.refuse = self.rng.chance(30);
        self.log(format!("close + reopen (refuse {})", self.model.refuse));
        self.open();
    }

    /// A power loss: now, or inside the syncs of the next write; the disk's pending writes
    /// are dropped, kept or torn, and the database reopens from what survived.
    fn power_loss(&mut self) {
        let mode = match self.rng.below(4) {
            0 => TearMode::DropAll,
            1 => TearMode::KeepAll,
            _ => TearMode::Random(self.rng.next()),
        };
        if self.rng.chance(60) {
            self.backend.crash_at_sync(self.rng.below(2), mode);
            self.armed = true;
            match self.rng.below(4) {
                0 => self.reserve(false),
                1 => self.execute(),
                2 => self.compact(),
                _ => self.owner(),
            }
        }
        let disk = self
            .backend
            .crashed_disk()
            .unwrap_or_else(|| self.backend.crash_disk(mode.fates()));
        self.armed = false;
        self.backend.kill();
        drop(self.db.take());
        self.backend = disk;
        self.model.refuse = self.rng.chance(30);
        self.log(format!(
            "power loss ({mode:?}), reopen (refuse {})",
            self.model.refuse
        ));
        self.open();
        if let Some(flight) = self.in_flight.take() {
            self.resolve(flight);
        }
    }

    /// The call in flight at a power loss happened entirely or not at all (a compaction:
    /// a prefix of its steps): the engine's records, rows and stored counts must be one of
    /// the candidate states.
    fn resolve(&mut self, flight: InFlight) {
        let now = self.now();
        let (refuse, n) = (self.model.refuse, flight.candidates.len());
        let counts: Vec<_> = flight.candidates.iter().map(Model::stored).collect();
        let found = flight
            .candidates
            .into_iter()
            .enumerate()
            .find_map(|(i, mut m)| {
                // Taken before the reopen: the policy is the one just opened with, and only
                // recognition still running was loaded.
                m.refuse = refuse;
                m.reopened(now);
                self.differs(&m).is_none().then_some((i, m))
            });
        match found {
            Some((i, m)) => {
                self.saw(if i == 0 {
                    "in flight at a power loss: lost"
                } else {
                    "in flight at a power loss: survived"
                });
                self.model = m;
                self.log(format!("  in flight: state {i} of {n} candidates survived"));
            }
            None => {
                let before = self.differs(&self.model).unwrap_or_default();
                self.fail(format!(
                    "after the power loss the state is none of the {n} the call in flight \
                     may have left (their stored counts: {counts:?}); against the state before \
                     it: {before}"
                ));
            }
        }
    }

    /// Where the engine differs from `m` (records, rows, stored counts); unseen tokens of
    /// `m` match any.
    fn differs(&self, m: &Model) -> Option<String> {
        let now = self.now();
        let db = self.db();
        for id in all_ids() {
            let got = match db.get(&scope(id), &key(id)) {
                Ok(r) => r,
                Err(e) => return Some(format!("get {id:?}: {e:?}")),
            };
            let fp = |p: usize| db.fingerprint(PAYLOADS[p]);
            if let Some(diff) = record_diff(got.as_ref(), m.live(id, now), fp) {
                return Some(format!("{id:?}: {diff}"));
            }
        }
        let rows = self.read_rows();
        if rows != m.rows {
            return Some(format!("rows {rows:?}, the model {:?}", m.rows));
        }
        let stats = db.stats();
        let got = (
            stats.stored_records,
            stats.in_flight_records,
            stats.partitions,
            stats.horizon_keys,
        );
        (got != m.stored()).then(|| {
            format!(
                "(stored, in flight, partitions, horizon keys) = {got:?}, the model {:?}",
                m.stored()
            )
        })
    }

    // ---- checks after every step ------------------------------------------------------

    fn read_rows(&self) -> BTreeMap<Id, u64> {
        let mut rows = BTreeMap::new();
        let txn = match self.db().begin_read() {
            Ok(t) => t,
            Err(e) => self.fail(format!("begin_read: {e:?}")),
        };
        let table = match txn.open_table(ROWS) {
            Ok(t) => t,
            Err(idemdb::redb::TableError::TableDoesNotExist(_)) => return rows,
            Err(e) => self.fail(format!("open rows: {e:?}")),
        };
        for id in all_ids() {
            match table.get(row_name(id).as_str()) {
                Ok(Some(v)) => {
                    rows.insert(id, v.value());
                }
                Ok(None) => {}
                Err(e) => self.fail(format!("read row: {e:?}")),
            }
        }
        rows
    }

    /// `get` of every identity equals the model's live record; tokens not seen yet are
    /// learnt here (and must be above every earlier one).
    fn check_state(&mut self) {
        let now = self.now();
        for id in all_ids() {
            let got = match self.db().get(&scope(id), &key(id)) {
                Ok(r) => r,
                Err(e) => self.fail(format!("get {id:?}: {e:?}")),
            };
            let want = self.model.live(id, now).cloned();
            if let (Some(g), Some(w)) = (&got, &want)
                && w.token.is_none()
            {
                if let Err(e) = self.model.note_token(g.token.get()) {
                    self.fail(format!("{id:?}: {e}"));
                }
                self.model.learn_token(id, now, g.token.get());
            }
            let fp = |p: usize| self.db().fingerprint(PAYLOADS[p]);
            if let Some(diff) = record_diff(got.as_ref(), self.model.live(id, now), fp) {
                self.fail(format!("get {id:?}: {diff}"));
            }
        }
        let rows = self.read_rows();
        if rows != self.model.rows {
            self.fail(format!(
                "business rows {rows:?}, the model {:?}",
                self.model.rows
            ));
        }
        let stats = self.db().stats();
        let got = (
            stats.stored_records,
            stats.in_flight_records,
            stats.partitions,
            stats.horizon_keys,
        );
        let want = self.model.stored();
        if got != want {
            self.fail(format!(
                "stats (stored, in flight, partitions, horizon keys) = {got:?}, the model {want:?}"
            ));
        }
        let got = Counters::of(&stats);
        if got != self.counters {
            self.fail(format!(
                "stats counters {got:?}, the model {:?}",
                self.counters
            ));
        }
    }

    fn step_once(&mut self) {
        match self.rng.weighted(&[18, 5, 14, 30, 4, 12, 4, 5, 3, 3]) {
            0 => self.reserve(false),
            1 => self.reserve(true),
            2 => self.execute(),
            3 => self.owner(),
            4 => self.get(),
            5 => self.advance(false),
            6 => self.advance(true),
            7 => self.compact(),
            8 => self.reopen(),
            _ => self.power_loss(),
        }
        self.check_state();
    }
}

/// Where the engine's record differs from the model's (an unseen model token matches any).
fn record_diff(
    got: Option<&Record>,
    want: Option<&model::Rec>,
    fingerprint: impl Fn(usize) -> idemdb::Fingerprint,
) -> Option<String> {
    let (g, w) = match (got, want) {
        (None, None) => return None,
        (Some(g), Some(w)) => (g, w),
        (g, w) => return Some(format!("engine has {g:?}, the model {w:?}")),
    };
    let same = st(g.state) == w.state
        && g.fingerprint == fingerprint(w.payload)
        && w.token.is_none_or(|t| t == g.token.get())
        && g.lease_expires_at == w.lease_expires_at
        && g.created_at == w.created_at
        && g.updated_at == w.updated_at
        && g.attempts == w.attempts
        && g.expires_at == w.expires_at
        && g.response == w.response;
    (!same).then(|| format!("engine has {g:?}, the model {w:?}"))
}

fn owner_ans(result: Result<(), Error>) -> Ans {
    match result {
        Ok(()) => Ans::Ok,
        Err(e) => Ans::of_error(&e),
    }
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

/// Runs one seed; returns how often each case came up.
fn run_seed(seed: u64, steps: usize) -> BTreeMap<&'static str, u64> {
    let mut run = Run::new(seed);
    while run.step < steps {
        run.step += 1;
        run.step_once();
    }
    run.seen
}

/// The first line of a panic's message.
fn panic_line(payload: &(dyn std::any::Any + Send)) -> String {
    let text = payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied())
        .unwrap_or("(non-string panic)");
    text.lines().next().unwrap_or_default().to_string()
}

#[test]
fn engine_matches_the_model_of_docs_semantics() {
    quiet_planned_panics();
    let steps = env_u64("IDEMDB_MODEL_STEPS").map_or(DEFAULT_STEPS, |s| s as usize);
    let seeds: Vec<u64> = match env_u64("IDEMDB_MODEL_SEED") {
        Some(seed) => vec![seed],
        None => (0..env_u64("IDEMDB_MODEL_SEEDS").unwrap_or(DEFAULT_SEEDS)).collect(),
    };
    // IDEMDB_MODEL_SURVEY=1: run every seed, then list each failing seed's first line.
    let survey = env_u64("IDEMDB_MODEL_SURVEY").is_some_and(|v| v != 0);
    let started = Instant::now();
    let mut failures = Vec::new();
    let mut seen: BTreeMap<&'static str, u64> = BTreeMap::new();
    for &seed in &seeds {
        let cases = if survey {
            match catch_unwind(|| run_seed(seed, steps)) {
                Ok(cases) => cases,
                Err(payload) => {
                    failures.push(panic_line(&*payload));
                    continue;
                }
            }
        } else {
            run_seed(seed, steps)
        };
        for (case, n) in cases {
            *seen.entry(case).or_default() += n;
        }
    }
    eprintln!(
        "model test: {} seeds x {steps} steps in {:.1} s; cases: {seen:?}",
        seeds.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(
        failures.is_empty(),
        "{} of {} seeds failed:\n{}",
        failures.len(),
        seeds.len(),
        failures.join("\n")
    );
}
