//! The caller's writes in the transaction that writes the record: `execute` (one shot) and
//! `complete_with` / `fail_with` (two step), over PostgreSQL; the inbox (inbox.rs) runs
//! `execute`'s per-key step.
//!
//! The closure returns a boxed future ([`PgFuture`]: `|tx| Box::pin(async move { .. })`),
//! so that the call's own future is `Send` wherever the closure's is (an async closure's
//! future cannot promise that to the compiler yet). It is `FnMut`: after a serialization
//! failure or a deadlock the whole transaction, closure included, runs again (its writes
//! were rolled back), up to 8 times. It must write only through the [`PgTx`]; a side effect
//! outside the database belongs in the two-step flow.

use std::future::Future;
use std::ops::Deref;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio_postgres::types::ToSql;
use tokio_postgres::{Row, ToStatement};

use super::errors::{MAX_ATTEMPTS, Step, backoff, is_retryable, moved, partition_missing, pool};
use super::owner::FINISH;
use super::partitions::PARTITION_SLACK_MS;
use super::reserve::prepared;
use super::rows::{Found, KeyParts, NEWEST, fingerprint_bytes, state_code, stored_ms, token_value};
use super::sql::{clock, key_is_params, span};
use super::stats::Owned;
use super::store::{Inner, PgStore};
use super::wait::{CHANNEL, payload};
use crate::error::PgError;
use idemdb_core::RecordState;
use idemdb_core::decide::{Decision, check_owner, decide};
use idemdb_core::error::ExecuteError;
use idemdb_core::fingerprint::{Fingerprint, Payload};
use idemdb_core::limits::Limits;
use idemdb_core::outbox::MessageId;
use idemdb_core::outcome::{ExecuteOutcome, Outcome};
use idemdb_core::retention::BeyondHorizonPolicy;
use idemdb_core::scope::{Key, RecordKey, Scope};
use idemdb_core::token::Reservation;

/// The transaction a closure of [`PgStore::execute`] or [`PgStore::complete_with`] writes
/// through: it derefs to tokio-postgres's
/// [`Transaction`](tokio_postgres::Transaction), which also writes (or finishes) the record;
/// both commit together.
///
/// Its own `execute`, `query`, `query_one`, `query_opt` and `batch_execute` (which the
/// methods of the same names resolve to) note a serialization failure or deadlock, so that
/// the store runs the transaction again even when the closure turned that error into its own.
/// Statements made through other methods of the `Transaction` are not watched.
pub struct PgTx<'a> {
    pub(crate) txn: &'a tokio_postgres::Transaction<'a>,
    /// The same transaction, for the pool's per-connection statement cache.
    pub(crate) cached: &'a deadpool_postgres::Transaction<'a>,
    now_ms: u64,
    beyond_horizon: bool,
    conflict: AtomicBool,
    /// The record whose commit this is (`None` in a `run`, which stages nothing).
    pub(crate) record: Option<&'a RecordKey>,
    pub(crate) limits: &'a Limits,
    /// The ids of the messages staged so far, in order (outbox.rs).
    pub(crate) staged: tokio::sync::Mutex<Vec<MessageId>>,
}

impl<'a> Deref for PgTx<'a> {
    type Target = tokio_postgres::Transaction<'a>;

    fn deref(&self) -> &Self::Target {
        self.txn
    }
}

impl<'a> PgTx<'a> {
    pub(super) fn new(
        txn: &'a deadpool_postgres::Transaction<'a>,
        now_ms: u64,
        beyond_horizon: bool,
        record: Option<&'a RecordKey>,
        limits: &'a Limits,
    ) -> Self {
        PgTx {
            txn,
            cached: txn,
            now_ms,
            beyond_horizon,
            conflict: AtomicBool::new(false),
            record,
            limits,
            staged: tokio::sync::Mutex::new(Vec::new()),
        }
    }

    /// The ids staged by the closure, taken once it ended.
    pub(super) fn take_staged(&mut self) -> Vec<MessageId> {
        std::mem::take(self.staged.get_mut())
    }

