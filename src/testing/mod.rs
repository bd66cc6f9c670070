//! Test support (feature `fault-injection`): a fault-injecting, power-loss-simulating redb
//! [`StorageBackend`](redb::StorageBackend), and a crash workload with a model of what was
//! acknowledged, shared by the crash tests and the fuzz targets.

mod backend;
#[cfg(feature = "postgres")]
pub mod postgres;
mod workload;

pub use backend::{Fate, Fault, FaultBackend, SECTOR, TearMode};
pub use workload::{
    CrashCheck, KeyLog, Script, check_recovered, open_workload, run_script, run_workload,
};

/// Operations queued for the writer and not yet taken into a batch: lets a test line up a
/// batch without sleeping.
pub fn queued_ops(db: &crate::IdemDb) -> usize {
    db.writer.queued()
}
