//! The one place every write goes through: a leader-based group commit.
//!
//! A caller queues its op. If no commit is running it becomes the leader: it takes what is
//! queued (its own op first, up to `max_batch`), applies it on its own thread, makes it
//! durable with one log append and `fdatasync`, answers the followers and hands leadership to
//! the committer thread if anything queued meanwhile (before that thread is started: to the
//! first op that queued). A lone caller pays one append and no thread hand-off; under load,
//! the committer thread leads batch after batch, each whatever arrived while the previous one
//! was made durable.
//!
//! Within a batch, runs of ops without closures share a segment; each op that runs caller
//! code gets a segment of its own so its failure undoes only its writes. Records are written
//! into memory only, over the overlay (overlay.rs); a closure's segment also has a redb
//! transaction for the caller's tables, committed with `Durability::None` (visible, not yet on
//! disk). The batch's durability point is one frame of its effects in the log (wal/), or, when
//! a closure wrote a table the log cannot replay, one durable redb commit. Nobody is answered,
//! and no record of the batch is installed in the overlay, before it returns; the applier
//! thread writes the overlay into redb later (applier.rs, settle.rs).

mod applier;
mod apply;
mod checkpoint;
mod committer;
mod exclusive;
pub(crate) mod op;
mod queue;
mod settle;

use std::ops::Range;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Weak};
use std::task::Waker;

use parking_lot::{Condvar, Mutex};

use crate::config::WriterConfig;
use crate::engine::Engine;
use crate::error::{CommitFailed, Error};
use crate::observe::write_span;
use crate::overlay::Written;
use crate::reentry::Committing;
use crate::retention::records::Created;
use crate::scope::RecordKey;
use crate::stats::Counter;
use crate::wal::{Effect, Log};

use apply::{Ctx, apply_segment};
use op::{OpOutput, WriteOp};
use queue::{Job, Queue, Slot, SlotState};

/// The queue, the leader state and the commits: everything that writes goes through here.
pub(crate) struct Writer {
    pub(crate) engine: Arc<Engine>,
    config: WriterConfig,
    queue: Mutex<Queue>,
    /// Wakes the committer thread (with `queue`'s lock) to lead for async callers.
    committer: Condvar,
    /// Wakes sync callers waiting for room in a full queue (with `queue`'s lock).
    room: Condvar,
    /// Held by the leader for the whole batch.
    leader: Mutex<LeaderState>,
    /// Held by whoever writes the overlay into redb (settle.rs), from taking its entries until
    /// it forgot them: one pass at a time, so no pass writes an older value after a newer
    /// one. Taken after `leader`, never before it.
    apply_lock: Mutex<()>,
    /// The applier thread (applier.rs) and its wake-up.
    applier: Mutex<ApplierThread>,
    apply_wake: Condvar,
    /// Itself, for the committer thread it starts.
    this: Weak<Writer>,
    /// Mirrors `Queue::committer_requested` so the committer thread can spin on it without
    /// the queue's lock.
    committer_wanted: AtomicBool,
}

/// The applier thread's handle and its stop flag (applier.rs).
#[derive(Default)]
struct ApplierThread {
    stop: bool,
    /// A checkpoint by size is wanted.
    checkpoint_requested: bool,
    thread: Option<std::thread::JoinHandle<()>>,
}

pub(super) struct LeaderState {
    next_token: u64,
    /// The committed ceiling: every token in a committed record is below it.
    token_ceiling: u64,
    batch_seq: u64,
    log: Log,
}