    pub(crate) fn watch<T>(
        &self,
        result: Result<T, tokio_postgres::Error>,
    ) -> Result<T, tokio_postgres::Error> {
        if let Err(e) = &result
            && is_retryable(e)
        {
            self.conflict.store(true, Ordering::Relaxed);
        }
        result
    }

    /// [`Transaction::execute`](tokio_postgres::Transaction::execute), watched for conflicts.
    pub async fn execute<T>(
        &self,
        statement: &T,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, tokio_postgres::Error>
    where
        T: ?Sized + ToStatement,
    {
        self.watch(self.txn.execute(statement, params).await)
    }

    /// [`Transaction::query`](tokio_postgres::Transaction::query), watched for conflicts.
    pub async fn query<T>(
        &self,
        statement: &T,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, tokio_postgres::Error>
    where
        T: ?Sized + ToStatement,
    {
        self.watch(self.txn.query(statement, params).await)
    }

    /// [`Transaction::query_one`](tokio_postgres::Transaction::query_one), watched for
    /// conflicts.
    pub async fn query_one<T>(
        &self,
        statement: &T,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Row, tokio_postgres::Error>
    where
        T: ?Sized + ToStatement,
    {
        self.watch(self.txn.query_one(statement, params).await)
    }

    /// [`Transaction::query_opt`](tokio_postgres::Transaction::query_opt), watched for
    /// conflicts.
    pub async fn query_opt<T>(
        &self,
        statement: &T,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>, tokio_postgres::Error>
    where
        T: ?Sized + ToStatement,
    {
        self.watch(self.txn.query_opt(statement, params).await)
    }

    /// [`Transaction::batch_execute`](tokio_postgres::Transaction::batch_execute), watched
    /// for conflicts.
    pub async fn batch_execute(&self, sql: &str) -> Result<(), tokio_postgres::Error> {
        self.watch(self.txn.batch_execute(sql).await)
    }

    /// Whether a watched statement hit a serialization failure or deadlock.
    pub(super) fn conflicted(&self) -> bool {
        self.conflict.load(Ordering::Relaxed)
    }

    /// The store's time (the server's clock) as this attempt's look read it, ms since the
    /// epoch.
    pub fn now_ms(&self) -> u64 {
        self.now_ms
    }

    /// Whether the key came back beyond its horizon (see
    /// [`Reservation::is_beyond_horizon`]).
    pub fn is_beyond_horizon(&self) -> bool {
        self.beyond_horizon
    }
}

/// The future a closure of [`PgStore::execute`] or [`PgStore::complete_with`] returns:
/// `Box::pin(async move { .. })`, borrowing the [`PgTx`] for its lifetime.
pub type PgFuture<'t, T> = Pin<Box<dyn Future<Output = T> + Send + 't>>;

/// What one attempt of a closure transaction ended with.
pub(super) enum Ran<T, E> {
    /// Committed (or answered without the closure).
    Answer(T),
    /// The closure failed: rolled back.
    Closure(E),
}

impl PgStore {
    /// Runs `body` once per intent, its writes and the finished record in one PostgreSQL
    /// transaction; duplicates get the stored outcome. See
    /// `idemdb::IdemDb::execute` for the outcomes.
    ///
    /// A duplicate that arrives while `body` runs waits for its commit (the key's lock
    /// stripe is held). `body` may run again after a serialization failure or deadlock.
    /// Write the closure inline in the call (bound to a variable first, it does not get the
    /// signature the call needs), and move owned copies of what it uses into its future.
    ///
    /// ```no_run
    /// # async fn run(store: &idemdb_postgres::PgStore) -> Result<(), Box<dyn std::error::Error>> {
    /// use idemdb_postgres::{Key, Outcome, PgTx, Scope};
    /// let (scope, key) = (Scope::new("POST /orders", "u1"), Key::new("k1"));
    /// let outcome = store
    ///     .execute(&scope, &key, b"req", |tx: &mut PgTx<'_>| {
    ///         Box::pin(async move {
    ///             tx.execute("INSERT INTO orders (id) VALUES ('o-1')", &[]).await?;
    ///             Ok::<_, idemdb_postgres::tokio_postgres::Error>(Outcome::Completed(b"201".to_vec()))
    ///         })
    ///     })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub async fn execute<F, E>(
        &self,
        scope: &Scope,
        key: &Key,
        payload: impl Into<Payload<'_>>,
        body: F,
    ) -> Result<ExecuteOutcome, ExecuteError<E, PgError>>
    where
        F: for<'t> FnMut(&'t mut PgTx<'_>) -> PgFuture<'t, Result<Outcome, E>> + Send,
        E: Send + 'static,
    {
        let inner = &self.inner;
        let key = RecordKey::encode(scope, key, &inner.limits)?;
        let fingerprint = inner.fingerprinter.resolve(payload.into());
        let result = inner.execute_encoded(&key, fingerprint, body).await;
        inner.counters.executed(&result);
        result
    }

    /// Finishes the reservation with success and runs `body` in the same transaction: the
    /// record becomes COMPLETED with `response` only if `body` succeeds. Refused like
    /// [`complete`](crate::Store::complete) (nothing runs then).
    pub async fn complete_with<F, E>(
        &self,
        reservation: &Reservation,
        response: impl Into<Vec<u8>>,
        body: F,
    ) -> Result<(), ExecuteError<E, PgError>>
    where
        F: for<'t> FnMut(&'t mut PgTx<'_>) -> PgFuture<'t, Result<(), E>> + Send,
        E: Send + 'static,
    {
        let state = RecordState::Completed;
        let result = self
            .inner
            .finish_with(reservation, state, response.into(), body)
            .await;
        self.count_owned(&result);
        result
    }

    /// [`complete_with`](Self::complete_with) for a deterministic failure: FAILED.
    pub async fn fail_with<F, E>(
        &self,
        reservation: &Reservation,
        response: impl Into<Vec<u8>>,
        body: F,
    ) -> Result<(), ExecuteError<E, PgError>>
    where
        F: for<'t> FnMut(&'t mut PgTx<'_>) -> PgFuture<'t, Result<(), E>> + Send,
        E: Send + 'static,
    {
        let state = RecordState::Failed;
        let result = self
            .inner
            .finish_with(reservation, state, response.into(), body)
            .await;
        self.count_owned(&result);
        result
    }
}

/// The record the reservation owns (`$4` its token), live by the store's clock, locked for the
/// transaction; the store's time.
const OWNED: &str = concat!(
    "WITH ",
    clock!(),
    " SELECT clock.now_ms FROM idemdb_records, clock WHERE ",
    key_is_params!(),
    " AND token = $4 AND state = 1 AND expires_at > clock.now_ms FOR UPDATE OF idemdb_records"
);

/// `execute`'s new record, finished (`$4` state, `$5` fingerprint, `$6` TTL, `$7` response),
/// its times the store's.
const INSERT_FINISHED: &str = concat!(
    "WITH ",
    clock!(),
    " INSERT INTO idemdb_records (operation, principal, key, state, fingerprint, token, \
     lease_expires_at, created_at, updated_at, expires_at, attempts, response) \
     SELECT $1::bytea, $2::bytea, $3::bytea, $4::smallint, $5::bytea, \
     nextval('idemdb_tokens'), clock.now_ms, clock.now_ms, clock.now_ms, \
     clock.now_ms + $6::bigint, 1, $7::bytea FROM clock RETURNING token"
);

impl PgStore {
    fn count_owned<E>(&self, result: &Result<(), ExecuteError<E, PgError>>) {
        let seen = match result {
            Ok(()) => Ok(()),
            Err(ExecuteError::Db(e)) => Err(e),
            Err(ExecuteError::Closure(_)) => return,
        };
        self.inner.counters.owned(seen, Owned::Finished);
    }
}

/// `execute`'s takeover: the record finished under a new token (`$5` state, `$6` response,
/// `$7` TTL), if its earlier owner's lease is still over by the store's clock (an owner's
/// `extend` takes no stripe).
const TAKE_OVER_FINISHED: &str = concat!(
    "WITH ",
    clock!(),
    " UPDATE idemdb_records SET token = nextval('idemdb_tokens'), state = $5, response = $6, \
     lease_expires_at = clock.now_ms, updated_at = clock.now_ms, attempts = attempts + 1, \
     expires_at = clock.now_ms + $7 FROM clock WHERE ",
    key_is_params!(),
    " AND token = $4 AND state = 1 AND lease_expires_at <= clock.now_ms"
);

/// A watched statement of the closure lost a conflict: the transaction runs again.
pub(super) fn conflict() -> Step {
    Step::Retry(PgError::Internal(
        "the closure's transaction kept losing serialization conflicts or deadlocks".into(),
    ))
}

/// A key of `execute` (or of a poll's message): what each attempt needs.
pub(super) struct Keyed<'k> {
    pub(super) key: &'k RecordKey,
    pub(super) parts: KeyParts<'k>,
    fingerprint: Fingerprint,
    pub(super) ttl: u64,
}

/// What one key's step did in an open transaction; nothing of it is committed yet.
pub(super) enum Done<E> {
    /// Answered without the closure (a duplicate, or refused beyond the horizon); nothing
    /// written.
    Answer(ExecuteOutcome),
    /// The closure ran and the finished record is written: both commit together.
    Executed {
        outcome: Outcome,
        takeover: bool,
        beyond: bool,
        /// The outbox messages the closure staged, to wake the dispatcher for once committed.
        staged: Vec<MessageId>,
    },
    /// The closure failed: what it wrote is to be rolled back.
    Closure(E),
}

impl Inner {
    pub(super) fn keyed<'k>(
        &self,
        key: &'k RecordKey,
        fingerprint: Fingerprint,
    ) -> Result<Keyed<'k>, PgError> {
        Ok(Keyed {
            parts: KeyParts::of(key)?,
            key,
            fingerprint,
            ttl: self.rules.ttl_ms(key),
        })
    }

