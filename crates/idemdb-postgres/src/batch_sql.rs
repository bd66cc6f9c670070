//! One batch (batch.rs) on one connection: `BEGIN`, the stripe locks, the reserves, the
//! finishes and `COMMIT`, pipelined in one round trip, plain SQL over arrays (design.md
//! §14.4).
//!
//! The reserves keep `idemdb_reserve`'s rule, set-based: a key is inserted only while its
//! stripe's row lock is held and, read after the lock, it has no live row. `LOCK` takes the
//! stripes of the keys it finds with no live row (sorted, so that batches and single calls
//! cannot deadlock on them) and names them in the transaction's setting `idemdb.locked`.
//! `RESERVE` is a later statement, so under READ COMMITTED it reads with a snapshot taken
//! after the locks were granted: it sees every insert their previous holders committed. It
//! inserts only keys whose stripe this transaction holds, and of several reserves of one key
//! only the first (the others read the same snapshot: they are decided on their own path,
//! after the batch committed). A replay's key has a live row, so its stripe is not locked for
//! it, and it writes nothing.

use std::time::Instant;

use tokio_postgres::types::ToSql;

use super::batch::{Answer, BatchAnswer, BatchOp};
use super::errors::{after_commit, database, pool};
use super::partitions::PARTITION_SLACK_MS;
use super::rows::{KeyParts, token_value};
use super::sql::{clock, key_hash, span};
use super::store::Inner;
use super::wait::{CHANNEL, payload};
use crate::error::PgError;

/// The batch's transaction begins. Its statements join a handful of requests to tables of
/// millions of rows through their indexes; a partition made minutes ago has no statistics
/// yet, and the planner, taking it for empty, would read it whole (seen: 2–4 ms a statement
/// at a few thousand rows). So the transaction reads tables through their indexes only, and
/// each statement reaches a partition per request (`LATERAL … LIMIT 1`) or by the array of
/// the requests' hashes. Their plans do not depend on the requests, so each is planned once
/// per connection rather than at every batch.
const BEGIN: &str = "BEGIN; SET LOCAL enable_seqscan = off; \
     SET LOCAL plan_cache_mode = force_generic_plan";

/// `$1..$3` the keys' parts, `$4` their stripes.
const LOCK: &str = concat!(
    "WITH ",
    clock!(),
    ", req AS (SELECT q.*, ",
    key_hash!("q.op", "q.pr", "q.k"),
    " AS h FROM unnest($1::bytea[], $2::bytea[], $3::bytea[], $4::int[]) \
     AS q(op, pr, k, stripe)), \
     need AS (SELECT DISTINCT q.stripe FROM req q CROSS JOIN clock c LEFT JOIN LATERAL \
     (SELECT true AS live FROM idemdb_records r WHERE r.key_hash = q.h \
     AND r.operation = q.op AND r.principal = q.pr AND r.key = q.k \
     AND r.expires_at > c.now_ms LIMIT 1) l ON true WHERE l.live IS NULL), \
     locked AS (SELECT s.stripe FROM idemdb_stripes s WHERE s.stripe IN \
     (SELECT stripe FROM need) ORDER BY s.stripe FOR UPDATE) \
     SELECT set_config('idemdb.locked', COALESCE(string_agg(stripe::text, ','), ''), true) \
     FROM locked"
);

