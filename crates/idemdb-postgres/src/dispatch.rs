//! `PgDispatcher`: a task that claims committed messages, hands them to an async publisher in
//! order per ordering key, and marks them in a later commit. Several instances dispatch one
//! outbox side by side (docs/design.md §15).
//!
//! A round: one transaction takes the claim lock exclusively and claims up to a batch of
//! messages that are due, not parked, not claimed by a live claim, and not behind an earlier
//! message of their key that is any of those, under a fresh claim token and a lease by the
//! server's clock. Publishing runs outside any transaction. A second transaction, under the
//! claim lock's shared side, marks the outcome of each message where the row still carries
//! this round's token: delivered (deleted), rescheduled, parked, or released unsent. A claim
//! that lapsed and was taken by another instance carries its token: this round's marks of it
//! are fenced. Claims never run beside a mark, so a claim sees every earlier mark whole.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_postgres::types::ToSql;

use super::errors::{database, pool};
use super::outbox::{CLAIM_LOCK, message};
use super::sql::{clock, span};
use super::store::{Inner, PgStore};
use crate::error::PgError;
use idemdb_core::dispatch::{AfterFailure, DispatchOptions, RetrySchedule, publisher_panicked};
use idemdb_core::outbox::{AsyncPublish, OutboxMessage, PublishError};

/// Claims up to `$1` messages for `$2` ms; `$3` is the furthest ahead a retry is ever
/// scheduled (one further ahead was scheduled before the clock stepped back: due). A row
/// locked by anyone else fails the claim (`NOWAIT`) rather than being skipped: a skipped
/// message would let a later one of its key go first. Every write of idemdb's own runs under
/// the claim lock's shared side, so only an outsider's lock can be met.
fn claim_sql() -> String {
    format!(
        concat!(
            "WITH ",
            clock!(),
            ", token AS (SELECT nextval('idemdb_outbox_claims') AS t), \
             free AS (SELECT o.seq FROM idemdb_outbox o, clock c \
             WHERE NOT o.parked AND o.claim_expires_at <= c.now_ms \
             AND (o.next_attempt_at <= c.now_ms OR o.next_attempt_at > c.now_ms + $3) \
             AND (o.ordering_key IS NULL OR NOT EXISTS (SELECT 1 FROM idemdb_outbox e \
             WHERE e.ordering_key = o.ordering_key AND e.seq < o.seq \
             AND (e.parked OR e.claim_expires_at > c.now_ms \
             OR (e.next_attempt_at > c.now_ms AND e.next_attempt_at <= c.now_ms + $3)))) \
             ORDER BY o.seq LIMIT $1 FOR UPDATE OF o NOWAIT) \
             UPDATE idemdb_outbox SET claim_token = token.t, \
             claim_expires_at = clock.now_ms + $2 \
             FROM free, token, clock WHERE idemdb_outbox.seq = free.seq \
             RETURNING {}, token.t, clock.now_ms"
        ),
        "idemdb_outbox.seq, idemdb_outbox.id, idemdb_outbox.destination, \
         idemdb_outbox.ordering_key, idemdb_outbox.header_names, idemdb_outbox.header_values, \
         idemdb_outbox.payload, idemdb_outbox.staged_at, idemdb_outbox.attempts, \
         idemdb_outbox.last_error"
    )
}

/// The claim lock, exclusively (a claim) or shared (a mark).
const LOCK: &str = "SELECT pg_advisory_xact_lock($1, 0)";
const LOCK_SHARED: &str = "SELECT pg_advisory_xact_lock_shared($1, 0)";

/// Delivered: deleted, where the row is still this claim's (`$2`) and not parked meanwhile.
const DELIVERED: &str = "DELETE FROM idemdb_outbox WHERE seq = ANY($1) AND claim_token = $2 \
     AND NOT parked";

/// Failed: rescheduled or parked, the claim released; where the row is still this claim's.
const FAILED: &str = "UPDATE idemdb_outbox o SET attempts = f.attempts, last_error = f.reason, \
     next_attempt_at = f.next_at, parked = f.park, claim_expires_at = 0 \
     FROM unnest($1::bigint[], $2::int[], $3::text[], $4::bigint[], $5::bool[]) \
     AS f(seq, attempts, reason, next_at, park) \
     WHERE o.seq = f.seq AND o.claim_token = $6 AND NOT o.parked RETURNING f.park";

/// Claimed and not sent (a failure ahead of it in its key, or a stop): released.
const RELEASED: &str = "UPDATE idemdb_outbox SET claim_expires_at = 0 \
     WHERE seq = ANY($1) AND claim_token = $2";

