//! Applies queued operations inside one redb write transaction. Pure state transitions over
//! the record tables (in-flight and partitions); committing and batching live in the writer.

use std::panic::{AssertUnwindSafe, catch_unwind};

use redb::{Durability, WriteTransaction};

use super::op::{BusinessFn, ClosureFailed, ExecuteFn, OpOutput, RecordOp, RunFn, WriteOp};
use crate::config::Limits;
use crate::engine::Engine;
use crate::error::Error;
use crate::outbox_state::OutboxState;
use crate::record::{Record, RecordState};
use crate::records::locate::Found;
use crate::records::overlay::Written;
use crate::records::txn::{Created, Records};
use crate::tables::TableRegistry;
use crate::tx::{Tx, TxEnv};
use crate::tx_table::BusinessLog;
use crate::wal::Effect;
use idemdb_core::decide::{Decision, Replay, check_owner, decide, new_owner};
use idemdb_core::fingerprint::Fingerprint;
use idemdb_core::outcome::{ExecuteOutcome, Outcome, ReserveOutcome};
use idemdb_core::retention::BeyondHorizonPolicy;
use idemdb_core::scope::RecordKey;
use idemdb_core::token::{FencingToken, Grant, Reservation};

/// State shared by the ops of one transaction.
pub(crate) struct Ctx<'a> {
    pub(crate) now_ms: u64,
    pub(crate) database_id: u64,
    /// The next fencing token to issue; advanced by every acquisition.
    pub(crate) next_token: &'a mut u64,
    pub(crate) limits: &'a Limits,
    /// The caller tables whose writes are logged.
    pub(crate) tables: &'a TableRegistry,
    /// Where staged messages take their numbers.
    pub(crate) outbox: &'a OutboxState,
}

impl<'a> Ctx<'a> {
    /// What a closure's transaction uses.
    fn tx_env(&self) -> TxEnv<'a> {
        TxEnv {
            tables: self.tables,
            limits: self.limits,
            outbox: self.outbox,
            now_ms: self.now_ms,
        }
    }
}

/// The result of applying one op.
pub(crate) struct Applied {
    pub(crate) output: Result<OpOutput, Error>,
    /// The op changed its record (waiters on the key should look again).
    pub(crate) changed: bool,
    /// The op's writes must not commit: its closure failed or panicked, or a write failed.
    pub(crate) abort: bool,
    /// The op met a key beyond its retention (acquired with the flag, or refused).
    pub(crate) beyond_horizon: bool,
    /// An execute that took over an expired lease: its answer does not say so, so the writer
    /// counts it (a reservation's takeover is counted from its `Reservation`).
    pub(crate) execute_takeover: bool,
    /// What its closure wrote to caller tables.
    pub(crate) business: BusinessLog,
}

impl Applied {
    fn answer(output: Result<OpOutput, Error>) -> Self {
        Applied {
            output,
            changed: false,
            abort: false,
            beyond_horizon: false,
            execute_takeover: false,
            business: BusinessLog::default(),
        }
    }

    /// Refused by the beyond-horizon policy: nothing written.
    fn refused(output: OpOutput) -> Self {
        Applied {
            beyond_horizon: true,
            ..Applied::answer(Ok(output))
        }
    }

    fn changed(output: OpOutput) -> Self {
        Applied {
            changed: true,
            ..Applied::answer(Ok(output))
        }
    }

    fn aborted(output: Result<OpOutput, Error>) -> Self {
        Applied {
            abort: true,
            ..Applied::answer(output)
        }
    }

    /// With what its closure wrote.
    fn wrote(self, business: BusinessLog) -> Self {
        Applied { business, ..self }
    }
}

/// One applied, not yet committed transaction of a batch.
pub(super) struct Segment {
    /// Its redb transaction, for the caller tables its closure writes: only a segment that
    /// runs caller code has one (its records are deferred like every other's).
    pub(super) txn: Option<WriteTransaction>,
    pub(super) applied: Vec<Applied>,
    /// Partitions it added to the catalog.
    pub(super) created: Created,
    /// What it wrote, as post-images for the log.
    pub(super) effects: Vec<Effect>,
    /// Its record writes, newest per (table, key): into the overlay once durable.
    pub(super) written: Written,
    /// Every write is in `effects`: no closure wrote a table the log cannot replay.
    pub(super) logged: bool,
}

