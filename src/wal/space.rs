//! The log file's zero-filled extent, shared by the leader (whose frame may not fit) and the
//! applier thread, which grows it ahead of the frames (`grow_ahead`) so that no batch waits
//! for a zero-fill.
//!
//! Invariants: a frame goes only below the log's recorded length (`Log::len`), which rises
//! only with a durable commit that records it (a batch's own growth raises it for the commit
//! that is that batch's durability point), and never above `filled`; `filled` is published only once the zeros
//! below it are synced; fills never run at once (`filling`), so none writes zeros where a
//! frame may already be.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;
use redb::StorageBackend;

use crate::config::GROW_STEP;

use super::frame::FRAMES_START;

/// The log's file length and the bytes of frames since the last checkpoint, kept current
/// for `stats` and the applier thread (which must not wait for the leader lock).
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

    pub(super) fn set(&self, len: u64, since: u64) {
        self.0[0].store(len, Ordering::Relaxed);
        self.0[1].store(since, Ordering::Relaxed);
    }

    pub(super) fn set_len(&self, len: u64) {
        self.0[0].store(len, Ordering::Relaxed);
    }

    pub(super) fn set_since(&self, since: u64) {
        self.0[1].store(since, Ordering::Relaxed);
    }
}

pub(crate) struct LogSpace {
    file: Arc<dyn StorageBackend>,
    /// The unit the file grows by.
    step: u64,
    /// The file's zero-filled and synced length.
    filled: AtomicU64,
    /// The log's recorded length, as the leader last set it.
    recorded: AtomicU64,
    filling: Mutex<()>,
    /// A fill ahead failed (a full disk, an I/O error): none is tried again, and a leader
    /// grows the log when a frame needs it, as it would without them.
    ahead_failed: AtomicBool,
    gauges: LogGauges,
}

impl LogSpace {
    /// `file`, zero-filled and synced up to `len`, which the database records.
    pub(super) fn new(
        file: Arc<dyn StorageBackend>,
        step: u64,
        len: u64,
        gauges: LogGauges,
    ) -> LogSpace {
        gauges.set(len, 0);
        LogSpace {
            file,
            step,
            filled: AtomicU64::new(len),
            recorded: AtomicU64::new(len),
            filling: Mutex::new(()),
            ahead_failed: AtomicBool::new(false),
            gauges,
        }
    }

    pub(super) fn filled(&self) -> u64 {
        self.filled.load(Ordering::Acquire)
    }

    pub(super) fn set_recorded(&self, len: u64) {
        self.recorded.store(len, Ordering::Release);
    }

    /// The length to grow a log of `len` to, for `need` bytes: at least double.
    pub(super) fn target(&self, len: u64, need: u64) -> u64 {
        need.max(len.saturating_mul(2)).div_ceil(self.step) * self.step
    }

    /// Zero-fills the file up to `to` and syncs it, unless it is filled that far already.
    pub(super) fn fill_to(&self, to: u64) -> io::Result<()> {
        let _filling = self.filling.lock();
        let from = self.filled();
        if from < to {
            zero_fill(&*self.file, from, to)?;
            self.file.sync_data()?;
            self.filled.store(to, Ordering::Release);
            self.gauges.set_len(to);
        }
        Ok(())
    }

    /// The applier thread's: once the frames since the checkpoint reach three quarters of the
    /// recorded length, and the file is not grown ahead already, doubles it. True when it
    /// grew: a checkpoint should then record the new length, before a frame needs it.
    pub(crate) fn grow_ahead(&self) -> bool {
        if self.ahead_failed.load(Ordering::Relaxed) {
            return false;
        }
        let len = self.recorded.load(Ordering::Acquire);
        let end = FRAMES_START + self.gauges.read().1;
        if end < len - len / 4 || self.filled() > len {
            return false;
        }
        match self.fill_to(self.target(len, 0)) {
            Ok(()) => true,
            Err(_) => {
                self.ahead_failed.store(true, Ordering::Relaxed);
                false
            }
        }
    }
}

/// Writes zeros over `from..to`.
pub(super) fn zero_fill(file: &dyn StorageBackend, from: u64, to: u64) -> io::Result<()> {
    let zeros = vec![0u8; GROW_STEP as usize];
    let mut at = from;
    while at < to {
        let n = (to - at).min(GROW_STEP);
        file.write(at, &zeros[..n as usize])?;
        at += n;
    }
    Ok(())
}
