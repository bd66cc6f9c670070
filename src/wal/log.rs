//! The log file: `Log` (append + `fdatasync`, growth, recycling, the cycle sector), its
//! creation and the I/O error that names its path.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use redb::StorageBackend;

use crate::config::GROW_STEP;
use crate::error::Error;

use super::frame::{
    ALIGN, CYCLE_AT, Effect, FRAMES_START, encode_cycle, encode_frame, encode_header,
};
use super::state::LogState;

/// The log file as an open finds it.
pub(crate) enum LogFile {
    /// Open for reading and writing: a file, or a storage backend (`path: None`).
    Open {
        file: Box<dyn StorageBackend>,
        path: Option<PathBuf>,
    },
    /// No file at `path`: created only once the open goes ahead (a refused open creates
    /// nothing).
    Absent { path: PathBuf },
}

impl LogFile {
    pub(crate) fn path(&self) -> Option<&Path> {
        match self {
            LogFile::Open { path, .. } => path.as_deref(),
            LogFile::Absent { path } => Some(path),
        }
    }
}

/// The log of one open database. Owned by the writer's leader state: appends and
/// checkpoints are serialised by the leader lock.
pub(crate) struct Log {
    file: Box<dyn StorageBackend>,
    path: Option<PathBuf>,
    database_id: u64,
    /// Its identity and the checkpoint it was created at (as recorded in the database).
    id: u64,
    since: u64,
    /// The checkpoint its cycle sector durably holds (`None`: not known to hold one): the
    /// frames written follow it.
    cycle: Option<u64>,
    /// Its size at creation, and the unit it grows by.
    step: u64,
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
    /// The log in `file`, as the database records it in `state`, whose cycle sector holds
    /// `cycle`, after the checkpoint `last_seq`: the next frame is written at its start, once
    /// the cycle sector says `last_seq`.
    pub(crate) fn opened(
        file: Box<dyn StorageBackend>,
        path: Option<PathBuf>,
        database_id: u64,
        (state, cycle): (LogState, Option<u64>),
        last_seq: u64,
        step: u64,
    ) -> Result<Log, Error> {
        let mut log = Log {
            file,
            path,
            database_id,
            id: state.id,
            since: state.since,
            cycle,
            step,
            end: FRAMES_START,
            len: state.len,
            last_seq,
            gauges: LogGauges::default(),
        };
        log.checkpointed()?;
        Ok(log)
    }

    /// Appends one frame holding `effects` and waits for it to be durable: `Ok(true)`.
    /// `Ok(false)` when the frame did not fit: nothing was appended, and the file was grown
    /// (zero-filled and synced) to hold it; the batch's durability point must then be a
    /// durable commit, which records the new length (a cut log is told by its length, so no
    /// frame lies past the length the database recorded). An error leaves the frame's
    /// durability unknown: the caller must stop writing (a failed `fdatasync` is never
    /// retried).
    pub(crate) fn append(&mut self, effects: &[Effect]) -> Result<bool, Error> {
        let seq = self.last_seq + 1;
        let frame = encode_frame(seq, self.database_id, effects);
        let end = self.end + frame.len() as u64;
        if end > self.len {
            self.grow(end)?;
            return Ok(false);
        }
        self.file
            .write(self.end, &frame)
            .map_err(|e| self.error("write", e))?;
        self.file.sync_data().map_err(|e| self.error("sync", e))?;
        self.end = end;
        self.last_seq = seq;
        self.gauges.set(self.len, self.bytes_since_checkpoint());
        Ok(true)
    }

    /// Bytes of frames not yet covered by a checkpoint.
    pub(crate) fn bytes_since_checkpoint(&self) -> u64 {
        self.end - FRAMES_START
    }

    /// The sequence number a checkpoint taken now records.
    pub(crate) fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// What a durable commit taken now records of the log: with `in_use`, until a clean close.
    pub(crate) fn state(&self, in_use: bool) -> LogState {
        LogState {
            id: self.id,
            len: self.len,
            since: self.since,
            in_use,
        }
    }

    /// A durable redb commit recorded `last_seq`: every frame is redundant, and the next one
    /// is written at the start of the log's frames, once the cycle sector durably says that
    /// they follow `last_seq`. Recovery tells this cycle's frames (or a torn first one) from an
    /// older log by it. Old frames past the new ones have lower sequence numbers, which ends
    /// recovery's scan. An error leaves the log unusable: the caller must stop writing.
    pub(crate) fn checkpointed(&mut self) -> Result<(), Error> {
        self.end = FRAMES_START;
        self.gauges.set(self.len, 0);
        if self.cycle != Some(self.last_seq) {
            let sector = encode_cycle(self.database_id, self.id, self.last_seq);
            self.file
                .write(CYCLE_AT, &sector)
                .map_err(|e| self.error("write", e))?;
            self.file.sync_data().map_err(|e| self.error("sync", e))?;
            self.cycle = Some(self.last_seq);
        }
        Ok(())
    }

    /// The log's sizes, kept current.
    pub(crate) fn gauges(&self) -> LogGauges {
        self.gauges.clone()
    }

    /// Extends the zero-filled file to hold `need` bytes, at least doubling it, durably.
    fn grow(&mut self, need: u64) -> Result<(), Error> {
        let target = need.max(self.len.saturating_mul(2)).div_ceil(self.step) * self.step;
        zero_fill(&*self.file, self.len, target).map_err(|e| self.error("grow", e))?;
        self.file.sync_data().map_err(|e| self.error("sync", e))?;
        self.len = target;
        self.gauges.set(self.len, self.bytes_since_checkpoint());
        Ok(())
    }

    fn error(&self, action: &'static str, e: io::Error) -> Error {
        log_io(self.path.as_deref(), action, e)
    }
}

/// An I/O error of the log at `path`.
pub(crate) fn log_io(path: Option<&Path>, action: &'static str, e: io::Error) -> Error {
    Error::LogIo {
        log: path.map(Path::to_path_buf),
        action,
        source: Arc::new(e),
    }
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

/// Makes the entries of `path`'s directory durable: a file created there survives a power
/// loss only once its name does.
pub(crate) fn sync_dir(path: &Path) -> io::Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    std::fs::File::open(dir)?.sync_all()
}

/// Writes a fresh log over `file`: its old content dropped, then the header, the cycle sector
/// (frames follow `checkpoint`) and a zero-filled first step, durable before the database
/// records it (and so before any frame).
pub(crate) fn create(
    file: &dyn StorageBackend,
    (database_id, log_id): (u64, u64),
    checkpoint: u64,
    size: u64,
) -> io::Result<u64> {
    let size = size.max(FRAMES_START + ALIGN);
    file.set_len(0)?;
    file.write(0, &encode_header(database_id, log_id))?;
    file.write(CYCLE_AT, &encode_cycle(database_id, log_id, checkpoint))?;
    zero_fill(file, FRAMES_START, size)?;
    file.sync_data()?;
    Ok(size)
}
