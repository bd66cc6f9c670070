//! # idemdb-core
//!
//! What every idemdb store shares, whatever it stores in: a record's identity ([`Scope`],
//! [`Key`], [`RecordKey`]), the [`Record`], its state and fencing token, [`Reservation`]s,
//! fingerprints, the outcomes of docs/semantics.md and the one function that decides them
//! ([`decide::decide`]), retention settings, the [`Store`] trait and what is built on it
//! ([`Typed`], [`Heartbeat`], the renewal loop), the input limits, clocks, the names of the
//! counters, and the errors both stores refuse with ([`InputError`], [`Refusal`], read through
//! [`StoreError`]).
//!
//! Users depend on a store (`idemdb`, the embedded engine, or `idemdb-postgres`), which
//! re-exports what a user names; a store implementation depends on this crate directly.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod clock;
pub mod counters;
pub mod decide;
pub mod dispatch;
pub mod error;
pub mod fencing;
pub mod fingerprint;
mod heartbeat;
pub mod inbox;
pub mod limits;
pub mod outbox;
pub mod outcome;
pub mod record;
pub mod renewal;
pub mod retention;
mod saga;
pub mod scope;
pub mod state;
mod store;
pub mod token;
mod typed;

pub use clock::{Clock, ManualClock, SystemClock};
pub use counters::{HISTOGRAM_BUCKETS, Histogram};
pub use dispatch::{DispatchOptions, OutboxStats};
pub use error::{ExecuteError, InputError, Refusal, StoreError};
pub use fencing::FencingToken;
pub use fingerprint::{Fingerprint, Payload};
pub use heartbeat::Heartbeat;
pub use inbox::Consumed;
pub use limits::Limits;
pub use outbox::{AsyncPublish, Message, MessageId, OutboxMessage, Publish, PublishError};
pub use outcome::{ExecuteOutcome, Outcome, ReserveOutcome};
pub use record::Record;
pub use retention::{BeyondHorizonPolicy, Retention};
pub use saga::SagaStep;
pub use scope::{Key, RecordKey, Scope};
pub use state::RecordState;
pub use store::{BlockingStore, Store};
pub use token::Reservation;
pub use typed::{Typed, TypedOutcome};
