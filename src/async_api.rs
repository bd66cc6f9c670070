//! The same operations as `async fn`s, runtime-agnostic: an awaiting task is woken by the
//! commit that covers its op and never blocks its executor thread. Commits for async callers
//! are led by the `idemdb-committer` thread (or by a sync caller leading a shared batch).
//!
//! Dropping one of these futures after its op was queued does not withdraw the op: it still
//! commits, and its answer is lost. A dropped `reserve_async` may thus leave an IN_PROGRESS
//! record that nobody owns until its lease runs out.

use std::time::Duration;

use crate::db::IdemDb;
use crate::error::{Error, ExecuteError};
use crate::fingerprint::Payload;
use crate::ops::{
    Prepared, done_answer, execute_answer, extend_answer, finish_with_answer, reserve_answer,
};
use crate::outcome::{ExecuteOutcome, Outcome, ReserveOutcome};
use crate::record::RecordState;
use crate::scope::{Key, Scope};
use crate::token::Reservation;
use crate::tx::Tx;

impl IdemDb {
    /// [`reserve`](Self::reserve), awaiting the commit instead of blocking.
    ///
    /// ```
    /// # use idemdb::{IdemDb, Key, ReserveOutcome, Scope};
    /// # use std::time::Duration;
    /// # let dir = tempfile::tempdir()?;
    /// # let db = IdemDb::open(dir.path().join("db"))?;
    /// let scope = Scope::new("purchase", "u1");
    /// let outcome = futures_executor_block_on(db.reserve_async(
    ///     &scope, &Key::new("k"), b"req", Duration::from_secs(30)))?;
    /// assert!(matches!(outcome, ReserveOutcome::Acquired(_)));
    /// # fn futures_executor_block_on<F: std::future::Future>(f: F) -> F::Output {
    /// #     tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
    /// # }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub async fn reserve_async<'p>(
        &self,
        scope: &Scope,
        key: &Key,
        payload: impl Into<Payload<'p>>,
        lease: Duration,
    ) -> Result<ReserveOutcome, Error> {
        match self.prepare_reserve(scope, key, payload.into(), lease)? {
            Prepared::Answer(outcome) => Ok(outcome),
            Prepared::Submit(op) => reserve_answer(self.writer.submit_async(op).await?),
        }
    }

    /// [`complete`](Self::complete), awaiting the commit.
    pub async fn complete_async(
        &self,
        reservation: &Reservation,
        response: impl Into<Vec<u8>>,
    ) -> Result<(), Error> {
        let op = self.prepare_finish(reservation, RecordState::Completed, response.into())?;
        done_answer(self.writer.submit_async(op).await?)
    }

    /// [`fail`](Self::fail), awaiting the commit.
    pub async fn fail_async(
        &self,
        reservation: &Reservation,
        response: impl Into<Vec<u8>>,
    ) -> Result<(), Error> {
        let op = self.prepare_finish(reservation, RecordState::Failed, response.into())?;
        done_answer(self.writer.submit_async(op).await?)
    }

    /// [`release`](Self::release), awaiting the commit.
    pub async fn release_async(&self, reservation: &Reservation) -> Result<(), Error> {
        let op = Self::prepare_release(reservation);
        done_answer(self.writer.submit_async(op).await?)
    }

    /// [`extend`](Self::extend), awaiting the commit.
    pub async fn extend_async(
        &self,
        reservation: &mut Reservation,
        lease: Duration,
    ) -> Result<(), Error> {
        let op = Self::prepare_extend(reservation, lease)?;
        extend_answer(self.writer.submit_async(op).await?, reservation)
    }

    /// [`complete_with`](Self::complete_with), awaiting the commit. The closure runs on the
    /// committing thread, not in the task.
    pub async fn complete_with_async<F, E>(
        &self,
        reservation: &Reservation,
        response: impl Into<Vec<u8>>,
        business: F,
    ) -> Result<(), ExecuteError<E>>
    where
        F: FnOnce(&mut Tx<'_>) -> Result<(), E> + Send + 'static,
        E: Send + 'static,
    {
        let (op, error) = self.prepare_finish_with(
            reservation,
            RecordState::Completed,
            response.into(),
            business,
        )?;
        finish_with_answer(self.writer.submit_async(op).await, &error)
    }

    /// [`fail_with`](Self::fail_with), awaiting the commit.
    pub async fn fail_with_async<F, E>(
        &self,
        reservation: &Reservation,
        response: impl Into<Vec<u8>>,
        business: F,
    ) -> Result<(), ExecuteError<E>>
    where
        F: FnOnce(&mut Tx<'_>) -> Result<(), E> + Send + 'static,
        E: Send + 'static,
    {
        let (op, error) =
            self.prepare_finish_with(reservation, RecordState::Failed, response.into(), business)?;
        finish_with_answer(self.writer.submit_async(op).await, &error)
    }

    /// [`execute`](Self::execute), awaiting the commit. The closure runs on the committing
    /// thread, not in the task.
    pub async fn execute_async<'p, F, E>(
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
        match self.prepare_execute(scope, key, payload.into(), body)? {
            (Prepared::Answer(outcome), _) => Ok(outcome),
            (Prepared::Submit(op), error) => {
                execute_answer(self.writer.submit_async(op).await, &error)
            }
        }
    }
}