    /// Makes the partitions that records finished now with TTLs from `shortest` to
    /// `longest` go to (the server's time estimated, with slack).
    pub(super) async fn partitions_ahead(
        &self,
        client: &deadpool_postgres::Client,
        shortest: u64,
        longest: u64,
    ) -> Result<(), Step> {
        let now = self.server_time();
        let to = now
            .saturating_add(longest)
            .saturating_add(PARTITION_SLACK_MS);
        self.partitions
            .ensure_range(client, now.saturating_add(shortest), to)
            .await
            .map_err(Step::before_commit)?;
        Ok(())
    }

    /// After a failed attempt: `Ok` to run it again (after a pause, or once the missing
    /// partition is made), else the caller's error.
    pub(super) async fn again(&self, step: Step, attempt: u32) -> Result<(), PgError> {
        match step {
            Step::Fail(e) => Err(e),
            Step::Partition(at) if attempt < MAX_ATTEMPTS => {
                self.counters.retried();
                self.remake_partition(at).await
            }
            Step::Retry(_) if attempt < MAX_ATTEMPTS => {
                self.counters.retried();
                tokio::time::sleep(backoff(attempt)).await;
                Ok(())
            }
            Step::Partition(_) => Err(partition_missing()),
            Step::Retry(e) => Err(e),
        }
    }

