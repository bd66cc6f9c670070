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
//! - Feature `postgres`: [`PgStore`] gives the same semantics to instances that share one
//!   PostgreSQL database; the [`Store`] trait, the HTTP layer (crate `idemdb-http`) and [`Typed`] take either store.
//!
//! See `docs/semantics.md` for every state × operation and `docs/design.md` for the layout.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod builder;
use idemdb_core::{clock, fencing, scope, state};
mod config;
mod db;
mod decide;
mod durability;
mod engine;
mod engine_tables;
mod error;
mod fingerprint;
mod guard;
mod heartbeat;
mod inbox;
mod log_problem;
mod measured;
mod meta;
mod observe;
mod ops;
mod outcome;
#[cfg(feature = "postgres")]
mod postgres;
mod record;
mod reentry;
mod renewal;
mod retention;
mod saga;
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
mod token;
mod tx;
mod tx_table;
mod typed;
mod wait;
mod wal;
mod writer;

/// The redb version idemdb is built on, for the caller's own table definitions.
pub use redb;
/// The tokio-postgres version the PostgreSQL store is built on, for closures' statements.
#[cfg(feature = "postgres")]
pub use tokio_postgres;

pub use builder::Builder;
pub use clock::{Clock, ManualClock, SystemClock};
pub use config::Limits;
pub use db::IdemDb;
pub use error::{Error, ExecuteError, InputError, Refusal, StoreError};
pub use fingerprint::{Fingerprint, Payload};
pub use guard::{Guarded, Upserted, Versioned};
pub use heartbeat::Heartbeat;
pub use inbox::Consumed;
pub use log_problem::LogProblem;
pub use outcome::{ExecuteOutcome, Outcome, ReserveOutcome};
#[cfg(feature = "postgres")]
pub use postgres::{
    PgCompaction, PgError, PgFuture, PgStats, PgStore, PgStoreBuilder, PgTx, pg_handler,
};
pub use record::{Record, RecordState};
pub use retention::compactor::CompactionReport;
pub use retention::{BeyondHorizonPolicy, Retention};
pub use saga::SagaStep;
pub use scan::{Problem, ScanFilter, ScanSummary, ScannedRecord, StoredIn, VerifyReport};
pub use scope::{Key, Scope};
pub use stats::{HISTOGRAM_BUCKETS, Histogram, LogLoss, Stats};
pub use store::Store;
pub use token::{FencingToken, Reservation};
pub use tx::Tx;
pub use tx_table::TxTable;
pub use typed::{Typed, TypedOutcome};
