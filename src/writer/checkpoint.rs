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

use super::{LeaderState, Writer};
use crate::engine_tables::{CHECKPOINT_KEY, META, NEXT_TOKEN_KEY};
use crate::error::Error;
use crate::stats::Counter;

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
        let done = catch_unwind(AssertUnwindSafe(|| self.durable_commit(&mut leader)))
            .unwrap_or_else(|_| Err(Error::Poisoned("a checkpoint panicked".into())));
        drop(leader);
        if let Err(e) = done {
            engine.poison();
            return Err(e);
        }
        engine.stats.record_checkpoint(started.elapsed());
        Ok(())
    }

    /// At close, after the last batch: a checkpoint that also records the log as no longer in
    /// use, so that the next open needs nothing from it. Not after a failure: then the log
    /// may hold what redb lacks, and stays in use.
    pub(crate) fn close_log(&self) -> Result<(), Error> {
        let mut leader = self.leader.lock();
        if self.engine.is_poisoned() {
            return Ok(());
        }
        let txn = self.begin_durable()?;
        self.commit_as_checkpoint(txn, &mut leader, false)
    }

    /// I21: one durable redb commit: it covers every `Durability::None` commit before it and
    /// records the newest frame in `log_checkpoint`, after which the log starts over. The caller holds the leader
    /// lock and poisons the engine on an error.
    pub(super) fn durable_commit(&self, leader: &mut LeaderState) -> Result<(), Error> {
        self.commit_as_checkpoint(self.begin_durable()?, leader, true)
    }

    /// A write transaction that commits durably (quick-repair as configured).
    pub(super) fn begin_durable(&self) -> Result<WriteTransaction, Error> {
        let mut txn = self.engine.db.begin_write()?;
        txn.set_quick_repair(self.config.quick_repair);
        Ok(txn)
    }

    /// Commits `txn` durably as a checkpoint: with the newest frame, the log's record (`in_use`
    /// until a clean close) and, when fewer than half a block of tokens remain below it, a
    /// token ceiling one block above the counter, so that batches seldom need a durable
    /// commit of their own to raise it (design.md §7).
    pub(super) fn commit_as_checkpoint(
        &self,
        txn: WriteTransaction,
        leader: &mut LeaderState,
        in_use: bool,
    ) -> Result<(), Error> {
        let block = self.config.token_block;
        let raise = leader.next_token.saturating_add(block / 2) > leader.token_ceiling;
        let ceiling = leader.next_token.saturating_add(block);
        {
            let mut meta = txn.open_table(META)?;
            meta.insert(CHECKPOINT_KEY, &leader.log.last_seq().to_le_bytes()[..])?;
            leader.log.state(in_use).write(&mut meta)?;
            if raise {
                meta.insert(NEXT_TOKEN_KEY, &ceiling.to_le_bytes()[..])?;
            }
        }
        txn.commit()?;
        // In-memory state follows the commit (I19).
        if raise {
            leader.token_ceiling = ceiling;
        }
        leader.log.checkpointed()?;
        self.engine.stats.add(Counter::Checkpoints);
        Ok(())
    }

    /// Asks the committer thread for a checkpoint (the log passed `checkpoint_bytes`). Had
    /// it not started and cannot start, none is taken by size: a leader takes one once the
    /// log holds twice as much (`checkpoint_if_far_behind`).
    pub(super) fn request_checkpoint(&self) {
        let mut queue = self.queue.lock();
        if self.ensure_committer(&mut queue).is_err() {
            return;
        }
        if !std::mem::replace(&mut queue.checkpoint_requested, true) {
            self.committer.notify_one();
        }
    }
}
