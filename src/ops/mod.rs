//! Every public operation is one [`Call`]: its input checked, then either an answer already
//! known (a replay from the snapshot, a refusal) or an op for the writer with the typed
//! finisher that reads the writer's answer. [`IdemDb::call`] and [`IdemDb::call_async`] drive
//! every call and count what the caller is told; the public methods are short wrappers.
//!
//! Every public method of [`IdemDb`] is in this folder:
//! - open.rs: `open`, `builder`, `close`;
//! - reserve.rs: `reserve`, `reserve_or_wait` and their async twins;
//! - owner.rs: `complete`, `fail`, `release`, `extend`, `complete_with`, `fail_with`;
//! - execute.rs: `execute` and `run`;
//! - inbox.rs: `consume`, `consume_batch`;
//! - outbox.rs: `outbox_stats`, `outbox_pending`, `outbox_parked`, `retry_parked`,
//!   `park_message`, `purge_parked`; dispatch.rs: the [`Dispatcher`](crate::Dispatcher) that
//!   delivers what closures stage (`Tx::stage`, tx_outbox.rs);
//! - inspect.rs: `get`, `stats`, `begin_read`, the settings in force, `compact_now`;
//! - scan.rs: `scan`, `verify`;
//! - typed.rs: `typed`;
//! - store.rs: `IdemDb` as a `Store` and a `BlockingStore`.

mod dispatch;
mod execute;
mod held;
mod inbox;
mod inspect;
mod open;
mod outbox;
mod owner;
mod reserve;
mod scan;
mod store;
mod typed;

pub use dispatch::Dispatcher;

use std::panic::resume_unwind;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use crate::db::IdemDb;
use crate::error::{Error, ExecuteError};
use crate::stats::StatsCollector;
use crate::tx::Tx;
use crate::writer::op::{ClosureFailed, OpOutput, WriteOp};

/// Reads the writer's answer to one op as the caller's result.
type Finish<'a, T> = Box<dyn FnOnce(Result<OpOutput, Error>) -> T + Send + 'a>;

/// One public operation, prepared.
pub(crate) struct Call<'a, T> {
    step: Step<'a, T>,
    /// Counts what the caller is told (stats.rs).
    count: fn(&StatsCollector, &T),
}

/// An answer, or an op (`O`: the op itself, or `()` once handed to the writer) and the
/// finisher of its answer.
enum Step<'a, T, O = WriteOp> {
    Answer(T),
    Submit(O, Finish<'a, T>),
}

impl<'a, T> Call<'a, T> {
    /// Answered without the writer.
    fn answer(out: T) -> Self {
        Call {
            step: Step::Answer(out),
            count: |_, _| {},
        }
    }

    /// `op` for the writer; `finish` reads its answer.
    fn submit(op: WriteOp, finish: impl FnOnce(Result<OpOutput, Error>) -> T + Send + 'a) -> Self {
        Call {
            step: Step::Submit(op, Box::new(finish)),
            count: |_, _| {},
        }
    }

    fn counted(mut self, count: fn(&StatsCollector, &T)) -> Self {
        self.count = count;
        self
    }
}

impl<'a, X, E: From<Error>> Call<'a, Result<X, E>> {
    /// The call, or its input's refusal: nothing is queued then.
    fn checked(prepared: Result<Self, Error>) -> Self {
        prepared.unwrap_or_else(|e| Call::answer(Err(e.into())))
    }
}

impl IdemDb {
    /// Drives `call` on this thread: a submitted op may lead the group commit here.
    pub(crate) fn call<T>(&self, call: Call<'_, T>) -> T {
        let out = match call.step {
            Step::Answer(out) => out,
            Step::Submit(op, finish) => finish(self.writer.submit(op)),
        };
        (call.count)(&self.engine.stats, &out);
        out
    }

    /// Drives `calls` on this thread, their ops queued together so that they share commits;
    /// the answers are in the same order.
    pub(crate) fn call_many<T>(&self, calls: Vec<Call<'_, T>>) -> Vec<T> {
        // The ops go to the writer together; each call keeps its answer or its finisher.
        let mut ops = Vec::new();
        let pending: Vec<_> = calls
            .into_iter()
            .map(|call| match call.step {
                Step::Answer(out) => (Step::Answer(out), call.count),
                Step::Submit(op, finish) => {
                    ops.push(op);
                    (Step::Submit((), finish), call.count)
                }
            })
            .collect();
        let mut answers = self.writer.submit_many(ops).into_iter();
        pending
            .into_iter()
            .map(|(step, count)| {
                let out = match step {
                    Step::Answer(out) => out,
                    Step::Submit((), finish) => finish(answers.next().unwrap_or_else(|| {
                        Err(Error::Internal("an op was never answered".into()))
                    })),
                };
                count(&self.engine.stats, &out);
                out
            })
            .collect()
    }

    /// Drives `call` for a task: woken by the commit that covers its op, never blocking.
    pub(crate) async fn call_async<T>(&self, call: Call<'_, T>) -> T {
        let out = match call.step {
            Step::Answer(out) => out,
            Step::Submit(op, finish) => finish(self.writer.submit_async(op).await),
        };
        (call.count)(&self.engine.stats, &out);
        out
    }
}

/// A lease in whole milliseconds ([`idemdb_core::clock::lease_ms`]), a zero lease refused.
pub(crate) fn lease_ms(lease: Duration) -> Result<u64, Error> {
    Ok(idemdb_core::clock::lease_ms(lease)?)
}

/// Where a caller's closure leaves its error (and a `run` its value) for the finisher, while
/// the writer reports only that it failed.
type Slot<T> = Arc<Mutex<Option<T>>>;

/// Wraps a caller's closure for the writer: its error is kept aside for the caller.
fn capture<T, E, F>(
    f: F,
) -> (
    impl FnOnce(&mut Tx<'_>) -> Result<T, ClosureFailed> + Send + 'static,
    Slot<E>,
)
where
    F: FnOnce(&mut Tx<'_>) -> Result<T, E> + Send + 'static,
    E: Send + 'static,
{
    let slot = Arc::new(Mutex::new(None));
    let theirs = Arc::clone(&slot);
    let body = move |tx: &mut Tx<'_>| {
        f(tx).map_err(|e| {
            *theirs.lock() = Some(e);
            ClosureFailed
        })
    };
    (body, slot)
}

/// The caller's result for a closure op whose closure did not simply succeed. A panic in the
/// closure resumes here, on the caller's thread.
fn closure_failure<E>(output: OpOutput, error: &Slot<E>) -> ExecuteError<E> {
    match output {
        OpOutput::ClosureFailed => match error.lock().take() {
            Some(e) => ExecuteError::Closure(e),
            None => ExecuteError::Db(Error::Internal("a closure error went missing".into())),
        },
        OpOutput::ClosurePanicked(payload) => resume_unwind(payload),
        other => ExecuteError::Db(unexpected(other)),
    }
}

/// The writer answered an op with another op's answer: a bug.
fn unexpected(output: OpOutput) -> Error {
    Error::Internal(format!("unexpected writer answer {output:?}"))
}
