//! The database handle and its synchronous operations.

use std::fmt;
use std::sync::{Arc, OnceLock};

use redb::{Database, ReadTransaction, ReadableDatabase};

use crate::config::Limits;
use crate::engine::Engine;
use crate::engine_tables::INFLIGHT;
use crate::error::Error;
use crate::fingerprint::{Fingerprint, Fingerprinter};
use crate::meta;
use crate::record::Record;
use crate::reentry::refuse_reentry;
use crate::retention::Retention;
use crate::retention::compactor::{CompactionReport, Compactor, compact};
use crate::retention::locate::Layout;
use crate::scope::{Key, RecordKey, Scope};
use crate::settings::{FileSize, Settings};
use crate::stats::Stats;
use crate::timer::Timer;
use crate::writer::Writer;

/// An idempotency store in one redb file.
///
/// `IdemDb` is `Send + Sync`: share it by reference or in an [`Arc`]. Every write goes through
/// one group-commit writer; replays and in-progress answers are read from an MVCC snapshot and
/// never wait for it. Every outcome returned is durable: it survives a crash at any later
/// moment.
///
/// ```
/// use idemdb::{IdemDb, Key, ReserveOutcome, Scope};
/// use std::time::Duration;
///
/// # let dir = tempfile::tempdir()?;
/// let db = IdemDb::open(dir.path().join("dedupe.idemdb"))?;
/// let scope = Scope::new("POST /purchases", "user-42");
/// let key = Key::new("7f7d0c1e-intent");
/// let lease = Duration::from_secs(30);
///
/// match db.reserve(&scope, &key, b"{\"sku\":1}", lease)? {
///     ReserveOutcome::Acquired(reservation) => {
///         // ... charge the card, passing the key downstream ...
///         db.complete(&reservation, b"201 {\"order\":9}".to_vec())?;
///     }
///     other => panic!("fresh key: {other:?}"),
/// }
/// // A retry of the same intent gets the first answer, byte for byte.
/// assert_eq!(
///     db.reserve(&scope, &key, b"{\"sku\":1}", lease)?,
///     ReserveOutcome::Completed(b"201 {\"order\":9}".to_vec())
/// );
/// // The same key with another payload is refused.
/// assert_eq!(db.reserve(&scope, &key, b"{\"sku\":2}", lease)?, ReserveOutcome::Mismatch);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct IdemDb {
    pub(crate) engine: Arc<Engine>,
    pub(crate) writer: Arc<Writer>,
    pub(crate) fingerprinter: Fingerprinter,
    compactor: Option<Compactor>,
    /// Started by the first async wait that needs a deadline.
    timer: OnceLock<Timer>,
    retention: Retention,
    /// Where its size is read, for `stats`.
    file: FileSize,
    /// The log's sizes, for `stats`.
    log_gauges: crate::wal::LogGauges,
    recovered: crate::wal::Recovered,
}

impl fmt::Debug for IdemDb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdemDb")
            .field("limits", self.limits())
            .finish_non_exhaustive()
    }
}

impl Drop for IdemDb {
    /// Answers every queued operation (of dropped async callers) before the file closes.
    fn drop(&mut self) {
        if let Some(mut compactor) = self.compactor.take() {
            compactor.stop();
        }
        self.writer.shutdown();
        if let Some(committer) = self.writer.take_committer() {
            // A panic there already poisoned the writer; nothing is left to answer.
            let _ = committer.join();
        }
        self.writer.stop_applier();
        // A last checkpoint that records the log as no longer in use: a clean close leaves
        // nothing the next open needs from the log (it may then be removed or replaced).
        let _ = self.writer.close_log();
    }
}

