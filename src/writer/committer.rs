//! The async side of the writer: the future an async caller awaits, the committer thread
//! that leads for async callers and drains the queue at shutdown, and the detached release of
//! an acquisition whose future was dropped.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::Instant;

use super::group_commit::Writer;
use super::op::{OpOutput, RecordOp, WriteOp};
use super::queue::{Job, Queue, Slot, SlotState, acquired};
use crate::error::Error;
use crate::observe::{Span, write_span};
use idemdb_core::token::Reservation;

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

    /// Starts the committer thread unless it runs already. Called with `queue` locked before
    /// anything is queued for the thread, so it exists whenever work for it does.
    pub(super) fn ensure_committer(&self, queue: &mut Queue) -> Result<(), Error> {
        if queue.committer.is_some() {
            return Ok(());
        }
        // None only while the writer is being dropped, when nothing is queued any more.
        let Some(writer) = self.this.upgrade() else {
            return Err(Error::Closed);
        };
        let thread = std::thread::Builder::new()
            .name("idemdb-committer".into())
            .spawn(move || writer.run_committer())
            .map_err(|e| Error::ThreadSpawn {
                thread: "committer",
                source: Arc::new(e),
            })?;
        queue.committer = Some(thread);
        Ok(())
    }

    /// The committer thread, if it was started, to join after [`shutdown`](Self::shutdown).
    pub(crate) fn take_committer(&self) -> Option<std::thread::JoinHandle<()>> {
        self.queue.lock().committer.take()
    }

    #[cfg(feature = "test-hooks")]
    pub(crate) fn queued(&self) -> usize {
        self.queue.lock().jobs.len()
    }

    #[cfg(feature = "test-hooks")]
    pub(crate) fn leading(&self) -> bool {
        self.queue.lock().leader_active
    }

    pub(super) fn refusing(&self, queue: &Queue) -> bool {
        queue.shutdown || self.engine.is_poisoned()
    }

    pub(super) fn check_open(&self, queue: &Queue) -> Result<(), Error> {
        if self.engine.is_poisoned() {
            return Err(self.engine.poisoned_error());
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
        if self.ensure_committer(&mut queue).is_err() {
            return; // Nobody to commit it either.
        }
        queue.jobs.push_back(Job {
            op: WriteOp::Record {
                key: reservation.record_key().clone(),
                op: RecordOp::Release {
                    token: reservation.token(),
                },
            },
            slot: Slot::new(true),
        });
        if !std::mem::replace(&mut queue.leader_active, true) {
            self.request_committer(&mut queue);
        }
    }

    /// Asks the committer thread to lead the next batch.
    pub(super) fn request_committer(&self, queue: &mut Queue) {
        queue.committer_requested = true;
        self.committer_wanted.store(true, Ordering::Release);
        self.committer.notify_one();
    }

    /// Spins for up to `committer_spin` until the committer is wanted again. After a batch
    /// with async ops, their callers' next ops come about one thread wake-up later, and
    /// waking this thread from a halted CPU would cost as much again (REFERENCE.md:
    /// hand-offs 57–136 µs on this kind of VM).
    fn spin_for_work(&self) {
        let until = Instant::now() + self.config.committer_spin;
        while !self.committer_wanted.load(Ordering::Acquire) && Instant::now() < until {
            for _ in 0..64 {
                std::hint::spin_loop();
            }
        }
    }

    /// The committer thread's loop: leads for async callers, and for everyone while ops keep
    /// queuing, until shutdown; then drains. (Checkpoints are the applier thread's.)
    pub(crate) fn run_committer(&self) {
        let mut queue = self.queue.lock();
        let mut led_async = false;
        loop {
            if std::mem::take(&mut queue.committer_requested) {
                self.committer_wanted.store(false, Ordering::Relaxed);
                drop(queue);
                led_async = self.lead();
                queue = self.queue.lock();
                continue;
            }
            if queue.shutdown && !queue.leader_active {
                return;
            }
            if std::mem::take(&mut led_async) && !self.config.committer_spin.is_zero() {
                drop(queue);
                self.spin_for_work();
                queue = self.queue.lock();
                continue;
            }
            self.committer.wait(&mut queue);
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
            // Whoever leads for it is the committer thread.
            if let Err(e) = writer.ensure_committer(&mut queue) {
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
                writer.request_committer(&mut queue);
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
