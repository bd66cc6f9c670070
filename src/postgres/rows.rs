//! Records as rows: the columns every read selects, and conversions between idemdb's
//! unsigned milliseconds and PostgreSQL's `bigint`.

use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use crate::error::Error;
use crate::fingerprint::Fingerprint;
use crate::record::{Record, RecordState};
use crate::scope::RecordKey;
use crate::token::FencingToken;

/// A key's newest row: the live record if there is one (a new row always expires after every
/// older row of its key), else the expired one still stored.
pub(crate) const NEWEST: &str = "SELECT state, fingerprint, token, lease_expires_at, \
     created_at, updated_at, expires_at, attempts, response FROM idemdb_records \
     WHERE operation = $1 AND principal = $2 AND key = $3 ORDER BY expires_at DESC LIMIT 1";

/// The key's newest row, read on `client` by itself (the statement prepared once per
/// connection).
pub(crate) async fn newest(
    client: &deadpool_postgres::Client,
    p: &KeyParts<'_>,
) -> Result<Option<Row>, tokio_postgres::Error> {
    let stmt = client.prepare_cached(NEWEST).await?;
    client
        .query_opt(&stmt, &[&p.operation, &p.principal, &p.key])
        .await
}

/// A record key split into its three columns.
pub(crate) struct KeyParts<'a> {
    pub(crate) operation: &'a [u8],
    pub(crate) principal: &'a [u8],
    pub(crate) key: &'a [u8],
}

impl<'a> KeyParts<'a> {
    pub(crate) fn of(key: &'a RecordKey) -> Result<KeyParts<'a>, Error> {
        let (operation, principal, key) = RecordKey::split(key.as_bytes())
            .ok_or_else(|| Error::Internal("a record key did not split".into()))?;
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

fn unsigned(what: &str, v: i64) -> Result<u64, Error> {
    u64::try_from(v).map_err(|_| Error::Corrupted(format!("idemdb_records.{what} is negative")))
}

/// The record in a row selected by [`NEWEST`].
pub(crate) fn record(row: &Row) -> Result<Record, Error> {
    let corrupt = |what: &str| Error::Corrupted(format!("idemdb_records.{what} is invalid"));
    let state: i16 = row.try_get(0).map_err(|_| corrupt("state"))?;
    let state = u8::try_from(state)
        .ok()
        .and_then(RecordState::from_byte)
        .ok_or_else(|| corrupt("state"))?;
    let fp: &[u8] = row.try_get(1).map_err(|_| corrupt("fingerprint"))?;
    let fp: [u8; 16] = fp.try_into().map_err(|_| corrupt("fingerprint"))?;
    let token: i64 = row.try_get(2).map_err(|_| corrupt("token"))?;
    let token = FencingToken::new(unsigned("token", token)?).ok_or_else(|| corrupt("token"))?;
    let get = |i: usize, what: &str| -> Result<u64, Error> {
        unsigned(what, row.try_get::<_, i64>(i).map_err(|_| corrupt(what))?)
    };
    let attempts: i32 = row.try_get(7).map_err(|_| corrupt("attempts"))?;
    Ok(Record {
        state,
        fingerprint: Fingerprint::from_u128(u128::from_be_bytes(fp)),
        token,
        lease_expires_at: get(3, "lease_expires_at")?,
        created_at: get(4, "created_at")?,
        updated_at: get(5, "updated_at")?,
        expires_at: get(6, "expires_at")?,
        attempts: u32::try_from(attempts).map_err(|_| corrupt("attempts"))?,
        response: row.try_get(8).map_err(|_| corrupt("response"))?,
    })
}

/// A record's columns as statement parameters `$1`–`$11`, in `INSERT`'s order: the key's
/// three parts, state, fingerprint, lease end, created, updated, expires, attempts, response.
pub(crate) struct RowValues<'r> {
    state: i16,
    fingerprint: Vec<u8>,
    times: [i64; 4],
    attempts: i32,
    response: &'r Vec<u8>,
}

impl<'r> RowValues<'r> {
    pub(crate) fn of(rec: &'r Record) -> Self {
        RowValues {
            state: state_code(rec.state),
            fingerprint: fingerprint_bytes(rec.fingerprint).to_vec(),
            times: [
                ms(rec.lease_expires_at),
                ms(rec.created_at),
                ms(rec.updated_at),
                ms(rec.expires_at),
            ],
            attempts: i32::try_from(rec.attempts).unwrap_or(i32::MAX),
            response: &rec.response,
        }
    }

    pub(crate) fn params<'a>(&'a self, p: &'a KeyParts<'_>) -> Vec<&'a (dyn ToSql + Sync)> {
        let [lease, created, updated, expires] = &self.times;
        vec![
            &p.operation,
            &p.principal,
            &p.key,
            &self.state,
            &self.fingerprint,
            lease,
            created,
            updated,
            expires,
            &self.attempts,
            self.response,
        ]
    }
}

pub(crate) fn fingerprint_bytes(fp: Fingerprint) -> [u8; 16] {
    fp.as_u128().to_be_bytes()
}

pub(crate) fn state_code(state: RecordState) -> i16 {
    i16::from(state.to_byte())
}

/// A token as the sequence gave it.
pub(crate) fn token_from(value: i64) -> Result<FencingToken, Error> {
    u64::try_from(value)
        .ok()
        .and_then(FencingToken::new)
        .ok_or_else(|| Error::Corrupted("idemdb_tokens gave a token below 1".into()))
}

pub(crate) fn token_value(token: FencingToken) -> i64 {
    ms(token.get())
}

/// What a key's newest row says: the live record, and whether an expired one is still
/// stored (the key is recognised beyond its horizon).
pub(crate) struct Found {
    pub(crate) live: Option<Record>,
    pub(crate) expired: bool,
}

impl Found {
    pub(crate) fn of(row: Option<&Row>, now_ms: u64) -> Result<Found, Error> {
        let Some(row) = row else {
            return Ok(Found {
                live: None,
                expired: false,
            });
        };
        let rec = record(row)?;
        Ok(if rec.is_expired(now_ms) {
            Found {
                live: None,
                expired: true,
            }
        } else {
            Found {
                live: Some(rec),
                expired: false,
            }
        })
    }
}
