//! # idemdb
//!
//! An embedded, crash-safe store for idempotency (dedupe) records, on [`redb`].
//!
//! A service links it in to remember which *intents* it has already executed, so that client
//! retries, gateway retries and queue redeliveries run the side effect once and every
//! duplicate gets the first answer back, byte for byte.
//!
//! - A record is named by a [`Scope`] (operation, principal) and a [`Key`].
//! - [`IdemDb::reserve`] is atomic: of concurrent duplicates exactly one is
//!   [`Acquired`](ReserveOutcome::Acquired); the others see
//!   [`InProgress`](ReserveOutcome::InProgress), or the stored response once it is finished.
//! - The same key with another payload is a [`Mismatch`](ReserveOutcome::Mismatch), never a
//!   replay.
//! - An IN_PROGRESS record carries a lease; after it runs out a duplicate takes over with a
//!   higher [`FencingToken`], and the old owner's late calls are refused with
//!   [`Error::Fenced`].
//! - [`IdemDb::execute`] and [`IdemDb::complete_with`] commit the record together with the
//!   caller's own redb tables, in one transaction.
//! - Every outcome returned is durable. Writes from concurrent callers share fsyncs (group
//!   commit).
//!
//! - The crate `idemdb-postgres` gives the same semantics to instances that share one
//!   PostgreSQL database; the [`Store`] trait, the HTTP layer (crate `idemdb-http`) and
//!   [`Typed`] take either store.
//!
//! See `docs/semantics.md` for every state × operation and `docs/design.md` for the layout.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod builder;
use idemdb_core::{clock, decide, fencing, fingerprint, outcome, renewal, scope, state, token};
mod config;
mod db;
mod durability;
mod engine;
mod engine_tables;
mod error;
mod guard;
mod inbox;
mod log_problem;
mod measured;
mod meta;
mod observe;
mod ops;
mod overlay;
mod record;
mod reentry;
mod replay_cache;
mod retention;
mod scan;
mod settings;
mod shard;
mod snapshot;
mod stats;
mod store;
mod tables;
#[cfg(feature = "test-hooks")]
#[doc(hidden)]
pub mod testing;
mod timer;
mod tx;
mod tx_table;
mod typed;
mod wait;
mod wal;
mod writer;

/// The redb version idemdb is built on, for the caller's own table definitions.
pub use redb;

pub use builder::Builder;
pub use clock::{Clock, ManualClock, SystemClock};
pub use config::Limits;
pub use db::IdemDb;
pub use error::{Error, ExecuteError, InputError, Refusal, StoreError};
/// Renews a lease on a thread of its own; see [`idemdb_core::Heartbeat`]. Over the embedded
/// engine its error is [`Error`].
pub type Heartbeat<E = Error> = idemdb_core::Heartbeat<E>;
pub use fingerprint::{Fingerprint, Payload};
pub use guard::{Guarded, Upserted, Versioned};
pub use idemdb_core::SagaStep;
pub use idemdb_core::TypedOutcome;
pub use idemdb_core::{BlockingStore, Store};
/// A typed view of a store ([`idemdb_core::Typed`]); over the embedded engine by default,
/// from [`IdemDb::typed`].
pub type Typed<'db, T, F = T, S = IdemDb> = idemdb_core::Typed<'db, T, F, S>;
pub use inbox::Consumed;
pub use log_problem::LogProblem;
pub use outcome::{ExecuteOutcome, Outcome, ReserveOutcome};
pub use record::{Record, RecordState};
pub use retention::compactor::CompactionReport;
pub use retention::{BeyondHorizonPolicy, Retention};
pub use scan::{Problem, ScanFilter, ScanSummary, ScannedRecord, StoredIn, VerifyReport};
pub use scope::{Key, Scope};
pub use stats::{HISTOGRAM_BUCKETS, Histogram, LogLoss, Stats};
pub use token::{FencingToken, Reservation};
pub use tx::Tx;
pub use tx_table::TxTable;
