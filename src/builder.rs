//! Opening a database: settings, and the checks that it is one of ours.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use redb::backends::FileBackend;
use redb::{Key, StorageBackend, TableDefinition, Value};

use crate::config::{Limits, WriterConfig};
use crate::contain::contained;
use crate::db::IdemDb;
use crate::error::Error;
use crate::measured::Measured;
use crate::recovery::check_not_orphaned;
use crate::settings::{FileSize, Settings};
use crate::tables::TableRegistry;
use crate::wal::{LogFile, log_io};
use idemdb_core::clock::{Clock, SystemClock};
use idemdb_core::retention::Retention;

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
    cache_size: usize,
    memory_budget: Option<u64>,
    verify_on_open: bool,
    retention: Retention,
    tables: TableRegistry,
    accept_log_loss: bool,
    replay_cache: usize,
}

impl Default for Builder {
    fn default() -> Self {
        Builder {
            clock: Arc::new(SystemClock),
            limits: Limits::default(),
            writer: WriterConfig::default(),
            cache_size: crate::config::PAGE_CACHE_BYTES,
            memory_budget: None,
            verify_on_open: false,
            retention: Retention::default(),
            tables: TableRegistry::default(),
            accept_log_loss: false,
            replay_cache: crate::config::REPLAY_CACHE_BYTES,
        }
    }
}

impl Builder {
    /// The partition width where [`Retention::partition_width`] is not set.
    ///
    /// Narrow, because each checkpoint rewrites every B-tree page its records landed on, and
    /// keys are random: in a partition of the last few seconds those pages are few and new,
    /// in one of the last hour nearly all of its pages. One caller reserving and completing
    /// for 180 s (`--bench tail`): reserve p99.9 4.03× the fsync floor at 10 s, 4.80× at 1
    /// minute, 9.96× at 1 hour (docs/benchmarks.md). The price: a table per window that saw a
    /// record (at most 8,640 a day per TTL), each at least one 4 KiB page.
    pub const DEFAULT_PARTITION_WIDTH: std::time::Duration = crate::config::DEFAULT_PARTITION_WIDTH;

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

    /// Most operations one commit batch may carry (default 256; 0 is taken as 1).
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

    /// redb's quick-repair (default off): every durable redb commit (a checkpoint) also saves the allocator state
    /// (two-phase commit, a second fsync), so that opening after a crash skips the repair
    /// scan. docs/design.md gives both costs as measured.
    pub fn quick_repair(mut self, on: bool) -> Self {
        self.writer.quick_repair = on;
        self
    }

    /// Take a checkpoint once this many bytes of log frames follow the last one (default
    /// 32 MiB; at least 64 KiB). A checkpoint is one durable redb commit of what the frames
    /// hold, beside the writes. Bounds what recovery replays after a crash. The log file grows
    /// to about this size and is reused.
    pub fn checkpoint_bytes(mut self, bytes: u64) -> Self {
        self.writer.checkpoint_bytes = bytes.max(64 << 10);
        self
    }

    /// Take a checkpoint once log frames are this old (default 5 s; at least 1 ms). Bounds
    /// what recovery replays after a crash, and the cost of each checkpoint.
    pub fn checkpoint_interval(mut self, interval: std::time::Duration) -> Self {
        self.writer.checkpoint_interval = interval.max(std::time::Duration::from_millis(1));
        self
    }

    /// How long the committer thread, after committing a batch that held an async caller's
    /// op, spins for the next one before it sleeps (default 100 µs; at most 1 ms;
    /// `Duration::ZERO`: never spin). Async callers' next ops come about one thread wake-up
    /// after their answers; spinning through that gap saves waking the thread again, which
    /// on VMs whose idle CPUs halt costs about as much as an fsync. It costs up to this much
    /// CPU per async batch; sync callers never make it spin.
    pub fn committer_spin(mut self, spin: std::time::Duration) -> Self {
        self.writer.committer_spin = spin.min(crate::config::COMMITTER_SPIN_MAX);
        self
    }