    /// An attempt's end: `None` to run it again, else the caller's answer.
    pub(super) async fn settle<T, E>(
        &self,
        step: Result<Ran<T, E>, Step>,
        attempt: u32,
    ) -> Option<Result<T, ExecuteError<E, PgError>>> {
        match step {
            Ok(Ran::Answer(v)) => Some(Ok(v)),
            Ok(Ran::Closure(e)) => Some(Err(ExecuteError::Closure(e))),
            Err(step) => self.again(step, attempt).await.err().map(|e| Err(e.into())),
        }
    }

    async fn execute_encoded<F, E>(
        &self,
        key: &RecordKey,
        fingerprint: Fingerprint,
        mut body: F,
    ) -> Result<ExecuteOutcome, ExecuteError<E, PgError>>
    where
        F: for<'t> FnMut(&'t mut PgTx<'_>) -> PgFuture<'t, Result<Outcome, E>> + Send,
        E: Send + 'static,
    {
        let k = self.keyed(key, fingerprint)?;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let step = self.execute_once(&k, &mut body).await;
            if let Some(answer) = self.settle(step, attempt).await {
                return answer;
            }
        }
    }

    async fn execute_once<F, E>(
        &self,
        k: &Keyed<'_>,
        body: &mut F,
    ) -> Result<Ran<ExecuteOutcome, E>, Step>
    where
        F: for<'t> FnMut(&'t mut PgTx<'_>) -> PgFuture<'t, Result<Outcome, E>> + Send,
        E: Send + 'static,
    {
        let mut client = self.pool.get().await.map_err(pool)?;
        self.partitions_ahead(&client, k.ttl, k.ttl).await?;
        let txn = client.transaction().await.map_err(Step::before_commit)?;
        let found = self.locked_look(&txn, k.key, &k.parts).await?;
        Ok(match self.execute_locked(&txn, k, found, body).await? {
            Done::Answer(outcome) => Ran::Answer(outcome),
            Done::Closure(e) => Ran::Closure(e),
            Done::Executed {
                outcome,
                takeover,
                beyond,
                staged,
            } => {
                let began = std::time::Instant::now();
                txn.commit().await.map_err(Step::at_commit)?;
                self.counters.committed(began.elapsed());
                self.outbox.committed(&staged);
                self.counters.executed_as(takeover, beyond);
                Ran::Answer(ExecuteOutcome::Executed(outcome))
            }
        })
    }

    /// One key's step of `execute`, in `txn`, which holds the key's stripe lock: `found` (its
    /// newest row, read under that lock) decided on by the shared `decide`, then `body` and
    /// the finished record, inserted or taken over from an expired lease. Commits nothing.
    pub(super) async fn execute_locked<F, E>(
        &self,
        txn: &deadpool_postgres::Transaction<'_>,
        k: &Keyed<'_>,
        found: Found,
        body: &mut F,
    ) -> Result<Done<E>, Step>
    where
        F: for<'t> FnMut(&'t mut PgTx<'_>) -> PgFuture<'t, Result<Outcome, E>> + Send,
        E: Send + 'static,
    {
        let p = &k.parts;
        let (beyond, now) = (found.expired, found.now_ms);
        let previous = match decide(found.live, k.fingerprint, now) {
            Decision::Replay(r) => return Ok(Done::Answer(r.into())),
            Decision::Acquire if beyond && self.rules.policy == BeyondHorizonPolicy::Refuse => {
                return Ok(Done::Answer(ExecuteOutcome::BeyondHorizon));
            }
            Decision::Acquire => None,
            Decision::TakeOver(prev) => Some(prev),
        };
        let mut tx = PgTx::new(txn, now, beyond, Some(k.key), &self.limits);
        // A conflict the closure swallowed left the transaction aborted: run again.
        let outcome = match body(&mut tx).await {
            _ if tx.conflicted() => return Err(conflict()),
            Ok(outcome) => outcome,
            Err(e) => return Ok(Done::Closure(e)),
        };
        let staged = tx.take_staged();
        self.limits.check_response(outcome.response())?;
        let (state, response) = match &outcome {
            Outcome::Completed(b) => (RecordState::Completed, b),
            Outcome::Failed(b) => (RecordState::Failed, b),
        };
        let (state, ttl_v) = (state_code(state), span(k.ttl));
        match &previous {
            None => {
                let fp = fingerprint_bytes(k.fingerprint).to_vec();
                let params: [&(dyn ToSql + Sync); 7] = [
                    &p.operation,
                    &p.principal,
                    &p.key,
                    &state,
                    &fp,
                    &ttl_v,
                    response,
                ];
                txn.query_one(&prepared(txn, INSERT_FINISHED).await?, &params)
                    .await
                    .map_err(Step::before_commit)?;
            }
            Some(prev) => {
                // The earlier owner's lease ran out (and was not extended since: `extend`
                // takes no stripe); it is fenced from here on.
                let token = token_value(prev.token);
                let params: [&(dyn ToSql + Sync); 7] = [
                    &p.operation,
                    &p.principal,
                    &p.key,
                    &token,
                    &state,
                    response,
                    &ttl_v,
                ];
                let n = txn
                    .execute(&prepared(txn, TAKE_OVER_FINISHED).await?, &params)
                    .await
                    .map_err(Step::before_commit)?;
                if n != 1 {
                    // Its owner finished or extended it meanwhile: decide again.
                    return Err(moved());
                }
            }
        }
        Ok(Done::Executed {
            outcome,
            takeover: previous.is_some(),
            beyond,
            staged,
        })
    }

    async fn finish_with<F, E>(
        &self,
        reservation: &Reservation,
        state: RecordState,
        response: Vec<u8>,
        mut body: F,
    ) -> Result<(), ExecuteError<E, PgError>>
    where
        F: for<'t> FnMut(&'t mut PgTx<'_>) -> PgFuture<'t, Result<(), E>> + Send,
        E: Send + 'static,
    {
        self.check_issuer(reservation)?;
        self.limits.check_response(&response)?;
        let key = reservation.record_key();
        let p = KeyParts::of(key)?;
        let ttl = self.rules.ttl_ms(key);
        let channel = CHANNEL.to_string();
        let hash = payload(key);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let step: Result<Ran<(), E>, Step> = async {
                let mut client = self.pool.get().await.map_err(pool)?;
                let expires = self.server_time().saturating_add(ttl);
                self.partitions
                    .ensure(&client, expires)
                    .await
                    .map_err(Step::before_commit)?;
                let txn = client.transaction().await.map_err(Step::before_commit)?;
                // Owned, and locked: no takeover can slip in while the closure runs.
                let token = token_value(reservation.token());
                let owned = txn
                    .query_opt(
                        &prepared(&txn, OWNED).await?,
                        &[&p.operation, &p.principal, &p.key, &token],
                    )
                    .await
                    .map_err(Step::before_commit)?;
                let Some(owned) = owned else {
                    let look = txn
                        .query_one(
                            &prepared(&txn, NEWEST).await?,
                            &[&p.operation, &p.principal, &p.key],
                        )
                        .await
                        .map_err(Step::before_commit)?;
                    check_owner(self.seen(Found::of(&look, 9)?).live, reservation.token())?;
                    // Owned after all (it moved between the statements): run again.
                    return Err(moved());
                };
                let now: i64 = owned.try_get(0).map_err(Step::before_commit)?;
                let now = stored_ms(now)?;
                let beyond = reservation.is_beyond_horizon();
                let mut tx = PgTx::new(&txn, now, beyond, Some(key), &self.limits);
                match body(&mut tx).await {
                    _ if tx.conflicted() => return Err(conflict()),
                    Ok(()) => {}
                    Err(e) => return Ok(Ran::Closure(e)),
                }
                let staged = tx.take_staged();
                // After the closure: on a transaction the closure left aborted this fails,
                // where a bare COMMIT would roll back and report nothing.
                let finished = txn
                    .query(
                        &prepared(&txn, FINISH).await?,
                        &[
                            &p.operation,
                            &p.principal,
                            &p.key,
                            &token,
                            &state_code(state),
                            &response,
                            &span(ttl),
                            &channel,
                            &hash,
                        ],
                    )
                    .await
                    .map_err(Step::before_commit)?;
                if finished.len() != 1 {
                    return Err(Step::Fail(PgError::Internal(
                        "a locked record was not finished".into(),
                    )));
                }
                let began = std::time::Instant::now();
                txn.commit().await.map_err(Step::at_commit)?;
                self.counters.committed(began.elapsed());
                self.outbox.committed(&staged);
                Ok(Ran::Answer(()))
            }
            .await;
            if let Some(answer) = self.settle(step, attempt).await {
                return answer;
            }
        }
    }
}
