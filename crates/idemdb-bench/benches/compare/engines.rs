//! The engines under test, behind one small interface (the fsync floor is in
//! `shared/floor.rs`, and as an engine of one sync per write per caller in `floors.rs`).
//!
//! - `idemdb`: the crate, through its public sync API (and its async API in the async cells:
//!   [`IdemTask`]).
//! - `redb_naive`: what a user would write on redb alone: one `Durability::Immediate` write
//!   transaction per operation.
//! - `sqlite`: rusqlite (bundled SQLite), WAL, `synchronous=FULL`, one connection per thread.
//! - `redis`: a `redis-server` the bench starts, `appendfsync always` (`redis.rs`).
//! - `postgres`: the hand-written table on a PostgreSQL server (`postgres.rs`).
//!
//! Every engine stores the same logical record: the scope-qualified key, a 128-bit payload
//! fingerprint, a state, a fencing token and the response bytes. The two servers are in the
//! run only where their binaries are found and start ([`Lineup::probe`]).

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idemdb::redb::{self, ReadableDatabase, ReadableTable, TableDefinition};
use idemdb::{ExecuteOutcome, IdemDb, Key, Outcome, ReserveOutcome, Scope};
use rusqlite::{Connection, ErrorCode, TransactionBehavior, params};
use xxhash_rust::xxh3::xxh3_128;

use crate::floors::Floors;
use crate::postgres::Postgres;
use crate::redis::Redis;
use crate::shared::keys::{OPERATION, PAYLOAD, PRINCIPAL, RESPONSE, key_bytes};
use crate::shared::sqlite_wal_full;

/// Every reservation's lease (Redis's is the same 30 s, in ms).
pub const LEASE: Duration = Duration::from_secs(30);

/// The caller's own business table, written by `execute`.
const ORDERS: TableDefinition<&[u8], u64> = TableDefinition::new("orders");
/// The naive redb baseline's records table.
const IDEM: TableDefinition<&[u8], &[u8]> = TableDefinition::new("idem");

const STATE_IN_PROGRESS: u8 = 0;
const STATE_COMPLETED: u8 = 1;

/// The baselines' stored key: scope and key, as idemdb qualifies its own (similar length).
pub fn scoped_key(n: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(OPERATION.len() + PRINCIPAL.len() + 34);
    k.extend_from_slice(OPERATION.as_bytes());
    k.push(0);
    k.extend_from_slice(PRINCIPAL.as_bytes());
    k.push(0);
    k.extend_from_slice(&key_bytes(n));
    k
}

/// One caller's handle on an engine (a SQLite connection, or a shared handle).
pub trait Session: Send {
    /// Reserves a fresh key; it must be acquired.
    fn reserve(&mut self, id: u64);
    /// Reserves a fresh key and completes it: two durable writes.
    fn lifecycle(&mut self, id: u64);
    /// One-shot: reserve, one business insert and completion, in one durable transaction.
    fn execute(&mut self, id: u64);
    /// Reserves a completed key: returns the stored response's length.
    fn replay(&mut self, id: u64) -> usize;
}

/// An engine on one fresh file.
pub trait Engine: Send + Sync {
    /// A handle for one caller thread.
    fn session(&self) -> Box<dyn Session>;
    /// Stores `n` completed records, ids `0..n`, durably. Not measured; only needs speed.
    fn preload(&self, n: u64);
    /// The server processes doing this engine's work, whose CPU counts with the bench's (none
    /// for an embedded engine). Asked once its callers are connected.
    fn server_pids(&self) -> Vec<u32> {
        Vec::new()
    }
    /// The durable commits made so far, where the engine counts them (idemdb's log appends,
    /// `stats().commits`): a cell's writes ÷ its commits is the batch size.
    fn commits(&self) -> Option<u64> {
        None
    }
}

/// Which engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Idem,
    Naive,
    Sqlite,
    SqliteShared,
    Redis,
    Postgres,
    /// The fsync floor, one file and one sync per write per caller (`floors.rs`).
    Floor,
}

impl Kind {
    /// The embedded engines every cell compares.
    pub const MAIN: [Kind; 3] = [Kind::Idem, Kind::Naive, Kind::Sqlite];
    /// Every engine, in the summary's column order.
    pub const ALL: [Kind; 7] = [
        Kind::Idem,
        Kind::Naive,
        Kind::Sqlite,
        Kind::SqliteShared,
        Kind::Redis,
        Kind::Postgres,
        Kind::Floor,
    ];

