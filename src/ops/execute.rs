//! The one-shot flows: `execute` (reserve, run the caller's closure, record its outcome, one
//! commit) and `run` (the caller's writes with no dedupe record), sync and async.

use std::sync::Arc;

use parking_lot::Mutex;

use super::{Call, capture, closure_failure};
use crate::db::IdemDb;
use crate::error::{Error, ExecuteError};
use crate::stats::{Counter, StatsCollector};
use crate::tx::Tx;
use crate::writer::op::{OpOutput, RecordOp, WriteOp};
use idemdb_core::fingerprint::Payload;
use idemdb_core::outcome::{ExecuteOutcome, Outcome};
use idemdb_core::scope::{Key, RecordKey, Scope};

type Executed<E> = Result<ExecuteOutcome, ExecuteError<E>>;

impl IdemDb {
    /// The one-shot flow: reserves, runs `body` and records its [`Outcome`], all in one write
    /// transaction and one commit, so the record and `body`'s own writes are durable together
    /// or not at all.
    ///
    /// A duplicate gets the stored outcome (or `Mismatch`, or `InProgress` if a two-step owner
    /// holds the key) and `body` does not run. If `body` returns `Err`, nothing is committed
    /// and the error is returned: the next retry runs it again. `body` must be `Send +
    /// 'static` and must not call this database, as for [`complete_with`](Self::complete_with).
    ///
    /// `body` should be pure database work: if it also calls an outside system, that call is
    /// not undone when the transaction rolls back (a closure error, a response over
    /// [`Limits::max_response_len`](crate::Limits::max_response_len), a failed commit). Use
    /// the two-step flow for outside side effects.
    ///
    /// ```
    /// use idemdb::redb::{ReadableTableMetadata, TableDefinition};
    /// use idemdb::{ExecuteOutcome, IdemDb, Key, Outcome, Scope};
    ///
    /// const ORDERS: TableDefinition<&str, u64> = TableDefinition::new("orders");
    /// # let dir = tempfile::tempdir()?;
    /// // Registered, the table's writes ride in the record's log append.
    /// let db = IdemDb::builder().table(ORDERS).open(dir.path().join("db"))?;
    /// let place = |db: &IdemDb| {
    ///     db.execute(&Scope::new("POST /orders", "user-7"), &Key::new("intent-1"), b"req", |tx| {
    ///         tx.open_table(ORDERS)?.insert("o-1", 1999)?;
    ///         Ok::<_, idemdb::Error>(Outcome::Completed(b"201 order o-1".to_vec()))
    ///     })
    /// };
    /// let answer = Outcome::Completed(b"201 order o-1".to_vec());
    /// assert_eq!(place(&db)?, ExecuteOutcome::Executed(answer));
    /// // The retry gets the stored answer; the closure does not run again.
    /// assert_eq!(place(&db)?, ExecuteOutcome::Completed(b"201 order o-1".to_vec()));
    /// let read = db.begin_read()?;
    /// assert_eq!(read.open_table(ORDERS)?.len()?, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn execute<'p, F, E>(
        &self,
        scope: &Scope,
        key: &Key,
        payload: impl Into<Payload<'p>>,
        body: F,
    ) -> Executed<E>
    where
        F: FnOnce(&mut Tx<'_>) -> Result<Outcome, E> + Send + 'static,
        E: Send + 'static,
    {
        self.call(self.prepare_execute(scope, key, payload.into(), body))
    }

    /// [`execute`](Self::execute), awaiting the commit. The closure runs on the committing
    /// thread, not in the task.
    pub async fn execute_async<'p, F, E>(
        &self,
        scope: &Scope,
        key: &Key,
        payload: impl Into<Payload<'p>>,
        body: F,
    ) -> Executed<E>
    where
        F: FnOnce(&mut Tx<'_>) -> Result<Outcome, E> + Send + 'static,
        E: Send + 'static,
    {
        let call = self.prepare_execute(scope, key, payload.into(), body);
        self.call_async(call).await
    }

    /// Runs `body` in a write transaction of its own with no dedupe record, and commits it
    /// durably (group-committed with other callers' writes). For writes that are idempotent
    /// by construction: the version guards on [`Tx`] ([`Tx::apply_if_newer`],
    /// [`Tx::compare_and_set`], [`Tx::upsert`]). If `body` returns `Err`, nothing it wrote
    /// commits. `body` must be `Send + 'static` and must not call this database, as for
    /// [`complete_with`](Self::complete_with).
    pub fn run<T, E, F>(&self, body: F) -> Result<T, ExecuteError<E>>
    where
        F: FnOnce(&mut Tx<'_>) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: Send + 'static,
    {
        self.call(prepare_run(body))
    }

    /// [`run`](Self::run), awaiting the commit. The closure runs on the committing thread,
    /// not in the task.
    pub async fn run_async<T, E, F>(&self, body: F) -> Result<T, ExecuteError<E>>
    where
        F: FnOnce(&mut Tx<'_>) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: Send + 'static,
    {
        self.call_async(prepare_run(body)).await
    }

    pub(crate) fn prepare_execute<F, E>(
        &self,
        scope: &Scope,
        key: &Key,
        payload: Payload<'_>,
        body: F,
    ) -> Call<'static, Executed<E>>
    where
        F: FnOnce(&mut Tx<'_>) -> Result<Outcome, E> + Send + 'static,
        E: Send + 'static,
    {
        let prepared = || {
            let record_key = RecordKey::encode(scope, key, self.limits())?;
            let fingerprint = self.fingerprinter.resolve(payload);
            if let Some(replay) = self.answer_from_snapshot(&record_key, fingerprint)? {
                return Ok(Call::answer(Ok(replay.into())));
            }
            let (body, error) = capture(body);
            let op = WriteOp::Record {
                key: record_key,
                op: RecordOp::Execute {
                    fingerprint,
                    body: Box::new(body),
                },
            };
            Ok(Call::submit(op, move |out| match out? {
                OpOutput::Executed(outcome) => Ok(outcome),
                other => Err(closure_failure(other, &error)),
            }))
        };
        Call::checked(prepared()).counted(count_execute)
    }
}

/// The op of a `run`: its value and its closure's error wait in slots for the finisher.
fn prepare_run<T, E, F>(body: F) -> Call<'static, Result<T, ExecuteError<E>>>
where
    F: FnOnce(&mut Tx<'_>) -> Result<T, E> + Send + 'static,
    T: Send + 'static,
    E: Send + 'static,
{
    let (body, error) = capture(body);
    let value = Arc::new(Mutex::new(None));
    let theirs = Arc::clone(&value);
    let body = move |tx: &mut Tx<'_>| {
        *theirs.lock() = Some(body(tx)?);
        Ok(())
    };
    let op = WriteOp::Run {
        body: Box::new(body),
    };
    Call::submit(op, move |out| match out? {
        OpOutput::Ran => value
            .lock()
            .take()
            .ok_or_else(|| ExecuteError::Db(Error::Internal("a run value went missing".into()))),
        other => Err(closure_failure(other, &error)),
    })
}

/// Counts what an execution was told. An execution that took over an expired lease is
/// counted as a takeover by the writer: its answer does not say so.
fn count_execute<E>(stats: &StatsCollector, result: &Executed<E>) {
    match result {
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
}
