//! Naive redb, what a user would write on redb alone: one `Durability::Immediate` write
//! transaction per operation.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use idemdb::redb::{self, ReadableDatabase, ReadableTable, TableDefinition};
use xxhash_rust::xxh3::xxh3_128;

use crate::interface::{Engine, ORDERS, STATE_COMPLETED, STATE_IN_PROGRESS, Session, scoped_key};
use crate::shared::keys::{PAYLOAD, RESPONSE, key_bytes};

/// The naive redb baseline's records table.
const IDEM: TableDefinition<&[u8], &[u8]> = TableDefinition::new("idem");

pub struct Naive {
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
    pub fn open(path: &Path) -> Naive {
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
