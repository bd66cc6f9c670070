//! SQLite: WAL, synchronous=FULL, an index on expires_at, chunked DELETE.

use std::ops::Range;
use std::path::Path;
use std::time::Instant;

use rusqlite::{Connection, params};

use crate::baseline::BaselineDrop;
use crate::fill::{aligned_start, stored_key, window_ids};
use crate::settings::{DROP_TTL, HOUR_MS, Sizes};
use crate::shared::keys::{OPERATION, PAYLOAD, RESPONSE};
use crate::shared::{nanos, sqlite_wal_full};
use crate::space::file_size;

fn connect(path: &Path) -> Connection {
    let conn = sqlite_wal_full(path, None);
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS idem(key BLOB PRIMARY KEY, fp BLOB NOT NULL, \
           state INTEGER NOT NULL, token INTEGER NOT NULL, created_at INTEGER NOT NULL, \
           expires_at INTEGER NOT NULL, response BLOB);
         CREATE INDEX IF NOT EXISTS idem_expires ON idem(expires_at);",
    )
    .expect("schema");
    conn
}

/// Fills `ids` over `windows` windows, 100,000 rows per transaction (not measured).
fn fill(conn: &mut Connection, first_window_ms: u64, windows: u64, ids: Range<u64>) {
    let ttl = DROP_TTL.as_millis() as i64;
    let fp = xxhash_rust::xxh3::xxh3_128(PAYLOAD).to_le_bytes();
    let mut rows = Vec::new();
    for w in 0..windows {
        let updated = (first_window_ms + w * HOUR_MS + 1_000) as i64;
        for id in window_ids(&ids, windows, w) {
            rows.push((id, updated));
        }
    }
    for batch in rows.chunks(100_000) {
        let tx = conn.transaction().expect("begin");
        {
            let mut stmt = tx
                .prepare(
                    "INSERT INTO idem(key, fp, state, token, created_at, expires_at, response) \
                     VALUES (?1, ?2, 1, ?3, ?4, ?5, ?6)",
                )
                .expect("prepare");
            for &(id, updated) in batch {
                stmt.execute(params![
                    stored_key(OPERATION, id),
                    &fp[..],
                    id as i64 + 1,
                    updated,
                    updated + ttl,
                    RESPONSE
                ])
                .expect("insert");
            }
        }
        tx.commit().expect("commit");
    }
}

/// The main database file's size once the WAL is checkpointed into it and truncated.
fn size(conn: &Connection, path: &Path) -> u64 {
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .expect("checkpoint");
    file_size(path)
}

/// Bytes of the pages SQLite uses (all pages minus the free list).
fn in_use(conn: &Connection) -> u64 {
    let get = |pragma: &str| -> i64 {
        conn.query_row(&format!("PRAGMA {pragma}"), [], |r| r.get(0))
            .expect("pragma")
    };
    ((get("page_count") - get("freelist_count")) * get("page_size")) as u64
}

/// The drop cell's baseline: fill, chunked `DELETE` of everything, refill.
pub fn drop_baseline(dir: &Path, sizes: &Sizes) -> BaselineDrop {
    let n = sizes.drop_records;
    let parts = sizes.drop_partitions;
    let path = dir.join("baseline.sqlite");
    let mut conn = connect(&path);
    let s0 = size(&conn, &path);
    let start = aligned_start();
    let t = Instant::now();
    fill(&mut conn, start, parts, 0..n);
    let fill_s = t.elapsed().as_secs_f64();
    let s1 = size(&conn, &path);
    let u1 = in_use(&conn);
    // A fresh connection (default cache) for the sweep, as a service's sweeper would have.
    drop(conn);
    let conn = connect(&path);
    let now = (start + (parts + 1) * HOUR_MS + DROP_TTL.as_millis() as u64) as i64;
    let sql = format!(
        "DELETE FROM idem WHERE rowid IN \
         (SELECT rowid FROM idem WHERE expires_at <= ?1 LIMIT {})",
        sizes.chunk
    );
    let mut chunks = Vec::new();
    let mut deleted = 0u64;
    let t = Instant::now();
    loop {
        let c = Instant::now();
        let changed = conn
            .prepare_cached(&sql)
            .and_then(|mut s| s.execute(params![now]))
            .expect("delete");
        if changed == 0 {
            break;
        }
        chunks.push(nanos(c.elapsed()));
        deleted += changed as u64;
    }
    let total_ms = t.elapsed().as_secs_f64() * 1e3;
    assert_eq!(deleted, n, "every row expired");
    let left: i64 = conn
        .query_row("SELECT count(*) FROM idem", [], |r| r.get(0))
        .expect("count");
    assert_eq!(left, 0);
    let s2 = size(&conn, &path);
    let u2 = in_use(&conn);
    drop(conn);
    let mut conn = connect(&path);
    fill(&mut conn, start + (parts + 1 + 48) * HOUR_MS, parts, 0..n);
    let s3 = size(&conn, &path);
    let u3 = in_use(&conn);
    let (sizes, in_use) = ([s0, s1, s2, s3], [u1, u2, u3]);
    BaselineDrop::new("SQLite", fill_s, None, chunks, total_ms, sizes, in_use)
}
