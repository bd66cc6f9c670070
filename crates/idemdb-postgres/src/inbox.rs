//! The inbox over PostgreSQL: `consume`, `consume_batch` (a poll in one transaction), and
//! `run` (the caller's writes with no dedupe record). Each message is `execute`'s per-key
//! step (execute.rs), so the decisions are `execute`'s.

use super::errors::{Step, pool};
use super::execute::{Done, Keyed, PgFuture, PgTx, Ran, conflict};
use super::reserve::prepared;
use super::store::{Inner, PgStore};
use crate::error::PgError;
use idemdb_core::error::ExecuteError;
use idemdb_core::inbox::{Consumed, INBOX_PAYLOAD, consumed, names};
use idemdb_core::outcome::{ExecuteOutcome, Outcome};
use idemdb_core::scope::RecordKey;

/// A message of a poll: its key (or why it has none) and its handler as an `execute` closure.
type Message<'k, B> = (Result<Keyed<'k>, PgError>, B);

type Answer<E> = Result<ExecuteOutcome, ExecuteError<E, PgError>>;

/// Gives `f` the higher-ranked signature of a closure of [`PgStore::consume`] or
/// [`PgStore::consume_batch`]. Closures infer it only when written as the call's argument;
/// one built elsewhere (a poll's handlers, made in a `map`) is passed through this first.
pub fn pg_handler<F, E>(f: F) -> F
where
    F: for<'t> FnMut(&'t mut PgTx<'_>) -> PgFuture<'t, Result<(), E>>,
{
    f
}

/// A handler as an `execute` closure: its success completes the record, with no response.
fn completes<F, E>(
    mut handler: F,
) -> impl for<'t, 'a> FnMut(&'t mut PgTx<'a>) -> PgFuture<'t, Result<Outcome, E>> + Send
where
    F: for<'t> FnMut(&'t mut PgTx<'_>) -> PgFuture<'t, Result<(), E>> + Send,
    E: Send + 'static,
{
    move |tx| {
        let handled = handler(tx);
        Box::pin(async move { handled.await.map(|()| Outcome::Completed(Vec::new())) })
    }
}

impl PgStore {
    /// Inbox dedupe: runs `handler` once per `message_id` of `consumer`, its writes
    /// committing with the dedupe record. See `idemdb::IdemDb::consume`.
    pub async fn consume<F, E>(
        &self,
        consumer: &str,
        message_id: impl AsRef<[u8]>,
        handler: F,
    ) -> Result<Consumed, ExecuteError<E, PgError>>
    where
        F: for<'t> FnMut(&'t mut PgTx<'_>) -> PgFuture<'t, Result<(), E>> + Send,
        E: Send + 'static,
    {
        let (scope, key) = names(consumer, message_id.as_ref());
        let body = completes(handler);
        let outcome = self.execute(&scope, &key, INBOX_PAYLOAD, body).await?;
        Ok(consumed(consumer, outcome)?)
    }

