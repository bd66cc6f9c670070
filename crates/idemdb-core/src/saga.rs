//! Idempotency keys for the steps of a saga: one per (saga id, step name), stable across the
//! orchestrator's retries and restarts, and passed downstream to the system the step calls.

use crate::scope::Key;

/// One step of one saga: the key of its dedupe record, and the key to send downstream.
///
/// Use it with the two-step flow: `reserve` the step's key, call the outside system with
/// [`downstream_key`](Self::downstream_key) as its idempotency key, then `complete_with` the
/// step's result and the saga's state in one commit.
///
/// ```
/// use idemdb::{IdemDb, ReserveOutcome, SagaStep, Scope};
/// use std::time::Duration;
/// # let dir = tempfile::tempdir()?;
/// # let db = IdemDb::open(dir.path().join("db"))?;
/// let step = SagaStep::new("order-7781", "charge-card");
/// let scope = Scope::new("checkout-saga", "");
/// if let ReserveOutcome::Acquired(r) = db.reserve(&scope, &step.key(), b"cents=1999", Duration::from_secs(30))? {
///     let downstream = step.downstream_key(); // e.g. the provider's Idempotency-Key header
///     assert_eq!(downstream, "6f726465722d37373831.6368617267652d63617264");
///     db.complete(&r, b"charged".to_vec())?;
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SagaStep {
    saga_id: Vec<u8>,
    step: Vec<u8>,
}

impl SagaStep {
    /// The step `step` of saga `saga_id`.
    pub fn new(saga_id: impl AsRef<[u8]>, step: impl AsRef<[u8]>) -> Self {
        SagaStep {
            saga_id: saga_id.as_ref().to_vec(),
            step: step.as_ref().to_vec(),
        }
    }

    /// The key of the step's dedupe record: both parts, length-prefixed
    /// ([`Key::from_parts`]), so no two (saga, step) pairs share one.
    pub fn key(&self) -> Key {
        Key::from_parts([&self.saga_id, &self.step])
    }

    /// The key to pass to the system the step calls: the two parts in lower-case hex joined
    /// by a dot. Header-safe, unambiguous, and the same on every retry of the step.
    pub fn downstream_key(&self) -> String {
        format!("{}.{}", hex(&self.saga_id), hex(&self.step))
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_unambiguous() {
        let a = SagaStep::new("ab", "c");
        let b = SagaStep::new("a", "bc");
        assert_ne!(a.key(), b.key());
        assert_ne!(a.downstream_key(), b.downstream_key());
        assert_eq!(a.downstream_key(), "6162.63");
        assert_eq!(a, SagaStep::new(b"ab", b"c"));
    }
}
