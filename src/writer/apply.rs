//! Applies queued operations inside one redb write transaction. Pure state transitions over
//! the records table; committing and batching live in the writer.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Duration;

use redb::{ReadableTable, Table, WriteTransaction};

use crate::config::Limits;
use crate::decide::{Decision, check_owner, decide};
use crate::error::Error;
use crate::outcome::{ExecuteOutcome, Outcome, ReserveOutcome};
use crate::record::{Record, RecordState};
use crate::scope::RecordKey;
use crate::token::{FencingToken, Reservation};
use crate::tx::Tx;
use crate::writer::op::{ClosureFailed, OpOutput, WriteOp};

/// State shared by the ops of one transaction.
pub(crate) struct Ctx<'a> {
    pub(crate) now_ms: u64,
    /// The next fencing token to issue; advanced by every acquisition.
    pub(crate) next_token: &'a mut u64,
    pub(crate) limits: &'a Limits,
}

/// The result of applying one op.
pub(crate) struct Applied {
    pub(crate) output: Result<OpOutput, Error>,
    /// The op changed its record (waiters on the key should look again).
    pub(crate) changed: bool,
    /// The op's writes must not commit: its closure failed or panicked, or a write failed.
    pub(crate) abort: bool,
}

impl Applied {
    fn answer(output: Result<OpOutput, Error>) -> Self {
        Applied {
            output,
            changed: false,
            abort: false,
        }
    }

    fn changed(output: OpOutput) -> Self {
        Applied {
            output: Ok(output),
            changed: true,
            abort: false,
        }
    }

    fn aborted(output: Result<OpOutput, Error>) -> Self {
        Applied {
            output,
            changed: false,
            abort: true,
        }
    }
}

type Table2<'t> = Table<'t, &'static [u8], &'static [u8]>;

/// The two record tables of one write transaction (meta.rs): finished records and IN_PROGRESS
/// ones. Invariant: a key is in at most one of them.
pub(crate) struct Records<'t> {
    pub(crate) finished: Table2<'t>,
    pub(crate) inflight: Table2<'t>,
}

impl Records<'_> {
    fn load(&self, key: &RecordKey) -> Result<Option<Record>, Error> {
        load(&self.finished, &self.inflight, key)
    }

    /// Writes `rec` to the table its state belongs in. A record only ever moves from
    /// IN_PROGRESS to finished, never back.
    fn store(&mut self, key: &RecordKey, rec: &Record) -> Result<(), Error> {
        let bytes = rec.encode();
        if rec.state == RecordState::InProgress {
            self.inflight.insert(key.as_bytes(), bytes.as_slice())?;
        } else {
            self.inflight.remove(key.as_bytes())?;
            self.finished.insert(key.as_bytes(), bytes.as_slice())?;
        }
        Ok(())
    }

    /// Removes an IN_PROGRESS record (release).
    fn remove(&mut self, key: &RecordKey) -> Result<(), Error> {
        self.inflight.remove(key.as_bytes())?;
        Ok(())
    }
}

pub(crate) fn apply(
    op: WriteOp,
    txn: &WriteTransaction,
    records: &mut Records<'_>,
    ctx: &mut Ctx<'_>,
) -> Applied {
    match try_apply(op, txn, records, ctx) {
        Ok(applied) => applied,
        // Only a record that fails to decode gives Corrupted, before the op wrote anything: it
        // is reported to its caller alone.
        Err(e @ Error::Corrupted(_)) => Applied::answer(Err(e)),
        // A failed read or write leaves the transaction unusable.
        Err(e) => Applied::aborted(Err(e)),
    }
}

