//! Test support (feature `fault-injection`): a fault-injecting, power-loss-simulating redb
//! [`StorageBackend`](redb::StorageBackend), and a crash workload with a model of what was
//! acknowledged, shared by the crash tests and the fuzz targets.

mod backend;
mod decoders;
#[cfg(feature = "postgres")]
pub mod postgres;
mod steps;
mod workload;

pub use backend::{Fate, Fault, FaultBackend, SECTOR, TearMode};
pub use decoders::{DECODERS, decode_any, decode_seeds};
pub use steps::{Step, run_steps};
pub use workload::{
    Checkpoints, CrashCheck, KeyLog, Script, check_recovered, check_recovered_or_refused,
    check_tokens_after_loss, open_workload, open_workload_as, run_script, run_workload,
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

/// Runs `hook` once, on the writer's leader thread, right after the next commit of a
/// transaction with a record key returned: that commit is visible to a read transaction of
/// its own and not yet durable (its batch's durability point has not run), and it waits for
/// `hook` to return.
pub fn after_next_commit(db: &crate::IdemDb, hook: impl FnOnce() + Send + 'static) {
    *db.engine.durability.after_commit.lock() = Some(Box::new(hook));
}

/// What a log's bytes say, read from them alone (docs/design.md §5.6): for tests that alter a
/// log and must know whether the change is one an open can detect.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogLayout {
    /// The checkpoint its cycle sector holds (`None`: no valid cycle sector).
    pub cycle: Option<u64>,
    /// The run at the start of its frames: (offset, length in bytes, sequence number).
    pub run: Vec<(u64, u64, u64)>,
}

impl LogLayout {
    /// Reads `log`, a whole log file.
    pub fn read(log: &[u8]) -> LogLayout {
        let (cycle, run) = crate::wal::layout(log);
        LogLayout { cycle, run }
    }

    /// The newest frame of the run.
    pub fn last(&self) -> Option<u64> {
        self.run.last().map(|(_, _, seq)| *seq)
    }
}

/// What a database file's durable image records of its log: the checkpoint (the last frame it
/// holds), and whether it was in use (not closed cleanly). Read with redb alone.
pub fn recorded_log(database: &[u8]) -> Result<(u64, bool), String> {
    use redb::ReadableDatabase;
    let raw = redb::Builder::new()
        .create_with_backend(FaultBackend::from_image(database.to_vec()))
        .map_err(|e| e.to_string())?;
    let read = raw.begin_read().map_err(|e| e.to_string())?;
    let meta = read
        .open_table(crate::engine_tables::META)
        .map_err(|e| e.to_string())?;
    let recorded = crate::wal::read_log_record(&meta).map_err(|e| e.to_string())?;
    Ok((
        recorded.checkpoint,
        recorded.state.is_some_and(|s| s.in_use),
    ))
}
