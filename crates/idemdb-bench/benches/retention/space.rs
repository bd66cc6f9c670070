//! Space on disk: file sizes, and the pages redb actually uses.

use std::path::Path;

use idemdb::redb;

pub fn file_size(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

/// Bytes of the pages redb has allocated (in use by some tree) in an open database, from a
/// write transaction that is then aborted.
pub fn redb_allocated(db: &redb::Database) -> u64 {
    let txn = db.begin_write().expect("begin_write");
    let stats = txn.stats().expect("stats");
    txn.abort().expect("abort");
    stats.allocated_pages() * stats.page_size() as u64
}

/// [`redb_allocated`] of a closed idemdb file, opened with plain redb (nothing is written).
pub fn idemdb_allocated(path: &Path) -> u64 {
    let db = redb::Builder::new()
        .set_check_integrity_on_open(false)
        .open(path)
        .expect("open with redb");
    redb_allocated(&db)
}