    /// The embedded engines compared in a cell with `threads` concurrent callers: the shared
    /// SQLite connection only differs from a connection per thread when there are several.
    pub fn for_threads(threads: usize) -> &'static [Kind] {
        if threads > 1 {
            &Kind::ALL[..4]
        } else {
            &Kind::MAIN
        }
    }

    /// The benchmark id, also the directory name under target/criterion/<cell>/.
    pub fn id(self) -> &'static str {
        match self {
            Kind::Idem => "idemdb",
            Kind::Naive => "redb_naive",
            Kind::Sqlite => "sqlite",
            Kind::SqliteShared => "sqlite_shared",
            Kind::Redis => "redis",
            Kind::Postgres => "postgres",
            Kind::Floor => "fsync_floor",
        }
    }

    /// Opens the engine on a fresh file in `dir` (Redis: a server with its data in `dir`;
    /// PostgreSQL: a fresh schema). Call on the main thread (see `redis.rs`).
    pub fn open(self, dir: &Path) -> Arc<dyn Engine> {
        match self {
            Kind::Idem => Arc::new(Idem {
                db: open_idemdb(dir),
            }),
            Kind::Naive => Arc::new(Naive::open(&dir.join("bench.redb"))),
            Kind::Sqlite => Arc::new(Sqlite::open(&dir.join("bench.sqlite"))),
            Kind::SqliteShared => {
                let sqlite = Sqlite::open(&dir.join("bench.sqlite"));
                Arc::new(SqliteShared {
                    conn: Arc::new(Mutex::new(sqlite.connection())),
                    sqlite,
                })
            }
            Kind::Redis => Arc::new(Redis::open(dir)),
            Kind::Postgres => Arc::new(Postgres::open()),
            Kind::Floor => Arc::new(Floors::new(dir)),
        }
    }
}

/// The servers this run has: each is started once when the run begins, and one that is
/// missing or fails to start is left out of every cell, with the reason printed.
#[derive(Clone, Copy)]
pub struct Lineup {
    redis: bool,
    postgres: bool,
}

impl Lineup {
    /// Probes both servers (Redis with its data in a directory under `root`); returns the
    /// lineup and, per server, the summary's note on it.
    pub fn probe(root: &Path) -> (Lineup, Vec<(String, String)>) {
        let dir = tempfile::tempdir_in(root).expect("tempdir");
        let probes = [
            ("Redis", crate::redis::probe(dir.path())),
            ("PostgreSQL", crate::postgres::probe()),
        ];
        let mut notes = Vec::new();
        for (name, probe) in &probes {
            let note = match probe {
                Ok(note) => note.clone(),
                Err(why) => {
                    println!("{name} is left out of this run: {why}");
                    format!("left out of this run: {why}")
                }
            };
            notes.push((name.to_string(), note));
        }
        let lineup = Lineup {
            redis: probes[0].1.is_ok(),
            postgres: probes[1].1.is_ok(),
        };
        (lineup, notes)
    }

    /// `embedded` and the servers this run has.
    pub fn with_servers(self, embedded: &[Kind]) -> Vec<Kind> {
        let mut kinds = embedded.to_vec();
        kinds.extend(
            [(Kind::Redis, self.redis), (Kind::Postgres, self.postgres)]
                .into_iter()
                .filter_map(|(kind, here)| here.then_some(kind)),
        );
        kinds
    }
}

// ---------------------------------------------------------------------------------------------
// idemdb

/// The store on a fresh file in `dir`, as every idemdb cell opens it (sync and async API).
pub fn open_idemdb(dir: &Path) -> Arc<IdemDb> {
    // `orders` registered: execute's business insert is logged with its record.
    Arc::new(
        IdemDb::builder()
            .table(ORDERS)
            .open(dir.join("bench.idemdb"))
            .expect("open idemdb"),
    )
}

struct Idem {
    db: Arc<IdemDb>,
}

struct IdemSession {
    db: Arc<IdemDb>,
    scope: Scope,
}

impl Engine for Idem {
    fn session(&self) -> Box<dyn Session> {
        Box::new(IdemSession {
            db: Arc::clone(&self.db),
            scope: Scope::new(OPERATION, PRINCIPAL),
        })
    }

    fn commits(&self) -> Option<u64> {
        Some(self.db.stats().commits)
    }

