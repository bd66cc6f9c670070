//! # idemdb-postgres
//!
//! idemdb's semantics over PostgreSQL: the same `decide` and `check_owner` as the embedded
//! engine (both from idemdb-core; docs/semantics.md), for services whose instances share one
//! database. [`PgStore`] implements [`Store`], so the HTTP layer (crate `idemdb-http`),
//! [`Typed`] and [`Heartbeat`] run over it unchanged.
//!
//! Layout:
//! - builder.rs: `PgStoreBuilder` (`migrate`, `connect`); store.rs: `PgStore`, its shared
//!   state and the `Store` impl;
//! - reserve.rs: `reserve`, `reserve_or_wait`, `get`;
//! - batch.rs, batch_run.rs, batch_sql.rs: concurrent reserves and finishes gathered into
//!   one transaction, one round trip and one commit (the queue; who runs it; one batch);
//! - owner.rs: `complete`, `fail`, `release`, `extend`;
//! - execute.rs: `execute`, `complete_with`, `fail_with`: the caller's writes in the
//!   transaction that writes the record; inbox.rs: `consume`, `consume_batch` (a poll in one
//!   transaction, a savepoint per message) and `run` (no record);
//! - outbox.rs: `PgTx::stage`, the outbox's rows, stats and operator's tools; dispatch.rs:
//!   `PgDispatcher` (claims, publishing, marks); outbox_local.rs: the instance's wake-up and
//!   counters;
//! - schema.rs, rows.rs: the tables, versioned, and records as rows;
//! - sql.rs: the store's clock (the server's, read by each statement) and how a key is found;
//!   server_time.rs: what this instance last learnt of it;
//! - partitions.rs: time partitions and the compactor; wait.rs: LISTEN/NOTIFY;
//! - tls.rs: `sslmode` on rustls;
//! - errors.rs: refused, retried or outcome unknown, in the server's words.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod batch;
mod batch_run;
mod batch_sql;
mod builder;
mod dispatch;
mod error;
mod errors;
mod execute;
mod inbox;
mod outbox;
mod outbox_local;
mod owner;
mod partitions;
mod reserve;
mod rows;
mod schema;
mod server_time;
mod sql;
mod stats;
mod store;
mod tls;
mod wait;

pub use builder::PgStoreBuilder;
pub use dispatch::PgDispatcher;
pub use error::PgError;
pub use execute::{PgFuture, PgTx};
pub use inbox::pg_handler;
pub use partitions::PgCompaction;
pub use stats::PgStats;
pub use store::PgStore;

/// The tokio-postgres version the store is built on, for closures' statements.
pub use tokio_postgres;

pub use idemdb_core::{
    AsyncPublish, BeyondHorizonPolicy, Clock, Consumed, DispatchOptions, ExecuteError,
    ExecuteOutcome, FencingToken, Fingerprint, Heartbeat, InputError, Key, Limits, ManualClock,
    Message, MessageId, OutboxMessage, OutboxStats, Outcome, Payload, PublishError, Record,
    RecordKey, RecordState, Refusal, Reservation, ReserveOutcome, Retention, SagaStep, Scope,
    Store, StoreError, SystemClock, Typed, TypedOutcome,
};
