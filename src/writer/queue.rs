//! The write queue: queued jobs, the slots callers are answered in, the futures of async
//! callers, and the committer thread that leads for them.
//!
//! Invariant: `leader_active` is false only while the queue is empty. So a caller that finds no
//! leader has its op first in line, and a leader's own op is always in the batch it takes.
//! Sync callers lead on their own thread (writer/mod.rs). Async callers never block their
//! executor: when one is first in line with no leader, the committer thread leads for it.

use crate::observe::{Span, write_span};
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use parking_lot::Mutex;

use crate::error::Error;
use crate::outcome::ReserveOutcome;
use crate::token::Reservation;
use crate::writer::Writer;
use crate::writer::op::{OpOutput, RecordOp, WriteOp};

#[derive(Default)]
pub(crate) struct Queue {
    pub(super) jobs: VecDeque<Job>,
    pub(super) leader_active: bool,
    /// The committer thread should lead the next batch.
    pub(super) committer_requested: bool,
    /// The committer thread should take a checkpoint (the log is past its size).
    pub(super) checkpoint_requested: bool,
    shutdown: bool,
    /// Async callers waiting for room in a full queue.
    pub(super) room_wakers: Vec<Waker>,
}

pub(crate) struct Job {
    pub(crate) op: WriteOp,
    pub(super) slot: Arc<Slot>,
}

/// Where one caller's answer is delivered.
#[derive(Default)]
pub(super) struct Slot {
    pub(super) inner: Mutex<SlotInner>,
    pub(super) cv: parking_lot::Condvar,
}

#[derive(Default)]
pub(super) struct SlotInner {
    pub(super) state: SlotState,
    /// Set for an async caller: woken instead of the condvar.
    waker: Option<Waker>,
    is_async: bool,
    /// The async caller dropped its future before its answer came: an acquisition it would
    /// have received is released instead of being left IN_PROGRESS until its lease ends.
    abandoned: bool,
    /// Sync callers of the same batch that this caller wakes once it has its answer: the
    /// leader wakes two, each of them two more, so the leader is not busy waking a whole batch
    /// one by one (a cross-thread wake-up costs about as much as a small fsync on VMs whose
    /// idle CPUs halt).
    pub(super) wake_next: Vec<Arc<Slot>>,
}

#[derive(Default)]
pub(super) enum SlotState {
    #[default]
    Waiting,
    /// The previous leader handed leadership to this (sync) caller.
    Lead,
    Done(Result<OpOutput, Error>),
    /// The answer was taken.
    Taken,
}

impl Slot {
    pub(super) fn new(is_async: bool) -> Arc<Slot> {
        Arc::new(Slot {
            inner: Mutex::new(SlotInner {
                is_async,
                ..SlotInner::default()
            }),
            cv: parking_lot::Condvar::new(),
        })
    }

    pub(super) fn is_async(&self) -> bool {
        self.inner.lock().is_async
    }

    /// Stores the answer without waking anyone: the wake-up tree does that.
    pub(super) fn set_quietly(&self, state: SlotState, wake_next: Vec<Arc<Slot>>) {
        let mut inner = self.inner.lock();
        inner.state = state;
        inner.wake_next = wake_next;
    }

    pub(super) fn wake(&self) {
        self.cv.notify_one();
    }

    /// Delivers an async caller's answer; returns the reservation it acquired if the caller
    /// is gone (it must be released).
    pub(super) fn deliver(&self, result: Result<OpOutput, Error>) -> Option<Reservation> {
        // One lock for the look and the store: a future dropped in between would otherwise
        // leave the answer unread.
        let waker = {
            let mut inner = self.inner.lock();
            if inner.abandoned {
                return acquired(result);
            }
            inner.state = SlotState::Done(result);
            inner.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
        None
    }

    pub(super) fn set(&self, state: SlotState) {
        let waker = {
            let mut inner = self.inner.lock();
            inner.state = state;
            inner.waker.take()
        };
        self.cv.notify_one();
        if let Some(w) = waker {
            w.wake();
        }
    }
}

impl Writer {
    /// Queues `op` for an async caller; the future resolves once its batch is durable.
    /// Dropping the future does not withdraw a queued op: it still runs, unanswered.
    pub(crate) fn submit_async(self: &Arc<Self>, op: WriteOp) -> WriteFuture {
        WriteFuture {
            writer: Arc::clone(self),
            span: write_span(op.kind(), op.key()),
            op: Some(op),
            slot: None,
        }
    }

    #[cfg(feature = "test-hooks")]
    pub(crate) fn queued(&self) -> usize {
        self.queue.lock().jobs.len()
    }

    pub(super) fn refusing(&self, queue: &Queue) -> bool {
        queue.shutdown || self.engine.is_poisoned()
    }

