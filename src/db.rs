//! The database handle: what it holds, how an open assembles it (the meta table, the log's
//! recovery, the layout, the writer and the compactor), and how it closes. Its public
//! operations are under ops/.

use std::fmt;
use std::sync::{Arc, OnceLock};

use redb::Database;

use crate::compactor::Compactor;
use crate::engine::Engine;
use crate::error::Error;
use crate::meta;
use crate::records::locate::Layout;
use crate::settings::{FileSize, Settings};
use crate::stats::MemoryUse;
use crate::timer::Timer;
use crate::writer::Writer;
use idemdb_core::fingerprint::Fingerprinter;
use idemdb_core::retention::Retention;

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
    pub(crate) retention: Retention,
    /// Where its size is read, for `stats`.
    pub(crate) file: FileSize,
    /// The log's sizes, for `stats`.
    pub(crate) log_gauges: crate::wal::LogGauges,
    pub(crate) recovered: crate::recovery::Recovered,
    /// The caches' limits, for `stats`.
    pub(crate) caches: MemoryUse,
}

impl fmt::Debug for IdemDb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdemDb")
            .field("limits", &self.engine.limits)
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
            page_cache,
            memory_budget,
        } = settings;
        let rules = retention.rules(crate::config::DEFAULT_PARTITION_WIDTH);
        let mut tables = tables;
        // The outbox's tables are written through the log like a registered caller table.
        tables.register(crate::engine_tables::OUTBOX);
        tables.register(crate::engine_tables::OUTBOX_PARKED);
        let meta = meta::load_or_init(&db, &rules)?;
        let caches = MemoryUse {
            page_cache: page_cache as u64,
            replay_cache: replay_cache as u64,
            ..MemoryUse::default()
        };
        if let Some(budget) = memory_budget {
            // Before the log's commit: a refused open writes nothing.
            crate::records::locate::check_budget(
                &db,
                meta.index_seed,
                clock.now_ms(),
                caches,
                budget,
            )?;
        }
        let opening = crate::recovery::Opening {
            database_id: meta.database_id,
            tables: &tables,
            accept_loss: accept_log_loss,
            now_ms: clock.now_ms(),
            format_version: meta.log_version(),
            token_block: config.token_block,
            log_step: config.log_step,
        };
        let (log, recovered) = crate::recovery::open_log(&db, log, &opening)?;
        if meta.version < meta::CHECKSUMMED {
            meta::checksum_records(&db)?;
        }
        if meta.version < meta::RECOGNITION_INDEXED {
            meta::index_recognition_rows(&db)?;
        }
        if meta.version < meta::FORMAT_VERSION {
            meta::admit_outbox(&db)?;
        }
        // The open's commit is a checkpoint with nothing written after it.
        crate::redb_buffer::write_out(&db, config.quick_repair)?;
        let log_gauges = log.gauges();
        let staged_up_to = crate::outbox_state::highest_staged(&db)?;
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
        engine.outbox.start_above(staged_up_to);
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
            caches,
        })
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
}
