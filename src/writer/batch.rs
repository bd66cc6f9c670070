//! One batch, from its ops to its answers: split into segments (a transaction each), applied
//! (apply.rs), committed or rolled back, made durable at one durability point, then shown to
//! readers and waiters.
//!
//! Within a batch, runs of ops without closures share a segment; each op that runs caller
//! code gets a segment of its own so its failure undoes only its writes. Records are written
//! into memory only, over the overlay (records/overlay.rs); a closure's segment also has a
//! redb transaction for the caller's tables, committed with `Durability::None` (visible, not
//! yet on disk). The batch's durability point is one frame of its effects in the log (wal/),
//! or, when a closure wrote a table the log cannot replay, one durable redb commit. Nobody is
//! answered, and no record of the batch is installed in the overlay, before it returns; the
//! applier thread writes the overlay into redb later (applier.rs, settle.rs).

use std::ops::Range;
use std::sync::Arc;

use crate::engine::Engine;
use crate::error::{CommitFailed, Error};
use crate::records::overlay::Written;
use crate::records::txn::Created;
use crate::reentry::Committing;
use crate::stats::Counter;
use crate::wal::Effect;
use idemdb_core::scope::RecordKey;

use super::apply::{Ctx, apply_segment};
use super::group_commit::{LeaderState, Writer};
use super::op::{OpOutput, WriteOp};
use super::queue::Job;

impl Writer {
    pub(super) fn commit_batch(&self, batch: Vec<Job>) -> Vec<Result<OpOutput, Error>> {
        let _committing = Committing::start();
        let engine = &*self.engine;
        let n = batch.len();
        let started = std::time::Instant::now();
        if engine.is_poisoned() {
            return (0..n).map(|_| Err(engine.poisoned_error())).collect();
        }
        let mut guard = self.leader.lock();
        // Again under the lock: a checkpoint or compaction step that failed while this batch
        // waited for it poisoned the engine, and no frame may follow a failed commit. (Plain
        // batches never touch redb, so redb's own refusal would not stop them.)
        if engine.is_poisoned() {
            return (0..n).map(|_| Err(engine.poisoned_error())).collect();
        }
        let leader = &mut *guard;
        leader.batch_seq += 1;
        let seq = leader.batch_seq;
        let now_ms = engine.clock.now_ms();
        engine.layout.note_write_time(now_ms);
        let keys: Vec<Option<RecordKey>> = batch.iter().map(|j| j.op.key().cloned()).collect();
        // Messages are staged under the leader lock only: this batch's take the numbers from
        // here on.
        let first_staged = engine.outbox.peek_next();
        let closures: Vec<bool> = batch.iter().map(|j| j.op.runs_closure()).collect();
        // I7: each op acquires at most one token, and every token issued is below a ceiling
        // already durable in the database file: raised first, by a checkpoint, if need be.
        let need = n as u64;
        if leader.next_token.saturating_add(need) > leader.token_ceiling
            && let Err(e) = self.checkpoint_raising(leader, need)
        {
            return self.fail_batch(e, n);
        }
        let mut ops = batch.into_iter().map(|j| j.op);
        let mut done = Committed::with_capacity(n);
        for range in segments(&closures) {
            let seg_ops: Vec<WriteOp> = ops.by_ref().take(range.len()).collect();
            let step = self.commit_segment(leader, seg_ops, &keys[range], seq, now_ms, &mut done);
            if let Err(e) = step {
                return self.fail_batch(e, n);
            }
        }
        // Everything of the batch before its frame's write is done: nobody may see it yet.
        #[cfg(feature = "test-hooks")]
        if keys
            .iter()
            .zip(&done.changed)
            .any(|(k, c)| *c && k.is_some())
        {
            done.run_test_hook = true;
        }
        if done.any
            && let Err(e) = self.durability_point(leader, &done)
        {
            return self.fail_batch(e, n);
        }
        // Only now, after the durability point (I13): readers, marks, waiters.
        if done.any {
            // Before anyone is answered or woken (I13): readers find the batch's records in the
            // overlay from now on. And before any checkpoint: one taken now records this
            // batch's frame as covered, so it must write these records too (I21).
            let index = &engine.layout.index;
            engine
                .snapshots
                .overlay
                .install_all(std::mem::take(&mut done.written), seq, |k| index.hash(k));
        }
        self.checkpoint_if_far_behind(leader);
        if done.redb_changed {
            // The snapshot's read transaction would otherwise pin the pages these commits
            // freed until the applier's next pass: redb's accounting of pages freed while
            // unpersisted then grows with every commit (execute_64 ran at a third of its rate).
            engine.snapshots.refresh();
        }
        let wants_checkpoint = leader.log.bytes_since_checkpoint() >= self.config.checkpoint_bytes;
        if done.any {
            // The replay cache after the overlay, so that a fill read before is refused.
            for (key, _) in keys.iter().zip(&done.changed).filter(|(_, c)| **c) {
                if let Some(key) = key {
                    engine
                        .replays
                        .invalidate(engine.layout.index.hash(key.as_bytes()));
                }
            }
            engine.stats.record_batch(n, started.elapsed());
        }
        engine.durability.durable(seq);
        // After the durability point: the dispatcher reads only what is durable (I24).
        let next_staged = engine.outbox.peek_next();
        if done.any && next_staged > first_staged {
            engine.outbox.committed(first_staged, next_staged - 1);
        }
        engine.waits.notify(
            keys.iter()
                .zip(&done.changed)
                .filter(|(_, c)| **c)
                .filter_map(|(k, _)| k.as_ref()),
        );
        drop(guard);
        if wants_checkpoint {
            self.request_checkpoint();
        }
        done.results
    }