/// `$1..$3` the keys' parts, `$4` fingerprints, `$5` leases, `$6` TTLs, `$7` whether the
/// policy flags a key beyond its horizon, `$8` stripes. One row per request, in order, with
/// `idemdb_reserve`'s columns: the newest row (0–8), the inserted token and lease end (9,
/// 10), the store's time (11). Of several requests of one key only the first (`first`) may
/// insert, and only it is given the insert.
const RESERVE: &str = concat!(
    "WITH ",
    clock!(),
    ", req AS (SELECT q.*, ",
    key_hash!("q.op", "q.pr", "q.k"),
    " AS h, row_number() OVER (PARTITION BY q.op, q.pr, q.k ORDER BY q.i) = 1 AS first \
     FROM unnest($1::bytea[], $2::bytea[], $3::bytea[], $4::bytea[], $5::bigint[], \
     $6::bigint[], $7::bool[], $8::int[]) WITH ORDINALITY \
     AS q(op, pr, k, fp, lease, ttl, flag, stripe, i)), \
     newest AS (SELECT q.*, n.* FROM req q LEFT JOIN LATERAL (SELECT r.state, r.fingerprint, \
     r.token, r.lease_expires_at, r.created_at, r.updated_at, r.expires_at, r.attempts, \
     r.response FROM idemdb_records r WHERE r.key_hash = q.h AND r.operation = q.op \
     AND r.principal = q.pr AND r.key = q.k ORDER BY r.expires_at DESC LIMIT 1) n ON true), \
     ins AS (INSERT INTO idemdb_records (operation, principal, key, state, fingerprint, token, \
     lease_expires_at, created_at, updated_at, expires_at, attempts, response) \
     SELECT n.op, n.pr, n.k, 1, n.fp, nextval('idemdb_tokens'), c.now_ms + n.lease, c.now_ms, \
     c.now_ms, c.now_ms + n.lease + n.ttl, 1, ''::bytea FROM newest n CROSS JOIN clock c \
     WHERE n.first AND n.stripe = ANY (string_to_array(NULLIF(current_setting('idemdb.locked', \
     true), ''), ',')::int[]) \
     AND (n.expires_at IS NULL OR (n.expires_at <= c.now_ms AND n.flag)) ORDER BY n.i \
     RETURNING key_hash, token, lease_expires_at) \
     SELECT n.state, n.fingerprint, n.token, n.lease_expires_at, n.created_at, n.updated_at, \
     n.expires_at, n.attempts, n.response, ins.token, ins.lease_expires_at, c.now_ms \
     FROM newest n CROSS JOIN clock c LEFT JOIN ins ON n.first AND ins.key_hash = n.h \
     ORDER BY n.i"
);

/// `$1..$3` the keys' parts, `$4` tokens, `$5` states, `$6` responses, `$7` TTLs, `$8` the
/// notification payloads, `$9` the channel. The ordinal (1-based) of each request whose
/// guarded update matched; a finish that matched nothing is decided on its own path. The
/// rows are found through the hash index by the array of the requests' hashes, whatever
/// order the planner joins in: joined to the partitioned table by the hash alone, it put a
/// fresh partition, unanalysed, outside the loop and read its whole index.
const FINISH: &str = concat!(
    "WITH ",
    clock!(),
    ", req AS (SELECT q.*, ",
    key_hash!("q.op", "q.pr", "q.k"),
    " AS h FROM unnest($1::bytea[], $2::bytea[], $3::bytea[], $4::bigint[], \
     $5::smallint[], $6::bytea[], $7::bigint[], $8::text[]) WITH ORDINALITY \
     AS q(op, pr, k, token, state, response, ttl, note, i)), \
     done AS (UPDATE idemdb_records r SET state = q.state, response = q.response, \
     updated_at = c.now_ms, expires_at = c.now_ms + q.ttl FROM req q CROSS JOIN clock c \
     WHERE r.key_hash = ANY (ARRAY(SELECT h FROM req)) AND r.key_hash = q.h \
     AND r.operation = q.op AND r.principal = q.pr AND r.key = q.k AND r.token = q.token \
     AND r.state = 1 AND r.expires_at > c.now_ms RETURNING q.i, r.waiters, q.note) \
     SELECT i, CASE WHEN waiters > 0 THEN pg_notify($9, note)::text END FROM done"
);

/// The keys of one kind of request, as the statements' first three arrays, and where each
/// request is in the batch.
#[derive(Default)]
struct Keys<'a> {
    at: Vec<usize>,
    op: Vec<&'a [u8]>,
    pr: Vec<&'a [u8]>,
    k: Vec<&'a [u8]>,
}

