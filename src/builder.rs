//! Opening a database: settings, and the checks that it is one of ours.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use redb::StorageBackend;

use crate::clock::{Clock, SystemClock};
use crate::config::{Limits, WriterConfig};
use crate::db::IdemDb;
use crate::error::Error;
use crate::measured::Measured;
use crate::retention::Retention;

/// Settings for opening an [`IdemDb`]; start with [`IdemDb::builder`].
///
/// ```
/// use idemdb::{IdemDb, Limits, ManualClock};
/// # let dir = tempfile::tempdir()?;
/// let clock = ManualClock::new(1_700_000_000_000);
/// let mut limits = Limits::default();
/// limits.max_response_len = 64 * 1024;
/// let db = IdemDb::builder()
///     .clock(clock.clone())
///     .limits(limits)
///     .max_batch(128)
///     .open(dir.path().join("dedupe.idemdb"))?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Builder {
    clock: Arc<dyn Clock>,
    limits: Limits,
    writer: WriterConfig,
    cache_size: Option<usize>,
    verify_on_open: bool,
    retention: Retention,
}

impl Default for Builder {
    fn default() -> Self {
        Builder {
            clock: Arc::new(SystemClock),
            limits: Limits::default(),
            writer: WriterConfig::default(),
            cache_size: None,
            verify_on_open: true,
            retention: Retention::default(),
        }
    }
}

impl Builder {
    /// The clock for leases and timestamps (default: [`SystemClock`]).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Input size limits (default: [`Limits::default`]).
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// Most operations one durable commit may carry (default 256; 0 is taken as 1).
    pub fn max_batch(mut self, max_batch: usize) -> Self {
        self.writer.max_batch = max_batch.max(1);
        self
    }

    /// Most operations waiting for a commit before callers wait for room (default 4,096; 0 is
    /// taken as 1).
    pub fn max_queue(mut self, max_queue: usize) -> Self {
        self.writer.max_queue = max_queue.max(1);
        self
    }

    /// redb's quick-repair (default off): every durable commit also saves the allocator state
    /// (two-phase commit, a second fsync), so that opening after a crash skips the repair
    /// scan. docs/design.md gives both costs as measured.
    pub fn quick_repair(mut self, on: bool) -> Self {
        self.writer.quick_repair = on;
        self
    }

    /// Verify every page's checksum when opening (default: on). A file damaged since it was
    /// last written then fails to open with [`Error::Corrupted`] instead of being trusted;
    /// without the check, redb may panic on such a file. The check reads the whole file (see
    /// docs/design.md for its cost); turn it off only for files you trust.
    pub fn verify_on_open(mut self, on: bool) -> Self {
        self.verify_on_open = on;
        self
    }

    /// Retention: TTLs, partition width, beyond-horizon recognition and the background
    /// compactor (default: [`Retention::default`], a 24-hour TTL).
    pub fn retention(mut self, retention: Retention) -> Self {
        self.retention = retention;
        self
    }

    /// redb's page cache size in bytes (default: redb's).
    pub fn cache_size(mut self, bytes: usize) -> Self {
        self.cache_size = Some(bytes);
        self
    }

    /// Opens the database at `path`, creating it if the file is missing or empty.
    ///
    /// Fails with [`Error::NotIdemdb`] for a file that is not an idemdb database, with
    /// [`Error::UnsupportedFormat`] for one written by a newer format, and with a storage
    /// error if another handle has the file open.
    pub fn open(self, path: impl AsRef<Path>) -> Result<IdemDb, Error> {
        self.validate()?;
        let path = path.as_ref();
        let db = self.redb_builder().create(path).map_err(open_error)?;
        self.finish(db, FileSize::Path(path.to_path_buf()))
    }

    /// Opens the database over any [`redb::StorageBackend`], e.g. an in-memory or a
    /// fault-injecting one, creating it if the backend is empty.
    pub fn open_with_backend(self, backend: impl StorageBackend) -> Result<IdemDb, Error> {
        self.validate()?;
        let len = Arc::new(AtomicU64::new(0));
        let db = self
            .redb_builder()
            .create_with_backend(Measured::new(backend, Arc::clone(&len)))
            .map_err(open_error)?;
        self.finish(db, FileSize::Backend(len))
    }

    fn validate(&self) -> Result<(), Error> {
        self.limits.validate()?;
        self.retention.validate()
    }

    fn finish(self, db: redb::Database, size: FileSize) -> Result<IdemDb, Error> {
        IdemDb::from_parts(
            db,
            self.clock,
            self.limits,
            self.writer,
            self.retention,
            size,
        )
    }

    fn redb_builder(&self) -> redb::Builder {
        let mut b = redb::Builder::new();
        b.set_check_integrity_on_open(self.verify_on_open);
        if let Some(bytes) = self.cache_size {
            b.set_cache_size(bytes);
        }
        b
    }
}

fn open_error(e: redb::DatabaseError) -> Error {
    match e {
        // redb's contract: storage that does not hold a redb database is an I/O error of
        // kind InvalidData (since redb 2.4).
        redb::DatabaseError::Storage(redb::StorageError::Io(io))
            if io.kind() == std::io::ErrorKind::InvalidData =>
        {
            Error::NotIdemdb(format!("not a redb database file ({io})"))
        }
        redb::DatabaseError::Storage(redb::StorageError::Corrupted(msg)) => Error::Corrupted(msg),
        other => other.into(),
    }
}

/// Where `stats()` finds the size of the database.
pub(crate) enum FileSize {
    Path(PathBuf),
    Backend(Arc<AtomicU64>),
}

impl FileSize {
    pub(crate) fn bytes(&self) -> u64 {
        match self {
            FileSize::Path(path) => std::fs::metadata(path).map(|m| m.len()).unwrap_or(0),
            FileSize::Backend(len) => len.load(Ordering::Relaxed),
        }
    }
}
