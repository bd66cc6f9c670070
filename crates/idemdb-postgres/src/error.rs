//! `PgError`: what the PostgreSQL store's calls fail with. The protocol's refusals are the
//! embedded engine's ([`Refusal`]); the rest is the server's or the connection's, in their
//! words. No variant of the embedded engine's storage (redb, the write-ahead log) is here.

use std::fmt;
use std::sync::Arc;

use idemdb_core::error::{ExecuteError, InputError, Refusal, StoreError};

/// An error of [`PgStore`](crate::PgStore). Cheap to clone.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum PgError {
    /// The protocol refused the call, and nothing changed: invalid input (a key, scope or
    /// response over the limits, a zero lease, a setting out of range; nothing was sent), a
    /// stale fencing token, no live record for the reservation, a record no longer in
    /// progress, or a reservation of another database or store. The same [`Refusal`] as every
    /// store's ([`StoreError::refusal`]).
    Refused(Refusal),
    /// The schema is newer than this build supports: run the newer build's `migrate`, or
    /// this build against a database of its own version.
    UnsupportedFormat {
        /// The schema version found.
        found: u32,
        /// The newest this build knows.
        supported: u32,
    },
    /// The database has no idemdb schema, or an older one: run
    /// [`PgStoreBuilder::migrate`](crate::PgStoreBuilder::migrate).
    NotMigrated(String),
    /// A stored row is not one this store writes.
    Corrupted(String),
    /// The connection was lost after a write was sent: it may have committed. Read the
    /// record to learn which.
    OutcomeUnknown(Arc<dyn std::error::Error + Send + Sync>),
    /// A typed value could not be encoded or decoded.
    Codec(Arc<serde_json::Error>),
    /// A bug in idemdb, or a thread or task it could not start.
    Internal(String),
    /// The server refused a statement, or could not be reached; nothing was committed. In
    /// the server's words (SQLSTATE included) or the driver's.
    Database(Arc<dyn std::error::Error + Send + Sync>),
}

impl fmt::Display for PgError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PgError::UnsupportedFormat { found, supported } => write!(
                f,
                "schema version {found} is newer than this build supports ({supported})"
            ),
            PgError::NotMigrated(why) => write!(f, "not migrated: {why}"),
            PgError::Corrupted(why) => write!(f, "corrupted data: {why}"),
            PgError::OutcomeUnknown(e) => write!(f, "outcome unknown: {e}"),
            PgError::Codec(e) => write!(f, "typed value codec: {e}"),
            PgError::Internal(why) => write!(f, "internal error (a bug in idemdb): {why}"),
            PgError::Database(e) => write!(f, "database: {e}"),
            PgError::Refused(refusal) => write!(f, "{refusal}"),
        }
    }
}

impl std::error::Error for PgError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            PgError::OutcomeUnknown(e) | PgError::Database(e) => Some(&**e),
            PgError::Codec(e) => Some(&**e),
            _ => None,
        }
    }
}

impl PgError {
    /// Whether a write may have committed: the connection was lost after it was sent. Read
    /// the record to learn it.
    pub fn is_outcome_unknown(&self) -> bool {
        matches!(self, PgError::OutcomeUnknown(_))
    }
}

impl StoreError for PgError {
    fn refusal(&self) -> Option<&Refusal> {
        match self {
            PgError::Refused(refusal) => Some(refusal),
            _ => None,
        }
    }

    fn is_outcome_unknown(&self) -> bool {
        PgError::is_outcome_unknown(self)
    }

    fn is_transient(&self) -> bool {
        matches!(self, PgError::OutcomeUnknown(_) | PgError::Database(_))
    }

    fn codec(error: serde_json::Error) -> Self {
        PgError::Codec(Arc::new(error))
    }

    fn internal(what: String) -> Self {
        PgError::Internal(what)
    }
}

impl From<Refusal> for PgError {
    fn from(refusal: Refusal) -> Self {
        PgError::Refused(refusal)
    }
}

impl From<InputError> for PgError {
    fn from(e: InputError) -> Self {
        PgError::Refused(Refusal::InvalidInput(e))
    }
}

impl<E> From<PgError> for ExecuteError<E, PgError> {
    fn from(e: PgError) -> Self {
        ExecuteError::Db(e)
    }
}

/// For closures whose own error type is [`PgError`]: either way it is one error.
impl From<ExecuteError<PgError, PgError>> for PgError {
    fn from(e: ExecuteError<PgError, PgError>) -> Self {
        match e {
            ExecuteError::Closure(e) | ExecuteError::Db(e) => e,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idemdb_core::fencing::FencingToken;

    /// The renewal loop retries sooner after these (the server was unreachable, or a write's
    /// outcome is unknown), and stops at a refusal.
    #[test]
    fn a_lost_connection_is_transient_and_a_refusal_is_not() {
        let io = || Arc::new(std::io::Error::other("connection reset"));
        assert!(PgError::Database(io()).is_transient());
        assert!(PgError::OutcomeUnknown(io()).is_transient());
        assert!(PgError::OutcomeUnknown(io()).is_outcome_unknown());
        assert!(!PgError::Database(io()).is_outcome_unknown());
        let fenced = PgError::from(Refusal::Fenced {
            presented: FencingToken::new(1).unwrap(),
            current: FencingToken::new(2).unwrap(),
        });
        assert!(!fenced.is_transient());
        assert!(matches!(fenced.refusal(), Some(Refusal::Fenced { .. })));
        assert_eq!(
            fenced.to_string(),
            "fencing token 1 is stale: the record is now owned by token 2"
        );
        assert!(PgError::Database(io()).refusal().is_none());
    }
}