/// Applies `ops` in queue order (I18: tokens of one batch increase in that order) over the
/// snapshot, the overlay and `earlier` (what the batch's committed transactions wrote). Record
/// writes stay in memory (`Segment::written`) until the batch is durable; a segment that runs
/// caller code also opens a redb transaction for the caller's tables, left uncommitted: it
/// commits with `Durability::None`, the log (or a durable commit after it) being its
/// durability.
pub(super) fn apply_segment(
    engine: &Engine,
    ops: Vec<WriteOp>,
    ctx: &mut Ctx<'_>,
    earlier: &Written,
) -> Result<Segment, Error> {
    let txn = if ops.iter().any(WriteOp::runs_closure) {
        let mut txn = engine.db.begin_write()?;
        txn.set_durability(Durability::None)?;
        Some(txn)
    } else {
        None
    };
    let mut applied = Vec::with_capacity(ops.len());
    let finished = {
        let mut records = Records::deferred(&engine.snapshots, &engine.layout, earlier);
        for op in ops {
            applied.push(apply(op, txn.as_ref(), &mut records, ctx));
        }
        records.finish()
    };
    let mut effects = finished.effects;
    let mut logged = true;
    for a in &mut applied {
        logged &= !a.business.unlogged;
        effects.append(&mut a.business.effects);
    }
    Ok(Segment {
        txn,
        applied,
        created: finished.created,
        effects,
        written: finished.written,
        logged,
    })
}

pub(crate) fn apply(
    op: WriteOp,
    txn: Option<&WriteTransaction>,
    records: &mut Records<'_>,
    ctx: &mut Ctx<'_>,
) -> Applied {
    match try_apply(op, txn, records, ctx) {
        Ok(applied) => applied,
        Err(Stop::Answer(e)) => Applied::answer(Err(e)),
        Err(Stop::Abort(e)) => Applied::aborted(Err(e)),
    }
}

/// Why an op stopped with an error, decided where it happened.
enum Stop {
    /// Nothing of the op was written and the transaction is sound: its caller alone is told.
    Answer(Error),
    /// A write failed, or a read failed in storage, or the op's own writes cannot stand: the
    /// transaction must roll back.
    Abort(Error),
}

/// One op, dispatched to the step of its kind.
fn try_apply(
    op: WriteOp,
    txn: Option<&WriteTransaction>,
    records: &mut Records<'_>,
    ctx: &mut Ctx<'_>,
) -> Result<Applied, Stop> {
    let (key, op) = match op {
        WriteOp::Run { body } => return apply_run(body, txn, ctx),
        WriteOp::Record { key, op } => (key, op),
    };
    let hash = records.layout.index.hash(key.as_bytes());
    // A stored record that fails validation is this op's problem alone; a failed read leaves
    // the transaction suspect.
    let found = records.find(&key, hash, ctx.now_ms).map_err(|e| match e {
        Error::Corrupted(_) => Stop::Answer(e),
        _ => Stop::Abort(e),
    })?;
    let at = At { key, hash, found };
    match op {
        RecordOp::Reserve {
            fingerprint,
            lease_ms,
        } => apply_reserve(at, fingerprint, lease_ms, records, ctx),
        RecordOp::Finish {
            token,
            state,
            response,
            business,
        } => apply_finish(at, token, (state, response), business, txn, records, ctx),
        RecordOp::Release { token } => apply_release(at, token, records),
        RecordOp::Extend { token, lease_ms } => apply_extend(at, token, lease_ms, records, ctx),
        RecordOp::Execute { fingerprint, body } => {
            apply_execute(at, fingerprint, body, txn, records, ctx)
        }
    }
}

/// The key an op is about, its hash, and what the store holds for it.
struct At {
    key: RecordKey,
    hash: u64,
    found: Found,
}

/// Only a segment of one op that runs caller code has a transaction (apply_segment).
fn with_txn(txn: Option<&WriteTransaction>) -> Result<&WriteTransaction, Stop> {
    txn.ok_or_else(|| Stop::Abort(Error::Internal("caller code without a transaction".into())))
}

