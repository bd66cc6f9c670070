//! SQLite: rusqlite (bundled SQLite), WAL, `synchronous=FULL`, one connection per thread
//! (busy_timeout 10 s), or one connection shared by every thread behind a mutex.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::{Connection, ErrorCode, TransactionBehavior, params};
use xxhash_rust::xxh3::xxh3_128;

use crate::interface::{Engine, STATE_COMPLETED, Session, scoped_key};
use crate::shared::keys::{PAYLOAD, RESPONSE, key_bytes};
use crate::shared::sqlite_wal_full;

pub struct Sqlite {
    path: std::path::PathBuf,
    tokens: Arc<AtomicU64>,
}

pub struct SqliteSession {
    conn: Connection,
    tokens: Arc<AtomicU64>,
    fp: [u8; 16],
}

const SQL_RESERVE: &str = "INSERT INTO idem(key, fp, state, token, response) \
     VALUES (?1, ?2, 0, ?3, NULL) ON CONFLICT(key) DO NOTHING";
const SQL_LOOKUP: &str = "SELECT fp, state, token, response FROM idem WHERE key = ?1";
const SQL_COMPLETE: &str =
    "UPDATE idem SET state = 1, response = ?3 WHERE key = ?1 AND token = ?2 AND state = 0";
const SQL_ORDER: &str = "INSERT INTO orders(key, cents) VALUES (?1, ?2)";

/// Times a SQLite call had to be retried because it still got SQLITE_BUSY after busy_timeout.
pub static SQLITE_BUSY_RETRIES: AtomicU64 = AtomicU64::new(0);

fn connect(path: &Path) -> Connection {
    sqlite_wal_full(path, Some(Duration::from_secs(10)))
}

/// Runs `f`, again while SQLite reports busy (counted; with a 10 s busy_timeout it should not
/// happen).
fn retry_busy<T>(mut f: impl FnMut() -> rusqlite::Result<T>) -> T {
    loop {
        match f() {
            Ok(v) => return v,
            Err(rusqlite::Error::SqliteFailure(e, _)) if e.code == ErrorCode::DatabaseBusy => {
                SQLITE_BUSY_RETRIES.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => panic!("sqlite: {e}"),
        }
    }
}

impl Sqlite {
    pub fn open(path: &Path) -> Sqlite {
        let conn = connect(path);
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS idem(key BLOB PRIMARY KEY, fp BLOB NOT NULL, \
               state INTEGER NOT NULL, token INTEGER NOT NULL, response BLOB);
             CREATE TABLE IF NOT EXISTS orders(key BLOB PRIMARY KEY, cents INTEGER NOT NULL);",
        )
        .expect("schema");
        Sqlite {
            path: path.to_path_buf(),
            tokens: Arc::new(AtomicU64::new(1)),
        }
    }
}

impl Sqlite {
    pub fn connection(&self) -> SqliteSession {
        SqliteSession {
            conn: connect(&self.path),
            tokens: Arc::clone(&self.tokens),
            fp: xxh3_128(PAYLOAD).to_le_bytes(),
        }
    }
}

impl Engine for Sqlite {
    fn session(&self) -> Box<dyn Session> {
        Box::new(self.connection())
    }

    fn preload(&self, n: u64) {
        let mut conn = connect(&self.path);
        let fp = xxh3_128(PAYLOAD).to_le_bytes();
        let tx = conn.transaction().expect("begin");
        {
            let mut stmt = tx
                .prepare(
                    "INSERT INTO idem(key, fp, state, token, response) VALUES (?1, ?2, 1, ?3, ?4)",
                )
                .expect("prepare");
            for id in 0..n {
                let token = self.tokens.fetch_add(1, Ordering::Relaxed);
                stmt.execute(params![scoped_key(id), &fp[..], token as i64, RESPONSE])
                    .expect("insert");
            }
        }
        tx.commit().expect("commit");
    }
}

