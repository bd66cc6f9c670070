//! `reserve`, `reserve_or_wait` and `get` over PostgreSQL. The shared `decide` chooses; the
//! database makes each choice atomic:
//! - a fresh key or a replay is one autocommit statement (`idemdb_reserve`, design.md §14):
//!   it reads the newest row and, where nothing live exists, inserts under the key's stripe
//!   row lock after a second read under that lock, so that no two callers insert it (a
//!   partitioned table has no unique index across partitions);
//! - a live record whose lease ran out is taken over by an update guarded by its token,
//!   state and lease (a concurrent change makes it match nothing: look again).
use std::time::Duration;

use tokio::time::Instant;

use super::batch::{BatchAnswer, BatchOp, answer_of};
use super::batch_run::Turn;
use super::errors::{MAX_ATTEMPTS, Step, backoff, database, partition_missing, pool};
use super::partitions::PARTITION_SLACK_MS;
use super::rows::{
    Found, KeyParts, NEWEST, fingerprint_bytes, newest, stored_ms, token_from, token_value,
};
use super::schema::stripe;
use super::sql::{clock, key_is_params, span};
use super::store::Inner;
use crate::error::PgError;
use idemdb_core::Record;
use idemdb_core::clock::lease_ms;
use idemdb_core::decide::{Decision, decide};
use idemdb_core::fingerprint::{Fingerprint, Payload};
use idemdb_core::outcome::ReserveOutcome;
use idemdb_core::retention::BeyondHorizonPolicy;
use idemdb_core::scope::{Key, RecordKey, Scope};
use idemdb_core::token::{FencingToken, Grant, Reservation};
use tokio_postgres::types::ToSql;

type Reserved = Result<ReserveOutcome, PgError>;

/// What a reserve's row decides.
enum Reading {
    /// The answer, and whether it inserted the record (a write committed).
    Answer(ReserveOutcome, bool),
    /// A live record whose lease ran out: to take over.
    TakeOver(Record),
    /// Nothing live and nothing inserted; `expired`: an expired record is stored.
    NotInserted { expired: bool },
}

/// A takeover: the record's owner changes if it is still the one decided on and its lease is
/// still over by the store's clock. `$4` the token seen, `$5` the lease, `$6` the TTL (ms).
const TAKE_OVER: &str = concat!(
    "WITH ",
    clock!(),
    " UPDATE idemdb_records SET token = nextval('idemdb_tokens'), \
     lease_expires_at = clock.now_ms + $5, updated_at = clock.now_ms, \
     attempts = attempts + 1, expires_at = clock.now_ms + $5 + $6 FROM clock WHERE ",
    key_is_params!(),
    " AND token = $4 AND state = 1 AND lease_expires_at <= clock.now_ms \
     AND expires_at > clock.now_ms \
     RETURNING idemdb_records.token, idemdb_records.lease_expires_at, idemdb_records.attempts"
);

/// A waiting duplicate's announcement to the live IN_PROGRESS record of its key (`$4`: the
/// owner's token already told, if any; the record is left alone for it).
const ANNOUNCE: &str = concat!(
    "WITH ",
    clock!(),
    " UPDATE idemdb_records SET waiters = waiters + 1 FROM clock WHERE ",
    key_is_params!(),
    " AND state = 1 AND lease_expires_at > clock.now_ms AND expires_at > clock.now_ms \
     AND token IS DISTINCT FROM $4::bigint RETURNING idemdb_records.token"
);

/// The reservation in one statement (schema version 3's `idemdb_reserve`, design.md §14):
/// `$4` fingerprint, `$5` lease, `$6` TTL, `$7` whether the policy flags a key beyond its
/// horizon, `$8` the key's stripe. Columns 0–8 the newest row, 9 the inserted token, 10 its
/// lease end, 11 the store's time.
const RESERVE: &str = "SELECT * FROM idemdb_reserve($1, $2, $3, $4, $5, $6, $7, $8)";

/// Locks the stripe of a key; held until the transaction ends.
const LOCK_STRIPE: &str = "SELECT stripe FROM idemdb_stripes WHERE stripe = $1 FOR UPDATE";

/// Locks the stripes in `$1`: in the order of the sort, which is below the row locks in the
/// plan.
const LOCK_STRIPES: &str =
    "SELECT stripe FROM idemdb_stripes WHERE stripe = ANY($1) ORDER BY stripe FOR UPDATE";

/// A reservation in the making: what every attempt needs.
pub(crate) struct Request<'a> {
    pub(crate) key: &'a RecordKey,
    pub(crate) parts: KeyParts<'a>,
    pub(crate) fingerprint: Fingerprint,
    pub(crate) lease_ms: u64,
}