/// Delivers the outbox of the database a [`PgStore`] is connected to, through an async
/// publisher, on a task of the store's runtime, until stopped or dropped.
///
/// Start one in each instance of the service: they share the outbox through claims, each a
/// batch under a lease ([`DispatchOptions::claim_lease`], by the server's clock). Each message
/// goes to the publisher after the transaction that staged it committed; once the publisher
/// returns `Ok`, a later commit marks it delivered (deletes it). An instance that dies
/// between the two, or whose claim lapses while it publishes, leaves the message to be sent
/// again, by another instance once the lease is over: delivery is at least once, with the
/// message's stable [`MessageId`](idemdb_core::MessageId) for the receiver to drop the
/// duplicate (semantics.md §13). A lapsed claimant's marks are fenced. Failures are retried
/// with exponential backoff and jitter up to [`DispatchOptions::max_attempts`]; then, or at
/// once on a permanent error, the message is parked, holding back only later messages of its
/// ordering key. A database error (a lost connection, a server restart) fails the round; the
/// dispatcher tries again after a pause and never stops on its own.
///
/// A commit of this instance that staged a message wakes its dispatcher; messages other
/// instances staged are found by their own dispatchers, or by this one's
/// [`idle_check`](DispatchOptions::idle_check).
///
/// ```no_run
/// # async fn run(store: &idemdb_postgres::PgStore) -> Result<(), idemdb_postgres::PgError> {
/// use idemdb_postgres::{DispatchOptions, OutboxMessage, PgDispatcher, PublishError};
/// let dispatcher = PgDispatcher::start(store, |m: OutboxMessage| async move {
///     // e.g. POST m.payload to m.destination with m.id as its Idempotency-Key
///     let _ = (m.id, m.payload);
///     Ok::<(), PublishError>(())
/// }, DispatchOptions::default());
/// // ... serve ...
/// dispatcher.stop().await;
/// # Ok(()) }
/// ```
pub struct PgDispatcher {
    stop: Arc<Stop>,
    task: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for PgDispatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgDispatcher")
            .field("running", &self.is_running())
            .finish_non_exhaustive()
    }
}

#[derive(Default)]
struct Stop {
    asked: AtomicBool,
    wake: Notify,
}

impl PgDispatcher {
    /// Starts delivering the outbox of `store`'s database through `publisher`, on the runtime
    /// the store was connected on.
    pub fn start(
        store: &PgStore,
        publisher: impl AsyncPublish,
        options: DispatchOptions,
    ) -> PgDispatcher {
        let inner = Arc::clone(&store.inner);
        let stop = Arc::new(Stop::default());
        let mut run = Rounds {
            schedule: RetrySchedule::new(&options),
            claim_sql: claim_sql(),
            inner: Arc::clone(&inner),
            stop: Arc::clone(&stop),
            options,
            publisher: Box::new(publisher),
            next_retry: None,
            conn: None,
        };
        let task = inner.runtime.spawn(async move { run.run().await });
        PgDispatcher {
            stop,
            task: Some(task),
        }
    }

    /// Whether its task still runs.
    pub fn is_running(&self) -> bool {
        self.task.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// Stops after the message being published (if any), its round's marks, and the release
    /// of what it claimed and did not send.
    pub async fn stop(mut self) {
        self.ask_stop();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }

    fn ask_stop(&self) {
        self.stop.asked.store(true, Ordering::Release);
        self.stop.wake.notify_one();
    }
}

impl Drop for PgDispatcher {
    /// Asks the task to stop; it ends its round (marks included) on its own.
    fn drop(&mut self) {
        self.ask_stop();
    }
}

/// How many times a round's marks are made again after a database error.
const MARK_ATTEMPTS: u32 = 4;

/// The dispatcher task's state.
struct Rounds {
    inner: Arc<Inner>,
    stop: Arc<Stop>,
    options: DispatchOptions,
    publisher: Box<dyn AsyncPublish>,
    schedule: RetrySchedule,
    claim_sql: String,
    /// When the earliest retry this dispatcher scheduled is due.
    next_retry: Option<Instant>,
    /// The connection of its busy rounds (`None` while idle).
    conn: Option<deadpool_postgres::Object>,
}

/// What one round's publishing decided, to be marked.
#[derive(Default)]
struct Marks {
    delivered: Vec<i64>,
    failed: Vec<(i64, i32, String, i64, bool)>,
    released: Vec<i64>,
}

impl Rounds {
    fn stopping(&self) -> bool {
        self.stop.asked.load(Ordering::Acquire)
    }

