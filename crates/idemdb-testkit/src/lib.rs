//! # idemdb-testkit
//!
//! What idemdb's tests, benches and fuzz targets share, and no shipped crate depends on:
//! - [`FaultBackend`]: a fault-injecting, power-loss-simulating redb
//!   [`StorageBackend`](idemdb::redb::StorageBackend);
//! - a crash workload with a model of what was acknowledged ([`run_workload`],
//!   [`check_recovered`]) and scripted steps ([`run_steps`]);
//! - [`postgres`]: a real, throwaway PostgreSQL server.
//!
//! It reaches the engine's internals only through `idemdb::testing` (idemdb's feature
//! `test-hooks`, hidden from its docs).

#![forbid(unsafe_code)]

mod backend;
pub mod postgres;
mod steps;
mod workload;

pub use backend::{Fate, Fault, FaultBackend, SECTOR, TearMode};
pub use steps::{Step, run_steps};
pub use workload::{
    Checkpoints, CrashCheck, KeyLog, Script, check_recovered, check_recovered_or_refused,
    check_tokens_after_loss, open_workload, open_workload_as, run_script, run_workload,
};
