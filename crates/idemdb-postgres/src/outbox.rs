//! The outbox over PostgreSQL: staging in the record's transaction (`PgTx::stage`), the
//! messages as rows, and the operator's tools and stats. Delivery is the
//! [`PgDispatcher`](crate::PgDispatcher) (dispatch.rs); docs/design.md §15 gives the table.
//!
//! Order per ordering key needs sequence order to be commit order among a key's messages:
//! staging a keyed message takes that key's advisory lock (held to the transaction's end)
//! before it draws its number, so a later-numbered message of the key commits later.
//! Claims and every other write of a message exclude one another through one more advisory
//! lock: a claim takes it exclusively, marks and operators shared (dispatch.rs).

use std::time::Duration;

use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use super::errors::{database, pool};
use super::execute::PgTx;
use super::rows::stored_ms;
use super::sql::clock;
use super::store::{Inner, PgStore};
use crate::error::PgError;
use idemdb_core::dispatch::OutboxStats;
use idemdb_core::error::{InputError, Refusal};
use idemdb_core::outbox::{Message, MessageId, OutboxMessage};

/// Advisory lock namespaces (the two-int4 form, its own key space): a key's staging lock,
/// and the claim lock.
pub(crate) const KEY_LOCKS: i32 = 0x1de3_0b01;
pub(crate) const CLAIM_LOCK: i32 = 0x1de3_0b02;

/// Stages one message: the key's lock first (in a subquery the planner keeps whole, so it is
/// taken before `nextval` draws the number), then the row.
const STAGE: &str = "INSERT INTO idemdb_outbox (seq, id, destination, ordering_key, \
     header_names, header_values, payload, staged_at) \
     SELECT nextval('idemdb_outbox_seq'), $1, $2, $3, $4, $5, $6, $7 \
     FROM (SELECT CASE WHEN $3::bytea IS NULL THEN NULL \
     ELSE pg_advisory_xact_lock($8::int, $9::int) END OFFSET 0) AS key_lock";

/// The columns a message is read from, in [`message`]'s order.
pub(crate) const COLUMNS: &str = "seq, id, destination, ordering_key, header_names, \
     header_values, payload, staged_at, attempts, last_error";

impl PgTx<'_> {
    /// Stages `message` in this transaction: it is sent by a [`PgDispatcher`](crate::PgDispatcher)
    /// once the transaction commits, and never if it rolls back. Its id derives from the
    /// record and its place among the messages this closure staged, so a retried intent
    /// stages the same ids. Messages with the same ordering key are sent in commit order;
    /// staging one holds its key's lock until the transaction ends, so concurrent
    /// transactions staging the same key commit one after another.
    ///
    /// Refused with nothing staged ([`PgError::Refused`]): an empty destination, a message
    /// over [`Limits::max_message_len`](idemdb_core::Limits::max_message_len), more than
    /// [`Limits::max_messages_per_commit`](idemdb_core::Limits::max_messages_per_commit), or
    /// staging in a [`run`](crate::PgStore::run), which has no record.
    pub async fn stage(&self, message: Message) -> Result<MessageId, PgError> {
        let refused = |e: InputError| PgError::Refused(Refusal::InvalidInput(e));
        let record = self
            .record
            .ok_or_else(|| refused(InputError::StagedWithoutRecord))?;
        // Numbered under the lock: concurrent `stage` calls of one closure take turns.
        let mut staged = self.staged.lock().await;
        let index = u32::try_from(staged.len()).unwrap_or(u32::MAX);
        message.check(staged.len(), self.limits).map_err(refused)?;
        let id = MessageId::derive(record, index);
        let key_lock = message.key().map_or(0, key_lock);
        let (names, values): (Vec<&str>, Vec<&[u8]>) = message
            .headers()
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_slice()))
            .unzip();
        let staged_at = i64::try_from(self.now_ms()).unwrap_or(i64::MAX);
        let params: [&(dyn ToSql + Sync); 9] = [
            &id.as_bytes().as_slice(),
            &message.destination(),
            &message.key(),
            &names,
            &values,
            &message.payload(),
            &staged_at,
            &KEY_LOCKS,
            &key_lock,
        ];
        // Prepared once per connection (the pool's cache): one round trip per message.
        let stage = self
            .watch(self.cached.prepare_cached(STAGE).await)
            .map_err(database)?;
        self.watch(self.txn.execute(&stage, &params).await)
            .map_err(database)?;
        staged.push(id);
        Ok(id)
    }
}

/// The second half of a key's staging lock: 32 bits of its hash (two keys sharing them only
/// wait for each other).
fn key_lock(key: &[u8]) -> i32 {
    xxhash_rust::xxh3::xxh3_64(key) as i32
}

/// A message as its row holds it.
pub(crate) fn message(row: &Row) -> Result<OutboxMessage, PgError> {
    let seq: i64 = row.try_get(0).map_err(database)?;
    let id: Vec<u8> = row.try_get(1).map_err(database)?;
    let id: [u8; 16] = id
        .try_into()
        .map_err(|_| PgError::Corrupted(format!("outbox message {seq}: an id not of 16 bytes")))?;
    let names: Vec<String> = row.try_get(4).map_err(database)?;
    let values: Vec<Vec<u8>> = row.try_get(5).map_err(database)?;
    if names.len() != values.len() {
        return Err(PgError::Corrupted(format!(
            "outbox message {seq}: {} header names and {} values",
            names.len(),
            values.len()
        )));
    }
    let attempts: i32 = row.try_get(8).map_err(database)?;
    let seq = u64::try_from(seq)
        .map_err(|_| PgError::Corrupted(format!("outbox message numbered {seq}")))?;
    let destination: String = row.try_get(2).map_err(database)?;
    let payload: Vec<u8> = row.try_get(6).map_err(database)?;
    let mut staged =
        Message::new(destination, payload).with_ordering_key(row.try_get(3).map_err(database)?);
    for (name, value) in names.into_iter().zip(values) {
        staged = staged.header(name, value);
    }
    let staged_at = stored_ms(row.try_get(7).map_err(database)?)?;
    let mut message = OutboxMessage::staged(MessageId::from_bytes(id), seq, staged, staged_at);
    message.attempts = u32::try_from(attempts).unwrap_or(0);
    message.last_error = row.try_get(9).map_err(database)?;
    Ok(message)
}

