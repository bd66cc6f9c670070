//! Tracing spans (feature `tracing`): one per write queued for the writer and one per
//! snapshot lookup, carrying the record's operation and principal and the kind of write,
//! never the key's payload or response. Without the feature, spans are a zero-sized no-op.

use idemdb_core::scope::RecordKey;

#[cfg(feature = "tracing")]
pub(crate) type Span = tracing::Span;

/// Stands in for a span when tracing is off.
#[cfg(not(feature = "tracing"))]
#[derive(Clone, Copy)]
pub(crate) struct Span;

/// What entering a [`Span`] gives back without tracing: nothing to exit.
#[cfg(not(feature = "tracing"))]
pub(crate) struct Entered;

#[cfg(not(feature = "tracing"))]
impl Span {
    pub(crate) fn enter(&self) -> Entered {
        Entered
    }
}

/// The span of a write (`kind`: what it does; `key`: its record, if it has one), from queueing
/// to its batch's durability point.
pub(crate) fn write_span(kind: &'static str, key: Option<&RecordKey>) -> Span {
    #[cfg(feature = "tracing")]
    {
        match key {
            Some(key) => tracing::debug_span!(
                "idemdb.write",
                kind = kind,
                operation = %Part::Operation(key),
                principal = %Part::Principal(key)
            ),
            None => tracing::debug_span!("idemdb.write", kind = kind),
        }
    }
    #[cfg(not(feature = "tracing"))]
    {
        let _ = (kind, key);
        Span
    }
}

/// The span of a lookup in the shared snapshot (a replay or an in-progress answer).
pub(crate) fn snapshot_span(key: &RecordKey) -> Span {
    #[cfg(feature = "tracing")]
    {
        tracing::debug_span!(
            "idemdb.snapshot",
            operation = %Part::Operation(key),
            principal = %Part::Principal(key)
        )
    }
    #[cfg(not(feature = "tracing"))]
    {
        let _ = key;
        Span
    }
}

/// A part of a record key's scope, split and printed only when a subscriber records the span:
/// a disabled span costs no allocation on the replay path.
#[cfg(feature = "tracing")]
enum Part<'a> {
    Operation(&'a RecordKey),
    Principal(&'a RecordKey),
}

#[cfg(feature = "tracing")]
impl std::fmt::Display for Part<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (key, principal) = match self {
            Part::Operation(key) => (key, false),
            Part::Principal(key) => (key, true),
        };
        let Some((operation, who, _)) = RecordKey::split(key.as_bytes()) else {
            return Ok(());
        };
        let part = if principal { who } else { operation };
        write!(f, "{}", String::from_utf8_lossy(part))
    }
}

/// A partition was created for a window older than the newest of its class: the clock went
/// back, or had jumped ahead once (the records written then keep their future partition).
pub(crate) fn clock_behind(partition: &str) {
    #[cfg(feature = "tracing")]
    tracing::warn!(
        target: "idemdb::retention",
        partition,
        "the clock is behind a partition written earlier: it went back, or had jumped ahead"
    );
    #[cfg(not(feature = "tracing"))]
    let _ = partition;
}
