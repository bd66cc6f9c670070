//! `reserve`, `reserve_or_wait` and `get` over PostgreSQL. The shared `decide` chooses; the
//! database makes each choice atomic:
//! - a live record is answered from one read, or taken over by an update guarded by its
//!   token, state and lease (a concurrent change makes it match nothing: look again);
//! - a key without a live record is inserted while its stripe's row lock is held, after a
//!   second read under that lock, so that no two callers insert it (a partitioned table has
//!   no unique index across partitions).

use std::time::Duration;

use tokio::time::Instant;

use super::Inner;
use super::errors::{MAX_ATTEMPTS, Step, after_commit, backoff, database, pool};
use super::rows::{Found, KeyParts, NEWEST, RowValues, ms, newest, token_from, token_value};
use crate::decide::{Decision, decide, new_owner};
use crate::error::Error;
use crate::fingerprint::{Fingerprint, Payload};
use crate::ops::lease_ms;
use crate::outcome::ReserveOutcome;
use crate::record::Record;
use crate::retention::BeyondHorizonPolicy;
use crate::scope::{Key, RecordKey, Scope};
use crate::token::{FencingToken, Reservation};
use tokio_postgres::types::ToSql;

type Reserved = Result<ReserveOutcome, Error>;

/// A takeover: the record's owner changes if it is still the one decided on.
const TAKE_OVER: &str = "UPDATE idemdb_records SET token = nextval('idemdb_tokens'), \
     lease_expires_at = $5, updated_at = $6, attempts = attempts + 1, expires_at = $7 \
     WHERE operation = $1 AND principal = $2 AND key = $3 AND token = $4 AND state = 1 \
     AND lease_expires_at <= $6 AND expires_at > $6 RETURNING token";

/// A waiting duplicate's announcement to the live IN_PROGRESS record of its key ($5: the
/// owner's token already told, if any; the record is left alone for it).
const ANNOUNCE: &str = "UPDATE idemdb_records SET waiters = waiters + 1 \
     WHERE operation = $1 AND principal = $2 AND key = $3 AND state = 1 \
     AND lease_expires_at > $4 AND expires_at > $4 \
     AND token IS DISTINCT FROM $5::bigint RETURNING token";

/// A new record, IN_PROGRESS (or finished, for `execute`).
pub(crate) const INSERT: &str = "INSERT INTO idemdb_records (operation, principal, key, \
     state, fingerprint, token, lease_expires_at, created_at, updated_at, expires_at, \
     attempts, response) VALUES ($1, $2, $3, $4, $5, nextval('idemdb_tokens'), $6, $7, $8, \
     $9, $10, $11) RETURNING token";

/// Under the key's stripe lock, one statement: the key's newest row, and the insert of the
/// new owner's record ($4–$11) if no live record exists ($12 = now) and either no record at
/// all or the policy flags a key beyond its horizon ($13). Column 9: the inserted token.
const CLAIM: &str = "WITH newest AS (SELECT state, fingerprint, token, lease_expires_at, \
     created_at, updated_at, expires_at, attempts, response FROM idemdb_records \
     WHERE operation = $1 AND principal = $2 AND key = $3 ORDER BY expires_at DESC LIMIT 1), \
     ins AS (INSERT INTO idemdb_records (operation, principal, key, state, fingerprint, token, \
     lease_expires_at, created_at, updated_at, expires_at, attempts, response) \
     SELECT $1, $2, $3, $4, $5, nextval('idemdb_tokens'), $6, $7, $8, $9, $10, $11 \
     WHERE NOT EXISTS (SELECT 1 FROM newest WHERE expires_at > $12) \
     AND ($13 OR NOT EXISTS (SELECT 1 FROM newest)) RETURNING token) \
     SELECT n.state, n.fingerprint, n.token, n.lease_expires_at, n.created_at, n.updated_at, \
     n.expires_at, n.attempts, n.response, (SELECT token FROM ins) \
     FROM (SELECT 1) AS one LEFT JOIN newest AS n ON true";

/// Locks the stripe of a key; held until the transaction ends.
const LOCK_STRIPE: &str = "SELECT stripe FROM idemdb_stripes WHERE stripe = $1 FOR UPDATE";

