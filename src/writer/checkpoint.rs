//! Checkpoints: a durable redb commit that records the newest log frame, after which the log
//! is written again from its start (wal/).
//!
//! Taken between batches, under the leader lock, so that every frame appended is covered:
//! by the committer thread once the log passes `checkpoint_bytes` or its frames are
//! `checkpoint_interval` old, at close, and by every batch that runs caller code (its durable
//! commit records the checkpoint too). The compactor's commits record it as well.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Instant;

use redb::WriteTransaction;

use super::Writer;
use crate::error::Error;
use crate::meta::{CHECKPOINT_KEY, META};
use crate::stats::Counter;
use crate::wal::Log;

impl Writer {
    /// Takes a checkpoint if frames follow the last one. A failed commit poisons the writer,
    /// as a batch's would: what it covered is durable in the log either way.
    pub(crate) fn checkpoint(&self) -> Result<(), Error> {
        let engine = &*self.engine;
        let mut leader = self.leader.lock();
        if leader.log.bytes_since_checkpoint() == 0 || engine.is_poisoned() {
            return Ok(());
        }
        let started = Instant::now();
        let done = catch_unwind(AssertUnwindSafe(|| self.durable_commit(&mut leader.log)))
            .unwrap_or_else(|_| Err(Error::Poisoned("a checkpoint panicked".into())));
        drop(leader);
        if let Err(e) = done {
            engine.poison();
            return Err(e);
        }
        engine.stats.record_checkpoint(started.elapsed());
        Ok(())
    }

    /// One durable redb commit: it covers every `Durability::None` commit before it and
    /// records the newest frame, after which the log starts over. The caller holds the leader
    /// lock (`log` is in its state) and poisons the engine on an error.
    pub(super) fn durable_commit(&self, log: &mut Log) -> Result<(), Error> {
        self.commit_as_checkpoint(self.begin_durable()?, log)
    }

    /// A write transaction that commits durably (quick-repair as configured).
    pub(super) fn begin_durable(&self) -> Result<WriteTransaction, Error> {
        let mut txn = self.engine.db.begin_write()?;
        txn.set_quick_repair(self.config.quick_repair);
        Ok(txn)
    }

    /// Commits `txn` durably with the newest frame recorded in it: a checkpoint.
    pub(super) fn commit_as_checkpoint(
        &self,
        txn: WriteTransaction,
        log: &mut Log,
    ) -> Result<(), Error> {
        txn.open_table(META)?
            .insert(CHECKPOINT_KEY, &log.last_seq().to_le_bytes()[..])?;
        txn.commit()?;
        log.checkpointed();
        self.engine.stats.add(Counter::Checkpoints);
        Ok(())
    }

    /// Asks the committer thread for a checkpoint (the log passed `checkpoint_bytes`).
    pub(super) fn request_checkpoint(&self) {
        let mut queue = self.queue.lock();
        if !std::mem::replace(&mut queue.checkpoint_requested, true) {
            self.committer.notify_one();
        }
    }
}
