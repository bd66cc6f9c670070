//! The write queue: queued jobs and the slots callers are answered in (the futures of async
//! callers and the committer thread are in committer.rs).
//!
//! Invariant: `leader_active` is false only while the queue is empty. So a caller that finds no
//! leader has its op first in line, and a leader's own op is always in the batch it takes.
//! A sync caller that finds no leader leads on its own thread (writer/mod.rs); what queues
//! behind a batch is led by the committer thread. Async callers never block their executor:
//! when one is first in line with no leader, the committer thread leads for it.

use std::collections::VecDeque;
use std::sync::Arc;
use std::task::Waker;

use parking_lot::Mutex;

use super::op::{OpOutput, WriteOp};
use crate::error::Error;
use idemdb_core::outcome::ReserveOutcome;
use idemdb_core::token::Reservation;

#[derive(Default)]
pub(crate) struct Queue {
    pub(super) jobs: VecDeque<Job>,
    pub(super) leader_active: bool,
    /// The committer thread should lead the next batch.
    pub(super) committer_requested: bool,
    pub(super) shutdown: bool,
    /// The committer thread, once started (at open, or when first needed).
    pub(super) committer: Option<std::thread::JoinHandle<()>>,
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
    pub(super) waker: Option<Waker>,
    is_async: bool,
    /// The async caller dropped its future before its answer came: an acquisition it would
    /// have received is released instead of being left IN_PROGRESS until its lease ends.
    pub(super) abandoned: bool,
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

/// The reservation an answer acquired, if any.
pub(super) fn acquired(result: Result<OpOutput, Error>) -> Option<Reservation> {
    match result {
        Ok(OpOutput::Reserved(ReserveOutcome::Acquired(r))) => Some(r),
        _ => None,
    }
}
