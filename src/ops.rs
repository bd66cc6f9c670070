//! Each public operation in two halves shared by the sync and async APIs: `prepare_*` checks
//! input and either answers from a snapshot or builds the write op; the `*_answer` functions
//! turn the writer's output into the public result.

use crate::observe::snapshot_span;
use std::panic::resume_unwind;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::clock::duration_ms;
use crate::db::IdemDb;
use crate::decide::{Decision, Replay, decide};
use crate::error::{Error, ExecuteError, InputError};
use crate::fingerprint::{Fingerprint, Payload};
use crate::outcome::{ExecuteOutcome, Outcome, ReserveOutcome};
use crate::record::RecordState;
use crate::scope::{Key, RecordKey, Scope};
use crate::stats::Counter;
use crate::token::Reservation;
use crate::tx::Tx;
use crate::writer::op::{ClosureFailed, OpOutput, WriteOp};

/// A `reserve_or_wait` under way: what each attempt reserves, and until when it may wait.
pub(crate) struct Wait {
    pub(crate) key: RecordKey,
    pub(crate) fingerprint: Fingerprint,
    pub(crate) lease_ms: u64,
    deadline: Option<Instant>,
}

impl Wait {
    /// After an attempt answered `outcome`: when to look again (if the intent is in progress,
    /// the owner's lease end or the timeout, whichever comes first), or `None` when the
    /// caller is answered now.
    pub(crate) fn next_look(&self, outcome: &ReserveOutcome) -> Option<Instant> {
        let ReserveOutcome::InProgress { retry_after } = *outcome else {
            return None;
        };
        let now = Instant::now();
        let lease_end = now.checked_add(retry_after);
        match (self.deadline, lease_end) {
            (Some(d), _) if d <= now => None,
            (Some(d), Some(l)) => Some(d.min(l)),
            (Some(d), None) => Some(d),
            (None, Some(l)) => Some(l),
            (None, None) => Some(now + Duration::from_secs(3600)),
        }
    }
}

/// An answer that needed no write, or the op the writer must apply.
pub(crate) enum Prepared<T> {
    Answer(T),
    Submit(WriteOp),
}

/// Where a caller's closure error waits for the caller while the writer reports only that it
/// failed.
pub(crate) type ErrorSlot<E> = Arc<Mutex<Option<E>>>;

impl IdemDb {
    pub(crate) fn prepare_reserve(
        &self,
        scope: &Scope,
        key: &Key,
        payload: Payload<'_>,
        lease: Duration,
    ) -> Result<Prepared<ReserveOutcome>, Error> {
        let record_key = RecordKey::encode(scope, key, self.limits())?;
        let lease_ms = lease_ms(lease)?;
        let fingerprint = self.fingerprinter.resolve(payload);
        self.prepare_reserve_encoded(record_key, fingerprint, lease_ms)
    }

    pub(crate) fn prepare_wait(
        &self,
        scope: &Scope,
        key: &Key,
        payload: Payload<'_>,
        lease: Duration,
        timeout: Duration,
    ) -> Result<Wait, Error> {
        Ok(Wait {
            key: RecordKey::encode(scope, key, self.limits())?,
            lease_ms: lease_ms(lease)?,
            fingerprint: self.fingerprinter.resolve(payload),
            deadline: Instant::now().checked_add(timeout),
        })
    }

    /// One attempt of a wait: a reservation of its key.
    pub(crate) fn prepare_attempt(&self, wait: &Wait) -> Result<Prepared<ReserveOutcome>, Error> {
        self.prepare_reserve_encoded(wait.key.clone(), wait.fingerprint, wait.lease_ms)
    }

    pub(crate) fn prepare_reserve_encoded(
        &self,
        key: RecordKey,
        fingerprint: Fingerprint,
        lease_ms: u64,
    ) -> Result<Prepared<ReserveOutcome>, Error> {
        if let Some(answer) = self.answer_from_snapshot(&key, fingerprint)? {
            return Ok(Prepared::Answer(answer.into()));
        }
        Ok(Prepared::Submit(WriteOp::Reserve {
            key,
            fingerprint,
            lease_ms,
        }))
    }

    /// The answer a duplicate gets without writing, if the snapshot decides it and what it
    /// shows is durable. `None`: the writer must decide, inside its write transaction.
    fn answer_from_snapshot(
        &self,
        key: &RecordKey,
        fingerprint: Fingerprint,
    ) -> Result<Option<Replay>, Error> {
        let span = snapshot_span(key);
        let _span = span.enter();
        let now = self.engine.clock.now_ms();
        let existing = self.engine.snapshots.find(key, now)?.live;
        match decide(existing, fingerprint, now) {
            Decision::Replay(r) if self.engine.durability.pending_for(key).is_none() => Ok(Some(r)),
            _ => Ok(None),
        }
    }