/// `run`: the caller's closure over its tables, without a record.
fn apply_run(body: RunFn, txn: Option<&WriteTransaction>, ctx: &Ctx<'_>) -> Result<Applied, Stop> {
    let mut tx = Tx::new(with_txn(txn)?, ctx.tx_env(), None, false);
    Ok(match run_closure(|| body(&mut tx)) {
        Ok(()) => Applied::changed(OpOutput::Ran).wrote(tx.into_log()),
        Err(failed) => Applied::aborted(Ok(failed)),
    })
}

/// `reserve`: a replay, a refusal, or the key acquired with a new token and lease.
fn apply_reserve(
    at: At,
    fingerprint: Fingerprint,
    lease_ms: u64,
    records: &mut Records<'_>,
    ctx: &mut Ctx<'_>,
) -> Result<Applied, Stop> {
    let lease_expires_at = ctx.now_ms.saturating_add(lease_ms);
    let At { key, hash, found } = at;
    let claim =
        claim(found, fingerprint, lease_expires_at, records, hash, ctx).map_err(Stop::Answer)?;
    let (mut rec, takeover, beyond) = match claim {
        Claim::Replay(r) => return Ok(Applied::answer(Ok(OpOutput::Reserved(r.into())))),
        Claim::Refused => {
            return Ok(Applied::refused(OpOutput::Reserved(
                ReserveOutcome::BeyondHorizon,
            )));
        }
        Claim::Acquired {
            rec,
            takeover,
            beyond,
        } => (rec, takeover, beyond),
    };
    records.store(&key, hash, &mut rec).map_err(Stop::Abort)?;
    let acquired = Reservation::issue(Grant {
        database_id: ctx.database_id,
        record_key: key,
        token: rec.token,
        lease_expires_at,
        attempt: rec.attempts,
        takeover,
        beyond_horizon: beyond,
    });
    let mut applied = Applied::changed(OpOutput::Reserved(ReserveOutcome::Acquired(acquired)));
    applied.beyond_horizon = beyond;
    Ok(applied)
}

/// `complete` / `fail` (and their `_with` forms, whose closure writes the caller's tables):
/// the owner's record finished with its response.
fn apply_finish(
    at: At,
    token: FencingToken,
    (state, response): (RecordState, Vec<u8>),
    business: Option<BusinessFn>,
    txn: Option<&WriteTransaction>,
    records: &mut Records<'_>,
    ctx: &Ctx<'_>,
) -> Result<Applied, Stop> {
    let mut rec = match check_owner(at.found.live, token) {
        Ok(rec) => rec,
        Err(e) => return Ok(Applied::answer(Err(e.into()))),
    };
    let mut wrote = BusinessLog::default();
    if let Some(business) = business {
        let mut tx = Tx::new(with_txn(txn)?, ctx.tx_env(), Some(&at.key), false);
        match run_closure(|| business(&mut tx)) {
            Ok(()) => wrote = tx.into_log(),
            Err(failed) => return Ok(Applied::aborted(Ok(failed))),
        }
    }
    rec.state = state;
    rec.updated_at = ctx.now_ms;
    rec.response = response;
    records
        .store(&at.key, at.hash, &mut rec)
        .map_err(Stop::Abort)?;
    Ok(Applied::changed(OpOutput::Done).wrote(wrote))
}

/// `release`: the owner's IN_PROGRESS record removed, so that a retry runs again.
fn apply_release(at: At, token: FencingToken, records: &mut Records<'_>) -> Result<Applied, Stop> {
    if let Err(e) = check_owner(at.found.live, token) {
        return Ok(Applied::answer(Err(e.into())));
    }
    records.remove(&at.key, at.hash).map_err(Stop::Abort)?;
    Ok(Applied::changed(OpOutput::Done))
}

/// `extend`: the owner's lease renewed from now.
fn apply_extend(
    at: At,
    token: FencingToken,
    lease_ms: u64,
    records: &mut Records<'_>,
    ctx: &Ctx<'_>,
) -> Result<Applied, Stop> {
    let mut rec = match check_owner(at.found.live, token) {
        Ok(rec) => rec,
        Err(e) => return Ok(Applied::answer(Err(e.into()))),
    };
    rec.lease_expires_at = ctx.now_ms.saturating_add(lease_ms);
    rec.updated_at = ctx.now_ms;
    records
        .store(&at.key, at.hash, &mut rec)
        .map_err(Stop::Abort)?;
    Ok(Applied::changed(OpOutput::Extended {
        lease_expires_at: rec.lease_expires_at,
    }))
}

