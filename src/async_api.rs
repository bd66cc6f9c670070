//! The same operations as `async fn`s, runtime-agnostic: an awaiting task is woken by the
//! commit that covers its op and never blocks its executor thread. Commits for async callers
//! are led by the `idemdb-committer` thread (or by a sync caller leading a shared batch).
//!
//! Dropping one of these futures after its op was queued does not withdraw the op: it still
//! commits, and its answer is lost. A dropped `reserve_async` may thus leave an IN_PROGRESS
//! record that nobody owns until its lease runs out.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::db::IdemDb;
use crate::error::{Error, ExecuteError};
use crate::fingerprint::Payload;
use crate::ops::{
    Prepared, done_answer, execute_answer, extend_answer, finish_with_answer, is_fenced,
    is_fenced_db, reserve_answer,
};
use crate::outcome::{ExecuteOutcome, Outcome, ReserveOutcome};
use crate::record::RecordState;
use crate::scope::{Key, Scope};
use crate::stats::Counter;
use crate::timer::Timer;
use crate::token::Reservation;
use crate::tx::Tx;
use crate::wait::WaitGuard;

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
        let outcome = match self.prepare_reserve(scope, key, payload.into(), lease)? {
            Prepared::Answer(outcome) => Ok(outcome),
            Prepared::Submit(op) => self.writer.submit_async(op).await.and_then(reserve_answer),
        };
        self.counted_reserve(outcome)
    }

    /// [`reserve_or_wait`](Self::reserve_or_wait), awaiting instead of blocking: the task is
    /// woken by the owner's commit, or by idemdb's timer thread when the owner's lease or
    /// `timeout` runs out.
    pub async fn reserve_or_wait_async<'p>(
        &self,
        scope: &Scope,
        key: &Key,
        payload: impl Into<Payload<'p>>,
        lease: Duration,
        timeout: Duration,
    ) -> Result<ReserveOutcome, Error> {
        let wait = self.prepare_wait(scope, key, payload.into(), lease, timeout)?;
        let waiter = self.engine.waits.register(&wait.key);
        loop {
            let seen = waiter.generation();
            let outcome = match self.prepare_attempt(&wait)? {
                Prepared::Answer(outcome) => outcome,
                Prepared::Submit(op) => reserve_answer(self.writer.submit_async(op).await?)?,
            };
            let Some(until) = wait.next_look(&outcome) else {
                return self.counted_reserve(Ok(outcome));
            };
            WaitUntil {
                waiter: &waiter,
                seen,
                until,
                timer: self.timer()?,
                registration: None,
            }
            .await;
        }
    }

    /// [`complete`](Self::complete), awaiting the commit.
    pub async fn complete_async(
        &self,
        reservation: &Reservation,
        response: impl Into<Vec<u8>>,
    ) -> Result<(), Error> {
        let op = self.prepare_finish(reservation, RecordState::Completed, response.into())?;
        let done = self.writer.submit_async(op).await.and_then(done_answer);
        self.counted_owner(done, Some(Counter::Finished), is_fenced)
    }

    /// [`fail`](Self::fail), awaiting the commit.
    pub async fn fail_async(
        &self,
        reservation: &Reservation,
        response: impl Into<Vec<u8>>,
    ) -> Result<(), Error> {
        let op = self.prepare_finish(reservation, RecordState::Failed, response.into())?;
        let done = self.writer.submit_async(op).await.and_then(done_answer);
        self.counted_owner(done, Some(Counter::Finished), is_fenced)
    }

    /// [`release`](Self::release), awaiting the commit.
    pub async fn release_async(&self, reservation: &Reservation) -> Result<(), Error> {
        let op = self.prepare_release(reservation)?;
        let done = self.writer.submit_async(op).await.and_then(done_answer);
        self.counted_owner(done, Some(Counter::Releases), is_fenced)
    }

    /// [`extend`](Self::extend), awaiting the commit.
    pub async fn extend_async(
        &self,
        reservation: &mut Reservation,
        lease: Duration,
    ) -> Result<(), Error> {
        let op = self.prepare_extend(reservation, lease)?;
        let done = self
            .writer
            .submit_async(op)
            .await
            .and_then(|out| extend_answer(out, reservation));
        self.counted_owner(done, None, is_fenced)
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
        self.counted_owner(
            finish_with_answer(self.writer.submit_async(op).await, &error),
            Some(Counter::Finished),
            is_fenced_db,
        )
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
        self.counted_owner(
            finish_with_answer(self.writer.submit_async(op).await, &error),
            Some(Counter::Finished),
            is_fenced_db,
        )
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
            (Prepared::Answer(outcome), _) => self.counted_execute(Ok(outcome)),
            (Prepared::Submit(op), error) => {
                self.counted_execute(execute_answer(self.writer.submit_async(op).await, &error))
            }
        }
    }
}

/// Resolves when the key changes or `until` passes.
struct WaitUntil<'a> {
    waiter: &'a WaitGuard<'a>,
    seen: u64,
    until: Instant,
    timer: &'a Timer,
    registration: Option<u64>,
}

impl Future for WaitUntil<'_> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.waiter.poll_past(self.seen, cx).is_ready() || Instant::now() >= self.until {
            return Poll::Ready(());
        }
        match self.registration {
            Some(id) => self.timer.update(id, cx.waker()),
            None => {
                let id = self.timer.register(self.until, cx.waker().clone());
                self.registration = Some(id);
            }
        }
        Poll::Pending
    }
}

impl Drop for WaitUntil<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.registration {
            self.timer.cancel(id);
        }
    }
}