    /// Refuses a reservation issued by another database before anything is queued.
    fn check_issuer(&self, res: &Reservation) -> Result<(), Error> {
        if res.database_id != self.engine.database_id {
            return Err(Error::ForeignReservation);
        }
        Ok(())
    }

    pub(crate) fn prepare_finish(
        &self,
        res: &Reservation,
        state: RecordState,
        response: Vec<u8>,
    ) -> Result<WriteOp, Error> {
        self.check_issuer(res)?;
        self.limits().check_response(&response)?;
        Ok(WriteOp::Finish {
            key: res.record_key.clone(),
            token: res.token,
            state,
            response,
            business: None,
        })
    }

    pub(crate) fn prepare_finish_with<F, E>(
        &self,
        res: &Reservation,
        state: RecordState,
        response: Vec<u8>,
        business: F,
    ) -> Result<(WriteOp, ErrorSlot<E>), Error>
    where
        F: FnOnce(&mut Tx<'_>) -> Result<(), E> + Send + 'static,
        E: Send + 'static,
    {
        let mut op = self.prepare_finish(res, state, response)?;
        let (body, error) = capture(business);
        if let WriteOp::Finish { business, .. } = &mut op {
            *business = Some(Box::new(body));
        }
        Ok((op, error))
    }

    pub(crate) fn prepare_release(&self, res: &Reservation) -> Result<WriteOp, Error> {
        self.check_issuer(res)?;
        Ok(WriteOp::Release {
            key: res.record_key.clone(),
            token: res.token,
        })
    }

    pub(crate) fn prepare_extend(
        &self,
        res: &Reservation,
        lease: Duration,
    ) -> Result<WriteOp, Error> {
        self.check_issuer(res)?;
        Ok(WriteOp::Extend {
            key: res.record_key.clone(),
            token: res.token,
            lease_ms: lease_ms(lease)?,
        })
    }

    pub(crate) fn prepare_execute<F, E>(
        &self,
        scope: &Scope,
        key: &Key,
        payload: Payload<'_>,
        body: F,
    ) -> Result<(Prepared<ExecuteOutcome>, ErrorSlot<E>), Error>
    where
        F: FnOnce(&mut Tx<'_>) -> Result<Outcome, E> + Send + 'static,
        E: Send + 'static,
    {
        let record_key = RecordKey::encode(scope, key, self.limits())?;
        let fingerprint = self.fingerprinter.resolve(payload);
        let (body, error) = capture(body);
        let prepared = match self.answer_from_snapshot(&record_key, fingerprint)? {
            Some(answer) => Prepared::Answer(answer.into()),
            None => Prepared::Submit(WriteOp::Execute {
                key: record_key,
                fingerprint,
                body: Box::new(body),
            }),
        };
        Ok((prepared, error))
    }
}

/// Counting what callers are told (stats.rs), shared by the sync and async APIs.
impl IdemDb {
    pub(crate) fn counted_reserve(
        &self,
        result: Result<ReserveOutcome, Error>,
    ) -> Result<ReserveOutcome, Error> {
        let stats = &self.engine.stats;
        match &result {
            Ok(ReserveOutcome::Acquired(r)) => {
                stats.add(Counter::Acquired);
                if r.is_takeover() {
                    stats.add(Counter::Takeovers);
                }
            }
            Ok(ReserveOutcome::Completed(_)) => stats.add(Counter::ReplaysCompleted),
            Ok(ReserveOutcome::Failed(_)) => stats.add(Counter::ReplaysFailed),
            Ok(ReserveOutcome::Mismatch) => stats.add(Counter::Mismatches),
            Ok(ReserveOutcome::InProgress { .. }) => stats.add(Counter::InProgress),
            Ok(ReserveOutcome::BeyondHorizon) | Err(_) => {}
        }
        result
    }

    pub(crate) fn counted_execute<E>(
        &self,
        result: Result<ExecuteOutcome, ExecuteError<E>>,
    ) -> Result<ExecuteOutcome, ExecuteError<E>> {
        let stats = &self.engine.stats;
        match &result {
            Ok(ExecuteOutcome::Executed(_)) => {
                stats.add(Counter::Acquired);
                stats.add(Counter::Finished);
            }
            Ok(ExecuteOutcome::Completed(_)) => stats.add(Counter::ReplaysCompleted),
            Ok(ExecuteOutcome::Failed(_)) => stats.add(Counter::ReplaysFailed),
            Ok(ExecuteOutcome::Mismatch) => stats.add(Counter::Mismatches),
            Ok(ExecuteOutcome::InProgress { .. }) => stats.add(Counter::InProgress),
            Ok(ExecuteOutcome::BeyondHorizon) | Err(_) => {}
        }
        result
    }

    /// An owner call: `done` counts its success (if anything counts it), a fenced refusal
    /// counts as fenced.
    pub(crate) fn counted_owner<T>(
        &self,
        result: Result<(), T>,
        done: Option<Counter>,
        fenced: impl Fn(&T) -> bool,
    ) -> Result<(), T> {
        match &result {
            Ok(()) => done.into_iter().for_each(|c| self.engine.stats.add(c)),
            Err(e) if fenced(e) => self.engine.stats.add(Counter::Fenced),
            Err(_) => {}
        }
        result
    }
}

pub(crate) fn is_fenced(e: &Error) -> bool {
    matches!(e, Error::Fenced { .. })
}

pub(crate) fn is_fenced_db<E>(e: &ExecuteError<E>) -> bool {
    matches!(e, ExecuteError::Db(Error::Fenced { .. }))
}

/// The op of a `run` and where its closure's error waits for the caller.
pub(crate) fn prepare_run<T, E, F>(body: F) -> (WriteOp, ErrorSlot<E>)
where
    F: FnOnce(&mut Tx<'_>) -> Result<T, E> + Send + 'static,
    T: Send + 'static,
    E: Send + 'static,
{
    let (body, error) = capture(body);
    let body =
        move |tx: &mut Tx<'_>| body(tx).map(|v| Box::new(v) as Box<dyn std::any::Any + Send>);
    let op = WriteOp::Run {
        body: Box::new(body),
    };
    (op, error)
}

pub(crate) fn run_answer<T: 'static, E>(
    output: Result<OpOutput, Error>,
    error: &ErrorSlot<E>,
) -> Result<T, ExecuteError<E>> {
    match output? {
        OpOutput::Ran(value) => value
            .downcast::<T>()
            .map(|v| *v)
            .map_err(|_| ExecuteError::Db(Error::Internal("a run value of another type".into()))),
        other => Err(closure_answer(other, error)),
    }
}

pub(crate) fn reserve_answer(output: OpOutput) -> Result<ReserveOutcome, Error> {
    match output {
        OpOutput::Reserved(outcome) => Ok(outcome),
        other => Err(unexpected(other)),
    }
}

pub(crate) fn done_answer(output: OpOutput) -> Result<(), Error> {
    match output {
        OpOutput::Done => Ok(()),
        other => Err(unexpected(other)),
    }
}

pub(crate) fn extend_answer(output: OpOutput, res: &mut Reservation) -> Result<(), Error> {
    match output {
        OpOutput::Extended { lease_expires_at } => {
            res.lease_expires_at = lease_expires_at;
            Ok(())
        }
        other => Err(unexpected(other)),
    }
}

pub(crate) fn finish_with_answer<E>(
    output: Result<OpOutput, Error>,
    error: &ErrorSlot<E>,
) -> Result<(), ExecuteError<E>> {
    match output? {
        OpOutput::Done => Ok(()),
        other => Err(closure_answer(other, error)),
    }
}

pub(crate) fn execute_answer<E>(
    output: Result<OpOutput, Error>,
    error: &ErrorSlot<E>,
) -> Result<ExecuteOutcome, ExecuteError<E>> {
    match output? {
        OpOutput::Executed(outcome) => Ok(outcome),
        other => Err(closure_answer(other, error)),
    }
}

/// A lease in whole milliseconds, rounded up so that a sub-millisecond lease is not zero.
pub(crate) fn lease_ms(lease: Duration) -> Result<u64, Error> {
    if lease.is_zero() {
        return Err(Error::InvalidInput(InputError::ZeroLease));
    }
    let ms = duration_ms(lease);
    Ok(if lease > Duration::from_millis(ms) {
        ms.saturating_add(1)
    } else {
        ms
    })
}

/// Wraps a caller's closure for the writer: its error is kept aside for the caller.
fn capture<T, E, F>(
    f: F,
) -> (
    impl FnOnce(&mut Tx<'_>) -> Result<T, ClosureFailed> + Send + 'static,
    ErrorSlot<E>,
)
where
    F: FnOnce(&mut Tx<'_>) -> Result<T, E> + Send + 'static,
    E: Send + 'static,
{
    let slot = Arc::new(Mutex::new(None));
    let theirs = Arc::clone(&slot);
    let body = move |tx: &mut Tx<'_>| {
        f(tx).map_err(|e| {
            *theirs.lock() = Some(e);
            ClosureFailed
        })
    };
    (body, slot)
}

/// Maps the writer's answer for a closure op that did not simply succeed. A panic in the
/// closure resumes here, on the caller's thread.
fn closure_answer<E>(output: OpOutput, error: &ErrorSlot<E>) -> ExecuteError<E> {
    match output {
        OpOutput::ClosureFailed => match error.lock().take() {
            Some(e) => ExecuteError::Closure(e),
            None => ExecuteError::Db(Error::Internal("a closure error went missing".into())),
        },
        OpOutput::ClosurePanicked(payload) => resume_unwind(payload),
        other => ExecuteError::Db(unexpected(other)),
    }
}

fn unexpected(output: OpOutput) -> Error {
    Error::Internal(format!("unexpected writer answer {output:?}"))
}
