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

use super::group_commit::{LeaderState, Writer};
use crate::engine_tables::{CHECKPOINT_KEY, META, NEXT_TOKEN_KEY};
use crate::error::Error;
use crate::records::overlay::{Taken, Written};
use crate::stats::Counter;

/// Most rounds of a checkpoint's first phase.
const PHASE_ONE_ROUNDS: usize = 3;
/// A first-phase round this short leaves little for the second phase, which the batches
/// wait for: no further round.
const PHASE_ONE_ENOUGH: std::time::Duration = std::time::Duration::from_millis(5);

impl Writer {
    /// Takes a checkpoint if frames follow the last one, in two phases so that the batches
    /// wait only for a small one (I21). A failed commit poisons the writer, as a batch's
    /// would: what it covered is durable in the log either way.
    pub(crate) fn checkpoint(&self) -> Result<(), Error> {
        let engine = &*self.engine;
        let started = Instant::now();
        let done = catch_unwind(AssertUnwindSafe(|| self.checkpoint_in_two_phases()))
            .unwrap_or_else(|_| Err(Error::Poisoned("a checkpoint panicked".into())));
        match done {
            Ok(true) => engine.stats.record_checkpoint(started.elapsed()),
            Ok(false) => {}
            Err(e) => {
                engine.poison();
                return Err(e);
            }
        }
        Ok(())
    }

    /// Phase 1, beside the batches: a durable commit of the overlay that records the newest
    /// frame when it began, `seq`, as the checkpoint, while batches go on appending frames
    /// above it (the log is not written again from its start, so they stay; recovery replays
    /// the run above `seq`, wal/scan.rs). It holds the apply lock and redb's write lock, so no
    /// other durable commit runs meanwhile. Repeated while it took long (up to
    /// [`PHASE_ONE_ROUNDS`] times): each round has only what came during the one before to
    /// write. Phase 2, under the leader lock: an ordinary checkpoint, which has only what came
    /// during the last round left to write, after which the log starts over. Says whether
    /// one was taken.
    fn checkpoint_in_two_phases(&self) -> Result<bool, Error> {
        let engine = &*self.engine;
        for _ in 0..PHASE_ONE_ROUNDS {
            let started = Instant::now();
            let leader = self.leader.lock();
            if leader.log.bytes_since_checkpoint() == 0 || engine.is_poisoned() {
                return Ok(false);
            }
            // Lock order: leader, apply, redb's writer.
            let _applying = self.apply_lock.lock();
            let txn = self.begin_durable()?;
            // Every batch up to `seq` is durable and its records are in the overlay or redb.
            let seq = leader.log.last_seq();
            let state = leader.log.state(true);
            drop(leader);
            let taken = self.write_overlay(&txn, None)?;
            {
                let mut meta = txn.open_table(META)?;
                meta.insert(CHECKPOINT_KEY, &seq.to_le_bytes()[..])?;
                state.write(&mut meta)?;
            }
            txn.commit()?;
            engine.snapshots.refresh();
            self.forget_written(&taken);
            if started.elapsed() < PHASE_ONE_ENOUGH {
                break;
            }
        }
        let mut leader = self.leader.lock();
        if engine.is_poisoned() {
            return Ok(true);
        }
        self.durable_commit(&mut leader)?;
        Ok(true)
    }

    /// At close, after the last batch: a checkpoint that also records the log as no longer in
    /// use, so that the next open needs nothing from it. Not after a failure: then the log
    /// may hold what redb lacks, and stays in use.
    pub(crate) fn close_log(&self) -> Result<(), Error> {
        let mut leader = self.leader.lock();
        if self.engine.is_poisoned() {
            return Ok(());
        }
        self.commit_as_checkpoint(&mut leader, false, None, 0)
    }

    /// I21: one durable redb commit: it writes the overlay's entries, covers every
    /// `Durability::None` commit before it and records the newest frame in `log_checkpoint`,
    /// after which the log starts over. The caller holds the leader lock and poisons the engine
    /// on an error.
    pub(super) fn durable_commit(&self, leader: &mut LeaderState) -> Result<(), Error> {
        self.durable_commit_with(leader, None)
    }

    /// A durable commit that also writes `batch`, the records of a batch not in the log.
    pub(super) fn durable_commit_with(
        &self,
        leader: &mut LeaderState,
        batch: Option<&Written>,
    ) -> Result<(), Error> {
        self.commit_as_checkpoint(leader, true, batch, 0)
    }

    /// A checkpoint that leaves room for `need` more tokens below the ceiling (I7).
    pub(super) fn checkpoint_raising(
        &self,
        leader: &mut LeaderState,
        need: u64,
    ) -> Result<(), Error> {
        self.commit_as_checkpoint(leader, true, None, need)
    }

    /// A write transaction that commits durably (quick-repair as configured).
    pub(super) fn begin_durable(&self) -> Result<WriteTransaction, Error> {
        let mut txn = self.engine.db.begin_write()?;
        txn.set_quick_repair(self.config.quick_repair);
        Ok(txn)
    }

    /// Commits `txn` durably as a checkpoint: with the overlay's entries and `batch`'s records,
    /// the newest frame, the log's record (`in_use` until a clean close) and, when fewer than
    /// half a block of tokens (or `need`) remain below it, a token ceiling a block (at least
    /// `need`) above the counter, so that batches seldom need a checkpoint of their own to
    /// raise it (design.md §7).
    fn commit_as_checkpoint(
        &self,
        leader: &mut LeaderState,
        in_use: bool,
        batch: Option<&Written>,
        need: u64,
    ) -> Result<(), Error> {
        // Before redb's write lock (lock order: leader, apply, redb's writer).
        let _applying = self.apply_lock.lock();
        let txn = self.begin_durable()?;
        let taken = self.write_overlay(&txn, batch)?;
        self.commit_written_as_checkpoint(txn, leader, (in_use, need), &taken)
    }

    /// [`commit_as_checkpoint`](Self::commit_as_checkpoint) once the overlay's entries in
    /// `taken` are written into `txn`; the caller holds the apply lock.
    pub(super) fn commit_written_as_checkpoint(
        &self,
        txn: WriteTransaction,
        leader: &mut LeaderState,
        (in_use, need): (bool, u64),
        taken: &[Taken],
    ) -> Result<(), Error> {
        let block = self.config.token_block;
        let headroom = (block / 2).max(need);
        let raise = leader.next_token.saturating_add(headroom) > leader.token_ceiling;
        let ceiling = leader.next_token.saturating_add(block.max(need));
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
        // The overlay's entries leave it only once a snapshot that holds them is installed.
        self.engine.snapshots.refresh();
        self.forget_written(taken);
        leader.log.checkpointed()?;
        self.engine.stats.add(Counter::Checkpoints);
        Ok(())
    }

    /// Asks the applier thread for a checkpoint (the log passed `checkpoint_bytes`). Had it
    /// not started, none is taken by size: a leader takes one once the log holds twice as
    /// much (`checkpoint_if_far_behind`).
    pub(super) fn request_checkpoint(&self) {
        let mut applier = self.applier.lock();
        if !std::mem::replace(&mut applier.checkpoint_requested, true) {
            self.apply_wake.notify_one();
        }
    }
}
