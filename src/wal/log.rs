//! The log file: `Log` (append + `fdatasync`, growth, recycling, the cycle sector), its
//! creation and the I/O error that names its path.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use redb::StorageBackend;

use crate::error::Error;

use super::frame::{
    ALIGN, CYCLE_AT, Effect, FRAMES_START, encode_cycle, encode_frame, encode_header,
};
use super::space::{LogGauges, LogSpace, zero_fill};
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
    pub(super) fn path(&self) -> Option<&Path> {
        match self {
            LogFile::Open { path, .. } => path.as_deref(),
            LogFile::Absent { path } => Some(path),
        }
    }
}

/// The log of one open database. Owned by the writer's leader state: appends and
/// checkpoints are serialised by the leader lock.
pub(crate) struct Log {
    file: Arc<dyn StorageBackend>,
    /// The file's zero-filled extent, which the applier thread may grow ahead.
    space: Arc<LogSpace>,
    path: Option<PathBuf>,
    database_id: u64,
    /// Its identity and the checkpoint it was created at (as recorded in the database).
    id: u64,
    since: u64,
    /// The checkpoint its cycle sector durably holds (`None`: not known to hold one): the
    /// frames written follow it.
    cycle: Option<u64>,
    /// Where the next frame goes.
    end: u64,
    /// The length the database records: no frame goes past it (the file may be longer).
    len: u64,
    /// The sequence number of the newest frame appended, or of the checkpoint.
    last_seq: u64,
    /// For `stats` (read without the leader lock).
    gauges: LogGauges,
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
    pub(super) fn opened(
        file: Box<dyn StorageBackend>,
        path: Option<PathBuf>,
        database_id: u64,
        (state, cycle): (LogState, Option<u64>),
        last_seq: u64,
        step: u64,
    ) -> Result<Log, Error> {
        let file: Arc<dyn StorageBackend> = Arc::from(file);
        let gauges = LogGauges::default();
        let space = LogSpace::new(Arc::clone(&file), step, state.len, gauges.clone());
        let mut log = Log {
            file,
            space: Arc::new(space),
            path,
            database_id,
            id: state.id,
            since: state.since,
            cycle,
            end: FRAMES_START,
            len: state.len,
            last_seq,
            gauges,
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
        self.gauges.set_since(self.bytes_since_checkpoint());
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
    /// Its length is the file's zero-filled one, which may be past `len` (grown ahead).
    pub(crate) fn state(&self, in_use: bool) -> LogState {
        LogState {
            id: self.id,
            len: self.space.filled(),
            since: self.since,
            in_use,
        }
    }

    /// A durable commit recorded `state`: frames may go up to its length from now on.
    pub(crate) fn recorded(&mut self, state: &LogState) {
        if state.len > self.len {
            self.len = state.len;
            self.space.set_recorded(state.len);
        }
    }

    /// The file's extent, for the applier thread to grow ahead.
    pub(crate) fn space(&self) -> Arc<LogSpace> {
        Arc::clone(&self.space)
    }

    /// A durable redb commit recorded `last_seq`: every frame is redundant, and the next one
    /// is written at the start of the log's frames, once the cycle sector durably says that
    /// they follow `last_seq`. Recovery tells this cycle's frames (or a torn first one) from an
    /// older log by it. Old frames past the new ones have lower sequence numbers, which ends
    /// recovery's scan. An error leaves the log unusable: the caller must stop writing.
    pub(crate) fn checkpointed(&mut self) -> Result<(), Error> {
        self.end = FRAMES_START;
        self.gauges.set_since(0);
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

    /// Extends the zero-filled file to hold `need` bytes, at least doubling it, durably
    /// (nothing to write if the applier grew it ahead that far). The caller's durable commit
    /// then records the length.
    fn grow(&mut self, need: u64) -> Result<(), Error> {
        let target = self.space.target(self.len, need);
        self.space
            .fill_to(target)
            .map_err(|e| self.error("grow", e))?;
        self.len = target;
        self.space.set_recorded(target);
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
pub(super) fn create(
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
