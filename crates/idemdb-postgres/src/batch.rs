//! The queue of client-side group commit (design.md §14): concurrent reserves and finishes
//! on one store wait here to share one transaction, one round trip and one commit, as the
//! embedded writer's callers share one durable commit. Who runs them is batch_run.rs; one
//! batch's statements are batch_sql.rs.
//!
//! Invariant: jobs are queued only while a lone call or a drain runs (`lone > 0 || drains > 0`),
//! and a drain's exit is decided under the queue's lock, so a queued job always has a drain
//! to come.

use std::collections::VecDeque;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::oneshot;

use crate::error::PgError;
use idemdb_core::scope::RecordKey;
use idemdb_core::token::FencingToken;

/// One queued operation.
pub(crate) enum BatchOp {
    Reserve {
        key: RecordKey,
        fingerprint: [u8; 16],
        lease_ms: u64,
        ttl_ms: u64,
        flag_beyond: bool,
    },
    Finish {
        key: RecordKey,
        token: FencingToken,
        state: i16,
        response: Vec<u8>,
        ttl_ms: u64,
    },
}

impl BatchOp {
    pub(crate) fn key(&self) -> &RecordKey {
        match self {
            BatchOp::Reserve { key, .. } | BatchOp::Finish { key, .. } => key,
        }
    }
}

/// What a batch answers one operation.
pub(crate) enum BatchAnswer {
    /// A reserve's row: columns as `idemdb_reserve`'s (the newest row, the inserted token and
    /// lease end, the store's time), read and written in the batch's committed transaction.
    Reserved(tokio_postgres::Row),
    /// A finish whose guarded update matched, committed.
    Finished,
    /// Nothing of the operation committed and the batch could not decide it (a takeover, a
    /// record that changed between the batch's statements, an update that matched nothing,
    /// a statement of the batch refused): the caller runs it on its own path.
    Alone,
}

pub(crate) type Answer = Result<BatchAnswer, PgError>;

pub(crate) struct Job {
    pub(crate) op: BatchOp,
    pub(crate) answer: oneshot::Sender<Answer>,
}

/// The queue and who runs.
#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    /// Calls running alone, at most [`LONE`].
    lone: usize,
    /// Drain tasks running, at most [`LANES`].
    drains: usize,
}

/// Calls that may run alone at once, while no drain runs: as many callers run side by side as
/// they would without batching. Four measured best at 4 callers (replays 1.2–1.3× the
/// hand-written table's, against 0.7× with one) and no worse at 16 or 64 (docs/benchmarks.md).
const LONE: usize = 4;

/// Drains running at once. One: a second drain, or a drain started while a lone call runs,
/// measured no faster at 4, 16 or 64 callers (docs/benchmarks.md), and costs the server more
/// per call (smaller batches, waits on each other's stripe locks).
const LANES: usize = 1;

pub(crate) struct Batcher {
    queue: Mutex<Queue>,
    /// Most operations in one batch; below 2, every call runs alone.
    max_batch: usize,
}

impl Batcher {
    pub(crate) fn new(max_batch: usize) -> Self {
        Batcher {
            queue: Mutex::new(Queue::default()),
            max_batch,
        }
    }

    pub(crate) fn enabled(&self) -> bool {
        self.max_batch >= 2
    }

    /// A call's turn: `None` if no drain runs and fewer than [`LONE`] calls run alone (the
    /// call runs alone, and must call [`lone_done`](Self::lone_done) when it ends), else the
    /// receiver of its queued job's answer.
    pub(crate) fn enter(&self, op: impl FnOnce() -> BatchOp) -> Option<oneshot::Receiver<Answer>> {
        let mut queue = self.queue.lock();
        if queue.lone < LONE && queue.drains == 0 && queue.jobs.is_empty() {
            queue.lone += 1;
            return None;
        }
        let (answer, rx) = oneshot::channel();
        queue.jobs.push_back(Job { op: op(), answer });
        Some(rx)
    }

    /// The lone call ended; whether a drain must be started for what queued meanwhile (it is
    /// counted as running already).
    pub(crate) fn lone_done(&self) -> bool {
        let mut queue = self.queue.lock();
        queue.lone -= 1;
        if !queue.jobs.is_empty() && queue.drains < LANES {
            queue.drains += 1;
            return true;
        }
        false
    }

    /// Up to `max_batch` jobs from the front of the queue; `None` when it is empty, and then
    /// the drain's place is given back under the same lock (a job queued later finds nothing
    /// running and runs alone, or is drained by the lone call's successor).
    pub(crate) fn take_batch(&self) -> Option<Vec<Job>> {
        let mut queue = self.queue.lock();
        if queue.jobs.is_empty() {
            queue.drains -= 1;
            return None;
        }
        let n = queue.jobs.len().min(self.max_batch);
        Some(queue.jobs.drain(..n).collect())
    }

    /// A drain's task unwound without giving back its place: whether a new drain must take
    /// it over (jobs are queued); if not, the place is given back.
    pub(crate) fn drain_unwound(&self) -> bool {
        let mut queue = self.queue.lock();
        if queue.jobs.is_empty() {
            queue.drains -= 1;
            return false;
        }
        true
    }
}

/// A queued call's batch ended without answering it (its task was cancelled, at shutdown,
/// or panicked): whatever it wrote may have committed.
#[derive(Debug)]
struct BatchLost;

impl std::fmt::Display for BatchLost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(
            "the batch this call was part of ended without answering it (the runtime shut \
             down, or a bug); read the record to learn whether it committed",
        )
    }
}

impl std::error::Error for BatchLost {}

/// The answer of a queued call, or `OutcomeUnknown` if its batch never gave one.
pub(crate) async fn answer_of(rx: oneshot::Receiver<Answer>) -> Answer {
    rx.await
        .unwrap_or_else(|_| Err(PgError::OutcomeUnknown(Arc::new(BatchLost))))
}