impl SqliteSession {
    /// `INSERT .. ON CONFLICT DO NOTHING`; if no row was inserted, `SELECT` it. Returns the
    /// token.
    fn acquire(&self, key: &[u8]) -> u64 {
        let token = self.tokens.fetch_add(1, Ordering::Relaxed);
        let inserted = retry_busy(|| {
            self.conn
                .prepare_cached(SQL_RESERVE)?
                .execute(params![key, &self.fp[..], token as i64])
        });
        if inserted == 0 {
            let state: i64 = retry_busy(|| {
                self.conn
                    .prepare_cached(SQL_LOOKUP)?
                    .query_row(params![key], |r| r.get(1))
            });
            panic!("fresh key exists in state {state}");
        }
        token
    }

    /// The guarded `UPDATE`.
    fn complete(&self, key: &[u8], token: u64) {
        let updated = retry_busy(|| {
            self.conn
                .prepare_cached(SQL_COMPLETE)?
                .execute(params![key, token as i64, RESPONSE])
        });
        assert_eq!(updated, 1, "complete refused");
    }
}

impl Session for SqliteSession {
    fn reserve(&mut self, id: u64) {
        self.acquire(&scoped_key(id));
    }

    fn lifecycle(&mut self, id: u64) {
        let key = scoped_key(id);
        let token = self.acquire(&key);
        self.complete(&key, token);
    }

    fn execute(&mut self, id: u64) {
        let key = scoped_key(id);
        let token = self.tokens.fetch_add(1, Ordering::Relaxed);
        let fp = self.fp;
        let conn = &mut self.conn;
        retry_busy(|| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let inserted =
                tx.prepare_cached(SQL_RESERVE)?
                    .execute(params![key, &fp[..], token as i64])?;
            assert_eq!(inserted, 1, "fresh key exists");
            tx.prepare_cached(SQL_ORDER)?
                .execute(params![&key_bytes(id)[..], 1999])?;
            let updated =
                tx.prepare_cached(SQL_COMPLETE)?
                    .execute(params![key, token as i64, RESPONSE])?;
            assert_eq!(updated, 1, "complete refused");
            tx.commit()
        });
    }

    fn replay(&mut self, id: u64) -> usize {
        let key = scoped_key(id);
        let (fp, state, response): (Vec<u8>, i64, Vec<u8>) = retry_busy(|| {
            self.conn
                .prepare_cached(SQL_LOOKUP)?
                .query_row(params![key], |r| Ok((r.get(0)?, r.get(1)?, r.get(3)?)))
        });
        assert!(fp == self.fp && state == i64::from(STATE_COMPLETED));
        response.len()
    }
}

/// One SQLite connection shared by every thread, locked per operation (per statement for
/// reserve and complete, per transaction for execute).
pub struct SqliteShared {
    pub sqlite: Sqlite,
    pub conn: Arc<Mutex<SqliteSession>>,
}

struct SqliteSharedSession {
    conn: Arc<Mutex<SqliteSession>>,
}

impl Engine for SqliteShared {
    fn session(&self) -> Box<dyn Session> {
        Box::new(SqliteSharedSession {
            conn: Arc::clone(&self.conn),
        })
    }

    fn preload(&self, n: u64) {
        self.sqlite.preload(n);
    }
}

impl SqliteSharedSession {
    fn conn(&self) -> std::sync::MutexGuard<'_, SqliteSession> {
        self.conn.lock().expect("shared connection")
    }
}

impl Session for SqliteSharedSession {
    fn reserve(&mut self, id: u64) {
        self.conn().reserve(id);
    }

    fn lifecycle(&mut self, id: u64) {
        let key = scoped_key(id);
        let token = self.conn().acquire(&key);
        self.conn().complete(&key, token);
    }

    fn execute(&mut self, id: u64) {
        self.conn().execute(id);
    }

    fn replay(&mut self, id: u64) -> usize {
        self.conn().replay(id)
    }
}
