//! Work that must run between the writer's batches with a durable commit of its own: the
//! compactor's steps.

use redb::WriteTransaction;

use super::group_commit::Writer;
use std::sync::Arc;

use crate::error::{CommitFailed, Error};

/// What an exclusive step changes, for what it must invalidate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Touches {
    /// Records are removed (a drop, a sweep): no record the replay cache holds is trusted.
    Records,
    /// Only rows beside the records (summaries, retired recognition rows), or records moved
    /// unchanged from one table to another (widening): every cached record is still the
    /// stored one.
    RowsBeside,
}

impl Writer {
    /// Runs `f` in a durable write transaction of its own, between the writer's batches (the
    /// compactor's drops); once it committed, `publish` applies its in-memory side, still
    /// between batches, and the snapshot is refreshed. A failed commit poisons the writer, as
    /// a batch's would, and publishes nothing.
    pub(crate) fn exclusive<T>(
        &self,
        touches: Touches,
        f: impl FnOnce(&WriteTransaction) -> Result<T, Error>,
        publish: impl FnOnce(&T),
    ) -> Result<T, Error> {
        let engine = &*self.engine;
        let mut leader = self.leader.lock();
        if engine.is_poisoned() {
            return Err(engine.poisoned_error());
        }
        let fail = |e: Error| {
            engine.poison();
            match e {
                Error::Storage(s) => Error::OutcomeUnknown(Arc::new(CommitFailed(s))),
                other => other,
            }
        };
        // Before redb's write lock (lock order: leader, apply, redb's writer).
        let _applying = self.apply_lock.lock();
        let txn = self.begin_durable().map_err(fail)?;
        // `f` sees every record, the overlay's too, and a table it drops stays dropped.
        let taken = match self.write_overlay(&txn, None) {
            Ok(taken) => taken,
            Err(e) => {
                let _ = txn.abort();
                return Err(fail(e));
            }
        };
        let out = match f(&txn) {
            Ok(out) => out,
            Err(e) => {
                // Nothing committed; but a storage error is treated as a failed commit.
                let _ = txn.abort();
                return Err(match e {
                    e @ (Error::Storage(_) | Error::OutcomeUnknown(_)) => fail(e),
                    other => other,
                });
            }
        };
        // A durable commit covers every frame: it is a checkpoint.
        self.commit_written_as_checkpoint(txn, &mut leader, (true, 0), &taken)
            .map_err(fail)?;
        publish(&out);
        engine.snapshots.refresh();
        if touches == Touches::Records {
            // Records were removed outside a batch: no cached one is trusted.
            engine.replays.clear();
        }
        Ok(out)
    }
}
