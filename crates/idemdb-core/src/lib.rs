//! # idemdb-core
//!
//! What every idemdb store shares, whatever it stores in: a record's identity ([`Scope`],
//! [`Key`], [`RecordKey`]), its state and fencing token, the input limits, clocks, and the
//! errors both stores refuse with ([`InputError`], [`Refusal`], read through [`StoreError`]).
//!
//! Users depend on a store (`idemdb`, the embedded engine), which re-exports all of this;
//! a store implementation depends on this crate directly.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod clock;
pub mod error;
pub mod fencing;
pub mod limits;
pub mod scope;
pub mod state;

pub use clock::{Clock, ManualClock, SystemClock};
pub use error::{InputError, Refusal, StoreError};
pub use fencing::FencingToken;
pub use limits::Limits;
pub use scope::{Key, RecordKey, Scope};
pub use state::RecordState;
