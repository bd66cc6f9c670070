//! Errors: misuse, fencing, I/O and corruption. Expected outcomes (duplicate, mismatch,
//! in progress) are enum variants of the outcome types instead.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::log_problem::LogProblem;
use crate::stats::MemoryUse;
pub use idemdb_core::{InputError, Refusal, StoreError};

/// An idemdb error. Cheap to clone: one failed batch answers each of its callers with a copy.
///
/// After [`Error::OutcomeUnknown`] the database refuses writes with [`Error::WritesRefused`]
/// until it is reopened (redb's rule after a failed commit).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Error {
    /// The protocol refused the call, and nothing changed: invalid input, a stale fencing
    /// token, no live record for the reservation, a record no longer in progress, or a
    /// reservation of another database. The same [`Refusal`] as every store's
    /// ([`StoreError::refusal`]).
    Refused(Refusal),
    /// The file is a redb database but not an idemdb one (or not a database at all).
    NotIdemdb(String),
    /// The file was written by a newer idemdb with a format this version cannot read.
    UnsupportedFormat {
        /// The version found in the file.
        found: u32,
        /// The newest version this build reads.
        supported: u32,
    },
    /// Stored bytes failed validation.
    Corrupted(String),
    /// The open refused the write-ahead log beside the database: it lacks, or may lack,
    /// outcomes the database acknowledged, or it is not this database's. Nothing was
    /// changed; [`LogProblem`] says what was found and what can be done.
    LogRefused {
        /// The log's path (`None` when opened over storage backends).
        log: Option<PathBuf>,
        /// What was found.
        problem: LogProblem,
    },
    /// The write-ahead log could not be created, opened, read or written.
    LogIo {
        /// The log's path (`None` when opened over storage backends).
        log: Option<PathBuf>,
        /// What was being done ("create", "open", "read", "write", "sync", …).
        action: &'static str,
        /// The operating system's error.
        source: Arc<std::io::Error>,
    },
    /// An internal invariant failed: a bug in idemdb (please report it). Nothing was written
    /// by the call that got it, unless it says otherwise.
    Internal(String),
    /// An engine thread (committer, compactor, timer) could not be started.
    ThreadSpawn {
        /// Which thread.
        thread: &'static str,
        /// The operating system's error.
        source: Arc<std::io::Error>,
    },
    /// A commit failed with an I/O error: the batch's changes may or may not be durable. A
    /// holder of a reservation from that batch may or may not hold it. Reopen, then read the
    /// record. Its text says what failed, and what to do.
    OutcomeUnknown(Arc<dyn std::error::Error + Send + Sync>),
    /// An earlier commit failed; writes are refused until the database is reopened.
    WritesRefused,
    /// The database was closed.
    Closed,
    /// An engine thread panicked, or a commit failed and left state this process cannot
    /// vouch for; the database refuses writes until reopened.
    Poisoned(String),
    /// A closure of `execute` or `complete_with` called back into the database. It runs inside
    /// the commit, so that call would wait for itself: use the [`Tx`](crate::Tx) handle.
    Reentrant,
    /// The operating system gave no randomness for the fingerprint secret.
    Entropy(String),
    /// A [`Dispatcher`](crate::Dispatcher) of this database already runs: one at a time, so
    /// that messages of one ordering key go out in commit order.
    DispatcherRunning,
    /// A typed value failed to serialize or deserialize.
    Codec(Arc<serde_json::Error>),
    /// Opening would take more memory than [`Builder::memory_budget`](crate::Builder::memory_budget)
    /// allows: nothing was allocated for the records, and nothing was changed.
    MemoryBudget {
        /// What the open would take.
        needed: MemoryUse,
        /// The budget.
        budget: u64,
        /// Finished records stored outside the partitions found through their filters (each
        /// needs an entry in the key index).
        records: u64,
        /// Keys recognised beyond the horizon that memory holds at the open (of rows not yet
        /// entered on disk by hash, and older builds' tags).
        horizon_keys: u64,
    },
    /// An error from redb (storage, table or transaction).
    Storage(Arc<redb::Error>),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Refused(refusal) => write!(f, "{refusal}"),
            Error::NotIdemdb(why) => write!(f, "not an idemdb database: {why}"),
            Error::UnsupportedFormat { found, supported } => write!(
                f,
                "database format version {found} is newer than this build supports ({supported})"
            ),
            Error::Corrupted(why) => write!(f, "corrupted data: {why}"),
            Error::LogRefused { log, problem } => {
                write!(
                    f,
                    "the write-ahead log {} {problem}; nothing was changed",
                    log_name(log.as_deref())
                )?;
                if problem.can_accept() {
                    write!(
                        f,
                        ". Put the log (or the database file) back as it was and open again, \
                         or accept the loss knowingly (Builder::accept_log_loss, `idemdb \
                         accept-log-loss`)"
                    )?;
                }
                Ok(())
            }
            Error::LogIo {
                log,
                action,
                source,
            } => write!(
                f,
                "cannot {action} the write-ahead log {}: {source}",
                log_name(log.as_deref())
            ),
            Error::Internal(why) => write!(f, "internal error (a bug in idemdb): {why}"),
            Error::ThreadSpawn { thread, source } => {
                write!(f, "cannot start the {thread} thread: {source}")
            }
            Error::OutcomeUnknown(e) => write!(f, "outcome unknown: {e}"),
            Error::WritesRefused => write!(
                f,
                "writes are refused after a failed commit; reopen the database"
            ),
            Error::Closed => write!(f, "the database is closed"),
            Error::Poisoned(why) => write!(f, "database poisoned, reopen it: {why}"),
            Error::DispatcherRunning => write!(
                f,
                "an outbox dispatcher of this database already runs; stop it first"
            ),
            Error::Reentrant => write!(
                f,
                "a closure called the database from inside its own commit; use its Tx handle"
            ),
            Error::Entropy(e) => write!(f, "no randomness for the fingerprint secret: {e}"),
            Error::Codec(e) => write!(f, "typed value codec: {e}"),
            Error::MemoryBudget {
                needed,
                budget,
                records,
                horizon_keys,
            } => write!(
                f,
                "opening needs about {} of memory, over the memory budget of {}: page cache {}, \
                 replay cache {}, key index {} for {records} finished records, key filters {}, \
                 horizon {} for {horizon_keys} recognised keys. Raise Builder::memory_budget, lower \
                 cache_size or replay_cache, or keep fewer records (a shorter TTL or a lower \
                 horizon_factor)",
                mib(needed.total()),
                mib(*budget),
                mib(needed.page_cache),
                mib(needed.replay_cache),
                mib(needed.key_index),
                mib(needed.key_filters),
                mib(needed.horizon),
            ),
            Error::Storage(e) => write!(f, "storage: {e}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::OutcomeUnknown(e) => Some(&**e),
            Error::Codec(e) => Some(&**e),
            Error::Storage(e) => Some(&**e),
            Error::ThreadSpawn { source, .. } => Some(&**source),
            Error::LogIo { source, .. } => Some(&**source),
            _ => None,
        }
    }
}

