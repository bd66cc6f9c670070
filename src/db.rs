//! The database handle and its public operations.

use std::fmt;
use std::panic::resume_unwind;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use redb::{Database, ReadTransaction, ReadableDatabase};

use crate::builder::Builder;
use crate::clock::{Clock, duration_ms};
use crate::config::{Limits, WriterConfig};
use crate::decide::{Decision, decide};
use crate::error::{Error, ExecuteError, InputError};
use crate::fingerprint::{Fingerprint, Fingerprinter, Payload};
use crate::meta::{self, RECORDS};
use crate::outcome::{ExecuteOutcome, Outcome, ReserveOutcome};
use crate::record::{Record, RecordState};
use crate::scope::{Key, RecordKey, Scope};
use crate::token::Reservation;
use crate::tx::Tx;
use crate::writer::op::{ClosureFailed, OpOutput, WriteOp};
use crate::writer::{Writer, load, replay};

/// An idempotency store in one redb file.
///
/// `IdemDb` is `Send + Sync`: share it by reference or in an [`Arc`]. Every write goes through
/// one group-commit writer; replays and in-progress answers are read from an MVCC snapshot and
/// never wait for it. Every outcome returned is durable: it survives a crash at any later
/// moment.
///
/// ```
/// use idemdb::{IdemDb, Key, ReserveOutcome, Scope};
/// use std::time::Duration;
///
/// # let dir = tempfile::tempdir()?;
/// let db = IdemDb::open(dir.path().join("dedupe.idemdb"))?;
/// let scope = Scope::new("POST /purchases", "user-42");
/// let key = Key::new("7f7d0c1e-intent");
/// let lease = Duration::from_secs(30);
///
/// match db.reserve(&scope, &key, b"{\"sku\":1}", lease)? {
///     ReserveOutcome::Acquired(reservation) => {
///         // ... charge the card, passing the key downstream ...
///         db.complete(&reservation, b"201 {\"order\":9}".to_vec())?;
///     }
///     other => panic!("fresh key: {other:?}"),
/// }
/// // A retry of the same intent gets the first answer, byte for byte.
/// assert_eq!(
///     db.reserve(&scope, &key, b"{\"sku\":1}", lease)?,
///     ReserveOutcome::Completed(b"201 {\"order\":9}".to_vec())
/// );
/// // The same key with another payload is refused.
/// assert_eq!(db.reserve(&scope, &key, b"{\"sku\":2}", lease)?, ReserveOutcome::Mismatch);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct IdemDb {
    db: Arc<Database>,
    writer: Writer,
    fingerprinter: Fingerprinter,
    limits: Limits,
    clock: Arc<dyn Clock>,
}