    /// Test support (feature `test-hooks`): how many tokens each raise of the durable
    /// token ceiling reserves (default 1,048,576; at least 1). A small block makes every few
    /// acquisitions raise it, so that crash tests exercise that path (docs/design.md §7).
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn token_block(mut self, tokens: u64) -> Self {
        self.writer.token_block = tokens.max(1);
        self
    }

    /// Test support (feature `test-hooks`): the write-ahead log's size when it is
    /// created, and the unit it grows by (default 1 MiB; at least 1,536 bytes). A small log
    /// makes a test's disk images small and its runs grow the log often.
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn log_step(mut self, bytes: u64) -> Self {
        self.writer.log_step = bytes.max(1536);
        self
    }

    /// Test support (feature `test-hooks`): start the committer thread only when it is first
    /// needed (an async caller queues an op, or the log passes
    /// [`checkpoint_bytes`](Self::checkpoint_bytes)) instead of at open (default off).
    /// Until then no checkpoint is taken by age. A database used from one thread by sync
    /// callers then opens and closes without starting a thread: a fuzz target's every run
    /// saves the thread's start and the wake-ups of its shutdown.
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn lazy_committer(mut self, on: bool) -> Self {
        self.writer.lazy_committer = on;
        self
    }

    /// Test support (feature `test-hooks`): no applier thread. The overlay then reaches redb
    /// only through checkpoints, compaction steps and reads of redb itself, and the only
    /// checkpoints by size are the ones a leader takes at twice
    /// [`checkpoint_bytes`](Self::checkpoint_bytes): a test can tell when one happens.
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn without_applier(mut self) -> Self {
        self.writer.applier = false;
        self
    }

