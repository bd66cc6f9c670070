//! Tracing spans (feature `tracing`): one per write queued for the writer and one per
//! snapshot lookup, carrying the record's operation and principal and the kind of write,
//! never the key's payload or response. Without the feature, spans are a zero-sized no-op.

use crate::scope::RecordKey;
use crate::writer::op::WriteOp;

#[cfg(feature = "tracing")]
pub(crate) type Span = tracing::Span;

/// Stands in for a span when tracing is off.
#[cfg(not(feature = "tracing"))]
#[derive(Clone, Copy)]
pub(crate) struct Span;

#[cfg(not(feature = "tracing"))]
impl Span {
    pub(crate) fn enter(&self) {}
}

fn kind(op: &WriteOp) -> &'static str {
    match op {
        WriteOp::Reserve { .. } => "reserve",
        WriteOp::Finish { business: None, .. } => "finish",
        WriteOp::Finish { .. } => "finish_with",
        WriteOp::Release { .. } => "release",
        WriteOp::Extend { .. } => "extend",
        WriteOp::Execute { .. } => "execute",
        WriteOp::Run { .. } => "run",
    }
}

/// The span of a write, from queueing to its durable commit.
pub(crate) fn write_span(op: &WriteOp) -> Span {
    #[cfg(feature = "tracing")]
    {
        let (operation, principal) = scope_of(op.key());
        tracing::debug_span!("idemdb.write", kind = kind(op), %operation, %principal)
    }
    #[cfg(not(feature = "tracing"))]
    {
        let _ = kind(op);
        Span
    }
}

/// The span of a lookup in the shared snapshot (a replay or an in-progress answer).
pub(crate) fn snapshot_span(key: &RecordKey) -> Span {
    #[cfg(feature = "tracing")]
    {
        let (operation, principal) = scope_of(key);
        tracing::debug_span!("idemdb.snapshot", %operation, %principal)
    }
    #[cfg(not(feature = "tracing"))]
    {
        let _ = key;
        Span
    }
}

#[cfg(feature = "tracing")]
fn scope_of(key: &RecordKey) -> (String, String) {
    match RecordKey::split(key.as_bytes()) {
        Some((op, principal, _)) => (
            String::from_utf8_lossy(op).into_owned(),
            String::from_utf8_lossy(principal).into_owned(),
        ),
        None => (String::new(), String::new()),
    }
}
