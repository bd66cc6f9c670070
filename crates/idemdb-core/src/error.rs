//! What both stores refuse or fail with in common: invalid input, the protocol's refusals, and
//! the trait through which generic code reads either store's error.

use std::fmt;

use crate::fencing::FencingToken;
use crate::state::RecordState;

/// Why an input was refused. Nothing was written.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum InputError {
    /// A part that must not be empty was empty.
    Empty {
        /// Which part ("operation", "key").
        what: &'static str,
    },
    /// A part or response was longer than the configured limit.
    TooLong {
        /// Which part.
        what: &'static str,
        /// Its length in bytes.
        len: usize,
        /// The limit in bytes.
        max: usize,
    },
    /// More items than the configured limit.
    TooMany {
        /// Which items.
        what: &'static str,
        /// How many there would be.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// An outbox message was staged in a transaction without a record (`run`): its id
    /// derives from the record.
    StagedWithoutRecord,
    /// A lease of zero length was asked for.
    ZeroLease,
    /// A business table name used idemdb's reserved prefix `idemdb_`.
    ReservedTableName {
        /// The refused name.
        name: String,
    },
    /// An inbox consumer's scope holds a record written by something else (another payload):
    /// a consumer name was also used as an operation elsewhere.
    ConsumerScopeShared {
        /// The consumer name.
        consumer: String,
    },
}

impl fmt::Display for InputError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InputError::Empty { what } => write!(f, "{what} must not be empty"),
            InputError::TooLong { what, len, max } => {
                write!(f, "{what} is {len} bytes, more than the limit of {max}")
            }
            InputError::TooMany { what, count, max } => {
                write!(f, "{count} {what}, more than the limit of {max}")
            }
            InputError::StagedWithoutRecord => write!(
                f,
                "an outbox message can be staged only in the commit of a record (execute, \
                 complete_with, fail_with, an inbox handler): its id derives from the record"
            ),
            InputError::ZeroLease => write!(f, "a lease must be longer than zero"),
            InputError::ReservedTableName { name } => {
                write!(
                    f,
                    "table name {name:?} uses the reserved prefix \"idemdb_\""
                )
            }
            InputError::ConsumerScopeShared { consumer } => write!(
                f,
                "consumer {consumer:?} shares its scope with records of another payload: \
                 do not use a consumer name as an operation elsewhere"
            ),
        }
    }
}

impl std::error::Error for InputError {}

/// The protocol's refusals, the same for every store (docs/semantics.md): generic code reads
/// them from either store's error through [`StoreError::refusal`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refusal {
    /// The input was refused (see [`InputError`]); nothing changed.
    InvalidInput(InputError),
    /// The reservation's token is stale: the record was taken over.
    Fenced {
        /// The token the caller presented.
        presented: FencingToken,
        /// The token that owns the record now.
        current: FencingToken,
    },
    /// No live record exists for the reservation (released, or expired and gone).
    UnknownRecord,
    /// The record is no longer in progress.
    NotInProgress {
        /// Its state.
        state: RecordState,
    },
    /// The reservation was issued by another database.
    ForeignReservation,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::InvalidInput(e) => write!(f, "invalid input: {e}"),
            Refusal::Fenced { presented, current } => write!(
                f,
                "fencing token {presented} is stale: the record is now owned by token {current}"
            ),
            Refusal::UnknownRecord => write!(f, "no record exists for this reservation"),
            Refusal::NotInProgress { state } => {
                write!(f, "the record is {}, not in progress", state.as_str())
            }
            Refusal::ForeignReservation => write!(
                f,
                "the reservation was issued by another database; nothing changed"
            ),
        }
    }
}

/// What generic code (the HTTP layer, `Typed`, the lease renewal loop, a
/// service's own code over either store) needs to know of a store's error, whichever store it
/// came from.
pub trait StoreError: std::error::Error + Clone + Send + Sync + 'static {
    /// The protocol's refusal this error is, if it is one: the same for every store (each
    /// store's error holds it in one variant, `Refused`).
    fn refusal(&self) -> Option<&Refusal>;

    /// The invalid input this error refused, if that is what it is: nothing was written.
    fn input_error(&self) -> Option<&InputError> {
        match self.refusal() {
            Some(Refusal::InvalidInput(e)) => Some(e),
            _ => None,
        }
    }

    /// A write whose outcome is unknown: it may have committed. Read the record to learn it.
    fn is_outcome_unknown(&self) -> bool;

    /// Whether the same call may succeed if tried again later: the store was unreachable, or
    /// the outcome is unknown (an owner's token still owns the record either way).
    fn is_transient(&self) -> bool;

    /// A typed value that could not be encoded or decoded (`Typed`).
    fn codec(error: serde_json::Error) -> Self;

    /// A failure of idemdb itself, not of the store: a bug, or a thread it could not start
    /// (`Heartbeat`).
    fn internal(what: String) -> Self;
}

/// What a one-shot `execute` or `complete_with` call can fail with: the caller's own error
/// from the closure (nothing was committed), or the store's (`D`: `idemdb::Error` for the
/// embedded engine, `PgError` for PostgreSQL).
#[derive(Debug)]
pub enum ExecuteError<E, D> {
    /// The closure returned this error; neither its writes nor the record were committed.
    Closure(E),
    /// The database failed or refused.
    Db(D),
}

impl<E: fmt::Display, D: fmt::Display> fmt::Display for ExecuteError<E, D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExecuteError::Closure(e) => write!(f, "closure failed, nothing committed: {e}"),
            ExecuteError::Db(e) => write!(f, "{e}"),
        }
    }
}

impl<E, D> std::error::Error for ExecuteError<E, D>
where
    E: std::error::Error + 'static,
    D: std::error::Error + 'static,
{
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ExecuteError::Closure(e) => Some(e),
            ExecuteError::Db(e) => Some(e),
        }
    }
}

/// Bad input is the store's refusal, whatever the closure's error type.
impl<E, D: From<InputError>> From<InputError> for ExecuteError<E, D> {
    fn from(e: InputError) -> Self {
        ExecuteError::Db(e.into())
    }
}