fn try_apply(
    op: WriteOp,
    txn: &WriteTransaction,
    records: &mut Records<'_>,
    ctx: &mut Ctx<'_>,
) -> Result<Applied, Error> {
    match op {
        WriteOp::Reserve {
            key,
            fingerprint,
            lease_ms,
        } => {
            let existing = records.load(&key)?;
            let decision = decide(existing.as_ref(), fingerprint, ctx.now_ms);
            let acquired = match decision {
                Decision::Acquire | Decision::TakeOver => {
                    let lease_expires_at = ctx.now_ms.saturating_add(lease_ms);
                    let rec = acquire(existing, fingerprint, lease_expires_at, ctx)?;
                    records.store(&key, &rec)?;
                    Reservation {
                        record_key: key,
                        token: rec.token,
                        lease_expires_at,
                        attempt: rec.attempts,
                        takeover: decision == Decision::TakeOver,
                    }
                }
                other => {
                    let answer = replay(other, existing).map(OpOutput::Reserved);
                    return Ok(Applied::answer(answer));
                }
            };
            Ok(Applied::changed(OpOutput::Reserved(
                ReserveOutcome::Acquired(acquired),
            )))
        }
        WriteOp::Finish {
            key,
            token,
            state,
            response,
            business,
        } => {
            let existing = records.load(&key)?;
            if let Err(e) = check_owner(existing.as_ref(), token) {
                return Ok(Applied::answer(Err(e)));
            }
            if let Some(business) = business {
                let mut tx = Tx::new(txn, ctx.now_ms);
                match run_closure(|| business(&mut tx)) {
                    Ok(()) => {}
                    Err(failed) => return Ok(Applied::aborted(Ok(failed))),
                }
            }
            let mut rec = existing.ok_or(Error::UnknownRecord)?;
            rec.state = state;
            rec.updated_at = ctx.now_ms;
            rec.response = response;
            records.store(&key, &rec)?;
            Ok(Applied::changed(OpOutput::Done))
        }
        WriteOp::Release { key, token } => {
            let existing = records.load(&key)?;
            if let Err(e) = check_owner(existing.as_ref(), token) {
                return Ok(Applied::answer(Err(e)));
            }
            records.remove(&key)?;
            Ok(Applied::changed(OpOutput::Done))
        }
        WriteOp::Extend {
            key,
            token,
            lease_ms,
        } => {
            let existing = records.load(&key)?;
            if let Err(e) = check_owner(existing.as_ref(), token) {
                return Ok(Applied::answer(Err(e)));
            }
            let mut rec = existing.ok_or(Error::UnknownRecord)?;
            rec.lease_expires_at = ctx.now_ms.saturating_add(lease_ms);
            rec.updated_at = ctx.now_ms;
            records.store(&key, &rec)?;
            Ok(Applied::changed(OpOutput::Extended {
                lease_expires_at: rec.lease_expires_at,
            }))
        }
        WriteOp::Execute {
            key,
            fingerprint,
            body,
        } => {
            let existing = records.load(&key)?;
            let decision = decide(existing.as_ref(), fingerprint, ctx.now_ms);
            if !matches!(decision, Decision::Acquire | Decision::TakeOver) {
                let out = match replay(decision, existing)? {
                    ReserveOutcome::Mismatch => ExecuteOutcome::Mismatch,
                    ReserveOutcome::Completed(b) => ExecuteOutcome::Completed(b),
                    ReserveOutcome::Failed(b) => ExecuteOutcome::Failed(b),
                    ReserveOutcome::InProgress { retry_after } => {
                        ExecuteOutcome::InProgress { retry_after }
                    }
                    ReserveOutcome::Acquired(_) => {
                        return Err(Error::Corrupted("replay of an acquisition".into()));
                    }
                };
                return Ok(Applied::answer(Ok(OpOutput::Executed(out))));
            }
            // Before the closure: no error may follow its writes but a rollback.
            let mut rec = acquire(existing, fingerprint, ctx.now_ms, ctx)?;
            let mut tx = Tx::new(txn, ctx.now_ms);
            let outcome = match run_closure(|| body(&mut tx)) {
                Ok(outcome) => outcome,
                Err(failed) => return Ok(Applied::aborted(Ok(failed))),
            };
            if let Err(e) = ctx.limits.check_response(outcome.response()) {
                return Ok(Applied::aborted(Err(e)));
            }
            let (state, response) = match &outcome {
                Outcome::Completed(b) => (RecordState::Completed, b.clone()),
                Outcome::Failed(b) => (RecordState::Failed, b.clone()),
            };
            rec.state = state;
            rec.response = response;
            records.store(&key, &rec)?;
            Ok(Applied::changed(OpOutput::Executed(
                ExecuteOutcome::Executed(outcome),
            )))
        }
    }
}

/// Runs a caller's closure, containing its panic so that neighbours in the batch are not hurt.
fn run_closure<T>(f: impl FnOnce() -> Result<T, ClosureFailed>) -> Result<T, OpOutput> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(ClosureFailed)) => Err(OpOutput::ClosureFailed),
        Err(payload) => Err(OpOutput::ClosurePanicked(payload)),
    }
}

/// A fresh IN_PROGRESS record, or the takeover of an expired one, with a new token.
fn acquire(
    existing: Option<Record>,
    fingerprint: crate::fingerprint::Fingerprint,
    lease_expires_at: u64,
    ctx: &mut Ctx<'_>,
) -> Result<Record, Error> {
    let token = FencingToken::new(*ctx.next_token)
        .ok_or_else(|| Error::Corrupted("fencing token counter at 0".into()))?;
    *ctx.next_token = ctx
        .next_token
        .checked_add(1)
        .ok_or_else(|| Error::Corrupted("fencing tokens exhausted".into()))?;
    let (created_at, attempts) = match existing {
        Some(prev) => (prev.created_at, prev.attempts.saturating_add(1)),
        None => (ctx.now_ms, 1),
    };
    Ok(Record {
        state: RecordState::InProgress,
        fingerprint,
        token,
        lease_expires_at,
        created_at,
        updated_at: ctx.now_ms,
        attempts,
        response: Vec::new(),
    })
}

/// The answer for a decision that writes nothing.
pub(crate) fn replay(
    decision: Decision,
    existing: Option<Record>,
) -> Result<ReserveOutcome, Error> {
    Ok(match (decision, existing) {
        (Decision::Mismatch, _) => ReserveOutcome::Mismatch,
        (Decision::ReplayCompleted, Some(rec)) => ReserveOutcome::Completed(rec.response),
        (Decision::ReplayFailed, Some(rec)) => ReserveOutcome::Failed(rec.response),
        (Decision::InProgress { retry_after_ms }, _) => ReserveOutcome::InProgress {
            retry_after: Duration::from_millis(retry_after_ms),
        },
        // decide() replays only an existing record and never calls this for an acquisition.
        (other, _) => {
            return Err(Error::Corrupted(format!(
                "internal: {other:?} is not a replay"
            )));
        }
    })
}

/// The record for `key` in a pair of record tables (a write transaction's or a snapshot's).
pub(crate) fn load(
    finished: &impl ReadableTable<&'static [u8], &'static [u8]>,
    inflight: &impl ReadableTable<&'static [u8], &'static [u8]>,
    key: &RecordKey,
) -> Result<Option<Record>, Error> {
    let stored = match finished.get(key.as_bytes())? {
        Some(v) => Some(v),
        None => inflight.get(key.as_bytes())?,
    };
    match stored {
        Some(v) => Ok(Some(Record::decode(v.value())?)),
        None => Ok(None),
    }
}
