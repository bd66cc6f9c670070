//! The write-ahead log: the durability point of every batch whose writes it can replay.
//!
//! A batch's effects (its records, and a closure's caller tables), as absolute post-images,
//! are appended to the log as one frame and made durable by one `fdatasync` before anyone is
//! answered; redb gets them later, from the overlay. A checkpoint (a durable redb commit that
//! records the last frame's sequence number in meta) makes the frames before it redundant, and
//! the log is written again from its start once one is taken under the leader lock. At open,
//! the frames after the checkpoint are replayed (recover.rs). The byte layout is in frame.rs
//! and docs/design.md §5.6.

mod frame;
mod log;
mod recover;
mod scan;
mod state;

pub(crate) use frame::Effect;
pub(crate) use frame::fits;
#[cfg(feature = "test-hooks")]
pub(crate) use frame::fuzz;
#[cfg(feature = "test-hooks")]
pub(crate) use recover::read_log_record;
pub(crate) use recover::{Opening, Recovered, check_not_orphaned, open_log};
#[cfg(feature = "test-hooks")]
pub(crate) use scan::layout;
#[cfg(feature = "test-hooks")]
pub(crate) use state::LogState;

pub(crate) use log::{Log, LogFile, LogGauges, log_io, sync_dir};
