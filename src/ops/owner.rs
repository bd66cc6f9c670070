//! The owner's calls on its reservation: `complete`, `fail`, `release`, `extend`, and
//! `complete_with` / `fail_with` with business writes, sync and async. Each presents the
//! reservation's token; the writer checks it against the record (docs/semantics.md §4).

use idemdb_core::error::Refusal;
use std::time::Duration;

use super::{Call, capture, closure_failure, lease_ms, unexpected};
use crate::db::IdemDb;
use crate::error::{Error, ExecuteError};
use crate::record::RecordState;
use crate::stats::{Counter, StatsCollector};
use crate::tx::Tx;
use crate::writer::op::{BusinessFn, OpOutput, RecordOp, WriteOp};
use idemdb_core::token::Reservation;

type Done = Result<(), Error>;
type DoneWith<E> = Result<(), ExecuteError<E>>;

impl IdemDb {
    /// Finishes the reservation with success: the record becomes COMPLETED and `response` is
    /// replayed, byte for byte, to every duplicate.
    ///
    /// Refused with [`Refusal::Fenced`](crate::Refusal::Fenced) if the reservation was taken over,
    /// [`Refusal::UnknownRecord`](crate::Refusal::UnknownRecord) if it was released or expired, [`Refusal::NotInProgress`](crate::Refusal::NotInProgress) if it
    /// was already finished, [`Refusal::ForeignReservation`](crate::Refusal::ForeignReservation) if another database issued it;
    /// nothing changes then.
    ///
    /// ```
    /// use idemdb::{Error, IdemDb, Key, ManualClock, Refusal, ReserveOutcome, Scope};
    /// use std::time::Duration;
    /// # let dir = tempfile::tempdir()?;
    /// let clock = ManualClock::new(1_700_000_000_000);
    /// let db = IdemDb::builder().clock(clock.clone()).open(dir.path().join("db"))?;
    /// let (scope, key) = (Scope::new("POST /orders", "user-7"), Key::new("intent-1"));
    /// let lease = Duration::from_secs(5);
    /// let ReserveOutcome::Acquired(first) = db.reserve(&scope, &key, b"req", lease)? else {
    ///     panic!("a fresh key is acquired");
    /// };
    /// // The first owner stalls past its lease: a retry takes the intent over, with a higher
    /// // fencing token, and completes it.
    /// clock.advance(Duration::from_secs(10));
    /// let ReserveOutcome::Acquired(second) = db.reserve(&scope, &key, b"req", lease)? else {
    ///     panic!("an expired lease is taken over");
    /// };
    /// assert!(second.is_takeover() && second.token() > first.token());
    /// db.complete(&second, b"201".to_vec())?;
    /// // The first owner's late answer is refused, and the stored one stands.
    /// assert!(matches!(
    ///     db.complete(&first, b"201 late".to_vec()),
    ///     Err(Error::Refused(Refusal::Fenced { .. }))
    /// ));
    /// assert_eq!(db.reserve(&scope, &key, b"req", lease)?, ReserveOutcome::Completed(b"201".to_vec()));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn complete(&self, reservation: &Reservation, response: impl Into<Vec<u8>>) -> Done {
        self.call(self.prepare_finish(reservation, RecordState::Completed, response.into()))
    }

    /// [`complete`](Self::complete), awaiting the commit.
    pub async fn complete_async(
        &self,
        reservation: &Reservation,
        response: impl Into<Vec<u8>>,
    ) -> Done {
        let call = self.prepare_finish(reservation, RecordState::Completed, response.into());
        self.call_async(call).await
    }

    /// Finishes the reservation with a deterministic failure (a declined card): the record
    /// becomes FAILED and `response` is replayed to every duplicate, which never re-executes.
    /// Refused as [`complete`](Self::complete) is.
    pub fn fail(&self, reservation: &Reservation, response: impl Into<Vec<u8>>) -> Done {
        self.call(self.prepare_finish(reservation, RecordState::Failed, response.into()))
    }

    /// [`fail`](Self::fail), awaiting the commit.
    pub async fn fail_async(
        &self,
        reservation: &Reservation,
        response: impl Into<Vec<u8>>,
    ) -> Done {
        let call = self.prepare_finish(reservation, RecordState::Failed, response.into());
        self.call_async(call).await
    }

    /// Gives the intent up after a transient failure: the record is removed, so the next retry
    /// executes. Refused as [`complete`](Self::complete) is.
    pub fn release(&self, reservation: &Reservation) -> Done {
        self.call(self.prepare_release(reservation))
    }

    /// [`release`](Self::release), awaiting the commit.
    pub async fn release_async(&self, reservation: &Reservation) -> Done {
        self.call_async(self.prepare_release(reservation)).await
    }

    /// Renews the lease for long work: it now runs out `lease` from now. Updates
    /// `reservation`'s expiry. Refused as [`complete`](Self::complete) is; an owner whose lease
    /// ran out but who was not taken over may still extend, until the record expires (a TTL
    /// after the lease's end).
    pub fn extend(&self, reservation: &mut Reservation, lease: Duration) -> Done {
        self.call(self.prepare_extend(reservation, lease))
    }

    /// [`extend`](Self::extend), awaiting the commit.
    pub async fn extend_async(&self, reservation: &mut Reservation, lease: Duration) -> Done {
        let call = self.prepare_extend(reservation, lease);
        self.call_async(call).await
    }

    /// The two-step flow's second step: runs `business` and marks the record COMPLETED with
    /// `response`, in one commit. If `business` returns `Err`, nothing it wrote commits and the
    /// record stays IN_PROGRESS (retry, or release). Refused, without running `business`, as
    /// [`complete`](Self::complete) is.
    ///
    /// The closure may run on another caller's thread (the one leading the group commit), so it
    /// must be `Send + 'static`: move what it needs into it. It runs inside the commit: it must
    /// not call this database (such a call fails with [`Error::Reentrant`]); write through the
    /// [`Tx`]. A panic in it is resumed on the calling thread, after its writes were rolled
    /// back.
    pub fn complete_with<F, E>(
        &self,
        reservation: &Reservation,
        response: impl Into<Vec<u8>>,
        business: F,
    ) -> DoneWith<E>
    where
        F: FnOnce(&mut Tx<'_>) -> Result<(), E> + Send + 'static,
        E: Send + 'static,
    {
        let state = RecordState::Completed;
        self.call(self.prepare_finish_with(reservation, state, response.into(), business))
    }

    /// [`complete_with`](Self::complete_with), awaiting the commit. The closure runs on the
    /// committing thread, not in the task.
    pub async fn complete_with_async<F, E>(
        &self,
        reservation: &Reservation,
        response: impl Into<Vec<u8>>,
        business: F,
    ) -> DoneWith<E>
    where
        F: FnOnce(&mut Tx<'_>) -> Result<(), E> + Send + 'static,
        E: Send + 'static,
    {
        let state = RecordState::Completed;
        let call = self.prepare_finish_with(reservation, state, response.into(), business);
        self.call_async(call).await
    }

    /// As [`complete_with`](Self::complete_with), but the record becomes FAILED: a
    /// deterministic failure recorded together with the business writes that go with it.
    pub fn fail_with<F, E>(
        &self,
        reservation: &Reservation,
        response: impl Into<Vec<u8>>,
        business: F,
    ) -> DoneWith<E>
    where
        F: FnOnce(&mut Tx<'_>) -> Result<(), E> + Send + 'static,
        E: Send + 'static,
    {
        let state = RecordState::Failed;
        self.call(self.prepare_finish_with(reservation, state, response.into(), business))
    }

    /// [`fail_with`](Self::fail_with), awaiting the commit.
    pub async fn fail_with_async<F, E>(
        &self,
        reservation: &Reservation,
        response: impl Into<Vec<u8>>,
        business: F,
    ) -> DoneWith<E>
    where
        F: FnOnce(&mut Tx<'_>) -> Result<(), E> + Send + 'static,
        E: Send + 'static,
    {
        let state = RecordState::Failed;
        let call = self.prepare_finish_with(reservation, state, response.into(), business);
        self.call_async(call).await
    }

    /// Refuses a reservation issued by another database before anything is queued.
    fn check_issuer(&self, res: &Reservation) -> Result<(), Error> {
        if res.database_id() != self.engine.database_id {
            return Err(Error::Refused(Refusal::ForeignReservation));
        }
        Ok(())
    }

    /// The op finishing `res` as `state` with `response` (and `business`), checked.
    fn finish_op(
        &self,
        res: &Reservation,
        state: RecordState,
        response: Vec<u8>,
        business: Option<BusinessFn>,
    ) -> Result<WriteOp, Error> {
        self.check_issuer(res)?;
        self.limits().check_response(&response)?;
        Ok(owner_op(
            res,
            RecordOp::Finish {
                token: res.token(),
                state,
                response,
                business,
            },
        ))
    }

    pub(crate) fn prepare_finish(
        &self,
        res: &Reservation,
        state: RecordState,
        response: Vec<u8>,
    ) -> Call<'static, Done> {
        let prepared = self
            .finish_op(res, state, response, None)
            .map(|op| Call::submit(op, done));
        Call::checked(prepared).counted(|stats, out| {
            count_owner(
                stats,
                out.is_ok(),
                out.as_ref().is_err_and(fenced),
                Some(Counter::Finished),
            )
        })
    }

    fn prepare_finish_with<F, E>(
        &self,
        res: &Reservation,
        state: RecordState,
        response: Vec<u8>,
        business: F,
    ) -> Call<'static, DoneWith<E>>
    where
        F: FnOnce(&mut Tx<'_>) -> Result<(), E> + Send + 'static,
        E: Send + 'static,
    {
        let (body, error) = capture(business);
        let prepared = self.finish_op(res, state, response, Some(Box::new(body)));
        let prepared = prepared.map(|op| {
            Call::submit(op, move |out| match out? {
                OpOutput::Done => Ok(()),
                other => Err(closure_failure(other, &error)),
            })
        });
        Call::checked(prepared).counted(|stats, out| {
            let was_fenced = matches!(out, Err(ExecuteError::Db(e)) if fenced(e));
            count_owner(stats, out.is_ok(), was_fenced, Some(Counter::Finished))
        })
    }

    pub(crate) fn prepare_release(&self, res: &Reservation) -> Call<'static, Done> {
        let prepared = self.check_issuer(res).map(|()| {
            let op = owner_op(res, RecordOp::Release { token: res.token() });
            Call::submit(op, done)
        });
        Call::checked(prepared).counted(|stats, out| {
            count_owner(
                stats,
                out.is_ok(),
                out.as_ref().is_err_and(fenced),
                Some(Counter::Releases),
            )
        })
    }

    fn prepare_extend<'r>(&self, res: &'r mut Reservation, lease: Duration) -> Call<'r, Done> {
        // A renewed lease is not counted; a fenced refusal is.
        let count: fn(&StatsCollector, &Done) =
            |stats, out| count_owner(stats, out.is_ok(), out.as_ref().is_err_and(fenced), None);
        let lease_ms = match self.check_issuer(res).and_then(|()| lease_ms(lease)) {
            Ok(ms) => ms,
            Err(e) => return Call::answer(Err(e)).counted(count),
        };
        let op = owner_op(
            res,
            RecordOp::Extend {
                token: res.token(),
                lease_ms,
            },
        );
        let finish = move |out: Result<OpOutput, Error>| match out? {
            OpOutput::Extended { lease_expires_at } => {
                res.renewed(lease_expires_at);
                Ok(())
            }
            other => Err(unexpected(other)),
        };
        Call::submit(op, finish).counted(count)
    }
}

/// `op` on the record `res` reserved.
fn owner_op(res: &Reservation, op: RecordOp) -> WriteOp {
    WriteOp::Record {
        key: res.record_key().clone(),
        op,
    }
}

fn done(out: Result<OpOutput, Error>) -> Done {
    match out? {
        OpOutput::Done => Ok(()),
        other => Err(unexpected(other)),
    }
}

/// Counts an owner call: its success as `done` (if anything counts it), a fenced refusal as
/// fenced.
fn count_owner(stats: &StatsCollector, ok: bool, fenced: bool, done: Option<Counter>) {
    match (ok, done) {
        (true, Some(done)) => stats.add(done),
        (false, _) if fenced => stats.add(Counter::Fenced),
        _ => {}
    }
}

fn fenced(e: &Error) -> bool {
    matches!(e, Error::Refused(Refusal::Fenced { .. }))
}