/// The table counted: undelivered (not parked), parked, the oldest undelivered one's staging
/// time, and the store's time.
const COUNTS: &str = concat!(
    "WITH ",
    clock!(),
    " SELECT count(o.seq) FILTER (WHERE NOT o.parked), count(o.seq) FILTER (WHERE o.parked), \
     min(o.staged_at) FILTER (WHERE NOT o.parked), clock.now_ms \
     FROM clock LEFT JOIN idemdb_outbox o ON true GROUP BY clock.now_ms"
);

impl PgStore {
    /// The outbox's backlog, parked messages and oldest undelivered age (a count of the
    /// table, which this also sets the `metrics` gauges from), and what this instance's
    /// dispatchers did since connect.
    pub async fn outbox_stats(&self) -> Result<OutboxStats, PgError> {
        let inner = &self.inner;
        let client = inner.pool.get().await.map_err(pool)?;
        let row = client.query_one(COUNTS, &[]).await.map_err(database)?;
        let backlog: i64 = row.try_get(0).map_err(database)?;
        let parked: i64 = row.try_get(1).map_err(database)?;
        let oldest: Option<i64> = row.try_get(2).map_err(database)?;
        let now: i64 = row.try_get(3).map_err(database)?;
        let local = &inner.outbox;
        let mut stats = local.counted();
        stats.backlog = u64::try_from(backlog).unwrap_or(0);
        stats.parked = u64::try_from(parked).unwrap_or(0);
        stats.oldest_undelivered_age =
            oldest.map(|at| Duration::from_millis(u64::try_from(now - at).unwrap_or(0)));
        local.gauge(stats.backlog, stats.parked, stats.oldest_undelivered_age);
        Ok(stats)
    }

    /// Up to `limit` undelivered messages, oldest first (with their failed attempts and last
    /// error).
    pub async fn outbox_pending(&self, limit: usize) -> Result<Vec<OutboxMessage>, PgError> {
        self.inner.outbox_list(false, limit).await
    }

    /// Up to `limit` parked messages, oldest first, each with the error that parked it.
    pub async fn outbox_parked(&self, limit: usize) -> Result<Vec<OutboxMessage>, PgError> {
        self.inner.outbox_list(true, limit).await
    }

    /// Puts the parked message `id` back in line, its attempts reset: it is delivered in its
    /// original place among its ordering key's messages. False if no parked message has that
    /// id.
    pub async fn retry_parked(&self, id: MessageId) -> Result<bool, PgError> {
        let n = self
            .inner
            .outbox_write(
                "UPDATE idemdb_outbox SET parked = false, attempts = 0, next_attempt_at = 0, \
                 claim_expires_at = 0 WHERE id = $1 AND parked",
                &[&id.as_bytes().as_slice()],
            )
            .await?;
        self.inner.outbox.wake.notify_one();
        Ok(n > 0)
    }

    /// Parks the pending message `id` with `reason`: it is not sent until
    /// [`retry_parked`](Self::retry_parked), and holds back later messages of its ordering
    /// key. A publish already under way may still complete (its mark then leaves the parked
    /// row where it is). False if no pending message has that id.
    pub async fn park_message(&self, id: MessageId, reason: &str) -> Result<bool, PgError> {
        let reason = format!("parked by an operator: {reason}");
        let n = self
            .inner
            .outbox_write(
                "UPDATE idemdb_outbox SET parked = true, last_error = $2 \
                 WHERE id = $1 AND NOT parked",
                &[&id.as_bytes().as_slice(), &reason],
            )
            .await?;
        self.inner.outbox.count(0, 0, n, 0);
        Ok(n > 0)
    }

    /// Removes every parked message for good (they are never sent); how many were removed.
    pub async fn purge_parked(&self) -> Result<u64, PgError> {
        self.inner
            .outbox_write("DELETE FROM idemdb_outbox WHERE parked", &[])
            .await
    }
}

impl Inner {
    async fn outbox_list(&self, parked: bool, limit: usize) -> Result<Vec<OutboxMessage>, PgError> {
        let client = self.pool.get().await.map_err(pool)?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let sql =
            format!("SELECT {COLUMNS} FROM idemdb_outbox WHERE parked = $1 ORDER BY seq LIMIT $2");
        let rows = client
            .query(sql.as_str(), &[&parked, &limit])
            .await
            .map_err(database)?;
        rows.iter().map(message).collect()
    }

    /// An operator's write, under the claim lock's shared side: no claim reads the outbox
    /// while it is under way.
    async fn outbox_write(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, PgError> {
        let mut client = self.pool.get().await.map_err(pool)?;
        let txn = client.transaction().await.map_err(database)?;
        txn.execute("SELECT pg_advisory_xact_lock_shared($1, 0)", &[&CLAIM_LOCK])
            .await
            .map_err(database)?;
        let n = txn.execute(sql, params).await.map_err(database)?;
        txn.commit().await.map_err(database)?;
        Ok(n)
    }
}