impl<'a> Keys<'a> {
    fn push(&mut self, at: usize, p: &KeyParts<'a>) {
        self.at.push(at);
        self.op.push(p.operation);
        self.pr.push(p.principal);
        self.k.push(p.key);
    }
}

/// The reserves' parameters, as arrays.
#[derive(Default)]
struct Reserves<'a> {
    keys: Keys<'a>,
    fp: Vec<&'a [u8]>,
    lease: Vec<i64>,
    ttl: Vec<i64>,
    flag: Vec<bool>,
    stripe: Vec<i32>,
}

/// The finishes' parameters, as arrays.
#[derive(Default)]
struct Finishes<'a> {
    keys: Keys<'a>,
    token: Vec<i64>,
    state: Vec<i16>,
    response: Vec<&'a [u8]>,
    ttl: Vec<i64>,
    note: Vec<String>,
}

impl Inner {
    /// Runs one batch; an answer per op, in order.
    pub(crate) async fn run_batch(&self, ops: &[BatchOp]) -> Vec<Answer> {
        let alone = || ops.iter().map(|_| Ok(BatchAnswer::Alone)).collect();
        let client = match self.pool.get().await {
            Ok(client) => client,
            Err(e) => {
                let e = pool(e);
                return ops.iter().map(|_| Err(e.clone())).collect();
            }
        };
        let (mut reserves, mut finishes) = (Reserves::default(), Finishes::default());
        // How far past the store's time each write's expiry lies.
        let mut spans: Vec<u64> = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            let Ok(p) = KeyParts::of(op.key()) else {
                return alone();
            };
            match op {
                BatchOp::Reserve {
                    key,
                    fingerprint,
                    lease_ms,
                    ttl_ms,
                    flag_beyond,
                } => {
                    spans.push(lease_ms.saturating_add(*ttl_ms));
                    reserves.keys.push(i, &p);
                    reserves.fp.push(&fingerprint[..]);
                    reserves.lease.push(span(*lease_ms));
                    reserves.ttl.push(span(*ttl_ms));
                    reserves.flag.push(*flag_beyond);
                    reserves.stripe.push(super::schema::stripe(key));
                }
                BatchOp::Finish {
                    key,
                    token,
                    state,
                    response,
                    ttl_ms,
                } => {
                    spans.push(*ttl_ms);
                    finishes.keys.push(i, &p);
                    finishes.token.push(token_value(*token));
                    finishes.state.push(*state);
                    finishes.response.push(response);
                    finishes.ttl.push(span(*ttl_ms));
                    finishes.note.push(payload(key));
                }
            }
        }
        // The partitions the batch's writes land in, estimated as a single call does (one
        // range per distinct span, not one from the shortest to the longest): a missed one
        // fails the batch's statement, and each op then runs on its own path, which makes it.
        let now = self.server_time();
        spans.sort_unstable();
        spans.dedup();
        for span_ms in spans {
            let expires = now.saturating_add(span_ms);
            let to = expires.saturating_add(PARTITION_SLACK_MS);
            if self
                .partitions
                .ensure_range(&client, expires, to)
                .await
                .is_err()
            {
                return alone();
            }
        }
        let statements = async {
            let lock = client.prepare_cached(LOCK).await?;
            let reserve = client.prepare_cached(RESERVE).await?;
            let finish = client.prepare_cached(FINISH).await?;
            Ok::<_, tokio_postgres::Error>((lock, reserve, finish))
        };
        let Ok((lock, reserve, finish)) = statements.await else {
            return alone();
        };
        let lock_params: [&(dyn ToSql + Sync); 4] = [
            &reserves.keys.op,
            &reserves.keys.pr,
            &reserves.keys.k,
            &reserves.stripe,
        ];
        let reserve_params: [&(dyn ToSql + Sync); 8] = [
            &reserves.keys.op,
            &reserves.keys.pr,
            &reserves.keys.k,
            &reserves.fp,
            &reserves.lease,
            &reserves.ttl,
            &reserves.flag,
            &reserves.stripe,
        ];
        let channel = CHANNEL;
        let finish_params: [&(dyn ToSql + Sync); 9] = [
            &finishes.keys.op,
            &finishes.keys.pr,
            &finishes.keys.k,
            &finishes.token,
            &finishes.state,
            &finishes.response,
            &finishes.ttl,
            &finishes.note,
            &channel,
        ];
        let has_reserves = !reserves.keys.at.is_empty();
        let has_finishes = !finishes.keys.at.is_empty();
        let began = Instant::now();
        // Every message is sent at the first poll, in this order: one round trip.
        let (begun, locked, reserved, finished, committed) = tokio::join!(
            client.batch_execute(BEGIN),
            async {
                match has_reserves {
                    true => client.query(&lock, &lock_params).await.map(Some),
                    false => Ok(None),
                }
            },
            async {
                match has_reserves {
                    true => client.query(&reserve, &reserve_params).await.map(Some),
                    false => Ok(None),
                }
            },
            async {
                match has_finishes {
                    true => client.query(&finish, &finish_params).await.map(Some),
                    false => Ok(None),
                }
            },
            client.batch_execute("COMMIT"),
        );
        let took = began.elapsed();
        let (reserved, finished) = match (begun, locked, reserved, finished) {
            (Ok(()), Ok(_), Ok(reserved), Ok(finished)) => (reserved, finished),
            (begun, locked, reserved, finished) => {
                let errors: Vec<tokio_postgres::Error> =
                    [begun.err(), locked.err(), reserved.err(), finished.err()]
                        .into_iter()
                        .flatten()
                        .collect();
                // A statement the server refused aborted the transaction: its `COMMIT`
                // rolled back, nothing is committed, and every op runs on its own path.
                if errors.iter().any(|e| e.as_db_error().is_some()) {
                    return alone();
                }
                // The connection broke with `COMMIT` already sent: whatever the batch wrote
                // may have committed.
                let e = errors
                    .into_iter()
                    .next()
                    .map(after_commit)
                    .unwrap_or_else(|| PgError::Internal("a batch failed without an error".into()));
                return ops.iter().map(|_| Err(e.clone())).collect();
            }
        };
        if let Err(e) = committed {
            let e = after_commit(e);
            return ops.iter().map(|_| Err(e.clone())).collect();
        }
        let mut answers: Vec<Answer> = ops.iter().map(|_| Ok(BatchAnswer::Alone)).collect();
        let mut writes = 0;
        if let Some(rows) = reserved {
            if rows.len() != reserves.keys.at.len() {
                let e = PgError::Internal("a batch's reserve answered the wrong rows".into());
                return ops.iter().map(|_| Err(e.clone())).collect();
            }
            for (at, row) in reserves.keys.at.iter().zip(rows) {
                if row.try_get::<_, Option<i64>>(9).ok().flatten().is_some() {
                    writes += 1;
                }
                answers[*at] = Ok(BatchAnswer::Reserved(row));
            }
        }
        if let Some(rows) = finished {
            for row in rows {
                let ordinal: i64 = match row.try_get(0) {
                    Ok(i) => i,
                    Err(e) => {
                        let e = database(e);
                        return ops.iter().map(|_| Err(e.clone())).collect();
                    }
                };
                let Some(at) = usize::try_from(ordinal - 1)
                    .ok()
                    .and_then(|i| finishes.keys.at.get(i))
                else {
                    let e = PgError::Internal("a batch's finish answered the wrong rows".into());
                    return ops.iter().map(|_| Err(e.clone())).collect();
                };
                answers[*at] = Ok(BatchAnswer::Finished);
                writes += 1;
            }
        }
        if writes > 0 {
            self.counters.committed_batch(took, writes);
        }
        self.counters.batch(ops.len());
        answers
    }
}