    /// Registers a caller table that closures write through [`Tx::open_table`](crate::Tx):
    /// its writes are logged (key and value bytes), so a batch running caller code is durable
    /// with one log append instead of a durable redb commit. Opening a database whose log
    /// holds writes to a table requires that table to be registered again.
    ///
    /// ```
    /// use idemdb::{IdemDb, Key, Outcome, Scope};
    /// use idemdb::redb::TableDefinition;
    /// const ORDERS: TableDefinition<&str, u64> = TableDefinition::new("orders");
    /// # let dir = tempfile::tempdir()?;
    /// let db = IdemDb::builder().table(ORDERS).open(dir.path().join("db"))?;
    /// db.execute(&Scope::new("order", "u1"), &Key::new("k1"), b"req", |tx| {
    ///     tx.open_table(ORDERS)?.insert("k1", 990)?;
    ///     Ok::<_, idemdb::Error>(Outcome::Completed(b"201".to_vec()))
    /// })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn table<K: Key + 'static, V: Value + 'static>(
        mut self,
        definition: TableDefinition<'static, K, V>,
    ) -> Self {
        self.tables.register(definition);
        self
    }

    /// Verify every page's checksum when opening (default: off). A file damaged since it was
    /// last written then fails to open with [`Error::Corrupted`] instead of being opened. The
    /// check reads the whole file: its time grows with the records held (at 50 million
    /// records, 32 s with the file in the page cache; docs/benchmarks.md §6), so it is off by
    /// default. Without it, damage is found when it is read: every record carries a checksum
    /// of its key and bytes, verified on every read, and a panic of redb's on a damaged page
    /// is contained; either way the one caller that read it gets [`Error::Corrupted`]
    /// (docs/design.md §3, §10). [`IdemDb::verify`](crate::IdemDb::verify) reads every
    /// record, beside the service.
    pub fn verify_on_open(mut self, on: bool) -> Self {
        self.verify_on_open = on;
        self
    }

    /// Retention: TTLs, partition width, beyond-horizon recognition and the background
    /// compactor (default: [`Retention::default`], a 24-hour TTL, partitions of
    /// [`DEFAULT_PARTITION_WIDTH`](Self::DEFAULT_PARTITION_WIDTH)).
    pub fn retention(mut self, retention: Retention) -> Self {
        self.retention = retention;
        self
    }

    /// Open even if the write-ahead log lacks outcomes the database acknowledged (default:
    /// off, and such an open fails with [`Error::LogRefused`]). For an operator who cannot
    /// restore the log as it was and knowingly accepts that some acknowledged answers are
    /// gone: retries of those intents will run again.
    ///
    /// Only when the open finds such a loss does this do anything: it keeps every intact frame
    /// the log still holds, raises the fencing-token ceiling above every token the two files
    /// show (by 2^40, so that no token issued before can be issued again), starts a fresh log,
    /// and notes the loss durably in the file ([`Stats::log_losses_accepted`],
    /// [`Stats::last_log_loss`], `idemdb stats`). A log of another database, or a log without
    /// its database file, is refused even so. The CLI's `idemdb accept-log-loss` does the same.
    ///
    /// [`Stats::log_losses_accepted`]: crate::Stats::log_losses_accepted
    /// [`Stats::last_log_loss`]: crate::Stats::last_log_loss
    pub fn accept_log_loss(mut self, accept: bool) -> Self {
        self.accept_log_loss = accept;
        self
    }

    /// Memory for finished records kept to answer replays (default 32 MiB; 0: none). A
    /// duplicate of a COMPLETED or FAILED intent whose record is here is answered from one
    /// hash probe, without reading the database; the oldest entries make room for new ones.
    /// Each entry costs its scoped key, its response and about 128 bytes. Answers are the
    /// same with or without it (docs/design.md §6).
    pub fn replay_cache(mut self, bytes: usize) -> Self {
        self.replay_cache = bytes;
        self
    }

    /// redb's page cache in bytes (default 64 MiB). It holds the B-tree pages last read and
    /// the pages written since the last checkpoint (at most half of it; more are written out
    /// early). A larger cache speeds up replays of keys whose pages it then holds: at 64 MiB,
    /// 128,764 replays/s at 10 million records and 91,079 at 50 million, where it holds the
    /// B-trees' upper branch levels and a part of the lowest (docs/benchmarks.md §6).
    pub fn cache_size(mut self, bytes: usize) -> Self {
        self.cache_size = bytes;
        self
    }

    /// The most memory an open may plan for (default: no limit): the page cache and the
    /// replay cache at their limits, plus the key index and the beyond-horizon map at the
    /// size the stored records need ([`MemoryUse`]). An open that would need more is
    /// refused with [`Error::MemoryBudget`], which gives each part, before anything is
    /// allocated for the records. What each record costs: docs/design.md §8.7.
    ///
    /// The budget is checked at open; records finished after it grow the key index (by 19 to
    /// 39 bytes each), which [`Stats::memory`](crate::Stats::memory) shows.
    ///
    /// ```
    /// # use idemdb::{Error, IdemDb};
    /// # let dir = tempfile::tempdir()?;
    /// let path = dir.path().join("db");
    /// // The caches alone (64 MiB + 32 MiB) are over a 32 MiB budget.
    /// let refused = IdemDb::builder().memory_budget(32 << 20).open(&path);
    /// assert!(matches!(refused, Err(Error::MemoryBudget { .. })));
    /// let db = IdemDb::builder()
    ///     .cache_size(8 << 20)
    ///     .replay_cache(4 << 20)
    ///     .memory_budget(32 << 20)
    ///     .open(&path)?;
    /// assert_eq!(db.stats().memory.page_cache, 8 << 20);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// [`MemoryUse`]: crate::MemoryUse
    pub fn memory_budget(mut self, bytes: u64) -> Self {
        self.memory_budget = Some(bytes);
        self
    }

    /// Opens the database at `path`, creating it if the file is missing or empty.
    ///
    /// Fails with [`Error::NotIdemdb`] for a file that is not an idemdb database, with
    /// [`Error::UnsupportedFormat`] for one written by a newer format, and with a storage
    /// error if another handle has the file open.
    ///
    /// The write-ahead log lives beside it, in `<path>-wal` (see docs/design.md §5.6), found
    /// from the file the path resolves to (through symbolic links), so that every spelling of
    /// the path finds the same log. The two files belong together: an open refuses
    /// ([`Error::LogRefused`]) a log that lacks outcomes the database acknowledged (missing,
    /// cut, older, damaged), a log of another database, and a log whose database file is
    /// missing or empty (restore the file, or delete the log to start afresh).
    pub fn open(self, path: impl AsRef<Path>) -> Result<IdemDb, Error> {
        self.validate()?;
        let path = resolve(path.as_ref())?;
        let log_path = log_path(&path);
        let db_len = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        let log = match OpenOptions::new().read(true).write(true).open(&log_path) {
            Ok(file) => {
                // Locked as redb locks the database: a second open fails here, as it would there.
                let file = FileBackend::new(file)?;
                check_not_orphaned(db_len, &file, Some(&log_path))?;
                LogFile::Open {
                    file: Box::new(file),
                    path: Some(log_path),
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                LogFile::Absent { path: log_path }
            }
            Err(e) => return Err(log_io(Some(&log_path), "open", e)),
        };
        let created = db_len == 0;
        let opened = contained("the database file", || {
            let db = self.redb_builder().create(&path).map_err(open_error)?;
            self.finish(db, FileSize::Path(path.clone()), log)
        })?;
        if created {
            // The new file's name must survive a power loss with what it acknowledges.
            crate::wal::sync_dir(&path)
                .map_err(|e| Error::Storage(Arc::new(redb::Error::Io(e))))?;
        }
        Ok(opened)
    }

    /// Opens the database over any [`redb::StorageBackend`]s, e.g. in-memory or
    /// fault-injecting ones: `db` for the redb file, `log` for its write-ahead log. Creates
    /// the database if `db` is empty.
    pub fn open_with_backend(
        self,
        db: impl StorageBackend,
        log: impl StorageBackend,
    ) -> Result<IdemDb, Error> {
        self.validate()?;
        check_not_orphaned(
            db.len()
                .map_err(|e| Error::Storage(Arc::new(redb::Error::Io(e))))?,
            &log,
            None,
        )?;
        let len = Arc::new(AtomicU64::new(0));
        contained("the database file", || {
            let db = self
                .redb_builder()
                .create_with_backend(Measured::new(db, Arc::clone(&len)))
                .map_err(open_error)?;
            let log = LogFile::Open {
                file: Box::new(log),
                path: None,
            };
            self.finish(db, FileSize::Backend(len), log)
        })
    }

    fn validate(&self) -> Result<(), Error> {
        self.limits.validate()?;
        Ok(self.retention.validate()?)
    }

    fn finish(self, db: redb::Database, size: FileSize, log: LogFile) -> Result<IdemDb, Error> {
        let settings = Settings {
            clock: self.clock,
            limits: self.limits,
            writer: self.writer,
            retention: self.retention,
            tables: self.tables,
            accept_log_loss: self.accept_log_loss,
            replay_cache: self.replay_cache,
            page_cache: self.cache_size,
            memory_budget: self.memory_budget,
        };
        IdemDb::from_parts(db, log, settings, size)
    }

    fn redb_builder(&self) -> redb::Builder {
        let mut b = redb::Builder::new();
        b.set_check_integrity_on_open(self.verify_on_open);
        b.set_cache_size(self.cache_size);
        b
    }
}

/// The file `path` names, with every symbolic link (of the file and of its directories)
/// resolved: its log is found beside that file, whatever the spelling of the path. A path to
/// no file yet resolves its directory, so the file and its log are created there.
fn resolve(path: &Path) -> Result<PathBuf, Error> {
    let io = |e: std::io::Error| Error::Storage(Arc::new(redb::Error::Io(e)));
    let mut path = path.to_path_buf();
    // A dangling link names the file it would create: follow it by hand (bounded, as the
    // kernel bounds link chains).
    for _ in 0..40 {
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.file_type().is_symlink() => {
                let target = std::fs::read_link(&path).map_err(io)?;
                path = match path.parent() {
                    Some(dir) => dir.join(target),
                    None => target,
                };
            }
            Ok(_) => return std::fs::canonicalize(&path).map_err(io),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
            Err(e) => return Err(io(e)),
        }
    }
    let name = path.file_name().ok_or_else(|| {
        io(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{} does not name a file", path.display()),
        ))
    })?;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    Ok(std::fs::canonicalize(dir).map_err(io)?.join(name))
}

/// Where the log of the database at `path` lives: `<path>-wal`.
pub(crate) fn log_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push("-wal");
    PathBuf::from(name)
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