impl IdemDb {
    pub(crate) fn from_parts(
        db: Database,
        log: crate::wal::LogFile,
        settings: Settings,
        file: FileSize,
    ) -> Result<IdemDb, Error> {
        let Settings {
            clock,
            limits,
            writer: config,
            retention,
            tables,
            accept_log_loss,
            replay_cache,
        } = settings;
        let rules = retention.rules(crate::Builder::DEFAULT_PARTITION_WIDTH);
        let meta = meta::load_or_init(&db, &rules)?;
        let opening = crate::wal::Opening {
            database_id: meta.database_id,
            tables: &tables,
            accept_loss: accept_log_loss,
            now_ms: clock.now_ms(),
            format_version: meta::FORMAT_VERSION,
            token_block: config.token_block,
            log_step: config.log_step,
        };
        let (log, recovered) = crate::wal::open_log(&db, log, &opening)?;
        let log_gauges = log.gauges();
        let layout = Layout::load(&db, rules, meta.index_seed, clock.now_ms())?;
        let engine = Arc::new(Engine::new(
            Arc::new(db),
            Arc::clone(&clock),
            limits,
            meta.database_id,
            Arc::new(layout),
            tables,
            replay_cache,
        ));
        let writer = Writer::start(
            Arc::clone(&engine),
            config,
            recovered.next_token,
            recovered.token_ceiling,
            log,
        )?;
        let compactor = match retention.compact_interval {
            Some(interval) => Some(Compactor::start(
                Arc::clone(&writer),
                Arc::clone(&clock),
                interval,
            )?),
            None => None,
        };
        Ok(IdemDb {
            engine,
            writer,
            fingerprinter: meta.fingerprinter,
            compactor,
            timer: OnceLock::new(),
            retention,
            file,
            log_gauges,
            recovered,
        })
    }

    /// Closes the database: answers every queued operation, then closes the file. The same
    /// as dropping it, spelled out.
    pub fn close(self) {
        drop(self);
    }

    pub(crate) fn timer(&self) -> Result<&Timer, Error> {
        if let Some(timer) = self.timer.get() {
            return Ok(timer);
        }
        // A racing second start loses the `set` and its thread is joined at once.
        let _ = self.timer.set(Timer::start()?);
        self.timer
            .get()
            .ok_or_else(|| Error::Internal("the timer was set but is missing".into()))
    }

