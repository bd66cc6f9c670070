//! The schema, created and upgraded by [`PgStoreBuilder::migrate`](crate::PgStoreBuilder::migrate),
//! versioned in `idemdb_meta`. docs/design.md §14 describes every table.

use tokio_postgres::error::SqlState;

use super::errors::{database, is_retryable};
use super::sql::key_hash;
use crate::error::PgError;
use idemdb_core::fingerprint::database_id;
use idemdb_core::fingerprint::{Fingerprinter, SECRET_LEN};
use idemdb_core::scope::RecordKey;

/// The newest schema version this build writes and reads.
pub(crate) const SCHEMA_VERSION: i32 = 4;

/// Lock stripes: a reservation of a key with no live record holds its stripe's row lock
/// while it looks again and inserts, so that no two callers insert the same key (a
/// partitioned table has no unique index across partitions).
pub(crate) const STRIPES: i32 = 1024;

/// The lock stripe of a key.
pub(crate) fn stripe(key: &RecordKey) -> i32 {
    let h = xxhash_rust::xxh3::xxh3_64(key.as_bytes());
    i32::try_from(h % u64::from(STRIPES.unsigned_abs())).unwrap_or(0)
}

/// Version 1. Every statement is idempotent, so that instances migrating at once converge.
const V1: &str = "
CREATE TABLE IF NOT EXISTS idemdb_meta (
    id int PRIMARY KEY CHECK (id = 1),
    schema_version int NOT NULL,
    fingerprint_secret bytea NOT NULL
);
CREATE SEQUENCE IF NOT EXISTS idemdb_tokens AS bigint MINVALUE 1 START WITH 1;
CREATE TABLE IF NOT EXISTS idemdb_stripes (stripe int PRIMARY KEY);
CREATE TABLE IF NOT EXISTS idemdb_records (
    operation bytea NOT NULL,
    principal bytea NOT NULL,
    key bytea NOT NULL,
    state smallint NOT NULL,
    fingerprint bytea NOT NULL,
    token bigint NOT NULL,
    lease_expires_at bigint NOT NULL,
    created_at bigint NOT NULL,
    updated_at bigint NOT NULL,
    expires_at bigint NOT NULL,
    attempts int NOT NULL,
    response bytea NOT NULL,
    waiters int NOT NULL DEFAULT 0
) PARTITION BY RANGE (expires_at);
CREATE INDEX IF NOT EXISTS idemdb_records_key
    ON idemdb_records (operation, principal, key, expires_at DESC);
";