    pub(super) fn check_open(&self, queue: &Queue) -> Result<(), Error> {
        if self.engine.is_poisoned() {
            return Err(self.engine.refusal());
        }
        if queue.shutdown {
            return Err(Error::Closed);
        }
        Ok(())
    }

    /// Queues the release of an acquisition nobody will receive, with no one waiting for it;
    /// the committer leads for it if no leader is active.
    pub(super) fn release_detached(&self, reservation: &Reservation) {
        let mut queue = self.queue.lock();
        if queue.shutdown && !queue.leader_active {
            return; // Closed: nobody would commit it; the lease runs out instead.
        }
        queue.jobs.push_back(Job {
            op: WriteOp::Record {
                key: reservation.record_key.clone(),
                op: RecordOp::Release {
                    token: reservation.token,
                },
            },
            slot: Slot::new(true),
        });
        if !std::mem::replace(&mut queue.leader_active, true) {
            queue.committer_requested = true;
            self.committer.notify_one();
        }
    }

    /// The committer thread's loop: leads for async callers until shutdown, then drains.
    pub(crate) fn run_committer(&self) {
        let interval = self.config.checkpoint_interval;
        let mut queue = self.queue.lock();
        let mut next_checkpoint = Instant::now() + interval;
        loop {
            if std::mem::take(&mut queue.committer_requested) {
                drop(queue);
                self.lead();
                queue = self.queue.lock();
                continue;
            }
            if std::mem::take(&mut queue.checkpoint_requested) || Instant::now() >= next_checkpoint
            {
                drop(queue);
                // A failure poisoned the writer: later writes are refused with it.
                let _ = self.checkpoint();
                next_checkpoint = Instant::now() + interval;
                queue = self.queue.lock();
                continue;
            }
            if queue.shutdown && !queue.leader_active {
                return;
            }
            self.committer.wait_until(&mut queue, next_checkpoint);
        }
    }

    /// Refuses new ops; the committer thread answers what is queued and then returns.
    pub(crate) fn shutdown(&self) {
        let mut queue = self.queue.lock();
        queue.shutdown = true;
        self.committer.notify_one();
        self.room.notify_all();
        for w in std::mem::take(&mut queue.room_wakers) {
            w.wake();
        }
    }
}

/// The answer to an async caller's queued op.
pub(crate) struct WriteFuture {
    writer: Arc<Writer>,
    op: Option<WriteOp>,
    slot: Option<Arc<Slot>>,
    span: Span,
}

impl Future for WriteFuture {
    type Output = Result<OpOutput, Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        // Entered for this poll only: the future stays Send.
        let _span = this.span.enter();
        if let Some(op) = this.op.take() {
            let writer = &this.writer;
            let mut queue = writer.queue.lock();
            if let Err(e) = writer.check_open(&queue) {
                return Poll::Ready(Err(e));
            }
            if queue.jobs.len() >= writer.config.max_queue {
                queue.room_wakers.push(cx.waker().clone());
                this.op = Some(op);
                return Poll::Pending;
            }
            let slot = Slot::new(true);
            slot.inner.lock().waker = Some(cx.waker().clone());
            queue.jobs.push_back(Job {
                op,
                slot: Arc::clone(&slot),
            });
            if !std::mem::replace(&mut queue.leader_active, true) {
                queue.committer_requested = true;
                writer.committer.notify_one();
            }
            this.slot = Some(slot);
            return Poll::Pending;
        }
        let Some(slot) = &this.slot else {
            return Poll::Ready(Err(Error::Closed));
        };
        let mut inner = slot.inner.lock();
        match std::mem::replace(&mut inner.state, SlotState::Taken) {
            SlotState::Done(result) => Poll::Ready(result),
            pending => {
                inner.state = pending;
                inner.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

impl Drop for WriteFuture {
    /// A future dropped after its op was queued: the op still commits. If it acquires a key,
    /// nobody would own it until the lease ran out, so it is released.
    fn drop(&mut self) {
        let Some(slot) = self.slot.take() else {
            return;
        };
        let orphan = {
            let mut inner = slot.inner.lock();
            match std::mem::replace(&mut inner.state, SlotState::Taken) {
                SlotState::Done(result) => acquired(result),
                pending => {
                    inner.state = pending;
                    inner.abandoned = true;
                    None
                }
            }
        };
        if let Some(reservation) = orphan {
            self.writer.release_detached(&reservation);
        }
    }
}

fn acquired(result: Result<OpOutput, Error>) -> Option<Reservation> {
    match result {
        Ok(OpOutput::Reserved(ReserveOutcome::Acquired(r))) => Some(r),
        _ => None,
    }
}
