//! Test support (feature `fault-injection`): a fault-injecting, power-loss-simulating redb
//! [`StorageBackend`](redb::StorageBackend), and a crash workload with a model of what was
//! acknowledged, shared by the crash tests and the fuzz targets.

mod backend;
#[cfg(feature = "postgres")]
pub mod postgres;
mod workload;

pub use backend::{Fate, Fault, FaultBackend, SECTOR, TearMode};
pub use workload::{
    CrashCheck, KeyLog, Script, check_recovered, check_recovered_or_refused,
    check_tokens_after_loss, open_workload, run_script, run_workload,
};

/// Operations queued for the writer and not yet taken into a batch: lets a test line up a
/// batch without sleeping.
pub fn queued_ops(db: &crate::IdemDb) -> usize {
    db.writer.queued()
}

/// Makes every refresh of the shared read snapshot fail from now on (and drops the current
/// one): readers then open a read transaction of their own, which shows commits that are not
/// durable yet, so only the durability tracker stands between them and such state.
pub fn fail_snapshot_refresh(db: &crate::IdemDb) {
    let snapshots = &db.engine.snapshots;
    snapshots
        .fail_refresh
        .store(true, std::sync::atomic::Ordering::SeqCst);
    snapshots.refresh();
}