impl fmt::Debug for IdemDb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdemDb")
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl IdemDb {
    /// Opens (or creates) the database at `path` with default settings.
    pub fn open(path: impl AsRef<std::path::Path>) -> Result<IdemDb, Error> {
        Builder::default().open(path)
    }

    /// Settings for opening a database.
    pub fn builder() -> Builder {
        Builder::default()
    }

    pub(crate) fn from_parts(
        db: Database,
        clock: Arc<dyn Clock>,
        limits: Limits,
        config: WriterConfig,
    ) -> Result<IdemDb, Error> {
        let meta = meta::load_or_init(&db)?;
        let db = Arc::new(db);
        let writer = Writer::new(
            Arc::clone(&db),
            Arc::clone(&clock),
            limits.clone(),
            config,
            meta.next_token,
        );
        Ok(IdemDb {
            db,
            writer,
            fingerprinter: meta.fingerprinter,
            limits,
            clock,
        })
    }

    /// The fingerprint of `payload` under this database's secret, as `reserve` computes it.
    pub fn fingerprint(&self, payload: &[u8]) -> Fingerprint {
        self.fingerprinter.fingerprint(payload)
    }

    /// The limits in force.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Reserves the intent `key` in `scope` for the request `payload`, atomically.
    ///
    /// Returns exactly one [`ReserveOutcome`]; see docs/semantics.md for the full table. On
    /// `Acquired` the IN_PROGRESS record is durable and leased for `lease`; the caller runs
    /// the work and then calls [`complete`](Self::complete), [`fail`](Self::fail) or
    /// [`release`](Self::release). Replays and in-progress answers come from a snapshot
    /// without waiting for the writer.
    pub fn reserve<'p>(
        &self,
        scope: &Scope,
        key: &Key,
        payload: impl Into<Payload<'p>>,
        lease: Duration,
    ) -> Result<ReserveOutcome, Error> {
        let record_key = RecordKey::encode(scope, key, &self.limits)?;
        let lease_ms = lease_ms(lease)?;
        let fingerprint = self.fingerprinter.resolve(payload.into());
        self.reserve_encoded(record_key, fingerprint, lease_ms)
    }

    fn reserve_encoded(
        &self,
        key: RecordKey,
        fingerprint: Fingerprint,
        lease_ms: u64,
    ) -> Result<ReserveOutcome, Error> {
        if let Some(answer) = self.answer_from_snapshot(&key, fingerprint)? {
            return Ok(answer);
        }
        match self.writer.submit(WriteOp::Reserve {
            key,
            fingerprint,
            lease_ms,
        })? {
            OpOutput::Reserved(outcome) => Ok(outcome),
            other => Err(unexpected(other)),
        }
    }

    /// The answer a reservation gets without writing, if the snapshot decides it and what it
    /// shows is durable. `None`: the writer must decide.
    fn answer_from_snapshot(
        &self,
        key: &RecordKey,
        fingerprint: Fingerprint,
    ) -> Result<Option<ReserveOutcome>, Error> {
        let txn = self.db.begin_read()?;
        let existing = load(&txn.open_table(RECORDS)?, key)?;
        let decision = decide(existing.as_ref(), fingerprint, self.clock.now_ms());
        if matches!(decision, Decision::Acquire | Decision::TakeOver)
            || self.writer.durability.pending_for(key).is_some()
        {
            return Ok(None);
        }
        Ok(Some(replay(decision, existing)))
    }

    /// Like [`reserve`](Self::reserve), but a duplicate that finds the intent IN_PROGRESS waits,
    /// in this process, until the owner completes, fails or releases it (it is woken by the
    /// owner's commit, not by polling), or until its lease runs out and it may take over, or
    /// until `timeout` passes, when it returns `InProgress`.
    ///
    /// The timeout is measured in real time; lease expiry by the database's clock.
    pub fn reserve_or_wait<'p>(
        &self,
        scope: &Scope,
        key: &Key,
        payload: impl Into<Payload<'p>>,
        lease: Duration,
        timeout: Duration,
    ) -> Result<ReserveOutcome, Error> {
        let record_key = RecordKey::encode(scope, key, &self.limits)?;
        let lease_ms = lease_ms(lease)?;
        let fingerprint = self.fingerprinter.resolve(payload.into());
        let deadline = Instant::now().checked_add(timeout);
        let waiter = self.writer.waits.register(&record_key);
        loop {
            let seen = waiter.generation();
            let outcome = self.reserve_encoded(record_key.clone(), fingerprint, lease_ms)?;
            let ReserveOutcome::InProgress { retry_after } = outcome else {
                return Ok(outcome);
            };
            let now = Instant::now();
            let lease_end = now.checked_add(retry_after);
            let until = match (deadline, lease_end) {
                (Some(d), _) if d <= now => return Ok(outcome),
                (Some(d), Some(l)) => d.min(l),
                (Some(d), None) => d,
                (None, Some(l)) => l,
                (None, None) => now + Duration::from_secs(3600),
            };
            waiter.wait_past(seen, until);
        }
    }

    /// Finishes the reservation with success: the record becomes COMPLETED and `response` is
    /// replayed, byte for byte, to every duplicate.
    ///
    /// Refused with [`Error::Fenced`] if the reservation was taken over,
    /// [`Error::UnknownRecord`] if it was released, [`Error::NotInProgress`] if it was already
    /// finished; nothing changes then.
    pub fn complete(
        &self,
        reservation: &Reservation,
        response: impl Into<Vec<u8>>,
    ) -> Result<(), Error> {
        self.finish(reservation, RecordState::Completed, response.into())
    }

    /// Finishes the reservation with a deterministic failure (a declined card): the record
    /// becomes FAILED and `response` is replayed to every duplicate, which never re-executes.
    /// Refused as [`complete`](Self::complete) is.
    pub fn fail(
        &self,
        reservation: &Reservation,
        response: impl Into<Vec<u8>>,
    ) -> Result<(), Error> {
        self.finish(reservation, RecordState::Failed, response.into())
    }

    fn finish(
        &self,
        res: &Reservation,
        state: RecordState,
        response: Vec<u8>,
    ) -> Result<(), Error> {
        self.limits.check_response(&response)?;
        let op = WriteOp::Finish {
            key: res.record_key.clone(),
            token: res.token,
            state,
            response,
            business: None,
        };
        match self.writer.submit(op)? {
            OpOutput::Done => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    /// Gives the intent up after a transient failure: the record is removed, so the next retry
    /// executes. Refused as [`complete`](Self::complete) is.
    pub fn release(&self, reservation: &Reservation) -> Result<(), Error> {
        let op = WriteOp::Release {
            key: reservation.record_key.clone(),
            token: reservation.token,
        };
        match self.writer.submit(op)? {
            OpOutput::Done => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    /// Renews the lease for long work: it now runs out `lease` from now. Updates
    /// `reservation`'s expiry. Refused as [`complete`](Self::complete) is; an owner whose lease
    /// ran out but who was not taken over may still extend.
    pub fn extend(&self, reservation: &mut Reservation, lease: Duration) -> Result<(), Error> {
        let op = WriteOp::Extend {
            key: reservation.record_key.clone(),
            token: reservation.token,
            lease_ms: lease_ms(lease)?,
        };
        match self.writer.submit(op)? {
            OpOutput::Extended { lease_expires_at } => {
                reservation.lease_expires_at = lease_expires_at;
                Ok(())
            }
            other => Err(unexpected(other)),
        }
    }

    /// The two-step flow's second step: runs `business` and marks the record COMPLETED with
    /// `response`, in one commit. If `business` returns `Err`, nothing it wrote commits and the
    /// record stays IN_PROGRESS (retry, or release). Refused, without running `business`, as
    /// [`complete`](Self::complete) is.
    ///
    /// The closure may run on another caller's thread (the one leading the group commit), so it
    /// must be `Send + 'static`: move what it needs into it. A panic in it is resumed on the
    /// calling thread, after its writes were rolled back.
    pub fn complete_with<F, E>(
        &self,
        reservation: &Reservation,
        response: impl Into<Vec<u8>>,
        business: F,
    ) -> Result<(), ExecuteError<E>>
    where
        F: FnOnce(&mut Tx<'_>) -> Result<(), E> + Send + 'static,
        E: Send + 'static,
    {
        self.finish_with(
            reservation,
            RecordState::Completed,
            response.into(),
            business,
        )
    }

    /// As [`complete_with`](Self::complete_with), but the record becomes FAILED: a
    /// deterministic failure recorded together with the business writes that go with it.
    pub fn fail_with<F, E>(
        &self,
        reservation: &Reservation,
        response: impl Into<Vec<u8>>,
        business: F,
    ) -> Result<(), ExecuteError<E>>
    where
        F: FnOnce(&mut Tx<'_>) -> Result<(), E> + Send + 'static,
        E: Send + 'static,
    {
        self.finish_with(reservation, RecordState::Failed, response.into(), business)
    }

    fn finish_with<F, E>(
        &self,
        res: &Reservation,
        state: RecordState,
        response: Vec<u8>,
        business: F,
    ) -> Result<(), ExecuteError<E>>
    where
        F: FnOnce(&mut Tx<'_>) -> Result<(), E> + Send + 'static,
        E: Send + 'static,
    {
        self.limits.check_response(&response)?;
        let (body, error) = capture(business);
        let op = WriteOp::Finish {
            key: res.record_key.clone(),
            token: res.token,
            state,
            response,
            business: Some(Box::new(body)),
        };
        match self.writer.submit(op)? {
            OpOutput::Done => Ok(()),
            other => Err(closure_result(other, &error)),
        }
    }

    /// The one-shot flow: reserves, runs `body` and records its [`Outcome`], all in one write
    /// transaction and one commit, so the record and `body`'s own writes are durable together
    /// or not at all.
    ///
    /// A duplicate gets the stored outcome (or `Mismatch`, or `InProgress` if a two-step owner
    /// holds the key) and `body` does not run. If `body` returns `Err`, nothing is committed
    /// and the error is returned: the next retry runs it again. `body` must be `Send +
    /// 'static`, as for [`complete_with`](Self::complete_with).
    pub fn execute<'p, F, E>(
        &self,
        scope: &Scope,
        key: &Key,
        payload: impl Into<Payload<'p>>,
        body: F,
    ) -> Result<ExecuteOutcome, ExecuteError<E>>
    where
        F: FnOnce(&mut Tx<'_>) -> Result<Outcome, E> + Send + 'static,
        E: Send + 'static,
    {
        let record_key = RecordKey::encode(scope, key, &self.limits)?;
        let fingerprint = self.fingerprinter.resolve(payload.into());
        if let Some(answer) = self.answer_from_snapshot(&record_key, fingerprint)? {
            return Ok(match answer {
                ReserveOutcome::Mismatch => ExecuteOutcome::Mismatch,
                ReserveOutcome::Completed(b) => ExecuteOutcome::Completed(b),
                ReserveOutcome::Failed(b) => ExecuteOutcome::Failed(b),
                ReserveOutcome::InProgress { retry_after } => {
                    ExecuteOutcome::InProgress { retry_after }
                }
                ReserveOutcome::Acquired(_) => return Err(unexpected_acquire().into()),
            });
        }
        let (body, error) = capture(body);
        let op = WriteOp::Execute {
            key: record_key,
            fingerprint,
            body: Box::new(body),
        };
        match self.writer.submit(op)? {
            OpOutput::Executed(outcome) => Ok(outcome),
            other => Err(closure_result(other, &error)),
        }
    }

    /// A read-only view of the record for `key` in `scope`, for operators and tests. Waits if
    /// the record's newest state is not durable yet.
    pub fn get(&self, scope: &Scope, key: &Key) -> Result<Option<Record>, Error> {
        let record_key = RecordKey::encode(scope, key, &self.limits)?;
        loop {
            let txn = self.db.begin_read()?;
            let record = load(&txn.open_table(RECORDS)?, &record_key)?;
            match self.writer.durability.pending_for(&record_key) {
                None => return Ok(record),
                Some(seq) => self.writer.durability.wait(seq)?,
            }
        }
    }

    /// A redb read transaction for the caller's own tables (and idemdb's, read-only). It shows
    /// only durable state: if the writer has non-durable commits in flight, this waits for the
    /// durable commit that covers them.
    pub fn begin_read(&self) -> Result<ReadTransaction, Error> {
        let txn = self.db.begin_read()?;
        if let Some(seq) = self.writer.durability.pending_any() {
            self.writer.durability.wait(seq)?;
        }
        Ok(txn)
    }
}

fn lease_ms(lease: Duration) -> Result<u64, Error> {
    match duration_ms(lease) {
        0 => Err(Error::InvalidInput(InputError::ZeroLease)),
        ms => Ok(ms),
    }
}

/// Where a caller's closure error waits for the caller while the writer reports only that it
/// failed.
type ErrorSlot<E> = Arc<Mutex<Option<E>>>;

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

/// Maps the writer's answer for a closure op that did not simply succeed.
fn closure_result<E>(output: OpOutput, error: &Mutex<Option<E>>) -> ExecuteError<E> {
    match output {
        OpOutput::ClosureFailed => match error.lock().take() {
            Some(e) => ExecuteError::Closure(e),
            None => ExecuteError::Db(Error::Corrupted("closure error went missing".into())),
        },
        OpOutput::ClosurePanicked(payload) => resume_unwind(payload),
        other => ExecuteError::Db(unexpected(other)),
    }
}

fn unexpected(output: OpOutput) -> Error {
    Error::Corrupted(format!("internal: unexpected writer answer {output:?}"))
}

fn unexpected_acquire() -> Error {
    Error::Corrupted("internal: a snapshot answered with an acquisition".into())
}