/// Version 2: the store's time is the server's (`frozen_now_ms`: NULL but in tests, see
/// `clock.rs`), and records are found by a fixed-size hash of their key (a btree entry holds
/// at most ~2.7 KB; keys may be far longer), the full key compared on read.
const V2: &str = concat!(
    "
ALTER TABLE idemdb_meta ADD COLUMN IF NOT EXISTS frozen_now_ms bigint;
ALTER TABLE idemdb_records ADD COLUMN IF NOT EXISTS key_hash bytea
    GENERATED ALWAYS AS (",
    key_hash!("operation", "principal", "key"),
    ") STORED;
CREATE INDEX IF NOT EXISTS idemdb_records_hash ON idemdb_records (key_hash, expires_at DESC);
DROP INDEX IF EXISTS idemdb_records_key;
"
);

/// Version 3: `idemdb_reserve`, a reservation in one statement (one round trip, one commit).
/// It reads the key's newest row; a live one is returned for the caller's `decide`. Else it
/// takes the key's stripe lock, reads again and inserts the new owner's IN_PROGRESS record
/// if no live record exists and either none at all or `p_flag` (the policy flags a key beyond
/// its horizon). Each statement of a PL/pgSQL function takes its own snapshot under READ
/// COMMITTED, so the read after the lock sees the insert of the lock's previous holder. The
/// stripes are those of versions 1 and 2: an older build's instance still running beside a
/// newer one excludes the same inserts. Columns: the newest row (0-8; NULL for none), the
/// inserted token and lease end (9, 10; NULL when nothing was inserted), the store's time (11).
const V3: &str = concat!(
    "
CREATE OR REPLACE FUNCTION idemdb_reserve(p_operation bytea, p_principal bytea, p_key bytea,
    p_fingerprint bytea, p_lease bigint, p_ttl bigint, p_flag boolean, p_stripe int,
    OUT o_state smallint, OUT o_fingerprint bytea, OUT o_token bigint, OUT o_lease bigint,
    OUT o_created bigint, OUT o_updated bigint, OUT o_expires bigint, OUT o_attempts int,
    OUT o_response bytea, OUT o_new_token bigint, OUT o_new_lease bigint, OUT o_now bigint)
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    h bytea := ",
    key_hash!("p_operation", "p_principal", "p_key"),
    ";
    locked boolean := false;
BEGIN
    -- Each statement takes a new snapshot (READ COMMITTED): the read after the lock sees
    -- every insert its previous holder committed.
    LOOP
        SELECT COALESCE(m.frozen_now_ms, floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint)
            INTO o_now FROM idemdb_meta m WHERE m.id = 1;
        SELECT r.state, r.fingerprint, r.token, r.lease_expires_at, r.created_at, r.updated_at,
            r.expires_at, r.attempts, r.response
            INTO o_state, o_fingerprint, o_token, o_lease, o_created, o_updated, o_expires,
                o_attempts, o_response
            FROM idemdb_records r
            WHERE r.key_hash = h AND r.operation = p_operation AND r.principal = p_principal
            AND r.key = p_key ORDER BY r.expires_at DESC LIMIT 1;
        -- A live record: answered from the row, nothing written.
        IF o_expires > o_now THEN
            RETURN;
        END IF;
        EXIT WHEN locked;
        PERFORM 1 FROM idemdb_stripes s WHERE s.stripe = p_stripe FOR UPDATE;
        locked := true;
    END LOOP;
    -- An expired record the policy refuses: the caller answers BeyondHorizon.
    IF o_expires IS NOT NULL AND NOT p_flag THEN
        RETURN;
    END IF;
    INSERT INTO idemdb_records (operation, principal, key, state, fingerprint, token,
        lease_expires_at, created_at, updated_at, expires_at, attempts, response)
    VALUES (p_operation, p_principal, p_key, 1, p_fingerprint, nextval('idemdb_tokens'),
        o_now + p_lease, o_now, o_now, o_now + p_lease + p_ttl, 1, ''::bytea)
    RETURNING token, lease_expires_at INTO o_new_token, o_new_lease;
END
$fn$;
"
);

/// Version 4: the outbox (docs/design.md §15). A message is a row of `idemdb_outbox`,
/// numbered by `idemdb_outbox_seq`; its claims are numbered by `idemdb_outbox_claims`, so
/// that no two claims share a token. Not partitioned: a delivered message is deleted by
/// primary key in its mark's commit, and nothing else ever deletes an undelivered one.
const V4: &str = "
CREATE SEQUENCE IF NOT EXISTS idemdb_outbox_seq AS bigint MINVALUE 1 START WITH 1;
CREATE SEQUENCE IF NOT EXISTS idemdb_outbox_claims AS bigint MINVALUE 1 START WITH 1;
CREATE TABLE IF NOT EXISTS idemdb_outbox (
    seq bigint PRIMARY KEY,
    id bytea NOT NULL,
    destination text NOT NULL,
    ordering_key bytea,
    header_names text[] NOT NULL,
    header_values bytea[] NOT NULL,
    payload bytea NOT NULL,
    staged_at bigint NOT NULL,
    attempts int NOT NULL DEFAULT 0,
    next_attempt_at bigint NOT NULL DEFAULT 0,
    last_error text,
    parked boolean NOT NULL DEFAULT false,
    claim_token bigint NOT NULL DEFAULT 0,
    claim_expires_at bigint NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS idemdb_outbox_ordering
    ON idemdb_outbox (ordering_key, seq) WHERE ordering_key IS NOT NULL;
CREATE INDEX IF NOT EXISTS idemdb_outbox_id ON idemdb_outbox (id);
";

/// Applies every migration newer than the database's version, in one transaction each;
/// returns the version now in place. Refuses a database of a newer build.
pub(crate) async fn migrate(client: &mut tokio_postgres::Client) -> Result<i32, PgError> {
    // Made once: the first instance's wins. The database's identity derives from it.
    let secret = Fingerprinter::random_secret()
        .map_err(|e| PgError::Internal(format!("no entropy for the fingerprint secret: {e}")))?
        .to_vec();
    let mut attempts = 0;
    loop {
        match migrate_once(client, &secret).await {
            Ok(Migrated::Version(v)) => return Ok(v),
            Ok(Migrated::Newer(v)) => return Err(newer(v)),
            // Two instances creating the same objects at once: the loser retries and finds
            // them made.
            Err(e) if attempts < 8 && (is_retryable(&e) || is_create_race(&e)) => attempts += 1,
            Err(e) => return Err(database(e)),
        }
    }
}

/// The refusal of a schema made by a newer build.
fn newer(found: i32) -> PgError {
    PgError::UnsupportedFormat {
        found: found.unsigned_abs(),
        supported: SCHEMA_VERSION.unsigned_abs(),
    }
}

fn is_create_race(e: &tokio_postgres::Error) -> bool {
    matches!(
        e.code(),
        Some(
            &SqlState::UNIQUE_VIOLATION | &SqlState::DUPLICATE_TABLE | &SqlState::DUPLICATE_OBJECT
        )
    )
}

/// What one migration attempt found: done, or a schema of a newer build.
enum Migrated {
    Version(i32),
    Newer(i32),
}

async fn migrate_once(
    client: &mut tokio_postgres::Client,
    secret: &[u8],
) -> Result<Migrated, tokio_postgres::Error> {
    match version(client).await? {
        Some(v) if v > SCHEMA_VERSION => return Ok(Migrated::Newer(v)),
        Some(v) if v == SCHEMA_VERSION => return Ok(Migrated::Version(v)),
        _ => {}
    }
    let txn = client.transaction().await?;
    txn.batch_execute(V1).await?;
    txn.batch_execute(V2).await?;
    txn.batch_execute(V3).await?;
    txn.batch_execute(V4).await?;
    txn.execute(
        "INSERT INTO idemdb_stripes SELECT generate_series(0, $1::int - 1) ON CONFLICT DO NOTHING",
        &[&STRIPES],
    )
    .await?;
    txn.execute(
        "INSERT INTO idemdb_meta (id, schema_version, fingerprint_secret) \
         VALUES (1, $1, $2) ON CONFLICT (id) DO NOTHING",
        &[&SCHEMA_VERSION, &secret],
    )
    .await?;
    txn.execute(
        "UPDATE idemdb_meta SET schema_version = $1 WHERE id = 1 AND schema_version < $1",
        &[&SCHEMA_VERSION],
    )
    .await?;
    txn.commit().await?;
    Ok(Migrated::Version(SCHEMA_VERSION))
}

/// The schema version in place in the connection's `current_schema()`, the first schema of
/// its `search_path` that exists; `None` if idemdb's tables are not there. Tables of the same
/// names in a schema later in the path are another store's (another tenant's): found
/// through the whole path, they would be adopted. Every other statement names its tables
/// unqualified, and the path finds those of `current_schema()` first.
async fn version(client: &tokio_postgres::Client) -> Result<Option<i32>, tokio_postgres::Error> {
    let exists = client
        .query_one(
            "SELECT to_regclass(quote_ident(current_schema()) || '.idemdb_meta') IS NOT NULL",
            &[],
        )
        .await?
        .get::<_, bool>(0);
    if !exists {
        return Ok(None);
    }
    let row = client
        .query_opt("SELECT schema_version FROM idemdb_meta WHERE id = 1", &[])
        .await?;
    Ok(row.map(|r| r.get(0)))
}

/// Where a connection's idemdb tables are, as a message says it: `schema "name"` (the first
/// schema of its `search_path` that exists), or that the path names none.
async fn schema_in_use(client: &tokio_postgres::Client) -> Result<String, PgError> {
    let row = client
        .query_one(
            "SELECT current_schema(), current_setting('search_path')",
            &[],
        )
        .await
        .map_err(database)?;
    let schema: Option<String> = row.try_get(0).map_err(database)?;
    let path: String = row.try_get(1).map_err(database)?;
    Ok(match schema {
        Some(schema) => format!("schema \"{schema}\" (the first of search_path = {path})"),
        None => format!("no schema: search_path = {path} names none that exists"),
    })
}

/// The store's time now (the server's clock, or the frozen time of a test).
pub(crate) async fn server_now(client: &tokio_postgres::Client) -> Result<u64, PgError> {
    let row = client
        .query_one(
            concat!("WITH ", super::sql::clock!(), " SELECT now_ms FROM clock"),
            &[],
        )
        .await
        .map_err(database)?;
    super::rows::stored_ms(row.try_get(0).map_err(database)?)
}

/// What a store reads once at connect: the fingerprint secret, and the database's identity
/// derived from it as the embedded engine derives its own.
pub(crate) struct Meta {
    pub(crate) database_id: u64,
    pub(crate) fingerprinter: Fingerprinter,
}

impl Meta {
    /// Reads the meta row, refusing a database that was not migrated or was migrated by a
    /// newer build.
    pub(crate) async fn read(client: &tokio_postgres::Client) -> Result<Meta, PgError> {
        let found = version(client).await.map_err(database)?;
        match found {
            None => {
                return Err(PgError::NotMigrated(format!(
                    "no idemdb tables in {}: run PgStoreBuilder::migrate first",
                    schema_in_use(client).await?
                )));
            }
            Some(v) if v > SCHEMA_VERSION => return Err(newer(v)),
            Some(v) if v < SCHEMA_VERSION => {
                return Err(PgError::NotMigrated(format!(
                    "schema version {v} is older than {SCHEMA_VERSION}: run PgStoreBuilder::migrate"
                )));
            }
            Some(_) => {}
        }
        let row = client
            .query_one(
                "SELECT fingerprint_secret FROM idemdb_meta WHERE id = 1",
                &[],
            )
            .await
            .map_err(database)?;
        let secret: Vec<u8> = row.try_get(0).map_err(database)?;
        let secret: [u8; SECRET_LEN] = secret.try_into().map_err(|_| {
            PgError::Corrupted("idemdb_meta.fingerprint_secret has the wrong length".into())
        })?;
        Ok(Meta {
            database_id: database_id(&secret),
            fingerprinter: Fingerprinter::new(secret),
        })
    }
}