impl Error {
    /// Whether the operation may have taken effect even though it returned this error: a
    /// failed commit, or an engine panic during one. Reopen, then read the record.
    pub fn is_outcome_unknown(&self) -> bool {
        matches!(self, Error::OutcomeUnknown(_) | Error::Poisoned(_))
    }
}

/// Bytes in MiB, one decimal.
fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20))
}

/// How a log is named in messages: its path, or what stands for one over backends.
fn log_name(log: Option<&Path>) -> String {
    match log {
        Some(path) => path.display().to_string(),
        None => "(a storage backend)".to_string(),
    }
}

/// Why an embedded commit's outcome is unknown: the storage error, and what to do about it.
#[derive(Debug)]
pub(crate) struct CommitFailed(pub(crate) Arc<dyn std::error::Error + Send + Sync>);

impl fmt::Display for CommitFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "a commit failed and its changes may be durable; writes are refused until the \
             database is reopened, then read the record: {}",
            self.0
        )
    }
}

impl std::error::Error for CommitFailed {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}

macro_rules! from_redb {
    ($($t:ty),*) => {$(
        impl From<$t> for Error {
            fn from(e: $t) -> Self {
                Error::Storage(Arc::new(e.into()))
            }
        }
    )*};
}
from_redb!(
    redb::StorageError,
    redb::TableError,
    redb::TransactionError,
    redb::CommitError,
    redb::DatabaseError,
    redb::SetDurabilityError
);

impl From<redb::Error> for Error {
    fn from(e: redb::Error) -> Self {
        Error::Storage(Arc::new(e))
    }
}

/// What an [`IdemDb::execute`](crate::IdemDb::execute) or
/// [`complete_with`](crate::IdemDb::complete_with) call can fail with: the caller's own error
/// from the closure (nothing was committed), or the store's (`D`: [`Error`] for the embedded
/// engine).
pub type ExecuteError<E, D = Error> = idemdb_core::ExecuteError<E, D>;

impl<E> From<Error> for ExecuteError<E> {
    fn from(e: Error) -> Self {
        ExecuteError::Db(e)
    }
}

/// For closures whose own error type is [`Error`]: either way it is one error.
impl From<ExecuteError<Error>> for Error {
    fn from(e: ExecuteError<Error>) -> Self {
        match e {
            ExecuteError::Closure(e) | ExecuteError::Db(e) => e,
        }
    }
}

impl StoreError for Error {
    fn refusal(&self) -> Option<&Refusal> {
        match self {
            Error::Refused(refusal) => Some(refusal),
            _ => None,
        }
    }

    fn is_outcome_unknown(&self) -> bool {
        Error::is_outcome_unknown(self)
    }

    fn is_transient(&self) -> bool {
        // The embedded engine has no connection to lose: only an unknown outcome may pass.
        matches!(self, Error::OutcomeUnknown(_))
    }

    fn codec(error: serde_json::Error) -> Self {
        Error::Codec(std::sync::Arc::new(error))
    }

    fn internal(what: String) -> Self {
        Error::Internal(what)
    }
}

impl From<InputError> for Error {
    fn from(e: InputError) -> Self {
        Error::Refused(Refusal::InvalidInput(e))
    }
}

impl From<Refusal> for Error {
    fn from(refusal: Refusal) -> Self {
        Error::Refused(refusal)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idemdb_core::fencing::FencingToken;

    /// The renewal loop (idemdb-core) retries sooner after an unknown outcome and stops at a
    /// refusal: the engine's side of that contract.
    #[test]
    fn an_unknown_outcome_is_transient_and_a_refusal_is_not() {
        let unknown = Error::OutcomeUnknown(Arc::new(std::io::Error::other("cut")));
        assert!(StoreError::is_transient(&unknown));
        assert!(unknown.refusal().is_none());
        let fenced = Error::from(Refusal::Fenced {
            presented: FencingToken::new(3).unwrap(),
            current: FencingToken::new(4).unwrap(),
        });
        assert!(!StoreError::is_transient(&fenced));
        assert!(matches!(fenced.refusal(), Some(Refusal::Fenced { .. })));
        assert!(!StoreError::is_transient(&Error::Refused(
            Refusal::UnknownRecord
        )));
    }
}