impl Writer {
    /// The writer, with its committer thread running (unless `config.lazy_committer`).
    pub(crate) fn start(
        engine: Arc<Engine>,
        config: WriterConfig,
        next_token: u64,
        token_ceiling: u64,
        log: Log,
    ) -> Result<Arc<Self>, Error> {
        let lazy = config.lazy_committer;
        let writer = Arc::new_cyclic(|this| Writer {
            engine,
            config,
            queue: Mutex::new(Queue::default()),
            committer: Condvar::new(),
            room: Condvar::new(),
            leader: Mutex::new(LeaderState {
                next_token,
                token_ceiling,
                batch_seq: 0,
                log,
            }),
            apply_lock: Mutex::new(()),
            applier: Mutex::new(ApplierThread::default()),
            apply_wake: Condvar::new(),
            this: this.clone(),
            committer_wanted: AtomicBool::new(false),
        });
        if !lazy {
            writer.ensure_committer(&mut writer.queue.lock())?;
        }
        if writer.config.applier {
            writer.start_applier();
        }
        Ok(writer)
    }

    /// Queues `op`, waits until its batch is durable, and returns its answer. The caller
    /// may lead the commit on its own thread.
    pub(crate) fn submit(&self, op: WriteOp) -> Result<OpOutput, Error> {
        crate::reentry::refuse_reentry()?;
        let span = write_span(op.kind(), op.key());
        let _span = span.enter();
        let slot = Slot::new(false);
        let lead = {
            let mut queue = self.queue.lock();
            while queue.jobs.len() >= self.config.max_queue && !self.refusing(&queue) {
                self.room.wait(&mut queue);
            }
            self.check_open(&queue)?;
            queue.jobs.push_back(Job {
                op,
                slot: Arc::clone(&slot),
            });
            !std::mem::replace(&mut queue.leader_active, true)
        };
        self.wait_for(&slot, lead)
    }

    /// Queues `ops` together, in order, so that they share commits, and waits for all of
    /// their answers (in the same order). Waits for room for the first op only: the caller
    /// bounds how many it queues at once (`consume_batch`'s poll).
    pub(crate) fn submit_many(&self, ops: Vec<WriteOp>) -> Vec<Result<OpOutput, Error>> {
        if let Err(e) = crate::reentry::refuse_reentry() {
            return ops.iter().map(|_| Err(e.clone())).collect();
        }
        if ops.is_empty() {
            // Nothing to queue, so nobody to lead: taking leadership here would leave
            // `leader_active` set over an empty queue and every later write waiting for a
            // leader that never comes.
            return Vec::new();
        }
        let slots: Vec<Arc<Slot>> = ops.iter().map(|_| Slot::new(false)).collect();
        let lead = {
            let mut queue = self.queue.lock();
            while queue.jobs.len() >= self.config.max_queue && !self.refusing(&queue) {
                self.room.wait(&mut queue);
            }
            if let Err(e) = self.check_open(&queue) {
                return ops.iter().map(|_| Err(e.clone())).collect();
            }
            for (op, slot) in ops.into_iter().zip(&slots) {
                queue.jobs.push_back(Job {
                    op,
                    slot: Arc::clone(slot),
                });
            }
            !std::mem::replace(&mut queue.leader_active, true)
        };
        // Answered in queue order: leadership is only ever handed to the first op still
        // waiting, which is the one waited for here.
        slots
            .iter()
            .enumerate()
            .map(|(i, slot)| self.wait_for(slot, lead && i == 0))
            .collect()
    }

    /// Waits for `slot`'s answer, leading a batch first if `lead`, or when leadership is
    /// handed to it.
    fn wait_for(&self, slot: &Slot, mut lead: bool) -> Result<OpOutput, Error> {
        loop {
            if lead {
                self.lead();
            }
            let mut inner = slot.inner.lock();
            loop {
                match std::mem::replace(&mut inner.state, SlotState::Taken) {
                    SlotState::Done(result) => {
                        let next = std::mem::take(&mut inner.wake_next);
                        drop(inner);
                        next.iter().for_each(|s| s.wake());
                        return result;
                    }
                    SlotState::Lead => {
                        lead = true;
                        break;
                    }
                    waiting => {
                        inner.state = waiting;
                        slot.cv.wait(&mut inner);
                    }
                }
            }
        }
    }

