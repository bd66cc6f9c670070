//! The `Writer`: its queue, the leader's state, and how a caller's op reaches a batch.
//!
//! A caller queues its op. If no commit is running it becomes the leader: it takes what is
//! queued (its own op first, up to `max_batch`), commits it (batch.rs) on its own thread,
//! answers the followers and hands leadership to the committer thread if anything queued
//! meanwhile (before that thread is started: to the first op that queued). A lone caller pays
//! one append and no thread hand-off; under load, the committer thread leads batch after
//! batch, each whatever arrived while the previous one was made durable.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Weak};
use std::task::Waker;

use parking_lot::{Condvar, Mutex};

use crate::config::WriterConfig;
use crate::engine::Engine;
use crate::error::Error;
use crate::observe::write_span;
use crate::wal::Log;

use super::op::{OpOutput, WriteOp};
use super::queue::{Job, Queue, Slot, SlotState};

/// The queue, the leader state and the commits: everything that writes goes through here.
pub(crate) struct Writer {
    pub(crate) engine: Arc<Engine>,
    pub(super) config: WriterConfig,
    pub(super) queue: Mutex<Queue>,
    /// Wakes the committer thread (with `queue`'s lock) to lead for async callers.
    pub(super) committer: Condvar,
    /// Wakes sync callers waiting for room in a full queue (with `queue`'s lock).
    pub(super) room: Condvar,
    /// Held by the leader for the whole batch.
    pub(super) leader: Mutex<LeaderState>,
    /// Held by whoever writes the overlay into redb (settle.rs), from taking its entries until
    /// it forgot them: one pass at a time, so no pass writes an older value after a newer
    /// one. Taken after `leader`, never before it.
    pub(super) apply_lock: Mutex<()>,
    /// The applier thread (applier.rs) and its wake-up.
    pub(super) applier: Mutex<ApplierThread>,
    pub(super) apply_wake: Condvar,
    /// Itself, for the committer thread it starts.
    pub(super) this: Weak<Writer>,
    /// Mirrors `Queue::committer_requested` so the committer thread can spin on it without
    /// the queue's lock.
    pub(super) committer_wanted: AtomicBool,
}

/// The applier thread's handle and its stop flag (applier.rs).
#[derive(Default)]
pub(super) struct ApplierThread {
    pub(super) stop: bool,
    /// A checkpoint by size is wanted.
    pub(super) checkpoint_requested: bool,
    pub(super) thread: Option<std::thread::JoinHandle<()>>,
}

pub(super) struct LeaderState {
    pub(super) next_token: u64,
    /// The committed ceiling: every token in a committed record is below it.
    pub(super) token_ceiling: u64,
    pub(super) batch_seq: u64,
    pub(super) log: Log,
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
    pub(super) fn lead(&self) -> bool {
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
        answer_as_tree(sync);
        had_async
    }
}

/// Answers a batch's sync callers: each slot gets its answer and the slots it wakes once its
/// caller read it; then the two roots are woken.
fn answer_as_tree(sync: Vec<(Arc<Slot>, Result<OpOutput, Error>)>) {
    let tree: Vec<Arc<Slot>> = sync.iter().map(|(s, _)| Arc::clone(s)).collect();
    let n = tree.len();
    let mut results: Vec<Option<_>> = sync.into_iter().map(|(_, r)| Some(r)).collect();
    // I23: a follower that was never asleep (it queued its op and was preempted before it
    // looked at its slot) reads its answer as soon as it is set, and wakes its children at
    // once; a child answered after that would sleep with nobody left to wake it, and its whole
    // subtree with it. So a slot is answered only after all of its descendants.
    for i in answer_order(n) {
        let Some(result) = results[i].take() else {
            continue;
        };
        let children = tree_children(i, n).map(|c| Arc::clone(&tree[c])).collect();
        tree[i].set_quietly(SlotState::Done(result), children);
    }
    tree.iter().take(2).for_each(|s| s.wake());
}

/// The sync callers of a batch woken by caller `i` of `n`: two roots (0 and 1), then each
/// caller `i` wakes `2i + 2` and `2i + 3`, so every caller but the roots has one parent.
fn tree_children(i: usize, n: usize) -> std::ops::Range<usize> {
    (2 * i + 2).min(n)..(2 * i + 4).min(n)
}

/// The order the callers' answers are set in: every caller after all of its descendants
/// (children have higher indices than their parent).
fn answer_order(n: usize) -> impl Iterator<Item = usize> {
    (0..n).rev()
}

#[cfg(test)]
mod tests {
    use super::{answer_as_tree, answer_order, tree_children};
    use crate::writer::op::OpOutput;
    use crate::writer::queue::{Slot, SlotState};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    fn descendants(i: usize, n: usize) -> Vec<usize> {
        let mut out = Vec::new();
        let mut next: Vec<usize> = tree_children(i, n).collect();
        while let Some(c) = next.pop() {
            out.push(c);
            next.extend(tree_children(c, n));
        }
        out
    }

    /// I23 on the real slots: slot `i`'s lock is held, so `answer_as_tree` stops at setting
    /// `i`'s answer, as a follower reading it at that moment would see it; by then every
    /// descendant of `i` must hold its answer (a follower that reads early wakes them at once).
    #[test]
    fn a_follower_reading_its_answer_early_finds_its_descendants_answered() {
        let n = 13;
        for i in 0..n {
            let slots: Vec<Arc<Slot>> = (0..n).map(|_| Slot::new(false)).collect();
            let held = slots[i].inner.lock();
            let batch = slots
                .iter()
                .map(|s| (Arc::clone(s), Ok(OpOutput::Done)))
                .collect();
            let answering = std::thread::spawn(move || answer_as_tree(batch));
            let deadline = Instant::now() + Duration::from_secs(5);
            for d in descendants(i, n) {
                while !matches!(slots[d].inner.lock().state, SlotState::Done(_)) {
                    assert!(
                        Instant::now() < deadline,
                        "caller {i} of {n} is answered before its descendant {d}"
                    );
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            drop(held);
            answering.join().unwrap();
            assert!(
                slots
                    .iter()
                    .all(|s| matches!(s.inner.lock().state, SlotState::Done(_)))
            );
        }
    }

    #[test]
    fn every_sync_caller_is_woken_once_and_only_after_its_children_were_answered() {
        for n in 0..300 {
            let mut parent = vec![None; n];
            for i in 0..n {
                for c in tree_children(i, n) {
                    assert!(c > i, "a child has a higher index than its parent");
                    assert_eq!(
                        parent[c].replace(i),
                        None,
                        "caller {c} of {n} has two parents"
                    );
                }
            }
            for (c, p) in parent.iter().enumerate() {
                // Only the two roots are woken by the leader.
                assert_eq!(p.is_none(), c < 2, "caller {c} of {n}");
            }
            // I23: when caller i's answer is set (and it may read it and wake its children at
            // once), every one of its children's answers is set already.
            let mut answered = vec![false; n];
            let mut seen = 0;
            for i in answer_order(n) {
                assert!(!answered[i], "caller {i} of {n} answered twice");
                assert!(
                    tree_children(i, n).all(|c| answered[c]),
                    "caller {i} of {n} answered before its children"
                );
                answered[i] = true;
                seen += 1;
            }
            assert_eq!(seen, n);
        }
    }
}
