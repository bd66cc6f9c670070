//! How PostgreSQL's errors reach the caller: refused (nothing committed), retried inside the
//! store (serialization failures and deadlocks), or `OutcomeUnknown` (the connection was lost
//! where a commit may have happened).

use std::sync::Arc;

use tokio_postgres::error::SqlState;

use crate::error::Error;

/// How many times a transaction that lost a serialization conflict or a deadlock is run.
pub(crate) const MAX_ATTEMPTS: u32 = 8;

/// A statement failed and nothing it wrote is committed.
pub(crate) fn database(e: tokio_postgres::Error) -> Error {
    Error::Database(Arc::new(e))
}

pub(crate) fn pool(e: deadpool_postgres::PoolError) -> Error {
    Error::Database(Arc::new(e))
}

/// A failure of a commit, or of a write that commits by itself: if the server answered with
/// an ERROR, it refused and nothing is committed; if the connection broke (or the server
/// ended the session with FATAL or PANIC, which it may do after the commit record is
/// written), the commit may have happened.
pub(crate) fn after_commit(e: tokio_postgres::Error) -> Error {
    match e.as_db_error() {
        Some(db) if db.severity() == "ERROR" => database(e),
        _ => Error::OutcomeUnknown(Arc::new(e)),
    }
}

/// A conflict the transaction may be run again for: nothing of it is committed.
pub(crate) fn is_retryable(e: &tokio_postgres::Error) -> bool {
    matches!(
        e.code(),
        Some(&SqlState::T_R_SERIALIZATION_FAILURE | &SqlState::T_R_DEADLOCK_DETECTED)
    )
}

/// The pause before attempt `attempt` (1-based) of a retried transaction: short, growing,
/// and jittered so that the two sides of a deadlock do not meet again.
pub(crate) fn backoff(attempt: u32) -> std::time::Duration {
    let mut jitter = [0u8; 2];
    let _ = getrandom::fill(&mut jitter);
    let base = 1u64 << attempt.min(6);
    std::time::Duration::from_micros(base * 500 + u64::from(u16::from_le_bytes(jitter)) % 1000)
}

/// A failed step of a store transaction, before its outcome is decided: retried if it is a
/// conflict, else the caller's error (with what a broken commit means).
pub(crate) enum Step {
    /// Run the transaction again (nothing committed); the error to answer if attempts run
    /// out.
    Retry(Error),
    /// Answer the caller with this.
    Fail(Error),
}

impl Step {
    /// A statement before the commit failed: nothing committed.
    pub(crate) fn before_commit(e: tokio_postgres::Error) -> Step {
        if is_retryable(&e) {
            Step::Retry(database(e))
        } else {
            Step::Fail(database(e))
        }
    }

    /// The commit failed.
    pub(crate) fn at_commit(e: tokio_postgres::Error) -> Step {
        if is_retryable(&e) {
            Step::Retry(database(e))
        } else {
            Step::Fail(after_commit(e))
        }
    }
}

impl From<Error> for Step {
    fn from(e: Error) -> Step {
        Step::Fail(e)
    }
}

/// A guarded write matched nothing though the record is still the caller's: it moved
/// between two statements. Decided again.
pub(crate) fn moved() -> Step {
    Step::Retry(Error::Internal(
        "the record kept changing between a read and its guarded write".into(),
    ))
}
