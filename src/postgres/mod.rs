//! The store over PostgreSQL (feature `postgres`): the same semantics as the embedded engine
//! (the same `decide` and `check_owner`, docs/semantics.md), for services whose instances
//! share one database.
//!
//! - builder.rs: `PgStoreBuilder` (`migrate`, `connect`); store.rs: `PgStore`, its shared
//!   state and the `Store` impl;
//! - reserve.rs: `reserve`, `reserve_or_wait`, `get`;
//! - owner.rs: `complete`, `fail`, `release`, `extend`;
//! - execute.rs: `execute`, `complete_with`, `fail_with`: the caller's writes in the
//!   transaction that writes the record; inbox.rs: `consume`, `consume_batch` (a poll in one
//!   transaction, a savepoint per message) and `run` (no record);
//! - schema.rs, rows.rs: the tables, versioned, and records as rows;
//! - sql.rs: the store's clock (the server's, read by each statement) and how a key is found;
//!   server_time.rs: what this instance last learnt of it;
//! - partitions.rs: time partitions and the compactor; wait.rs: LISTEN/NOTIFY;
//! - tls.rs: `sslmode` on rustls;
//! - errors.rs: refused, retried or outcome unknown, in the server's words.

mod builder;
mod error;
mod errors;
mod execute;
mod inbox;
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
pub use error::PgError;
pub use execute::{PgFuture, PgTx};
pub use inbox::pg_handler;
pub use partitions::PgCompaction;
pub use stats::PgStats;
pub use store::PgStore;
