//! The operations that flow through the writer, and what each one answers.

use std::any::Any;

use crate::record::RecordState;
use crate::tx::Tx;
use idemdb_core::fingerprint::Fingerprint;
use idemdb_core::outcome::{ExecuteOutcome, Outcome, ReserveOutcome};
use idemdb_core::scope::RecordKey;
use idemdb_core::token::FencingToken;

/// A caller's closure returned `Err`; the error itself stays with the caller.
pub(crate) struct ClosureFailed;

/// The closure of a one-shot execute.
pub(crate) type ExecuteFn = Box<dyn FnOnce(&mut Tx<'_>) -> Result<Outcome, ClosureFailed> + Send>;
/// The business writes of a `complete_with` / `fail_with`.
pub(crate) type BusinessFn = Box<dyn FnOnce(&mut Tx<'_>) -> Result<(), ClosureFailed> + Send>;
/// The writes of a `run`, with no record; its value goes back to the caller aside.
pub(crate) type RunFn = Box<dyn FnOnce(&mut Tx<'_>) -> Result<(), ClosureFailed> + Send>;

/// One write, as queued by a caller.
pub(crate) enum WriteOp {
    /// An operation on the record `key`.
    Record { key: RecordKey, op: RecordOp },
    /// Caller writes with no dedupe record (version-guarded writes).
    Run { body: RunFn },
}

/// What an op does to its record.
pub(crate) enum RecordOp {
    Reserve {
        fingerprint: Fingerprint,
        lease_ms: u64,
    },
    Finish {
        token: FencingToken,
        state: RecordState,
        response: Vec<u8>,
        business: Option<BusinessFn>,
    },
    Release {
        token: FencingToken,
    },
    Extend {
        token: FencingToken,
        lease_ms: u64,
    },
    Execute {
        fingerprint: Fingerprint,
        body: ExecuteFn,
    },
}

impl WriteOp {
    /// What the op does, as its tracing span names it.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            WriteOp::Record { op, .. } => match op {
                RecordOp::Reserve { .. } => "reserve",
                RecordOp::Finish { business: None, .. } => "finish",
                RecordOp::Finish { .. } => "finish_with",
                RecordOp::Release { .. } => "release",
                RecordOp::Extend { .. } => "extend",
                RecordOp::Execute { .. } => "execute",
            },
            WriteOp::Run { .. } => "run",
        }
    }

    /// The record the op acts on; `None` for a `run`, which has none.
    pub(crate) fn key(&self) -> Option<&RecordKey> {
        match self {
            WriteOp::Record { key, .. } => Some(key),
            WriteOp::Run { .. } => None,
        }
    }

    /// Whether the op runs caller code whose failure must undo its own writes only: such an op
    /// gets a write transaction of its own.
    pub(crate) fn runs_closure(&self) -> bool {
        matches!(
            self,
            WriteOp::Run { .. }
                | WriteOp::Record {
                    op: RecordOp::Execute { .. }
                        | RecordOp::Finish {
                            business: Some(_),
                            ..
                        },
                    ..
                }
        )
    }
}

/// What the writer answers one op with.
pub(crate) enum OpOutput {
    Reserved(ReserveOutcome),
    /// Finish or release applied.
    Done,
    Extended {
        lease_expires_at: u64,
    },
    Executed(ExecuteOutcome),
    /// A `run` closure succeeded (its value went to the caller aside).
    Ran,
    /// The caller's closure returned `Err`: nothing of this op committed.
    ClosureFailed,
    /// The caller's closure panicked: nothing of this op committed; the caller resumes the
    /// panic on its own thread.
    ClosurePanicked(Box<dyn Any + Send>),
}

impl std::fmt::Debug for OpOutput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OpOutput::Reserved(o) => write!(f, "Reserved({o:?})"),
            OpOutput::Done => write!(f, "Done"),
            OpOutput::Extended { lease_expires_at } => write!(f, "Extended({lease_expires_at})"),
            OpOutput::Executed(o) => write!(f, "Executed({o:?})"),
            OpOutput::Ran => write!(f, "Ran"),
            OpOutput::ClosureFailed => write!(f, "ClosureFailed"),
            OpOutput::ClosurePanicked(_) => write!(f, "ClosurePanicked"),
        }
    }
}
