//! PostgreSQL: the hand-written table (`shared/pg_table.rs`) on the test server of
//! `idemdb_testkit::postgres` (`$IDEMDB_TEST_PG`, else a throwaway cluster on this machine's
//! binaries, its data under the system's temp dir like the other engines' files): one database
//! for the run and a fresh schema (table, index, sequence) per cell, which is as fresh as a new
//! database and costs a few ms instead of the 0.3–0.5 s of `CREATE DATABASE`. Autocommit,
//! `synchronous_commit = on`, fsync checked on: every answer durable.
//!
//! Each caller thread has its own connection driven by its own current-thread tokio runtime,
//! as the sync `postgres` crate does: the connection makes progress on the caller's thread,
//! with no hand-off to another thread per statement. In the async cells every task has its
//! own connection, all of them driven by the one runtime thread that runs the tasks
//! ([`PgTask`]).
//!
//! One lifecycle: `INSERT … ON CONFLICT DO NOTHING RETURNING token`, then the guarded
//! `UPDATE`. A replay is the `SELECT` of the stored row, as SQLite's is.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use idemdb_postgres::tokio_postgres::{self, NoTls};
use idemdb_testkit::postgres::{ENV_URL, TestServer};
use tokio::runtime::Runtime;

use crate::interface::{Engine, Session};
use crate::shared::cpu;
use crate::shared::keys::{RESPONSE, key_bytes};
use crate::shared::pg_table::{Conn, Reserved};

/// The table in a schema of its own.
pub struct Postgres {
    url: String,
}

struct PgSession {
    conn: Conn,
    /// Drives `conn` while this thread waits for it; dropped after it.
    rt: Runtime,
}

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// The run's database on the test server, made on first use.
fn database() -> Result<&'static str, String> {
    static DATABASE: OnceLock<Result<String, String>> = OnceLock::new();
    DATABASE
        .get_or_init(|| TestServer::shared()?.fresh_database())
        .as_deref()
        .map_err(Clone::clone)
}

/// Names the cells' schemas.
static SCHEMAS: AtomicU64 = AtomicU64::new(0);

impl Postgres {
    /// The table in a new schema of the run's database.
    pub fn open() -> Postgres {
        let db = database().unwrap_or_else(|e| panic!("PostgreSQL: {e}"));
        let schema = format!("cell_{}", SCHEMAS.fetch_add(1, Ordering::Relaxed));
        // Every connection of this engine resolves the table's name in its schema.
        let separator = if db.contains('?') { '&' } else { '?' };
        let url = format!("{db}{separator}options=-c%20search_path%3D{schema}");
        runtime().block_on(async {
            let (client, connection) = tokio_postgres::connect(db, NoTls).await.expect("connect");
            let connection = tokio::spawn(connection);
            client
                .batch_execute(&format!("CREATE SCHEMA {schema}"))
                .await
                .expect("create schema");
            drop(client);
            let _ = connection.await;
            Conn::create_schema(&url).await;
            let (client, connection) = tokio_postgres::connect(&url, NoTls).await.expect("connect");
            tokio::spawn(connection);
            let row = client
                .query_one(
                    "SELECT relnamespace::regnamespace::text FROM pg_class \
                     WHERE oid = 'dedupe'::regclass",
                    &[],
                )
                .await
                .expect("the table");
            assert_eq!(
                row.get::<_, String>(0),
                schema,
                "the table in the cell's schema"
            );
        });
        Postgres { url }
    }
}

impl Engine for Postgres {
    fn session(&self) -> Box<dyn Session> {
        let rt = runtime();
        let conn = rt.block_on(Conn::connect(&self.url));
        Box::new(PgSession { conn, rt })
    }

    fn preload(&self, n: u64) {
        let rt = runtime();
        rt.block_on(async {
            Conn::connect(&self.url).await.preload(0..n).await;
        });
    }

