//! Retention: how long a record counts as a duplicate, where finished records live (time
//! partitions), how a key is found among them, which dropped keys are still recognised, and
//! the compactor that drops what expired. The settings and their formulas (expiry, horizons)
//! are idemdb-core's `Retention` and `Rules`, shared with PostgreSQL; the windows are here.
//!
//! - partition.rs: partition names, a record's window, and the catalog;
//! - key_index.rs: which partitions may hold a key;
//! - horizon.rs: recognised keys of removed records, and their rows on disk;
//! - locate.rs: the layout loaded at open, and the lookup of a key;
//! - records.rs: the record store of a write transaction (find, store, remove);
//! - compactor.rs: dropping partitions, sweeping abandoned reservations.

pub(crate) mod compactor;
pub(crate) mod horizon;
pub(crate) mod key_index;
pub(crate) mod locate;
pub(crate) mod partition;
pub(crate) mod records;

pub use idemdb_core::retention::{BeyondHorizonPolicy, Retention, Rules};
