//! Who runs the queued calls (batch.rs): a call that finds no batch running and fewer than four
//! calls running alone runs alone, on its own path, with no hand-off (a lone caller pays
//! nothing for batching); the calls that arrive meanwhile queue, and when a lone call ends
//! (returns, fails or is dropped) a task drains the queue batch after batch (batch_sql.rs)
//! until it is empty. Every caller gets the answer
//! it would get alone, in an order of the concurrent calls: the batch's reserves, then its
//! finishes.

use std::sync::{Arc, Weak};

use tokio::sync::oneshot;

use crate::batch::{Answer, BatchAnswer, BatchOp};
use crate::store::Inner;

/// A call's turn: alone (the guard hands the queue on when dropped), or queued.
pub(crate) enum Turn {
    Alone(Running),
    Queued(oneshot::Receiver<Answer>),
}

/// Held by a call that runs alone: when it is dropped (done, failed or cancelled), whatever
/// queued meanwhile is drained by a task.
pub(crate) struct Running {
    inner: Weak<Inner>,
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(inner) = self.inner.upgrade()
            && inner.batcher.lone_done()
        {
            spawn_drain(&inner);
        }
    }
}

impl Inner {
    /// Runs alone if nothing runs (or batching is off), else queues `op()`.
    pub(crate) fn turn(&self, op: impl FnOnce() -> BatchOp) -> Turn {
        if !self.batcher.enabled() {
            return Turn::Alone(Running { inner: Weak::new() });
        }
        match self.batcher.enter(op) {
            None => Turn::Alone(Running {
                inner: self.this.clone(),
            }),
            Some(rx) => Turn::Queued(rx),
        }
    }
}

fn spawn_drain(inner: &Arc<Inner>) {
    let task = Arc::clone(inner);
    inner.runtime.spawn(async move { drain(task).await });
}

/// A drain's place: given back when the drain finds the queue empty, or, if its task
/// unwinds, here (and the queue handed to a new drain).
struct Draining {
    inner: Arc<Inner>,
    counted: bool,
}

impl Drop for Draining {
    fn drop(&mut self) {
        if self.counted && self.inner.batcher.drain_unwound() {
            spawn_drain(&self.inner);
        }
    }
}

/// Runs batches until the queue is empty.
async fn drain(inner: Arc<Inner>) {
    let mut draining = Draining {
        inner,
        counted: true,
    };
    loop {
        let Some(jobs) = draining.inner.batcher.take_batch() else {
            // The queue was empty: `take_batch` gave back this drain's place.
            draining.counted = false;
            return;
        };
        if jobs.len() == 1 {
            // A batch of one costs the server more than the call's own statement: it runs
            // on its own path, on its caller's task.
            for job in jobs {
                let _ = job.answer.send(Ok(BatchAnswer::Alone));
            }
            continue;
        }
        let (ops, answers): (Vec<BatchOp>, Vec<oneshot::Sender<Answer>>) =
            jobs.into_iter().map(|j| (j.op, j.answer)).unzip();
        let results = draining.inner.run_batch(&ops).await;
        for (answer, result) in answers.into_iter().zip(results) {
            // A caller that went away (its future dropped) is not waited for.
            let _ = answer.send(result);
        }
    }
}