    fn preload(&self, n: u64) {
        // Many concurrent callers, so that group commit writes the preload in large batches.
        let threads = 128.min(n.max(1));
        std::thread::scope(|s| {
            for t in 0..threads {
                s.spawn(move || {
                    let mut session = self.session();
                    let mut id = t;
                    while id < n {
                        session.lifecycle(id);
                        id += threads;
                    }
                });
            }
        });
    }
}

impl IdemSession {
    fn acquire(&self, id: u64) -> idemdb::Reservation {
        match self
            .db
            .reserve(&self.scope, &Key::new(key_bytes(id)), PAYLOAD, LEASE)
            .expect("idemdb reserve")
        {
            ReserveOutcome::Acquired(reservation) => reservation,
            other => panic!("fresh key not acquired: {other:?}"),
        }
    }
}

impl Session for IdemSession {
    fn reserve(&mut self, id: u64) {
        self.acquire(id);
    }

    fn lifecycle(&mut self, id: u64) {
        let reservation = self.acquire(id);
        self.db
            .complete(&reservation, RESPONSE)
            .expect("idemdb complete");
    }

    fn execute(&mut self, id: u64) {
        let key = key_bytes(id);
        let done = self
            .db
            .execute(&self.scope, &Key::new(key), PAYLOAD, move |tx| {
                tx.open_table(ORDERS)?.insert(&key[..], 1999)?;
                Ok::<_, idemdb::Error>(Outcome::Completed(RESPONSE.to_vec()))
            })
            .expect("idemdb execute");
        assert!(matches!(done, ExecuteOutcome::Executed(_)), "{done:?}");
    }

    fn replay(&mut self, id: u64) -> usize {
        match self
            .db
            .reserve(&self.scope, &Key::new(key_bytes(id)), PAYLOAD, LEASE)
            .expect("idemdb replay")
        {
            ReserveOutcome::Completed(response) => response.len(),
            other => panic!("preloaded key not completed: {other:?}"),
        }
    }
}

/// One task's handle for the async cells: the async API, awaited on any executor (the
/// futures are woken by idemdb's committer thread).
pub struct IdemTask {
    db: Arc<IdemDb>,
    scope: Scope,
}

impl IdemTask {
    pub fn new(db: &Arc<IdemDb>) -> IdemTask {
        IdemTask {
            db: Arc::clone(db),
            scope: Scope::new(OPERATION, PRINCIPAL),
        }
    }

    /// `reserve_async` of a fresh key, which must be acquired, then `complete_async`.
    pub async fn lifecycle(&self, id: u64) {
        let key = Key::new(key_bytes(id));
        let reserved = self
            .db
            .reserve_async(&self.scope, &key, PAYLOAD, LEASE)
            .await
            .expect("idemdb reserve_async");
        let reservation = match reserved {
            ReserveOutcome::Acquired(reservation) => reservation,
            other => panic!("fresh key not acquired: {other:?}"),
        };
        self.db
            .complete_async(&reservation, RESPONSE)
            .await
            .expect("idemdb complete_async");
    }
}

// ---------------------------------------------------------------------------------------------
// Naive redb: one durable write transaction per operation.

struct Naive {
    db: Arc<redb::Database>,
    /// Fencing tokens; kept in memory (a real one would persist them: this favours the baseline).
    tokens: Arc<AtomicU64>,
}

struct NaiveSession {
    db: Arc<redb::Database>,
    tokens: Arc<AtomicU64>,
    fp: u128,
}

/// `state | token (8, LE) | fingerprint (16, LE) | response`.
fn encode(state: u8, token: u64, fp: u128, response: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(25 + response.len());
    v.push(state);
    v.extend_from_slice(&token.to_le_bytes());
    v.extend_from_slice(&fp.to_le_bytes());
    v.extend_from_slice(response);
    v
}

struct Decoded<'a> {
    state: u8,
    token: u64,
    fp: u128,
    response: &'a [u8],
}

fn decode(v: &[u8]) -> Decoded<'_> {
    Decoded {
        state: v[0],
        token: u64::from_le_bytes(v[1..9].try_into().expect("8 bytes")),
        fp: u128::from_le_bytes(v[9..25].try_into().expect("16 bytes")),
        response: &v[25..],
    }
}

impl Naive {
    fn open(path: &Path) -> Naive {
        let db = redb::Database::create(path).expect("open redb");
        let txn = db.begin_write().expect("begin");
        txn.open_table(IDEM).expect("create table");
        txn.open_table(ORDERS).expect("create table");
        txn.commit().expect("commit");
        Naive {
            db: Arc::new(db),
            tokens: Arc::new(AtomicU64::new(1)),
        }
    }
}

