//! The write-ahead log: the durability point of every batch whose writes it can replay.
//!
//! A batch's effects (its records, and a closure's caller tables), as absolute post-images,
//! are appended to the log as one frame and made durable by one `fdatasync` before anyone is
//! answered; redb gets them later, from the overlay. A checkpoint (a durable redb commit that
//! records the last frame's sequence number in meta) makes the frames before it redundant, and
//! the log is written again from its start once one is taken under the leader lock. At open,
//! the frames after the checkpoint are replayed (recovery.rs, above the record store). The
//! byte layout is in frame.rs and docs/design.md §5.6.
//!
//! - frame.rs: the byte layout of the header, the cycle sector and a frame;
//! - state.rs: what the database file records of its log (meta `log`, `log_losses`);
//! - log.rs: `Log`: append + `fdatasync`, growth, recycling, the cycle sector;
//! - scan.rs: what an open finds in the log, and the evidence that it lacks what the file
//!   relies on.

pub(crate) mod frame;
pub(crate) mod log;
pub(crate) mod scan;
pub(crate) mod state;

pub(crate) use frame::{Effect, fits};
pub(crate) use log::{Log, LogFile, LogGauges, log_io, sync_dir};