/// `execute`: claims the key, runs the caller's closure and stores its outcome, all in one
/// transaction; or replays, or refuses.
fn apply_execute(
    at: At,
    fingerprint: Fingerprint,
    body: ExecuteFn,
    txn: Option<&WriteTransaction>,
    records: &mut Records<'_>,
    ctx: &mut Ctx<'_>,
) -> Result<Applied, Stop> {
    let now = ctx.now_ms;
    let At { key, hash, found } = at;
    // Claimed before the closure runs: no error may follow its writes but a rollback.
    let claimed = claim(found, fingerprint, now, records, hash, ctx).map_err(Stop::Answer)?;
    let (mut rec, beyond, takeover) = match claimed {
        Claim::Replay(r) => return Ok(Applied::answer(Ok(OpOutput::Executed(r.into())))),
        Claim::Refused => {
            return Ok(Applied::refused(OpOutput::Executed(
                ExecuteOutcome::BeyondHorizon,
            )));
        }
        Claim::Acquired {
            rec,
            beyond,
            takeover,
        } => (rec, beyond, takeover),
    };
    let mut tx = Tx::new(with_txn(txn)?, ctx.tx_env(), Some(&key), beyond);
    let outcome = match run_closure(|| body(&mut tx)) {
        Ok(outcome) => outcome,
        Err(failed) => return Ok(Applied::aborted(Ok(failed))),
    };
    let wrote = tx.into_log();
    if let Err(e) = ctx.limits.check_response(outcome.response()) {
        return Ok(Applied::aborted(Err(e.into())));
    }
    let (state, response) = match &outcome {
        Outcome::Completed(b) => (RecordState::Completed, b.clone()),
        Outcome::Failed(b) => (RecordState::Failed, b.clone()),
    };
    rec.state = state;
    rec.response = response;
    records.store(&key, hash, &mut rec).map_err(Stop::Abort)?;
    let mut applied =
        Applied::changed(OpOutput::Executed(ExecuteOutcome::Executed(outcome))).wrote(wrote);
    applied.beyond_horizon = beyond;
    applied.execute_takeover = takeover;
    Ok(applied)
}

/// Runs a caller's closure, containing its panic so that neighbours in the batch are not hurt.
fn run_closure<T>(f: impl FnOnce() -> Result<T, ClosureFailed>) -> Result<T, OpOutput> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(ClosureFailed)) => Err(OpOutput::ClosureFailed),
        Err(payload) => Err(OpOutput::ClosurePanicked(payload)),
    }
}

/// What a reservation or an execute claims: the answer to a duplicate, a refusal by the
/// beyond-horizon policy, or a new IN_PROGRESS record (not stored yet).
enum Claim {
    Replay(Replay),
    Refused,
    Acquired {
        rec: Record,
        takeover: bool,
        beyond: bool,
    },
}

/// I12: decides on the live record and acquires the key if the decision says so (a fresh
/// record, or the takeover of an expired lease, with a new token), reading and writing in the
/// same write transaction.
fn claim(
    found: Found,
    fingerprint: Fingerprint,
    lease_expires_at: u64,
    records: &Records<'_>,
    hash: u64,
    ctx: &mut Ctx<'_>,
) -> Result<Claim, Error> {
    let now = ctx.now_ms;
    let (previous, beyond) = match decide(found.live, fingerprint, now) {
        Decision::Replay(r) => return Ok(Claim::Replay(r)),
        // A takeover is never beyond horizon: its record is live.
        Decision::TakeOver(rec) => (Some(rec), false),
        Decision::Acquire => (None, records.beyond_horizon(found.expired, hash, now)?),
    };
    if beyond && records.layout.rules.policy == BeyondHorizonPolicy::Refuse {
        return Ok(Claim::Refused);
    }
    let token = FencingToken::new(*ctx.next_token)
        .ok_or_else(|| Error::Internal("fencing token counter at 0".into()))?;
    *ctx.next_token = ctx
        .next_token
        .checked_add(1)
        .ok_or_else(|| Error::Internal("fencing tokens exhausted".into()))?;
    let takeover = previous.is_some();
    let rec = new_owner(previous.as_ref(), fingerprint, token, lease_expires_at, now);
    Ok(Claim::Acquired {
        rec,
        takeover,
        beyond,
    })
}