    /// I17: commits one batch (which holds the leader's own op, if it has one) and passes
    /// leadership on (to the committer thread, or before it is started to the first op still
    /// queued), or clears `leader_active` when nothing is queued: one leader at a time, and no
    /// queued op without one. Says whether the batch held an async caller's op.
    fn lead(&self) -> bool {
        let (batch, room) = {
            let mut queue = self.queue.lock();
            let n = queue.jobs.len().min(self.config.max_batch.max(1));
            let batch: Vec<Job> = queue.jobs.drain(..n).collect();
            (batch, std::mem::take(&mut queue.room_wakers))
        };
        self.room.notify_all();
        room.into_iter().for_each(Waker::wake);
        let slots: Vec<Arc<Slot>> = batch.iter().map(|j| Arc::clone(&j.slot)).collect();
        let results = match catch_unwind(AssertUnwindSafe(|| self.commit_batch(batch))) {
            Ok(results) => results,
            Err(_) => {
                // A bug in the engine or in redb: the file's state is unknown to us.
                self.engine.poison();
                let e = Error::Poisoned("the writer panicked during a commit".into());
                slots.iter().map(|_| Err(e.clone())).collect()
            }
        };
        let had_async = self.answer(slots, results);
        let mut queue = self.queue.lock();
        match queue.jobs.front() {
            // The committer thread, once started, leads whatever queued meanwhile: it stays
            // awake while ops keep coming, where a sync caller handed leadership would first
            // have to be woken for it.
            Some(next) if next.slot.is_async() || queue.committer.is_some() => {
                self.request_committer(&mut queue);
            }
            Some(next) => next.slot.set(SlotState::Lead),
            None => queue.leader_active = false,
        }
        had_async
    }

    /// Delivers a batch's answers. Async callers are woken directly; sync callers form a
    /// binary tree in which every caller, on reading its answer, wakes its two children.
    /// Says whether any caller was async.
    fn answer(&self, slots: Vec<Arc<Slot>>, results: Vec<Result<OpOutput, Error>>) -> bool {
        let (sync, asynchronous): (Vec<_>, Vec<_>) = slots
            .into_iter()
            .zip(results)
            .partition(|(slot, _)| !slot.is_async());
        let had_async = !asynchronous.is_empty();
        for (slot, result) in asynchronous {
            if let Some(orphan) = slot.deliver(result) {
                self.release_detached(&orphan);
            }
        }
        let tree: Vec<Arc<Slot>> = sync.iter().map(|(s, _)| Arc::clone(s)).collect();
        for (i, (slot, result)) in sync.into_iter().enumerate() {
            let children = tree.iter().skip(2 * i + 2).take(2).cloned().collect();
            slot.set_quietly(SlotState::Done(result), children);
        }
        // Roots last: nobody is woken before every answer is in place.
        tree.iter().take(2).for_each(|s| s.wake());
        had_async
    }

    fn commit_batch(&self, batch: Vec<Job>) -> Vec<Result<OpOutput, Error>> {
        let _committing = Committing::start();
        let engine = &*self.engine;
        let n = batch.len();
        let started = std::time::Instant::now();
        if engine.is_poisoned() {
            return (0..n).map(|_| Err(engine.refusal())).collect();
        }
        let mut guard = self.leader.lock();
        // Again under the lock: a checkpoint or compaction step that failed while this batch
        // waited for it poisoned the engine, and no frame may follow a failed commit. (Plain
        // batches never touch redb, so redb's own refusal would not stop them.)
        if engine.is_poisoned() {
            return (0..n).map(|_| Err(engine.refusal())).collect();
        }
        let leader = &mut *guard;
        leader.batch_seq += 1;
        let seq = leader.batch_seq;
        let now_ms = engine.clock.now_ms();
        engine.layout.note_write_time(now_ms);
        let keys: Vec<Option<RecordKey>> = batch.iter().map(|j| j.op.key().cloned()).collect();
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