impl Engine for Naive {
    fn session(&self) -> Box<dyn Session> {
        Box::new(NaiveSession {
            db: Arc::clone(&self.db),
            tokens: Arc::clone(&self.tokens),
            fp: xxh3_128(PAYLOAD),
        })
    }

    fn preload(&self, n: u64) {
        let fp = xxh3_128(PAYLOAD);
        let txn = self.db.begin_write().expect("begin");
        {
            let mut table = txn.open_table(IDEM).expect("table");
            for id in 0..n {
                let token = self.tokens.fetch_add(1, Ordering::Relaxed);
                let value = encode(STATE_COMPLETED, token, fp, RESPONSE);
                table
                    .insert(scoped_key(id).as_slice(), value.as_slice())
                    .expect("insert");
            }
        }
        txn.commit().expect("commit");
    }
}

impl NaiveSession {
    /// begin_write, get; absent: insert IN_PROGRESS and commit. Returns the token.
    fn acquire(&self, key: &[u8]) -> u64 {
        let fp = xxh3_128(PAYLOAD);
        let txn = self.db.begin_write().expect("begin_write");
        let token = {
            let mut table = txn.open_table(IDEM).expect("open_table");
            if let Some(v) = table.get(key).expect("get") {
                let rec = decode(v.value());
                panic!(
                    "fresh key exists: state {} fp match {}",
                    rec.state,
                    rec.fp == fp
                );
            }
            let token = self.tokens.fetch_add(1, Ordering::Relaxed);
            table
                .insert(key, encode(STATE_IN_PROGRESS, token, fp, &[]).as_slice())
                .expect("insert");
            token
        };
        txn.commit().expect("commit");
        token
    }
}

impl Session for NaiveSession {
    fn reserve(&mut self, id: u64) {
        self.acquire(&scoped_key(id));
    }

    fn lifecycle(&mut self, id: u64) {
        let key = scoped_key(id);
        let token = self.acquire(&key);
        // complete: begin_write, get, check owner and state, insert COMPLETED, commit.
        let txn = self.db.begin_write().expect("begin_write");
        {
            let mut table = txn.open_table(IDEM).expect("open_table");
            let value = {
                let v = table.get(key.as_slice()).expect("get").expect("reserved");
                let rec = decode(v.value());
                assert!(rec.state == STATE_IN_PROGRESS && rec.token == token);
                encode(STATE_COMPLETED, token, rec.fp, RESPONSE)
            };
            table
                .insert(key.as_slice(), value.as_slice())
                .expect("insert");
        }
        txn.commit().expect("commit");
    }

    fn execute(&mut self, id: u64) {
        let key = scoped_key(id);
        let fp = xxh3_128(PAYLOAD);
        let txn = self.db.begin_write().expect("begin_write");
        {
            let mut table = txn.open_table(IDEM).expect("open_table");
            assert!(table.get(key.as_slice()).expect("get").is_none());
            txn.open_table(ORDERS)
                .expect("orders")
                .insert(&key_bytes(id)[..], 1999)
                .expect("insert order");
            let token = self.tokens.fetch_add(1, Ordering::Relaxed);
            table
                .insert(
                    key.as_slice(),
                    encode(STATE_COMPLETED, token, fp, RESPONSE).as_slice(),
                )
                .expect("insert");
        }
        txn.commit().expect("commit");
    }

    fn replay(&mut self, id: u64) -> usize {
        let txn = self.db.begin_read().expect("begin_read");
        let table = txn.open_table(IDEM).expect("open_table");
        let v = table
            .get(scoped_key(id).as_slice())
            .expect("get")
            .expect("preloaded");
        let rec = decode(v.value());
        assert!(rec.fp == self.fp && rec.state == STATE_COMPLETED);
        rec.response.to_vec().len()
    }
}

// ---------------------------------------------------------------------------------------------
// SQLite: WAL, synchronous=FULL, one connection per thread, busy_timeout 10 s.

struct Sqlite {
    path: std::path::PathBuf,
    tokens: Arc<AtomicU64>,
}

struct SqliteSession {
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
    fn open(path: &Path) -> Sqlite {
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
    fn connection(&self) -> SqliteSession {
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
struct SqliteShared {
    sqlite: Sqlite,
    conn: Arc<Mutex<SqliteSession>>,
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