    /// Consumes a poll of many messages in one PostgreSQL transaction and one commit: the
    /// stripes of all its keys are locked first, in ascending order (two polls cannot
    /// deadlock on them), then each message runs `execute`'s step inside a savepoint, so a
    /// handler error (`Err(Closure(e))`) undoes that message only and the others commit.
    /// Answers are in the order given, and only after the commit; a message id that appears
    /// twice is `Processed` then `Duplicate`. A serialization failure or deadlock anywhere
    /// rolls back the whole poll and runs it again, every handler included, up to 8 times.
    /// See `idemdb::IdemDb::consume_batch`.
    ///
    /// A message's own failure is its answer (an id over the limits, or a handler that
    /// swallowed a failed statement: `Err(Db(Database))`, its savepoint rolled back); so is a
    /// failed commit, for every message whose handler did not fail (`OutcomeUnknown` where the
    /// connection broke after the commit was sent). `Err` of the whole call: the poll failed
    /// before its commit (no connection, or conflicts outlasted the attempts); nothing of it
    /// committed. An empty poll returns at once. The poll holds its keys' stripes until it
    /// commits: a duplicate of any of them (or a key sharing a stripe) waits for the whole
    /// poll. Build the handlers through [`pg_handler`].
    ///
    /// ```no_run
    /// # async fn run(store: &idemdb_postgres::PgStore) -> Result<(), Box<dyn std::error::Error>> {
    /// use idemdb_postgres::{Consumed, PgTx, pg_handler};
    /// let poll = ["m1", "m2", "m1"].map(|id| {
    ///     let handler = pg_handler(move |tx: &mut PgTx<'_>| {
    ///         Box::pin(async move {
    ///             tx.execute("INSERT INTO ledger (message) VALUES ($1)", &[&id]).await?;
    ///             Ok::<_, idemdb_postgres::tokio_postgres::Error>(())
    ///         })
    ///     });
    ///     (id, handler)
    /// });
    /// let answers = store.consume_batch("ledger", poll).await?;
    /// let answers: Vec<Consumed> = answers.into_iter().collect::<Result<_, _>>()?;
    /// assert_eq!(answers, [Consumed::Processed, Consumed::Processed, Consumed::Duplicate]);
    /// # Ok(()) }
    /// ```
    pub async fn consume_batch<I, M, F, E>(
        &self,
        consumer: &str,
        messages: I,
    ) -> Result<Vec<Result<Consumed, ExecuteError<E, PgError>>>, PgError>
    where
        I: IntoIterator<Item = (M, F)>,
        M: AsRef<[u8]>,
        F: for<'t> FnMut(&'t mut PgTx<'_>) -> PgFuture<'t, Result<(), E>> + Send,
        E: Send + 'static,
    {
        let inner = &self.inner;
        let fingerprint = inner.fingerprinter.resolve(INBOX_PAYLOAD.into());
        let (keys, handlers): (Vec<_>, Vec<_>) = messages
            .into_iter()
            .map(|(id, handler)| {
                let (scope, key) = names(consumer, id.as_ref());
                (RecordKey::encode(&scope, &key, &inner.limits), handler)
            })
            .unzip();
        let mut poll: Vec<Message<'_, _>> = keys
            .iter()
            .zip(handlers)
            .map(|(key, handler)| {
                let keyed = key.as_ref().map_err(|e| PgError::from(e.clone()));
                (
                    keyed.and_then(|k| inner.keyed(k, fingerprint)),
                    completes(handler),
                )
            })
            .collect();
        let answers = inner.poll(&mut poll).await?;
        Ok(answers
            .into_iter()
            .map(|answer| {
                inner.counters.executed(&answer);
                Ok(consumed(consumer, answer?)?)
            })
            .collect())
    }

    /// Runs `body` in a transaction with no dedupe record and commits it: for writes that
    /// are idempotent by construction (see `idemdb::IdemDb::run`).
    /// `Err(Closure(e))` rolls it back. Like [`execute`](Self::execute)'s, `body` runs again
    /// after a serialization failure or deadlock (up to 8 attempts), and one that swallowed
    /// a failed statement gets `Err(Db(Database))`, nothing committed. [`PgTx::now_ms`] is
    /// this instance's estimate of the server's time (no record is read).
    pub async fn run<F, T, E>(&self, mut body: F) -> Result<T, ExecuteError<E, PgError>>
    where
        F: for<'t> FnMut(&'t mut PgTx<'_>) -> PgFuture<'t, Result<T, E>> + Send,
        T: Send,
        E: Send + 'static,
    {
        let inner = &self.inner;
        let mut attempt = 0;
        let result = loop {
            attempt += 1;
            let step = inner.run_once(&mut body).await;
            if let Some(answer) = inner.settle(step, attempt).await {
                break answer;
            }
        };
        inner.counters.ran(&result);
        result
    }
}

/// Fails on a transaction a closure left aborted, where a bare COMMIT would roll it back and
/// report success.
const ALIVE: &str = "SELECT 1";