impl Inner {
    fn request<'k>(
        &self,
        key: &'k RecordKey,
        payload: Payload<'_>,
        lease: Duration,
    ) -> Result<Request<'k>, PgError> {
        Ok(Request {
            parts: KeyParts::of(key)?,
            key,
            fingerprint: self.fingerprinter.resolve(payload),
            lease_ms: lease_ms(lease)?,
        })
    }

    /// Locks the key's stripe in `txn` and reads its newest row again, with the store's time:
    /// what no other reservation of the key can change until the transaction ends.
    pub(crate) async fn locked_look(
        &self,
        txn: &deadpool_postgres::Transaction<'_>,
        key: &RecordKey,
        p: &KeyParts<'_>,
    ) -> Result<Found, Step> {
        txn.query_one(&prepared(txn, LOCK_STRIPE).await?, &[&stripe(key)])
            .await
            .map_err(Step::before_commit)?;
        self.look(txn, p).await
    }

    /// Locks the stripes of many keys in `txn`, in ascending order, so that two transactions
    /// locking overlapping sets cannot deadlock on them.
    pub(crate) async fn lock_stripes<'k>(
        &self,
        txn: &deadpool_postgres::Transaction<'_>,
        keys: impl Iterator<Item = &'k RecordKey>,
    ) -> Result<(), Step> {
        let mut stripes: Vec<i32> = keys.map(stripe).collect();
        stripes.sort_unstable();
        stripes.dedup();
        txn.query(&prepared(txn, LOCK_STRIPES).await?, &[&stripes])
            .await
            .map_err(Step::before_commit)?;
        Ok(())
    }

    /// The key's newest row read in `txn`, with the store's time; only what a lock on its
    /// stripe keeps until the transaction ends if `txn` holds one.
    pub(crate) async fn look(
        &self,
        txn: &deadpool_postgres::Transaction<'_>,
        p: &KeyParts<'_>,
    ) -> Result<Found, Step> {
        let row = txn
            .query_one(
                &prepared(txn, NEWEST).await?,
                &[&p.operation, &p.principal, &p.key],
            )
            .await
            .map_err(Step::before_commit)?;
        Ok(self.seen(Found::of(&row, 9)?))
    }

    pub(crate) async fn reserve(
        &self,
        scope: &Scope,
        key: &Key,
        payload: Payload<'_>,
        lease: Duration,
    ) -> Reserved {
        let key = RecordKey::encode(scope, key, &self.limits)?;
        let request = self.request(&key, payload, lease)?;
        self.reserve_request(&request).await
    }

    pub(crate) async fn reserve_or_wait(
        &self,
        scope: &Scope,
        key: &Key,
        payload: Payload<'_>,
        lease: Duration,
        timeout: Duration,
    ) -> Reserved {
        let key = RecordKey::encode(scope, key, &self.limits)?;
        let request = self.request(&key, payload, lease)?;
        let deadline = Instant::now().checked_add(timeout);
        let waiter = self.waits.register(&key);
        // The owner's token this waiter announced itself to, once it has.
        let mut announced = None;
        loop {
            // Armed before the look: a notification between the look and the wait counts.
            let notified = waiter.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let outcome = self.reserve_request(&request).await?;
            let ReserveOutcome::InProgress { retry_after } = outcome else {
                return Ok(outcome);
            };
            let now = Instant::now();
            if deadline.is_some_and(|d| d <= now) {
                return Ok(outcome);
            }
            match self.announce_waiter(&request, announced).await {
                // The record changed since the look: look again at once.
                Ok(None) => continue,
                Ok(Some(token)) => announced = Some(token),
                // Unannounced, the wait still ends by the poll below.
                Err(_) => {}
            }
            // The owner's notification, its lease's end, the timeout or the fallback poll.
            let mut until = now + retry_after.min(self.wait_poll);
            if let Some(d) = deadline {
                until = until.min(d);
            }
            let _ = tokio::time::timeout_at(until, notified).await;
        }
    }

    /// Tells the owner of the key's live IN_PROGRESS record that a duplicate waits, so that
    /// its finish or release notifies (once per owner: `announced` is the token already
    /// told). The owner's token, or `None` if there is no such record any more.
    async fn announce_waiter(
        &self,
        request: &Request<'_>,
        announced: Option<i64>,
    ) -> Result<Option<i64>, PgError> {
        let p = &request.parts;
        let client = self.pool.get().await.map_err(pool)?;
        let stmt = client.prepare_cached(ANNOUNCE).await.map_err(database)?;
        let row = client
            .query_opt(&stmt, &[&p.operation, &p.principal, &p.key, &announced])
            .await
            .map_err(database)?;
        match row {
            Some(row) => Ok(Some(row.try_get(0).map_err(database)?)),
            // Announced already to this owner, or the record changed.
            None if announced.is_some() => Ok(announced),
            None => Ok(None),
        }
    }

    pub(crate) async fn get(&self, scope: &Scope, key: &Key) -> Result<Option<Record>, PgError> {
        let key = RecordKey::encode(scope, key, &self.limits)?;
        let parts = KeyParts::of(&key)?;
        let client = self.pool.get().await.map_err(pool)?;
        let row = newest(&client, &parts).await.map_err(database)?;
        Ok(self.seen(Found::of(&row, 9)?).live)
    }

    pub(crate) async fn reserve_request(&self, request: &Request<'_>) -> Reserved {
        let flag_beyond = self.rules.policy == BeyondHorizonPolicy::Flag;
        let turn = self.turn(|| BatchOp::Reserve {
            key: request.key.clone(),
            fingerprint: fingerprint_bytes(request.fingerprint),
            lease_ms: request.lease_ms,
            ttl_ms: self.rules.ttl_ms(request.key),
            flag_beyond,
        });
        let rx = match turn {
            Turn::Alone(running) => {
                let answer = self.reserve_alone(request).await;
                drop(running);
                return answer;
            }
            Turn::Queued(rx) => rx,
        };
        let row = match answer_of(rx).await? {
            BatchAnswer::Reserved(row) => row,
            BatchAnswer::Finished | BatchAnswer::Alone => return self.reserve_alone(request).await,
        };
        match self.read_reserved(request, &row) {
            Ok(Reading::Answer(outcome, _)) => Ok(outcome),
            Ok(Reading::NotInserted { expired: true }) if !flag_beyond => {
                Ok(ReserveOutcome::BeyondHorizon)
            }
            // A takeover, or a record that expired between the batch's two statements:
            // nothing of this call committed; decided on its own path.
            Ok(Reading::TakeOver(_) | Reading::NotInserted { .. }) => {
                self.reserve_alone(request).await
            }
            Err(Step::Fail(e) | Step::Retry(e)) => Err(e),
            Err(Step::Partition(_)) => Err(partition_missing()),
        }
    }

    /// The reservation on its own path: attempts until one decides.
    async fn reserve_alone(&self, request: &Request<'_>) -> Reserved {
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.reserve_once(request).await {
                Ok(Some(outcome)) => return Ok(outcome),
                Err(Step::Fail(e)) => return Err(e),
                Err(Step::Partition(at)) if attempt < MAX_ATTEMPTS * 4 => {
                    self.counters.retried();
                    self.remake_partition(at).await?;
                }
                // The record changed between the read and the write, or a conflict.
                Ok(None) | Err(Step::Retry(_)) if attempt < MAX_ATTEMPTS * 4 => {
                    self.counters.retried();
                    tokio::time::sleep(backoff(attempt.min(4))).await;
                }
                Ok(None) => {
                    return Err(PgError::Internal(
                        "the record kept changing under the reservation".into(),
                    ));
                }
                Err(Step::Retry(e)) => return Err(e),
                Err(Step::Partition(_)) => return Err(partition_missing()),
            }
        }
    }

    /// What a row of `idemdb_reserve`'s columns (the single call's, or a batch's) decides.
    fn read_reserved(
        &self,
        request: &Request<'_>,
        row: &tokio_postgres::Row,
    ) -> Result<Reading, Step> {
        let found = self.seen(Found::of(row, 11)?);
        let inserted: Option<i64> = row.try_get(9).map_err(Step::before_commit)?;
        let Some(token) = inserted else {
            return Ok(
                match decide(found.live, request.fingerprint, found.now_ms) {
                    Decision::Replay(r) => Reading::Answer(r.into(), false),
                    Decision::TakeOver(prev) => Reading::TakeOver(prev),
                    Decision::Acquire => Reading::NotInserted {
                        expired: found.expired,
                    },
                },
            );
        };
        let lease_end: i64 = row.try_get(10).map_err(Step::before_commit)?;
        let beyond = row
            .try_get::<_, Option<i16>>(0)
            .map_err(Step::before_commit)?
            .is_some();
        let acquired = ReserveOutcome::Acquired(Reservation::issue(Grant {
            database_id: self.database_id,
            record_key: request.key.clone(),
            token: token_from(token)?,
            lease_expires_at: stored_ms(lease_end)?,
            attempt: 1,
            takeover: false,
            beyond_horizon: beyond,
        }));
        Ok(Reading::Answer(acquired, true))
    }

    /// One attempt; `None` when the record changed under it. A fresh key or a replay is one
    /// round trip: the statement reads, and inserts under the stripe lock where nothing live
    /// exists, committing by itself.
    async fn reserve_once(&self, request: &Request<'_>) -> Result<Option<ReserveOutcome>, Step> {
        let p = &request.parts;
        let ttl = self.rules.ttl_ms(request.key);
        let client = self.pool.get().await.map_err(pool)?;
        // Where an insert would land, estimated from the last reading of the server's time:
        // a partition missed is made when the insert says so, and the attempt runs again.
        let expires = self
            .server_time()
            .saturating_add(request.lease_ms)
            .saturating_add(ttl);
        self.partitions
            .ensure_range(&client, expires, expires.saturating_add(PARTITION_SLACK_MS))
            .await
            .map_err(Step::before_commit)?;
        let flag_beyond = self.rules.policy == BeyondHorizonPolicy::Flag;
        let fingerprint = fingerprint_bytes(request.fingerprint).to_vec();
        let params: [&(dyn ToSql + Sync); 8] = [
            &p.operation,
            &p.principal,
            &p.key,
            &fingerprint,
            &span(request.lease_ms),
            &span(ttl),
            &flag_beyond,
            &stripe(request.key),
        ];
        let stmt = client
            .prepare_cached(RESERVE)
            .await
            .map_err(Step::before_commit)?;
        let began = std::time::Instant::now();
        // It may have inserted and committed: a lost connection is an unknown outcome.
        let row = client
            .query_one(&stmt, &params)
            .await
            .map_err(Step::autocommit)?;
        match self.read_reserved(request, &row)? {
            Reading::Answer(outcome, inserted) => {
                // Only an insert wrote (and committed) anything.
                if inserted {
                    self.counters.committed(began.elapsed());
                }
                Ok(Some(outcome))
            }
            Reading::TakeOver(prev) => self.take_over(&client, request, &prev, ttl).await,
            // Nothing live and not inserted under the lock: an expired record the policy
            // refuses.
            Reading::NotInserted { .. } => Ok(Some(ReserveOutcome::BeyondHorizon)),
        }
    }

    /// Takes over `prev` (an IN_PROGRESS record whose lease ran out): one guarded update,
    /// which judges the lease again by the server's clock.
    async fn take_over(
        &self,
        client: &deadpool_postgres::Client,
        request: &Request<'_>,
        prev: &Record,
        ttl: u64,
    ) -> Result<Option<ReserveOutcome>, Step> {
        let p = &request.parts;
        let expires = self
            .server_time()
            .saturating_add(request.lease_ms)
            .saturating_add(ttl);
        self.partitions
            .ensure_range(client, expires, expires.saturating_add(PARTITION_SLACK_MS))
            .await
            .map_err(Step::before_commit)?;
        let stmt = client
            .prepare_cached(TAKE_OVER)
            .await
            .map_err(Step::before_commit)?;
        let params: [&(dyn ToSql + Sync); 6] = [
            &p.operation,
            &p.principal,
            &p.key,
            &token_value(prev.token),
            &span(request.lease_ms),
            &span(ttl),
        ];
        let began = std::time::Instant::now();
        let row = match client.query_opt(&stmt, &params).await {
            Ok(row) => row,
            Err(e) => return Err(Step::autocommit(e)),
        };
        let Some(row) = row else {
            return Ok(None);
        };
        self.counters.committed(began.elapsed());
        let token = token_of(&row)?;
        let lease_end: i64 = row.try_get(1).map_err(database)?;
        let attempts: i32 = row.try_get(2).map_err(database)?;
        Ok(Some(ReserveOutcome::Acquired(Reservation::issue(Grant {
            database_id: self.database_id,
            record_key: request.key.clone(),
            token,
            lease_expires_at: stored_ms(lease_end)?,
            attempt: u32::try_from(attempts).unwrap_or(u32::MAX),
            takeover: true,
            beyond_horizon: false,
        }))))
    }
}

pub(crate) fn token_of(row: &tokio_postgres::Row) -> Result<FencingToken, PgError> {
    token_from(row.try_get(0).map_err(database)?)
}

/// `sql` prepared on the transaction's connection, once per connection: a statement given
/// as text would cost a round trip to prepare it every time.
pub(crate) async fn prepared(
    txn: &deadpool_postgres::Transaction<'_>,
    sql: &str,
) -> Result<tokio_postgres::Statement, Step> {
    txn.prepare_cached(sql).await.map_err(Step::before_commit)
}
