//! Naive redb: one table, rows carry their expiry; the sweep scans and removes in chunks.

use std::ops::Range;
use std::path::Path;
use std::time::{Duration, Instant};

use idemdb::redb::{self, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};

use crate::baseline::BaselineDrop;
use crate::fill::{aligned_start, stored_key, window_ids};
use crate::settings::{DROP_TTL, HOUR_MS, LOAD_OPERATION, LOAD_TTL, Sizes};
use crate::shared::keys::{OPERATION, PAYLOAD, RESPONSE};
use crate::shared::nanos;
use crate::space::{file_size, redb_allocated};

const NAIVE: TableDefinition<&[u8], &[u8]> = TableDefinition::new("idem");
/// Offset of `expires_at` in a naive value.
const NAIVE_EXPIRES_AT: usize = 53;

/// A value of the same size as idemdb's record (62-byte header + response): state,
/// fingerprint, token, lease, created, updated, attempts, expires_at, a spare byte, response.
fn naive_value(state: u8, token: u64, updated: u64, expires: u64, response: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(62 + response.len());
    v.push(state);
    v.extend_from_slice(&xxhash_rust::xxh3::xxh3_128(PAYLOAD).to_le_bytes());
    v.extend_from_slice(&token.to_le_bytes());
    v.extend_from_slice(&updated.to_le_bytes()); // lease end
    v.extend_from_slice(&updated.to_le_bytes()); // created
    v.extend_from_slice(&updated.to_le_bytes()); // updated
    v.extend_from_slice(&1u32.to_le_bytes()); // attempts
    debug_assert_eq!(v.len(), NAIVE_EXPIRES_AT);
    v.extend_from_slice(&expires.to_le_bytes());
    v.push(0);
    v.extend_from_slice(response);
    v
}

fn naive_expires(v: &[u8]) -> u64 {
    u64::from_le_bytes(
        v[NAIVE_EXPIRES_AT..NAIVE_EXPIRES_AT + 8]
            .try_into()
            .expect("8 bytes"),
    )
}

fn open(path: &Path) -> redb::Database {
    let db = redb::Database::create(path).expect("open redb");
    let txn = db.begin_write().expect("begin");
    txn.open_table(NAIVE).expect("table");
    txn.commit().expect("commit");
    db
}

/// Fills `ids` with finished records over `windows` windows, 100,000 rows per durable
/// transaction (not measured).
fn fill(db: &redb::Database, first_window_ms: u64, windows: u64, ids: Range<u64>) {
    let ttl = DROP_TTL.as_millis() as u64;
    let mut rows = Vec::new();
    for w in 0..windows {
        let updated = first_window_ms + w * HOUR_MS + 1_000;
        for id in window_ids(&ids, windows, w) {
            rows.push((id, updated));
        }
    }
    for batch in rows.chunks(100_000) {
        let txn = db.begin_write().expect("begin");
        {
            let mut t = txn.open_table(NAIVE).expect("table");
            for &(id, updated) in batch {
                let v = naive_value(1, id + 1, updated, updated + ttl, RESPONSE);
                t.insert(stored_key(OPERATION, id).as_slice(), v.as_slice())
                    .expect("insert");
            }
        }
        txn.commit().expect("commit");
    }
}

/// Every key whose row expired at `now`, read in one read transaction (key order).
pub fn scan(db: &redb::Database, now: u64) -> Vec<Vec<u8>> {
    let txn = db.begin_read().expect("begin_read");
    let table = txn.open_table(NAIVE).expect("table");
    let mut keys = Vec::new();
    for row in table.iter().expect("iter") {
        let (k, v) = row.expect("row");
        if naive_expires(v.value()) <= now {
            keys.push(k.value().to_vec());
        }
    }
    keys
}

/// Removes `keys` in one durable write transaction.
pub fn remove(db: &redb::Database, keys: &[Vec<u8>]) {
    let txn = db.begin_write().expect("begin_write");
    {
        let mut t = txn.open_table(NAIVE).expect("table");
        for k in keys {
            t.remove(k.as_slice())
                .expect("remove")
                .expect("row existed");
        }
    }
    txn.commit().expect("commit");
}

/// Naive reserve (one durable transaction: check, insert IN_PROGRESS) and complete (another:
/// check the token, insert COMPLETED). Returns the reserve's start and latency.
pub fn lifecycle(db: &redb::Database, id: u64, now: u64) -> (Instant, Duration) {
    let key = stored_key(LOAD_OPERATION, id);
    let expires = now + LOAD_TTL.as_millis() as u64;
    let start = Instant::now();
    let txn = db.begin_write().expect("begin_write");
    {
        let mut t = txn.open_table(NAIVE).expect("table");
        assert!(t.get(key.as_slice()).expect("get").is_none(), "fresh key");
        t.insert(
            key.as_slice(),
            naive_value(0, id, now, expires, &[]).as_slice(),
        )
        .expect("insert");
    }
    txn.commit().expect("commit");
    let reserve = start.elapsed();
    let txn = db.begin_write().expect("begin_write");
    {
        let mut t = txn.open_table(NAIVE).expect("table");
        let v = t
            .get(key.as_slice())
            .expect("get")
            .expect("reserved")
            .value()[0];
        assert_eq!(v, 0, "in progress");
        t.insert(
            key.as_slice(),
            naive_value(1, id, now, expires, RESPONSE).as_slice(),
        )
        .expect("insert");
    }
    txn.commit().expect("commit");
    (start, reserve)
}

/// The drop cell's baseline: fill, scan and chunked removal of everything, refill. The file
/// stays in `dir` as `naive.redb` for the stall cell.
pub fn drop_baseline(dir: &Path, sizes: &Sizes) -> BaselineDrop {
    let n = sizes.drop_records;
    let parts = sizes.drop_partitions;
    let path = dir.join("naive.redb");
    let db = open(&path);
    let s0 = file_size(&path);
    let start = aligned_start();
    let t = Instant::now();
    fill(&db, start, parts, 0..n);
    let fill_s = t.elapsed().as_secs_f64();
    let s1 = file_size(&path);
    let u1 = redb_allocated(&db);
    let now = start + (parts + 1) * HOUR_MS + DROP_TTL.as_millis() as u64;

    let t = Instant::now();
    let keys = scan(&db, now);
    let scan_ms = t.elapsed().as_secs_f64() * 1e3;
    assert_eq!(keys.len() as u64, n, "every row expired");
    let mut chunks = Vec::new();
    for chunk in keys.chunks(sizes.chunk) {
        let t = Instant::now();
        remove(&db, chunk);
        chunks.push(nanos(t.elapsed()));
    }
    let total_ms = t.elapsed().as_secs_f64() * 1e3;
    {
        let txn = db.begin_read().expect("read");
        assert_eq!(txn.open_table(NAIVE).expect("table").len().expect("len"), 0);
    }
    let s2 = file_size(&path);
    let u2 = redb_allocated(&db);
    fill(&db, start + (parts + 1 + 48) * HOUR_MS, parts, 0..n);
    let s3 = file_size(&path);
    let u3 = redb_allocated(&db);
    let (sizes, in_use) = ([s0, s1, s2, s3], [u1, u2, u3]);
    BaselineDrop::new(
        "naive redb",
        fill_s,
        Some(scan_ms),
        chunks,
        total_ms,
        sizes,
        in_use,
    )
}