    async fn run(&mut self) {
        while !self.stopping() {
            let pause = match self.round().await {
                Ok(claimed) if claimed >= self.options.batch => continue,
                Ok(_) => {
                    // Idle: the connection goes back to the pool.
                    self.conn = None;
                    self.idle_wait()
                }
                Err(_e) => {
                    self.conn = None;
                    self.inner
                        .outbox
                        .round_errors
                        .fetch_add(1, Ordering::Relaxed);
                    #[cfg(feature = "tracing")]
                    tracing::warn!(error = %_e, "an outbox dispatching round failed; trying again");
                    self.options.idle_check.min(Duration::from_secs(1))
                }
            };
            tokio::select! {
                () = self.inner.outbox.wake.notified() => {}
                () = self.stop.wake.notified() => {}
                () = tokio::time::sleep(pause) => {}
            }
        }
    }

    /// How long to wait with nothing to send: until the earliest retry this dispatcher
    /// scheduled, at most `idle_check`. Refreshes the gauges meanwhile (feature `metrics`).
    fn idle_wait(&mut self) -> Duration {
        let now = Instant::now();
        let retry = self.next_retry.filter(|at| *at > now);
        self.next_retry = retry;
        retry.map_or(self.options.idle_check, |at| {
            (at - now).min(self.options.idle_check)
        })
    }

    /// One claim, its publishing and its marks; how many messages were claimed.
    async fn round(&mut self) -> Result<usize, PgError> {
        // Before the claim's statement reads the server's clock: the time since is never
        // less than the time since its `now`.
        let asked = Instant::now();
        let (claimed, token, now) = self.claim().await?;
        let n = claimed.len();
        if n == 0 {
            return Ok(0);
        }
        let marks = self.publish(claimed, now, asked).await;
        // A mark lost with its connection is made again on another (each statement applies
        // only where the row still carries this claim's token, so twice is once); else the
        // claims would hold their keys until the lease ends.
        let mut attempt = 0;
        loop {
            match self.mark(&marks, token).await {
                Ok(()) => return Ok(n),
                Err(e) if attempt >= MARK_ATTEMPTS => return Err(e),
                Err(_) => {
                    attempt += 1;
                    self.conn = None;
                    self.inner
                        .outbox
                        .round_errors
                        .fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(10 << attempt)).await;
                }
            }
        }
    }

    /// The connection this dispatcher's busy rounds share (taken from the pool, given back
    /// when idle or after an error), with its statements prepared.
    async fn connection(&mut self) -> Result<&deadpool_postgres::Object, PgError> {
        if self.conn.is_none() {
            self.conn = Some(self.inner.pool.get().await.map_err(pool)?);
        }
        self.conn
            .as_ref()
            .ok_or_else(|| PgError::Internal("no dispatcher connection".into()))
    }

    /// One claim: `BEGIN`, the claim lock, the claiming statement and `COMMIT`, sent in one
    /// round trip (pipelined; the statements are prepared, so each is sent at its first poll,
    /// in order). A failed statement leaves the transaction aborted, and its `COMMIT` rolls
    /// it back.
    async fn claim(&mut self) -> Result<(Vec<OutboxMessage>, i64, u64), PgError> {
        let batch = i64::try_from(self.options.batch).unwrap_or(i64::MAX);
        let lease = span(millis(self.options.claim_lease));
        let longest = span(self.schedule.longest());
        let claim_sql = self.claim_sql.clone();
        let client = self.connection().await?;
        let lock = client.prepare_cached(LOCK).await.map_err(database)?;
        let claim = client.prepare_cached(&claim_sql).await.map_err(database)?;
        let params: [&(dyn ToSql + Sync); 3] = [&batch, &lease, &longest];
        let (begin, locked, rows, commit) = tokio::join!(
            client.batch_execute("BEGIN"),
            client.execute(&lock, &[&CLAIM_LOCK]),
            client.query(&claim, &params),
            client.batch_execute("COMMIT"),
        );
        begin.map_err(database)?;
        locked.map_err(database)?;
        let rows = rows.map_err(database)?;
        commit.map_err(database)?;
        let mut token = 0;
        let mut now = 0;
        let mut claimed = Vec::with_capacity(rows.len());
        for row in &rows {
            token = row.try_get(10).map_err(database)?;
            let at: i64 = row.try_get(11).map_err(database)?;
            now = u64::try_from(at).unwrap_or(0);
            claimed.push(message(row)?);
        }
        claimed.sort_by_key(|m| m.seq);
        Ok((claimed, token, now))
    }

