//! The baseline a user writes instead of `PgStore` (issue 22): one table with a unique key,
//! `INSERT … ON CONFLICT DO NOTHING` to reserve (a `SELECT` of the stored row when it
//! conflicts), a guarded `UPDATE … WHERE token = $t AND state = 1` to complete; autocommit,
//! prepared statements, one connection per caller. It keeps no retention, no lease takeover
//! and no waiters: what it costs is the floor a dedupe store over PostgreSQL is held to.

use std::sync::Arc;

use idemdb_postgres::tokio_postgres::{self, Client, NoTls, Statement};
use parking_lot::Mutex;
use tokio::runtime::Handle;

use crate::shared::keys::{OPERATION, PAYLOAD, PRINCIPAL, RESPONSE, key_bytes};

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

/// A connection and its prepared statements.
struct Conn {
    client: Client,
    reserve: Statement,
    look: Statement,
    complete: Statement,
}

/// The baseline on one database: as many connections as callers, each taken by one call.
pub struct Table {
    idle: Mutex<Vec<Conn>>,
}

/// What a reservation of the baseline found.
enum Reserved {
    Acquired(i64),
    Completed(Vec<u8>),
}

impl Table {
    /// Makes the table in the (fresh) database at `url` and opens `connections` connections.
    pub fn open(rt: &Handle, url: &str, connections: usize) -> Table {
        rt.block_on(async {
            let mut idle = Vec::with_capacity(connections);
            for i in 0..connections {
                let (client, connection) = tokio_postgres::connect(url, NoTls)
                    .await
                    .expect("connect the baseline");
                tokio::spawn(connection);
                if i == 0 {
                    client.batch_execute(SCHEMA).await.expect("baseline schema");
                }
                let reserve = client.prepare(RESERVE).await.expect("prepare");
                let look = client.prepare(LOOK).await.expect("prepare");
                let complete = client.prepare(COMPLETE).await.expect("prepare");
                idle.push(Conn {
                    client,
                    reserve,
                    look,
                    complete,
                });
            }
            Table {
                idle: Mutex::new(idle),
            }
        })
    }

    fn take(&self) -> Conn {
        self.idle.lock().pop().expect("one connection per caller")
    }

    fn give_back(&self, conn: Conn) {
        self.idle.lock().push(conn);
    }

    async fn reserve(conn: &Conn, key: &[u8]) -> Reserved {
        let fingerprint = xxhash_rust::xxh3::xxh3_128(PAYLOAD).to_be_bytes().to_vec();
        let row = conn
            .client
            .query_opt(&conn.reserve, &[&OPERATION, &PRINCIPAL, &key, &fingerprint])
            .await
            .expect("baseline reserve");
        if let Some(row) = row {
            return Reserved::Acquired(row.get(0));
        }
        let row = conn
            .client
            .query_one(&conn.look, &[&OPERATION, &PRINCIPAL, &key])
            .await
            .expect("baseline look");
        let (state, stored): (i16, Vec<u8>) = (row.get(0), row.get(1));
        assert_eq!(stored, fingerprint, "same payload");
        assert_eq!(state, 2, "completed");
        Reserved::Completed(row.get(2))
    }

    /// reserve + complete of the fresh key `id`.
    pub async fn lifecycle(self: &Arc<Self>, id: u64) -> (std::time::Instant, std::time::Duration) {
        let conn = self.take();
        let key = key_bytes(id).to_vec();
        let start = std::time::Instant::now();
        let reserved = Table::reserve(&conn, &key).await;
        let took = start.elapsed();
        let Reserved::Acquired(token) = reserved else {
            panic!("fresh key {id} not acquired by the baseline");
        };
        let n = conn
            .client
            .execute(
                &conn.complete,
                &[&OPERATION, &PRINCIPAL, &key, &token, &RESPONSE],
            )
            .await
            .expect("baseline complete");
        assert_eq!(n, 1, "the owner's guarded update");
        self.give_back(conn);
        (start, took)
    }

    /// reserve of the completed key `id`: a replay.
    pub async fn replay(self: &Arc<Self>, id: u64) {
        let conn = self.take();
        let key = key_bytes(id).to_vec();
        match Table::reserve(&conn, &key).await {
            Reserved::Completed(bytes) => {
                assert_eq!(bytes.len(), RESPONSE.len(), "the stored response");
                std::hint::black_box(bytes);
            }
            Reserved::Acquired(_) => panic!("completed key {id} acquired again by the baseline"),
        }
        self.give_back(conn);
    }
}