    /// The postmaster and its children (backends, WAL writer, checkpointer …), if the server
    /// runs on this machine.
    fn server_pids(&self) -> Vec<u32> {
        let backend = runtime().block_on(async {
            let (client, connection) = tokio_postgres::connect(&self.url, NoTls).await.ok()?;
            tokio::spawn(connection);
            let row = client
                .query_one("SELECT pg_backend_pid()", &[])
                .await
                .ok()?;
            u32::try_from(row.get::<_, i32>(0)).ok()
        });
        let Some(postmaster) = backend.and_then(cpu::parent_of) else {
            return Vec::new();
        };
        let mut pids = cpu::children_of(postmaster);
        pids.push(postmaster);
        pids
    }
}

impl PgSession {
    fn acquire(&self, key: &[u8]) -> i64 {
        match self.rt.block_on(self.conn.reserve(key)) {
            Reserved::Acquired(token) => token,
            Reserved::Completed(_) => panic!("fresh key found completed"),
        }
    }
}

impl Session for PgSession {
    fn reserve(&mut self, id: u64) {
        self.acquire(&key_bytes(id));
    }

    fn lifecycle(&mut self, id: u64) {
        let key = key_bytes(id);
        let token = self.acquire(&key);
        self.rt.block_on(self.conn.complete(&key, token));
    }

    fn execute(&mut self, _id: u64) {
        unreachable!(
            "execute cells leave PostgreSQL out: its business write would be in another store"
        )
    }

    fn replay(&mut self, id: u64) -> usize {
        let response = self.rt.block_on(self.conn.look(&key_bytes(id)));
        assert_eq!(response, RESPONSE, "the stored response");
        response.len()
    }
}

/// Creates the run's database and checks that the server is durable: the summary's note on it, or why
/// PostgreSQL is left out.
pub fn probe() -> Result<String, String> {
    let url = database()?;
    let settings = runtime().block_on(async {
        let (client, connection) = tokio_postgres::connect(url, NoTls)
            .await
            .map_err(|e| format!("connecting: {e}"))?;
        tokio::spawn(connection);
        let mut out = Vec::new();
        for name in [
            "server_version",
            "fsync",
            "wal_sync_method",
            "full_page_writes",
        ] {
            let row = client
                .query_one("SELECT current_setting($1)", &[&name])
                .await
                .map_err(|e| format!("current_setting({name}): {e}"))?;
            out.push((name, row.get::<_, String>(0)));
        }
        Ok::<_, String>(out)
    })?;
    if let Some((_, fsync)) = settings.iter().find(|(n, _)| *n == "fsync")
        && fsync != "on"
    {
        return Err(format!(
            "fsync is {fsync}: its answers would not be durable"
        ));
    }
    let which = if std::env::var(ENV_URL).is_ok_and(|v| !v.trim().is_empty()) {
        "the server named by IDEMDB_TEST_PG"
    } else {
        "a throwaway cluster (idemdb_testkit::postgres) on this machine, 127.0.0.1 over TCP"
    };
    let settings: Vec<String> = settings.iter().map(|(n, v)| format!("{n}={v}")).collect();
    Ok(format!(
        "{which}; {}, synchronous_commit=on per connection",
        settings.join(", ")
    ))
}

/// One task's connection for the async cells: the table's own async calls, on the runtime
/// that runs the task (the connection's driver is spawned there too).
pub struct PgTask {
    conn: Conn,
}

impl Postgres {
    /// One task's session; await it on the runtime that will run the task.
    pub async fn task_session(&self) -> PgTask {
        PgTask {
            conn: Conn::connect(&self.url).await,
        }
    }
}

impl PgTask {
    /// The same statements as [`PgSession`]'s lifecycle.
    pub async fn lifecycle(&self, id: u64) {
        let key = key_bytes(id);
        match self.conn.reserve(&key).await {
            Reserved::Acquired(token) => self.conn.complete(&key, token).await,
            Reserved::Completed(_) => panic!("fresh key found completed"),
        }
    }
}