/// Longest a clock may move between the partition made for a write and the write itself.
pub(crate) const PARTITION_SLACK_MS: u64 = 60_000;

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
    ) -> Result<Request<'k>, Error> {
        Ok(Request {
            parts: KeyParts::of(key)?,
            key,
            fingerprint: self.fingerprinter.resolve(payload),
            lease_ms: lease_ms(lease)?,
        })
    }

    /// Locks the key's stripe in `txn` and reads its newest row again, at a clock reading
    /// taken after the lock: what no other reservation of the key can change until the
    /// transaction ends.
    pub(crate) async fn locked_look(
        &self,
        txn: &deadpool_postgres::Transaction<'_>,
        key: &RecordKey,
        p: &KeyParts<'_>,
    ) -> Result<(Found, u64), Step> {
        txn.query_one(&prepared(txn, LOCK_STRIPE).await?, &[&stripe(key)])
            .await
            .map_err(Step::before_commit)?;
        let now = self.clock.now_ms();
        let row = txn
            .query_opt(
                &prepared(txn, NEWEST).await?,
                &[&p.operation, &p.principal, &p.key],
            )
            .await
            .map_err(Step::before_commit)?;
        Ok((Found::of(row.as_ref(), now)?, now))
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
    ) -> Result<Option<i64>, Error> {
        let p = &request.parts;
        let client = self.pool.get().await.map_err(pool)?;
        let now = ms(self.clock.now_ms());
        let stmt = client.prepare_cached(ANNOUNCE).await.map_err(database)?;
        let row = client
            .query_opt(
                &stmt,
                &[&p.operation, &p.principal, &p.key, &now, &announced],
            )
            .await
            .map_err(database)?;
        match row {
            Some(row) => Ok(Some(row.try_get(0).map_err(database)?)),
            // Announced already to this owner, or the record changed.
            None if announced.is_some() => Ok(announced),
            None => Ok(None),
        }
    }

    pub(crate) async fn get(&self, scope: &Scope, key: &Key) -> Result<Option<Record>, Error> {
        let key = RecordKey::encode(scope, key, &self.limits)?;
        let parts = KeyParts::of(&key)?;
        let client = self.pool.get().await.map_err(pool)?;
        let row = newest(&client, &parts).await.map_err(database)?;
        Ok(Found::of(row.as_ref(), self.clock.now_ms())?.live)
    }

    pub(crate) async fn reserve_request(&self, request: &Request<'_>) -> Reserved {
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.reserve_once(request).await {
                Ok(Some(outcome)) => return Ok(outcome),
                Err(Step::Fail(e)) => return Err(e),
                // The record changed between the read and the write, or a conflict.
                Ok(None) | Err(Step::Retry(_)) if attempt < MAX_ATTEMPTS * 4 => {
                    self.counters.retried();
                    tokio::time::sleep(backoff(attempt.min(4))).await;
                }
                Ok(None) => {
                    return Err(Error::Internal(
                        "the record kept changing under the reservation".into(),
                    ));
                }
                Err(Step::Retry(e)) => return Err(e),
            }
        }
    }

    /// One attempt; `None` when the record changed under it.
    async fn reserve_once(&self, request: &Request<'_>) -> Result<Option<ReserveOutcome>, Step> {
        let p = &request.parts;
        let ttl = self.rules.ttl_ms(request.key);
        let mut client = self.pool.get().await.map_err(pool)?;
        let now = self.clock.now_ms();
        let row = newest(&client, p).await.map_err(Step::before_commit)?;
        let found = Found::of(row.as_ref(), now)?;
        if found.live.is_some() {
            return match decide(found.live, request.fingerprint, now) {
                Decision::Replay(r) => Ok(Some(r.into())),
                Decision::TakeOver(prev) => self.take_over(&client, request, &prev, now, ttl).await,
                // A live record is never absent: decided again under the lock below.
                Decision::Acquire => Ok(None),
            };
        }
        let lease_end = now.saturating_add(request.lease_ms);
        let expires = lease_end.saturating_add(ttl);
        self.partitions
            .ensure_range(&client, expires, expires.saturating_add(PARTITION_SLACK_MS))
            .await
            .map_err(Step::before_commit)?;
        let txn = client.transaction().await.map_err(Step::before_commit)?;
        txn.query_one(&prepared(&txn, LOCK_STRIPE).await?, &[&stripe(request.key)])
            .await
            .map_err(Step::before_commit)?;
        // What the lock lets this transaction see, read and acted on in one statement: the
        // new owner's record, inserted only where `decide` acquires (no live record; an
        // expired one only under `Flag`). Otherwise the shared decision, on the row read.
        let now = self.clock.now_ms();
        let lease_end = now.saturating_add(request.lease_ms);
        let placeholder = FencingToken::new(1).ok_or_else(|| Error::Internal("token 1".into()))?;
        let mut rec = new_owner(None, request.fingerprint, placeholder, lease_end, now);
        rec.expires_at = self.rules.expires_at(&rec, ttl);
        let flag_beyond = self.rules.policy == BeyondHorizonPolicy::Flag;
        let values = RowValues::of(&rec);
        let now_v = ms(now);
        let mut params = values.params(p);
        params.extend([&now_v as &(dyn ToSql + Sync), &flag_beyond]);
        let row = txn
            .query_one(&prepared(&txn, CLAIM).await?, &params)
            .await
            .map_err(Step::before_commit)?;
        let inserted: Option<i64> = row.try_get(9).map_err(Step::before_commit)?;
        let Some(token) = inserted else {
            // Not inserted: a newest row exists, live (or expired, refused by the policy).
            let found = Found::of(Some(&row), now)?;
            return match decide(found.live, request.fingerprint, now) {
                Decision::Replay(r) => Ok(Some(r.into())),
                // Taken over without the lock; the record is live, so no insert races it.
                Decision::TakeOver(_) => Ok(None),
                Decision::Acquire => Ok(Some(ReserveOutcome::BeyondHorizon)),
            };
        };
        let beyond = row
            .try_get::<_, Option<i16>>(0)
            .map_err(Step::before_commit)?
            .is_some();
        let token = token_from(token)?;
        txn.commit().await.map_err(Step::at_commit)?;
        Ok(Some(ReserveOutcome::Acquired(Reservation {
            database_id: self.database_id,
            record_key: request.key.clone(),
            token,
            lease_expires_at: lease_end,
            attempt: rec.attempts,
            takeover: false,
            beyond_horizon: beyond,
        })))
    }

    /// Takes over `prev` (an IN_PROGRESS record whose lease ran out): one guarded update.
    async fn take_over(
        &self,
        client: &deadpool_postgres::Client,
        request: &Request<'_>,
        prev: &Record,
        now: u64,
        ttl: u64,
    ) -> Result<Option<ReserveOutcome>, Step> {
        let p = &request.parts;
        let lease_end = now.saturating_add(request.lease_ms);
        let mut rec = new_owner(Some(prev), request.fingerprint, prev.token, lease_end, now);
        rec.expires_at = self.rules.expires_at(&rec, ttl);
        self.partitions
            .ensure(client, rec.expires_at)
            .await
            .map_err(Step::before_commit)?;
        let stmt = client
            .prepare_cached(TAKE_OVER)
            .await
            .map_err(Step::before_commit)?;
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 7] = [
            &p.operation,
            &p.principal,
            &p.key,
            &token_value(prev.token),
            &ms(lease_end),
            &ms(now),
            &ms(rec.expires_at),
        ];
        let row = match client.query_opt(&stmt, &params).await {
            Ok(row) => row,
            Err(e) if super::errors::is_retryable(&e) => return Err(Step::Retry(database(e))),
            // It commits by itself: a lost connection leaves it unknown.
            Err(e) => return Err(Step::Fail(after_commit(e))),
        };
        let Some(row) = row else {
            return Ok(None);
        };
        let token = token_of(&row)?;
        Ok(Some(ReserveOutcome::Acquired(Reservation {
            database_id: self.database_id,
            record_key: request.key.clone(),
            token,
            lease_expires_at: lease_end,
            attempt: rec.attempts,
            takeover: true,
            beyond_horizon: false,
        })))
    }
}

/// Inserts `rec` (its token is the sequence's next); the token it got.
pub(crate) async fn insert(
    txn: &deadpool_postgres::Transaction<'_>,
    p: &KeyParts<'_>,
    rec: &Record,
) -> Result<FencingToken, Step> {
    let values = RowValues::of(rec);
    let row = txn
        .query_one(&prepared(txn, INSERT).await?, &values.params(p))
        .await
        .map_err(Step::before_commit)?;
    Ok(token_of(&row)?)
}

pub(crate) fn token_of(row: &tokio_postgres::Row) -> Result<FencingToken, Error> {
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

/// The lock stripe of a key.
fn stripe(key: &RecordKey) -> i32 {
    let h = xxhash_rust::xxh3::xxh3_64(key.as_bytes());
    i32::try_from(h % u64::from(super::schema::STRIPES.unsigned_abs())).unwrap_or(0)
}