    /// One segment's transaction: applied, then committed (its keys marked first,
    /// [`mark_then_commit`], I14) or rolled back, the in-memory state following it
    /// ([`Writer::follow_commit`], I19). Its answers and what it wrote are added to `done`.
    fn commit_segment(
        &self,
        leader: &mut LeaderState,
        ops: Vec<WriteOp>,
        keys: &[Option<RecordKey>],
        seq: u64,
        now_ms: u64,
        done: &mut Committed,
    ) -> Result<(), Error> {
        let engine = &*self.engine;
        let mut ctx = Ctx {
            now_ms,
            database_id: engine.database_id,
            next_token: &mut leader.next_token,
            limits: &engine.limits,
            tables: &engine.tables,
            outbox: &engine.outbox,
        };
        let segment = apply_segment(engine, ops, &mut ctx, &done.written)?;
        let rollback = segment
            .applied
            .iter()
            .find(|a| a.abort)
            .map(|a| match &a.output {
                Err(e) => e.clone(),
                Ok(_) => Error::Internal("rolled back without an error".into()),
            });
        // A transaction that changed nothing is not worth a commit.
        let commits = rollback.is_none() && segment.applied.iter().any(|a| a.changed);
        match segment.txn {
            Some(txn) if commits => {
                mark_then_commit(engine, txn, keys, seq)?;
                done.redb_changed = true;
            }
            Some(txn) => txn.abort().map_err(Error::from)?,
            None => {}
        }
        self.follow_commit(commits, segment.created);
        if commits {
            done.written.absorb(segment.written);
            done.effects.extend(segment.effects);
            done.logged &= segment.logged;
            done.any = true;
        }
        for a in segment.applied {
            if a.beyond_horizon && rollback.is_none() {
                engine.stats.add(Counter::BeyondHorizon);
            }
            if a.execute_takeover && rollback.is_none() {
                engine.stats.add(Counter::Takeovers);
            }
            done.changed.push(a.changed && rollback.is_none());
            done.results.push(match &rollback {
                // A write in this transaction failed: its neighbours were rolled back too.
                Some(e) if !a.abort => Err(e.clone()),
                _ => a.output,
            });
        }
        Ok(())
    }

    /// I19: in-memory state moves only with the commit that makes it durable. After a commit,
    /// the partitions it made behind a newer one are counted; after a rollback, the partitions
    /// it placed in the catalog are forgotten.
    fn follow_commit(&self, committed: bool, created: Created) {
        let engine = &*self.engine;
        if committed {
            engine
                .stats
                .add_n(Counter::ClockBehind, created.behind_newest);
        } else {
            for id in created.ids {
                engine.layout.partitions.remove(id);
            }
        }
    }

    /// I13: the batch's durability point, before which nobody is answered. One log append
    /// and `fdatasync` of its effects, or one durable commit that writes its records and
    /// covers every frame before it (a checkpoint): when a closure wrote a table the log
    /// cannot replay, the frame would be over 1 GiB, or the log had to grow for it (the
    /// commit records the new length).
    fn durability_point(&self, leader: &mut LeaderState, done: &Committed) -> Result<(), Error> {
        #[cfg(feature = "test-hooks")]
        if done.run_test_hook
            && let Some(hook) = self.engine.durability.after_commit.lock().take()
        {
            hook();
        }
        let appended = if done.logged && crate::wal::fits(&done.effects) {
            leader.log.append(&done.effects)?
        } else {
            false
        };
        if appended {
            Ok(())
        } else {
            self.durable_commit_with(leader, Some(&done.written))
        }
    }

    /// The committer thread has fallen behind (starved of CPU) when the log holds twice the
    /// checkpoint's bytes: the leader takes the checkpoint itself, so the log stays near its
    /// size. The batch is durable in the log either way; a failed checkpoint poisons the
    /// engine for later writes.
    fn checkpoint_if_far_behind(&self, leader: &mut LeaderState) {
        let behind = leader.log.bytes_since_checkpoint();
        if behind >= self.config.checkpoint_bytes.saturating_mul(2)
            && self.durable_commit(leader).is_err()
        {
            self.engine.poison();
        }
    }

