//! Records as rows: the columns every read selects, and conversions between idemdb's
//! unsigned milliseconds and PostgreSQL's `bigint`.

use tokio_postgres::Row;

use super::sql::{clock, key_is_params};

use crate::error::PgError;
use idemdb_core::fingerprint::Fingerprint;
use idemdb_core::scope::RecordKey;
use idemdb_core::token::FencingToken;
use idemdb_core::{Record, RecordState};

/// A key's newest row (the live record if there is one: a new row always expires after every
/// older row of its key, else the expired one still stored), and the store's time (column 9),
/// read by the same statement. Always one row: columns 0–8 are NULL for a key without rows.
pub(crate) const NEWEST: &str = concat!(
    "WITH ",
    clock!(),
    " SELECT n.state, n.fingerprint, n.token, n.lease_expires_at, n.created_at, n.updated_at, \
     n.expires_at, n.attempts, n.response, clock.now_ms FROM clock LEFT JOIN LATERAL \
     (SELECT state, fingerprint, token, lease_expires_at, created_at, updated_at, expires_at, \
     attempts, response FROM idemdb_records WHERE ",
    key_is_params!(),
    " ORDER BY expires_at DESC LIMIT 1) AS n ON true"
);

/// The key's newest row and the store's time, read on `client` by itself (the statement
/// prepared once per connection).
pub(crate) async fn newest(
    client: &deadpool_postgres::Client,
    p: &KeyParts<'_>,
) -> Result<Row, tokio_postgres::Error> {
    let stmt = client.prepare_cached(NEWEST).await?;
    client
        .query_one(&stmt, &[&p.operation, &p.principal, &p.key])
        .await
}

/// A record key split into its three columns.
pub(crate) struct KeyParts<'a> {
    pub(crate) operation: &'a [u8],
    pub(crate) principal: &'a [u8],
    pub(crate) key: &'a [u8],
}

impl<'a> KeyParts<'a> {
    pub(crate) fn of(key: &'a RecordKey) -> Result<KeyParts<'a>, PgError> {
        let (operation, principal, key) = RecordKey::split(key.as_bytes())
            .ok_or_else(|| PgError::Internal("a record key did not split".into()))?;
        Ok(KeyParts {
            operation,
            principal,
            key,
        })
    }
}

/// Milliseconds as stored: `bigint` is signed, and times past its end are the same as never.
pub(crate) fn ms(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// A time as stored, in ms.
pub(crate) fn stored_ms(v: i64) -> Result<u64, PgError> {
    unsigned("time", v)
}

fn unsigned(what: &str, v: i64) -> Result<u64, PgError> {
    u64::try_from(v).map_err(|_| PgError::Corrupted(format!("idemdb_records.{what} is negative")))
}

/// The record in a row selected by [`NEWEST`]; `None` where the key has no row.
pub(crate) fn record(row: &Row) -> Result<Option<Record>, PgError> {
    let corrupt = |what: &str| PgError::Corrupted(format!("idemdb_records.{what} is invalid"));
    let state: Option<i16> = row.try_get(0).map_err(|_| corrupt("state"))?;
    let Some(state) = state else {
        return Ok(None);
    };
    let state = u8::try_from(state)
        .ok()
        .and_then(RecordState::from_byte)
        .ok_or_else(|| corrupt("state"))?;
    let fp: &[u8] = row.try_get(1).map_err(|_| corrupt("fingerprint"))?;
    let fp: [u8; 16] = fp.try_into().map_err(|_| corrupt("fingerprint"))?;
    let token: i64 = row.try_get(2).map_err(|_| corrupt("token"))?;
    let token = FencingToken::new(unsigned("token", token)?).ok_or_else(|| corrupt("token"))?;
    let get = |i: usize, what: &str| -> Result<u64, PgError> {
        unsigned(what, row.try_get::<_, i64>(i).map_err(|_| corrupt(what))?)
    };
    let attempts: i32 = row.try_get(7).map_err(|_| corrupt("attempts"))?;
    Ok(Some(Record {
        state,
        fingerprint: Fingerprint::from_u128(u128::from_be_bytes(fp)),
        token,
        lease_expires_at: get(3, "lease_expires_at")?,
        created_at: get(4, "created_at")?,
        updated_at: get(5, "updated_at")?,
        expires_at: get(6, "expires_at")?,
        attempts: u32::try_from(attempts).map_err(|_| corrupt("attempts"))?,
        response: row.try_get(8).map_err(|_| corrupt("response"))?,
    }))
}

pub(crate) fn fingerprint_bytes(fp: Fingerprint) -> [u8; 16] {
    fp.as_u128().to_be_bytes()
}

pub(crate) fn state_code(state: RecordState) -> i16 {
    i16::from(state.to_byte())
}

/// A token as the sequence gave it.
pub(crate) fn token_from(value: i64) -> Result<FencingToken, PgError> {
    u64::try_from(value)
        .ok()
        .and_then(FencingToken::new)
        .ok_or_else(|| PgError::Corrupted("idemdb_tokens gave a token below 1".into()))
}

pub(crate) fn token_value(token: FencingToken) -> i64 {
    ms(token.get())
}

/// What a key's newest row says: the live record, and whether an expired one is still
/// stored (the key is recognised beyond its horizon), at the store's time `now_ms`.
pub(crate) struct Found {
    pub(crate) live: Option<Record>,
    pub(crate) expired: bool,
    pub(crate) now_ms: u64,
}

impl Found {
    /// From a row of [`NEWEST`] (or a statement that selects the same columns), the store's
    /// time in column `now_at`.
    pub(crate) fn of(row: &Row, now_at: usize) -> Result<Found, PgError> {
        let now: i64 = row
            .try_get(now_at)
            .map_err(|_| PgError::Corrupted("the server's clock read as NULL".into()))?;
        let now_ms = unsigned("now", now)?;
        let (live, expired) = match record(row)? {
            None => (None, false),
            Some(rec) if rec.is_expired(now_ms) => (None, true),
            Some(rec) => (Some(rec), false),
        };
        Ok(Found {
            live,
            expired,
            now_ms,
        })
    }
}