impl Inner {
    /// A poll, run again whole after a conflict: each message's answer, in order.
    async fn poll<B, E>(&self, poll: &mut [Message<'_, B>]) -> Result<Vec<Answer<E>>, PgError>
    where
        B: for<'t> FnMut(&'t mut PgTx<'_>) -> PgFuture<'t, Result<Outcome, E>> + Send,
        E: Send + 'static,
    {
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.poll_once(poll).await {
                Ok(answers) => return Ok(answers),
                Err(step) => self.again(step, attempt).await?,
            }
        }
    }

    async fn poll_once<B, E>(&self, poll: &mut [Message<'_, B>]) -> Result<Vec<Answer<E>>, Step>
    where
        B: for<'t> FnMut(&'t mut PgTx<'_>) -> PgFuture<'t, Result<Outcome, E>> + Send,
        E: Send + 'static,
    {
        let keys = || poll.iter().filter_map(|(k, _)| k.as_ref().ok());
        let ttls = (keys().map(|k| k.ttl).min(), keys().map(|k| k.ttl).max());
        let (Some(shortest), Some(longest)) = ttls else {
            // No message has a key (an empty poll, or every id refused): nothing to run.
            let refused = poll.iter().filter_map(|(k, _)| k.as_ref().err());
            return Ok(refused.map(|e| Err(e.clone().into())).collect());
        };
        let mut client = self.pool.get().await.map_err(pool)?;
        self.partitions_ahead(&client, shortest, longest).await?;
        let mut txn = client.transaction().await.map_err(Step::before_commit)?;
        // Before any message runs, so that no poll waits for a stripe while holding one
        // another poll waits for.
        self.lock_stripes(&txn, keys().map(|k| k.key)).await?;
        let mut done = Vec::with_capacity(poll.len());
        for (k, body) in poll.iter_mut() {
            let k = match k {
                Ok(k) => &*k,
                Err(e) => {
                    done.push(Err(e.clone()));
                    continue;
                }
            };
            let sp = txn
                .savepoint("idemdb_message")
                .await
                .map_err(Step::before_commit)?;
            let step = match self.look(&sp, &k.parts).await {
                Ok(found) => self.execute_locked(&sp, k, found, body).await,
                Err(step) => Err(step),
            };
            // A message's failure is its own: its savepoint is rolled back, the others go on.
            // A conflict (or a missing partition) runs the whole poll again.
            let (step, keep) = match step {
                Ok(Done::Closure(e)) => (Ok(Done::Closure(e)), false),
                Ok(d) => (Ok(d), true),
                Err(Step::Fail(e)) => (Err(e), false),
                Err(step) => return Err(step),
            };
            let ended = if keep {
                sp.commit().await
            } else {
                sp.rollback().await
            };
            ended.map_err(Step::before_commit)?;
            done.push(step);
        }
        let writes = done
            .iter()
            .filter(|d| matches!(d, Ok(Done::Executed { .. })))
            .count();
        let began = std::time::Instant::now();
        let committed = match txn.commit().await.map_err(Step::at_commit) {
            Ok(()) if writes > 0 => {
                self.counters.committed_batch(began.elapsed(), writes);
                for d in &done {
                    if let Ok(Done::Executed { staged, .. }) = d {
                        self.outbox.committed(staged);
                    }
                }
                Ok(())
            }
            Ok(()) => Ok(()),
            Err(Step::Fail(e)) => Err(e),
            Err(step) => return Err(step),
        };
        Ok(done
            .into_iter()
            .map(|d| self.answer(d, &committed))
            .collect())
    }

    /// A message's answer once its poll's commit ended.
    fn answer<E>(
        &self,
        done: Result<Done<E>, PgError>,
        committed: &Result<(), PgError>,
    ) -> Answer<E> {
        match (done?, committed) {
            (Done::Closure(e), _) => Err(ExecuteError::Closure(e)),
            (_, Err(e)) => Err(ExecuteError::Db(e.clone())),
            (Done::Answer(outcome), Ok(())) => Ok(outcome),
            (
                Done::Executed {
                    outcome,
                    takeover,
                    beyond,
                    ..
                },
                Ok(()),
            ) => {
                self.counters.executed_as(takeover, beyond);
                Ok(ExecuteOutcome::Executed(outcome))
            }
        }
    }

    async fn run_once<F, T, E>(&self, body: &mut F) -> Result<Ran<T, E>, Step>
    where
        F: for<'t> FnMut(&'t mut PgTx<'_>) -> PgFuture<'t, Result<T, E>> + Send,
        T: Send,
        E: Send + 'static,
    {
        let mut client = self.pool.get().await.map_err(pool)?;
        let txn = client.transaction().await.map_err(Step::before_commit)?;
        let mut tx = PgTx::new(&txn, self.server_time(), false, None, &self.limits);
        let value = match body(&mut tx).await {
            _ if tx.conflicted() => return Err(conflict()),
            Ok(value) => value,
            Err(e) => return Ok(Ran::Closure(e)),
        };
        txn.query_one(&prepared(&txn, ALIVE).await?, &[])
            .await
            .map_err(Step::before_commit)?;
        txn.commit().await.map_err(Step::at_commit)?;
        Ok(Ran::Answer(value))
    }
}