    /// Counters of what the engine answered since open, and histograms of its commit batches.
    ///
    /// ```
    /// # use idemdb::{IdemDb, Key, Scope};
    /// # use std::time::Duration;
    /// # let dir = tempfile::tempdir()?;
    /// let db = IdemDb::open(dir.path().join("db"))?;
    /// let scope = Scope::new("op", "p");
    /// let _ = db.reserve(&scope, &Key::new("k"), b"a", Duration::from_secs(5))?;
    /// let _ = db.reserve(&scope, &Key::new("k"), b"b", Duration::from_secs(5))?;
    /// let stats = db.stats();
    /// assert_eq!((stats.acquired, stats.mismatches), (1, 1));
    /// assert_eq!(stats.batch_size.count, stats.commits);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn stats(&self) -> Stats {
        let mut stats = self.engine.stats.snapshot();
        let layout = &self.engine.layout;
        let catalog = layout.partitions.catalog();
        stats.partitions = catalog.parts().len() as u64;
        stats.horizon_keys = layout.horizon.len() as u64;
        stats.indexed_keys = layout.index.len() as u64;
        stats.replayed_frames = self.recovered.frames;
        stats.log_losses_accepted = self.recovered.losses;
        stats.last_log_loss = self.recovered.last_loss.clone();
        let (log_len, since) = self.log_gauges.read();
        stats.log_bytes_on_disk = log_len;
        stats.log_bytes_since_checkpoint = since;
        // Counted in redb: the overlay's records are written into it first. A failure here
        // poisoned the engine, and the counts are of what redb holds.
        let _ = self.writer.settle();
        if let Ok(txn) = self.engine.db.begin_read() {
            use redb::ReadableTableMetadata;
            let len = |t: Result<redb::ReadOnlyTable<&[u8], &[u8]>, redb::TableError>| {
                t.ok().and_then(|t| t.len().ok()).unwrap_or(0)
            };
            stats.in_flight_records = len(txn.open_table(INFLIGHT));
            stats.stored_records = stats.in_flight_records
                + catalog
                    .parts()
                    .iter()
                    .map(|p| len(txn.open_table(p.table())))
                    .sum::<u64>();
        }
        stats.bytes_on_disk = self.file.bytes();
        stats
    }

    /// Runs one compaction pass now, on this thread, at the database clock's time: drops
    /// every partition whose records have all expired (keeping their keys' tags for
    /// beyond-horizon recognition), removes abandoned IN_PROGRESS records, and retires horizon
    /// sets that ran out. Each step is a short durable transaction between the writer's
    /// batches; the background compactor does the same every
    /// [`Retention::compact_interval`].
    ///
    /// ```
    /// use idemdb::{IdemDb, Key, ManualClock, ReserveOutcome, Retention, Scope};
    /// use std::time::Duration;
    /// # let dir = tempfile::tempdir()?;
    /// let clock = ManualClock::new(1_700_000_000_000);
    /// let db = IdemDb::builder()
    ///     .clock(clock.clone())
    ///     .retention(
    ///         Retention::default()
    ///             .ttl(Duration::from_secs(600))
    ///             .partition_width(Duration::from_secs(600)),
    ///     )
    ///     .open(dir.path().join("db"))?;
    /// let (scope, key) = (Scope::new("op", "p"), Key::new("k"));
    /// let lease = Duration::from_secs(5);
    /// if let ReserveOutcome::Acquired(r) = db.reserve(&scope, &key, b"x", lease)? {
    ///     db.complete(&r, b"done".to_vec())?;
    /// }
    /// // Past the TTL (and the partition's window): the record is dropped with its partition.
    /// clock.advance(Duration::from_secs(30 * 60));
    /// let report = db.compact_now()?;
    /// assert_eq!((report.partitions_dropped, report.records_expired), (1, 1));
    /// // Gone, but recognised for 4 TTLs: a redrive this late is flagged, not silently re-run.
    /// match db.reserve(&scope, &key, b"x", lease)? {
    ///     ReserveOutcome::Acquired(r) => assert!(r.is_beyond_horizon()),
    ///     other => panic!("{other:?}"),
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn compact_now(&self) -> Result<CompactionReport, Error> {
        refuse_reentry()?;
        compact(&self.writer, self.engine.clock.now_ms())
    }

    /// The loss of the write-ahead log this open accepted
    /// ([`Builder::accept_log_loss`](crate::Builder::accept_log_loss)), if it found one.
    pub fn accepted_log_loss(&self) -> Option<&crate::LogProblem> {
        self.recovered.accepted.as_ref()
    }

    /// The retention in force.
    pub fn retention(&self) -> &Retention {
        &self.retention
    }

    /// The fingerprint of `payload` under this database's secret, as `reserve` computes it.
    pub fn fingerprint(&self, payload: &[u8]) -> Fingerprint {
        self.fingerprinter.fingerprint(payload)
    }

    /// The limits in force.
    pub fn limits(&self) -> &Limits {
        &self.engine.limits
    }

    /// A read-only view of the record for `key` in `scope`, for operators and tests. Waits if
    /// the record's newest state is not durable yet.
    pub fn get(&self, scope: &Scope, key: &Key) -> Result<Option<Record>, Error> {
        let record_key = RecordKey::encode(scope, key, self.limits())?;
        loop {
            let record = self
                .engine
                .snapshots
                .find(&record_key, self.engine.clock.now_ms())?
                .live;
            match self.engine.durability.pending_for(&record_key) {
                None => return Ok(record),
                Some(seq) => self.engine.durability.wait(seq)?,
            }
        }
    }

    /// A redb read transaction for the caller's own tables (and idemdb's, read-only). It shows
    /// only durable state: if the writer has non-durable commits in flight, this waits until
    /// their batch is durable (its log frame synced).
    pub fn begin_read(&self) -> Result<ReadTransaction, Error> {
        // From a closure it would wait for the closure's own commit (semantics.md §11).
        refuse_reentry()?;
        // Acknowledged records still in the overlay are written into redb first.
        self.writer.settle()?;
        let txn = self.engine.db.begin_read()?;
        if let Some(seq) = self.engine.durability.pending_any() {
            self.engine.durability.wait(seq)?;
        }
        Ok(txn)
    }
}
