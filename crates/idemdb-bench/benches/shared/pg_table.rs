//! The table a user writes by hand instead of `PgStore` (issue 22): one table with a unique key,
//! `INSERT … ON CONFLICT DO NOTHING` to reserve (a `SELECT` of the stored row when it
//! conflicts), a guarded `UPDATE … WHERE token = $t AND state = 1` to complete; autocommit,
//! prepared statements, `synchronous_commit = on` (every answer durable). It keeps no
//! retention, no lease takeover and no waiters: what it costs is the floor a dedupe store over
//! PostgreSQL is held to. One [`Conn`] is one connection; `pg_compare` pools them, `compare`
//! gives each caller thread its own.

use std::ops::Range;

use idemdb_postgres::tokio_postgres::{self, Client, NoTls, Statement};

use super::keys::{OPERATION, PAYLOAD, PRINCIPAL, RESPONSE, key_bytes};

const SCHEMA: &str = "
CREATE SEQUENCE dedupe_tokens;
CREATE TABLE dedupe (
    operation text NOT NULL,
    principal text NOT NULL,
    key bytea NOT NULL,
    state smallint NOT NULL,
    fingerprint bytea NOT NULL,
    token bigint NOT NULL DEFAULT nextval('dedupe_tokens'),
    lease_expires_at timestamptz NOT NULL,
    response bytea,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (operation, principal, key)
);";

const RESERVE: &str = "INSERT INTO dedupe (operation, principal, key, state, fingerprint, \
     lease_expires_at) VALUES ($1, $2, $3, 1, $4, now() + interval '60 seconds') \
     ON CONFLICT DO NOTHING RETURNING token";
const LOOK: &str = "SELECT state, fingerprint, response FROM dedupe \
     WHERE operation = $1 AND principal = $2 AND key = $3";
const COMPLETE: &str = "UPDATE dedupe SET state = 2, response = $5 \
     WHERE operation = $1 AND principal = $2 AND key = $3 AND token = $4 AND state = 1";
/// Completed records for the replay cells, many per statement (not measured).
const PRELOAD: &str = "INSERT INTO dedupe (operation, principal, key, state, fingerprint, \
     lease_expires_at, response) SELECT $1, $2, k, 2, $3, now(), $4 FROM unnest($5::bytea[]) AS k";

/// The stored state of a completed record.
const COMPLETED: i16 = 2;

/// One connection and its prepared statements.
pub struct Conn {
    client: Client,
    reserve: Statement,
    look: Statement,
    complete: Statement,
}

/// What a reservation found.
pub enum Reserved {
    Acquired(i64),
    Completed(Vec<u8>),
}

fn fingerprint() -> Vec<u8> {
    xxhash_rust::xxh3::xxh3_128(PAYLOAD).to_be_bytes().to_vec()
}

impl Conn {
    /// Connects to the database at `url`; the connection's task is spawned on the current
    /// tokio runtime, so it makes progress only while that runtime runs.
    pub async fn connect(url: &str) -> Conn {
        let (client, connection) = tokio_postgres::connect(url, NoTls)
            .await
            .expect("connect the baseline");
        tokio::spawn(connection);
        // The server's default, made sure of: a commit returns after its WAL flush.
        client
            .batch_execute("SET synchronous_commit = on")
            .await
            .expect("synchronous_commit");
        let reserve = client.prepare(RESERVE).await.expect("prepare");
        let look = client.prepare(LOOK).await.expect("prepare");
        let complete = client.prepare(COMPLETE).await.expect("prepare");
        Conn {
            client,
            reserve,
            look,
            complete,
        }
    }

    /// Makes the table in a fresh database.
    pub async fn create_schema(url: &str) {
        let (client, connection) = tokio_postgres::connect(url, NoTls)
            .await
            .expect("connect the baseline");
        let connection = tokio::spawn(connection);
        client.batch_execute(SCHEMA).await.expect("baseline schema");
        drop(client);
        let _ = connection.await;
    }

    /// Reserves `key`: acquired with its token, or the completed record's response (same
    /// payload checked).
    pub async fn reserve(&self, key: &[u8]) -> Reserved {
        let fingerprint = fingerprint();
        let row = self
            .client
            .query_opt(&self.reserve, &[&OPERATION, &PRINCIPAL, &key, &fingerprint])
            .await
            .expect("baseline reserve");
        if let Some(row) = row {
            return Reserved::Acquired(row.get(0));
        }
        Reserved::Completed(self.look(key).await)
    }

    /// The stored response of the completed record `key` (same payload checked): one
    /// `SELECT`.
    pub async fn look(&self, key: &[u8]) -> Vec<u8> {
        let row = self
            .client
            .query_one(&self.look, &[&OPERATION, &PRINCIPAL, &key])
            .await
            .expect("baseline look");
        let (state, stored): (i16, Vec<u8>) = (row.get(0), row.get(1));
        assert_eq!(stored, fingerprint(), "same payload");
        assert_eq!(state, COMPLETED, "completed");
        row.get(2)
    }

    /// The owner's guarded completion of `key`, reserved with `token`.
    pub async fn complete(&self, key: &[u8], token: i64) {
        let n = self
            .client
            .execute(
                &self.complete,
                &[&OPERATION, &PRINCIPAL, &key, &token, &RESPONSE],
            )
            .await
            .expect("baseline complete");
        assert_eq!(n, 1, "the owner's guarded update");
    }

    /// Stores completed records for the ids `ids`, 10,000 per statement.
    pub async fn preload(&self, ids: Range<u64>) {
        let fingerprint = fingerprint();
        let ids: Vec<u64> = ids.collect();
        for chunk in ids.chunks(10_000) {
            let keys: Vec<Vec<u8>> = chunk.iter().map(|&id| key_bytes(id).to_vec()).collect();
            self.client
                .execute(
                    PRELOAD,
                    &[&OPERATION, &PRINCIPAL, &fingerprint, &RESPONSE, &keys],
                )
                .await
                .expect("baseline preload");
        }
    }
}

/// Which server a bench runs on, and the values of `settings` there (the server's version and
/// what decides commit cost), as `(name, value)`.
pub fn pg_settings(
    rt: &tokio::runtime::Handle,
    store: &idemdb_postgres::PgStore,
    settings: &[&str],
) -> Vec<(String, String)> {
    let which =
        if std::env::var(idemdb_testkit::postgres::ENV_URL).is_ok_and(|v| !v.trim().is_empty()) {
            "the server named by IDEMDB_TEST_PG"
        } else {
            "a throwaway cluster (idemdb_testkit::postgres), 127.0.0.1 over TCP"
        };
    rt.block_on(async {
        let client = store.pool().get().await.expect("pool");
        let mut out = vec![("PostgreSQL server".to_string(), which.to_string())];
        for setting in settings {
            let v: String = client
                .query_one("SELECT current_setting($1)", &[setting])
                .await
                .expect("current_setting")
                .get(0);
            out.push((setting.to_string(), v));
        }
        out
    })
}
