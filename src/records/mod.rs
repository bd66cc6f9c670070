//! The record store: where records live and how a key is found, below the writer. The
//! in-flight table holds IN_PROGRESS records; finished ones live in time partitions, which
//! the compactor (compactor.rs, above the writer) drops whole. Retention's settings and
//! formulas (expiry, horizons) are idemdb-core's `Retention` and `Rules`, shared with
//! PostgreSQL; the windows are here.
//!
//! From the bottom up:
//! - head.rs: what a row kept beside a partition says of its table, and whether it holds;
//! - filter.rs: a wide partition's keys as a filter, found without the key index;
//! - partition.rs: partition names, a record's window, and the catalog;
//! - retired.rs: tables that left the catalog, their pages not freed yet;
//! - memory.rs: what a hash map of so many entries costs;
//! - key_index.rs: which partitions may hold a key;
//! - recognised.rs: recognised keys on disk, by hash;
//! - horizon.rs: recognised keys of removed records: their rows, and those held in memory;
//! - summary.rs: what a closed partition holds, kept beside it for the open and the drop;
//! - locate.rs: the layout loaded at open, and the lookup of a key;
//! - overlay.rs: record writes durable in the log and not yet in redb;
//! - snapshot.rs: the shared read snapshot, read under the overlay;
//! - replay_cache.rs: finished records kept in memory for replays;
//! - txn.rs: the record store of one write transaction (find, store, remove).

pub(crate) mod filter;
pub(crate) mod head;
pub(crate) mod horizon;
pub(crate) mod key_index;
pub(crate) mod locate;
pub(crate) mod memory;
pub(crate) mod overlay;
pub(crate) mod partition;
pub(crate) mod recognised;
pub(crate) mod replay_cache;
pub(crate) mod retired;
pub(crate) mod snapshot;
pub(crate) mod summary;
pub(crate) mod txn;