    /// I16: a transaction failed to begin, apply or commit: nobody in the batch can know
    /// whether what the batch did is durable. The engine is poisoned: `commit_batch` begins no
    /// transaction from now on (the panic arm of `lead` and the compactor poison it too).
    fn fail_batch(&self, e: Error, n: usize) -> Vec<Result<OpOutput, Error>> {
        self.engine.poison();
        let source: Arc<dyn std::error::Error + Send + Sync> = match e {
            Error::Storage(s) => Arc::new(CommitFailed(s)),
            Error::OutcomeUnknown(s) => s,
            // The log's I/O error (naming the log), or an engine error: kept whole.
            other => Arc::new(CommitFailed(Arc::new(other))),
        };
        (0..n)
            .map(|_| Err(Error::OutcomeUnknown(Arc::clone(&source))))
            .collect()
    }
}

/// I15: splits a batch into transactions: runs of plain ops share one; each closure op has its
/// own, so that its writes and its record change commit together or not at all, and its
/// failure rolls back only its own transaction.
/// `runs_closure[i]` says whether op `i` of the batch runs caller code.
fn segments(runs_closure: &[bool]) -> Vec<Range<usize>> {
    let mut out: Vec<Range<usize>> = Vec::new();
    let mut start = 0;
    for (i, &closure) in runs_closure.iter().enumerate() {
        if closure {
            if start < i {
                out.push(start..i);
            }
            out.push(i..i + 1);
            start = i + 1;
        }
    }
    if start < runs_closure.len() {
        out.push(start..runs_closure.len());
    }
    out
}

/// What a batch's committed transactions produced so far.
struct Committed {
    results: Vec<Result<OpOutput, Error>>,
    /// Per op: it changed its record (its waiters look again).
    changed: Vec<bool>,
    /// What the committed transactions wrote, for the log.
    effects: Vec<Effect>,
    /// Their record writes, newest per (table, key): into the overlay once durable.
    written: Written,
    /// Every write is in `effects`.
    logged: bool,
    /// Some transaction committed: the batch needs a durability point.
    any: bool,
    /// A closure's redb transaction committed.
    redb_changed: bool,
    /// `testing::after_next_commit`'s hook runs at this batch's durability point.
    #[cfg(feature = "test-hooks")]
    run_test_hook: bool,
}

impl Committed {
    fn with_capacity(n: usize) -> Self {
        Committed {
            results: Vec::with_capacity(n),
            changed: Vec::with_capacity(n),
            effects: Vec::new(),
            written: Written::default(),
            logged: true,
            any: false,
            redb_changed: false,
            #[cfg(feature = "test-hooks")]
            run_test_hook: false,
        }
    }
}

/// I14: a transaction's keys are marked not yet durable before its non-durable commit makes
/// them visible; the batch's durability point unmarks them. A `run` has no key: the mark of
/// the batch still holds back `begin_read`.
fn mark_then_commit(
    engine: &Engine,
    txn: redb::WriteTransaction,
    keys: &[Option<RecordKey>],
    seq: u64,
) -> Result<(), Error> {
    engine.durability.mark(keys.iter().flatten(), seq);
    txn.commit().map_err(Error::from)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::segments;

    #[test]
    fn the_design_example_splits_into_four_transactions() {
        // [R, R, X, F, C] with X and C closure ops (design.md §5.3).
        let closures = [false, false, true, false, true];
        assert_eq!(segments(&closures), [0..2, 2..3, 3..4, 4..5]);
    }

    #[test]
    fn plain_ops_share_one_transaction_and_closures_get_their_own() {
        assert!(segments(&[]).is_empty());
        assert_eq!(segments(&[false; 5]), vec![(0..5)]);
        assert_eq!(segments(&[true; 3]), [0..1, 1..2, 2..3]);
        assert_eq!(segments(&[true, false, false]), [0..1, 1..3]);
        assert_eq!(segments(&[false, true]), [0..1, 1..2]);
    }

    #[test]
    fn every_op_is_in_exactly_one_segment_in_order() {
        let mut state = 0x9e37_79b9_u64;
        for len in 0..40 {
            let closures: Vec<bool> = (0..len)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    state.is_multiple_of(3)
                })
                .collect();
            let segs = segments(&closures);
            let flat: Vec<usize> = segs.iter().flat_map(|r| r.clone()).collect();
            assert_eq!(flat, (0..len).collect::<Vec<_>>());
            for r in &segs {
                assert!(!r.is_empty());
                // A closure op is alone; a longer run holds plain ops only.
                if r.len() > 1 {
                    assert!(r.clone().all(|i| !closures[i]));
                }
            }
        }
    }
}