    /// Hands each claimed message to the publisher, in order; after a failure, later
    /// messages of the same ordering key are released for a later round. Stops publishing
    /// once the claim's lease may have lapsed by this instance's clock (`began`: just before
    /// the claim read the server's clock at `now`).
    async fn publish(&mut self, claimed: Vec<OutboxMessage>, now: u64, began: Instant) -> Marks {
        let mut marks = Marks::default();
        let mut failed: HashSet<Vec<u8>> = HashSet::new();
        for message in claimed {
            let seq = i64::try_from(message.seq).unwrap_or(i64::MAX);
            let held = message
                .ordering_key
                .as_ref()
                .is_some_and(|k| failed.contains(k));
            if held || self.stopping() || began.elapsed() >= self.options.claim_lease {
                marks.released.push(seq);
                continue;
            }
            let (id, key, attempts) = (message.id, message.ordering_key.clone(), message.attempts);
            // On a task of its own, so that a panicking publisher is a failed attempt; bounded
            // by what is left of the claim's lease, after which another instance may send it.
            let left = self.options.claim_lease.saturating_sub(began.elapsed());
            let task = tokio::spawn(self.publisher.publish(message));
            let abort = task.abort_handle();
            let sent = match tokio::time::timeout(left, task).await {
                Ok(Ok(sent)) => sent,
                Ok(Err(e)) if e.is_panic() => Err(publisher_panicked(&*e.into_panic())),
                Ok(Err(_)) => Err(PublishError::Transient("the publish was cancelled".into())),
                Err(_) => {
                    abort.abort();
                    Err(PublishError::Transient(
                        "the publish outlasted the claim's lease".into(),
                    ))
                }
            };
            let error = match sent {
                Ok(()) => {
                    self.inner.outbox.published(&id);
                    marks.delivered.push(seq);
                    continue;
                }
                Err(e) => e,
            };
            let attempts = attempts.saturating_add(1);
            // The backoff runs from the failure: the claim's time plus what passed since.
            let failed_at = now.saturating_add(millis(began.elapsed()));
            let (next_at, park) = match self.schedule.after(&error, attempts, failed_at) {
                AfterFailure::RetryAt(at) => {
                    let wait = Duration::from_millis(at.saturating_sub(failed_at));
                    let due = Instant::now() + wait;
                    self.next_retry = Some(self.next_retry.map_or(due, |d| d.min(due)));
                    (at, false)
                }
                AfterFailure::Park => (0, true),
            };
            let next_at = i64::try_from(next_at).unwrap_or(i64::MAX);
            let attempts = i32::try_from(attempts).unwrap_or(i32::MAX);
            marks
                .failed
                .push((seq, attempts, error.into_reason(), next_at, park));
            if let Some(k) = key {
                failed.insert(k);
            }
        }
        marks
    }

    /// The round's marks in one commit, each where the row is still this claim's.
    async fn mark(&mut self, marks: &Marks, token: i64) -> Result<(), PgError> {
        let (mut seqs, mut attempts, mut reasons, mut next_at, mut park) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (s, a, r, n, p) in &marks.failed {
            seqs.push(*s);
            attempts.push(*a);
            reasons.push(r.as_str());
            next_at.push(*n);
            park.push(*p);
        }
        let client = self.connection().await?;
        let lock = client.prepare_cached(LOCK_SHARED).await.map_err(database)?;
        let delivered = client.prepare_cached(DELIVERED).await.map_err(database)?;
        let failed = client.prepare_cached(FAILED).await.map_err(database)?;
        let released = client.prepare_cached(RELEASED).await.map_err(database)?;
        let delivered_params: [&(dyn ToSql + Sync); 2] = [&marks.delivered, &token];
        let failed_params: [&(dyn ToSql + Sync); 6] =
            [&seqs, &attempts, &reasons, &next_at, &park, &token];
        let released_params: [&(dyn ToSql + Sync); 2] = [&marks.released, &token];
        // One round trip, as the claim's.
        let (begin, locked, n_delivered, failed, released, commit) = tokio::join!(
            client.batch_execute("BEGIN"),
            client.execute(&lock, &[&CLAIM_LOCK]),
            client.execute(&delivered, &delivered_params),
            client.query(&failed, &failed_params),
            client.execute(&released, &released_params),
            client.batch_execute("COMMIT"),
        );
        begin.map_err(database)?;
        locked.map_err(database)?;
        let delivered = n_delivered.map_err(database)?;
        let failed = failed.map_err(database)?;
        released.map_err(database)?;
        commit.map_err(database)?;
        let parked = failed.iter().filter(|r| r.get::<_, bool>(0)).count() as u64;
        let retried = failed.len() as u64 - parked;
        let fenced = (marks.delivered.len() as u64).saturating_sub(delivered);
        self.inner.outbox.count(delivered, retried, parked, fenced);
        Ok(())
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_claim_names_every_column_a_message_is_read_from() {
        let sql = super::claim_sql();
        for column in super::super::outbox::COLUMNS.split(", ") {
            assert!(sql.contains(&format!("idemdb_outbox.{column}")), "{column}");
        }
    }
}
