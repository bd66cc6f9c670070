//! The write-ahead log: the durability point of every batch whose writes it can replay.
//!
//! A batch's redb transactions commit with `Durability::None`; their effects, as absolute
//! post-images, are appended to the log as one frame and made durable by one `fdatasync`
//! before anyone is answered. A checkpoint (a durable redb commit that records the last
//! frame's sequence number in meta) makes the frames before it redundant, and the log is
//! written again from its start. At open, the frames after the checkpoint are replayed
//! (recover.rs). The byte layout is in frame.rs and docs/design.md §5.6.

mod frame;
mod recover;

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use redb::StorageBackend;

pub(crate) use frame::Effect;
pub(crate) use frame::fits;
use frame::{HEADER_LEN, encode_frame, encode_header};
pub(crate) use recover::{Recovered, check_not_orphaned, open_log};

/// The log file preallocated at creation, and the step it grows by: zero-filled, so that an
/// append's `fdatasync` has no block allocation or file size to write.
const GROW_STEP: u64 = 1 << 20;

/// The log of one open database. Owned by the writer's leader state: appends and
/// checkpoints are serialised by the leader lock.
pub(crate) struct Log {
    file: Box<dyn StorageBackend>,
    database_id: u64,
    /// Where the next frame goes.
    end: u64,
    /// The file's zero-filled length.
    len: u64,
    /// The sequence number of the newest frame appended, or of the checkpoint.
    last_seq: u64,
    /// For `stats` (read without the leader lock).
    gauges: LogGauges,
}

/// The log's file length and the bytes of frames since the last checkpoint, kept current
/// for `stats` (which must not wait for the leader lock).
#[derive(Clone, Default)]
pub(crate) struct LogGauges(Arc<[AtomicU64; 2]>);

impl LogGauges {
    /// (file length, frame bytes since the last checkpoint)
    pub(crate) fn read(&self) -> (u64, u64) {
        (
            self.0[0].load(Ordering::Relaxed),
            self.0[1].load(Ordering::Relaxed),
        )
    }

    fn set(&self, len: u64, since: u64) {
        self.0[0].store(len, Ordering::Relaxed);
        self.0[1].store(since, Ordering::Relaxed);
    }
}

impl std::fmt::Debug for Log {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Log")
            .field("end", &self.end)
            .field("last_seq", &self.last_seq)
            .finish_non_exhaustive()
    }
}

impl Log {
    /// Appends one frame holding `effects` and waits for it to be durable. An error leaves
    /// the frame's durability unknown: the caller must stop writing (a failed `fdatasync` is
    /// never retried).
    pub(crate) fn append(&mut self, effects: &[Effect]) -> io::Result<()> {
        let seq = self.last_seq + 1;
        let frame = encode_frame(seq, self.database_id, effects);
        let end = self.end + frame.len() as u64;
        if end > self.len {
            self.grow(end)?;
        }
        self.file.write(self.end, &frame)?;
        self.file.sync_data()?;
        self.end = end;
        self.last_seq = seq;
        self.gauges.set(self.len, self.bytes_since_checkpoint());
        Ok(())
    }

    /// Bytes of frames not yet covered by a checkpoint.
    pub(crate) fn bytes_since_checkpoint(&self) -> u64 {
        self.end - HEADER_LEN
    }

    /// The sequence number a checkpoint taken now records.
    pub(crate) fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// A durable redb commit recorded `last_seq`: every frame is redundant, and the next one
    /// is written at the start of the log. Old frames past it have lower sequence numbers,
    /// which ends recovery's scan.
    pub(crate) fn checkpointed(&mut self) {
        self.end = HEADER_LEN;
        self.gauges.set(self.len, 0);
    }

    /// The log's sizes, kept current.
    pub(crate) fn gauges(&self) -> LogGauges {
        self.gauges.clone()
    }

    /// Extends the zero-filled file to hold `need` bytes, at least doubling it. The
    /// append's `fdatasync` makes it durable together with the frame.
    fn grow(&mut self, need: u64) -> io::Result<()> {
        let target = need.max(self.len.saturating_mul(2)).div_ceil(GROW_STEP) * GROW_STEP;
        zero_fill(&*self.file, self.len, target)?;
        self.len = target;
        Ok(())
    }
}

/// An I/O error of the log, as a storage error.
pub(crate) fn io_error(e: io::Error) -> crate::error::Error {
    crate::error::Error::Storage(std::sync::Arc::new(redb::Error::Io(e)))
}

/// Writes zeros over `from..to`.
fn zero_fill(file: &dyn StorageBackend, from: u64, to: u64) -> io::Result<()> {
    let zeros = vec![0u8; GROW_STEP as usize];
    let mut at = from;
    while at < to {
        let n = (to - at).min(GROW_STEP);
        file.write(at, &zeros[..n as usize])?;
        at += n;
    }
    Ok(())
}

/// Writes a fresh log: header and a zero-filled first step, durable before any frame.
fn create(file: &dyn StorageBackend, database_id: u64) -> io::Result<u64> {
    file.write(0, &encode_header(database_id))?;
    zero_fill(file, HEADER_LEN, GROW_STEP)?;
    file.sync_data()?;
    Ok(GROW_STEP)
}
