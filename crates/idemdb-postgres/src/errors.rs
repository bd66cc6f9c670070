//! How PostgreSQL's errors reach the caller: refused (nothing committed), retried inside the
//! store (serialization failures and deadlocks), or `OutcomeUnknown` (the connection was lost
//! where a commit may have happened).

use std::sync::Arc;

use tokio_postgres::error::SqlState;

use crate::error::PgError;

/// How many times a transaction that lost a serialization conflict or a deadlock is run.
pub(crate) const MAX_ATTEMPTS: u32 = 8;

/// A statement failed and nothing it wrote is committed.
pub(crate) fn database(e: tokio_postgres::Error) -> PgError {
    PgError::Database(Arc::new(ServerSaid::of(e)))
}

pub(crate) fn pool(e: deadpool_postgres::PoolError) -> PgError {
    let text = match &e {
        deadpool_postgres::PoolError::Backend(b) => describe(b),
        other => chain(other),
    };
    PgError::Database(Arc::new(ServerSaid {
        text: format!("no connection from the pool: {text}"),
        source: Box::new(e),
    }))
}

/// A PostgreSQL failure in the words the caller needs: the server's SQLSTATE, message, detail
/// and hint, or what broke the connection. `source()` is the driver's error.
#[derive(Debug)]
pub(crate) struct ServerSaid {
    text: String,
    source: Box<dyn std::error::Error + Send + Sync>,
}

impl ServerSaid {
    pub(crate) fn of(e: tokio_postgres::Error) -> Self {
        ServerSaid {
            text: describe(&e),
            source: Box::new(e),
        }
    }
}

impl std::fmt::Display for ServerSaid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::error::Error for ServerSaid {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.source)
    }
}

/// `ERROR 42P01: relation "x" does not exist (detail: …; hint: …)`, or the driver's own
/// words and their causes when the server said nothing.
pub(crate) fn describe(e: &tokio_postgres::Error) -> String {
    let Some(db) = e.as_db_error() else {
        return chain(e);
    };
    let mut text = format!("{} {}: {}", db.severity(), db.code().code(), db.message());
    let notes: Vec<String> = [("detail", db.detail()), ("hint", db.hint())]
        .into_iter()
        .filter_map(|(what, note)| note.map(|n| format!("{what}: {n}")))
        .collect();
    if !notes.is_empty() {
        text.push_str(&format!(" ({})", notes.join("; ")));
    }
    text
}

/// An error's text followed by each of its causes'.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(&format!(": {c}"));
        cause = c.source();
    }
    text
}

/// Why a PostgreSQL call's outcome is unknown, and what to do about it.
#[derive(Debug)]
struct LostAtCommit(ServerSaid);

impl std::fmt::Display for LostAtCommit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the connection to PostgreSQL broke after the commit was sent, so it may have \
             committed; read the record to learn which (other calls are not affected): {}",
            self.0
        )
    }
}

impl std::error::Error for LostAtCommit {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

/// A write's partition does not exist (another instance's compactor dropped it, or none was
/// made yet): `Some` of the partition key the server named, if it did.
pub(crate) fn missing_partition(e: &tokio_postgres::Error) -> Option<Option<u64>> {
    let db = e.as_db_error()?;
    if db.code() != &SqlState::CHECK_VIOLATION || !db.message().starts_with("no partition of") {
        return None;
    }
    // "Partition key of the failing row contains (expires_at) = (1700000030000)."
    let at = db.detail().and_then(|d| {
        let (_, value) = d.rsplit_once("= (")?;
        value.split(')').next()?.parse().ok()
    });
    Some(at)
}

/// The answer when partitions kept going missing under a write.
pub(crate) fn partition_missing() -> PgError {
    PgError::Internal("the partition of a write kept going missing".into())
}

/// A failure of a commit, or of a write that commits by itself: if the server answered with
/// an ERROR, it refused and nothing is committed; if the connection broke (or the server
/// ended the session with FATAL or PANIC, which it may do after the commit record is
/// written), the commit may have happened.
pub(crate) fn after_commit(e: tokio_postgres::Error) -> PgError {
    match e.as_db_error() {
        Some(db) if db.severity() == "ERROR" => database(e),
        _ => PgError::OutcomeUnknown(Arc::new(LostAtCommit(ServerSaid::of(e)))),
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
    Retry(PgError),
    /// Answer the caller with this.
    Fail(PgError),
    /// The write's partition is missing (nothing committed): make it (`Some`: the partition
    /// key the server named) and run again.
    Partition(Option<u64>),
}

impl Step {
    /// A statement before the commit failed: nothing committed.
    pub(crate) fn before_commit(e: tokio_postgres::Error) -> Step {
        if let Some(at) = missing_partition(&e) {
            Step::Partition(at)
        } else if is_retryable(&e) {
            Step::Retry(database(e))
        } else {
            Step::Fail(database(e))
        }
    }

    /// A statement that commits by itself failed.
    pub(crate) fn autocommit(e: tokio_postgres::Error) -> Step {
        match missing_partition(&e) {
            Some(at) => Step::Partition(at),
            None => Step::at_commit(e),
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

impl From<PgError> for Step {
    fn from(e: PgError) -> Step {
        Step::Fail(e)
    }
}

/// A shared input check's refusal.
impl From<idemdb_core::InputError> for Step {
    fn from(e: idemdb_core::InputError) -> Step {
        Step::Fail(e.into())
    }
}

/// A shared check's refusal (`check_owner`).
impl From<idemdb_core::Refusal> for Step {
    fn from(e: idemdb_core::Refusal) -> Step {
        Step::Fail(e.into())
    }
}

/// A guarded write matched nothing though the record is still the caller's: it moved
/// between two statements. Decided again.
pub(crate) fn moved() -> Step {
    Step::Retry(PgError::Internal(
        "the record kept changing between a read and its guarded write".into(),
    ))
}
