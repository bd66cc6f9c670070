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
//!   [`Refusal::Fenced`].
//! - [`IdemDb::execute`] and [`IdemDb::complete_with`] commit the record together with the
//!   caller's own redb tables, in one transaction.
//! - Every outcome returned is durable. Writes from concurrent callers share fsyncs (group
//!   commit).
//! - [`Tx::stage`] stages an outbox [`Message`] in the record's commit; a [`Dispatcher`]
//!   delivers it at least once after that commit is durable, with a stable [`MessageId`] for
//!   the receiver's dedupe, in commit order per ordering key.
//!
//! - The crate `idemdb-postgres` gives the same semantics to instances that share one
//!   PostgreSQL database; the [`Store`] trait, the HTTP layer (crate `idemdb-http`) and
//!   [`Typed`] take either store.
//!
//! See `docs/semantics.md` for every state × operation and `docs/design.md` for the layout.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

// The layers, from the bottom up (docs/design.md §1; crates/idemdb-tests/tests/layers.rs
// fails on an import from a higher one).
// Foundation: errors, settings, counters, the engine's table names, wake-ups.
mod config;
mod contain;
mod durability;
mod engine_tables;
mod error;
mod log_problem;
mod measured;
mod observe;
mod outbox_row;
mod outbox_state;
mod record;
mod reentry;
mod shard;
mod stats;
mod timer;
mod wait;
// The write-ahead log.
mod wal;
// Caller tables and the closure's transaction handle.
mod guard;
mod tables;
mod tx;
mod tx_outbox;
mod tx_table;
// The record store: partitions, the key index, the overlay, the read snapshot.
mod records;
// Whole-file work beside the writer: the meta table and upgrades, recovery at open, redb's
// write buffer written out, scans.
mod meta;
mod recovery;
mod redb_buffer;
mod scan;
// The engine's shared state, the group-commit writer, the compactor above it.
mod compactor;
mod engine;
mod reclaim;
mod recognition;
mod widen;
mod writer;
// The handle and its builder; the public operations on it.
mod builder;
mod db;
mod ops;
mod settings;
#[cfg(feature = "test-hooks")]
#[doc(hidden)]
pub mod testing;

/// The redb version idemdb is built on, for the caller's own table definitions.
pub use redb;

pub use builder::Builder;
pub use config::Limits;
pub use db::IdemDb;
pub use error::{Error, ExecuteError, InputError, Refusal, StoreError};
pub use idemdb_core::clock::{Clock, ManualClock, SystemClock};
/// Renews a lease on a thread of its own; see [`idemdb_core::Heartbeat`]. Over the embedded
/// engine its error is [`Error`].
pub type Heartbeat<E = Error> = idemdb_core::Heartbeat<E>;
pub use guard::{Guarded, Upserted, Versioned};
pub use idemdb_core::SagaStep;
pub use idemdb_core::TypedOutcome;
pub use idemdb_core::fingerprint::{Fingerprint, Payload};
pub use idemdb_core::{BlockingStore, Store};
/// A typed view of a store ([`idemdb_core::Typed`]); over the embedded engine by default,
/// from [`IdemDb::typed`].
pub type Typed<'db, T, F = T, S = IdemDb> = idemdb_core::Typed<'db, T, F, S>;
pub use compactor::CompactionReport;
pub use idemdb_core::dispatch::{DispatchOptions, OutboxStats};
pub use idemdb_core::inbox::Consumed;
pub use idemdb_core::outbox::{Message, MessageId, OutboxMessage, Publish, PublishError};
pub use idemdb_core::outcome::{ExecuteOutcome, Outcome, ReserveOutcome};
pub use idemdb_core::retention::{BeyondHorizonPolicy, Retention};
pub use idemdb_core::scope::{Key, RecordKey, Scope};
pub use idemdb_core::token::{FencingToken, Reservation};
pub use log_problem::LogProblem;
pub use ops::Dispatcher;
pub use record::{Record, RecordState};
pub use scan::{Problem, ScanFilter, ScanSummary, ScannedRecord, StoredIn, VerifyReport};
pub use stats::{HISTOGRAM_BUCKETS, Histogram, LogLoss, MemoryUse, Stats};
pub use tx::Tx;
pub use tx_table::TxTable;
