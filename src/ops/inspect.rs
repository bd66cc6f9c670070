//! What a handle tells about itself and its records: [`IdemDb::get`], [`IdemDb::stats`],
//! [`IdemDb::begin_read`], the settings in force; and [`IdemDb::compact_now`].

use redb::{ReadTransaction, ReadableDatabase};

use crate::compactor::{CompactionReport, compact};
use crate::config::Limits;
use crate::db::IdemDb;
use crate::engine_tables::INFLIGHT;
use crate::error::Error;
use crate::record::Record;
use crate::reentry::refuse_reentry;
use crate::stats::Stats;
use idemdb_core::fingerprint::Fingerprint;
use idemdb_core::retention::Retention;
use idemdb_core::scope::{Key, RecordKey, Scope};

impl IdemDb {
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
        stats.horizon_keys = layout.horizon.tags_len() as u64;
        stats.indexed_keys = layout.index.len() as u64;
        stats.partitions_read_at_open = layout.partitions_read;
        stats.memory = crate::stats::MemoryUse {
            key_index: layout.index.memory_bytes(),
            key_filters: catalog
                .filtered()
                .iter()
                .filter_map(|p| p.filter())
                .map(|f| f.memory_bytes())
                .sum(),
            horizon: layout.horizon.memory_bytes(),
            ..self.caches
        };
        stats.replayed_frames = self.recovered.frames;
        stats.log_losses_accepted = self.recovered.losses;
        stats.last_log_loss = self.recovered.last_loss.clone();
        let (log_len, since) = self.log_gauges.read();
        stats.log_bytes_on_disk = log_len;
        stats.log_bytes_since_checkpoint = since;
        // Counted in redb: the overlay's records are written into it first. A failure here
        // poisoned the engine, and the counts are of what redb holds.
        let _ = self.writer.settle();
        // Counts that cannot be read (a damaged page) stay 0.
        let _ = crate::contain::contained("the tables' lengths", || {
            use redb::ReadableTableMetadata;
            let txn = self.engine.db.begin_read()?;
            let len = |t: Result<redb::ReadOnlyTable<&[u8], &[u8]>, redb::TableError>| {
                t.ok().and_then(|t| t.len().ok()).unwrap_or(0)
            };
            stats.in_flight_records = len(txn.open_table(INFLIGHT));
            // Recognised keys: on disk by hash, and those of rows memory holds that are not
            // there yet (a key in both counted once).
            let keys = txn
                .open_table(crate::records::recognised::RECOGNISED_KEYS)
                .ok();
            let on_disk = |hash: u64| {
                keys.as_ref()
                    .and_then(|k| k.get(hash).ok().flatten())
                    .is_some()
            };
            let pending: std::collections::BTreeSet<u64> = layout
                .horizon
                .pending()
                .iter()
                .flat_map(|row| row.hashes.iter().copied())
                .filter(|&h| !on_disk(h))
                .collect();
            stats.horizon_keys +=
                pending.len() as u64 + keys.as_ref().and_then(|k| k.len().ok()).unwrap_or(0);
            stats.stored_records = stats.in_flight_records
                + catalog
                    .parts()
                    .iter()
                    .map(|p| len(txn.open_table(p.table())))
                    .sum::<u64>();
            Ok(())
        });
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
        let pass = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            compact(&self.writer, self.engine.clock.now_ms())
        }));
        pass.unwrap_or_else(|panic| {
            // As the compactor thread does: what the pass left is unknown.
            let e = crate::contain::corrupted("a compaction pass", &*panic);
            self.engine.poison_with(e.to_string());
            Err(e)
        })
    }

    /// The loss of the write-ahead log this open accepted
    /// ([`Builder::accept_log_loss`](crate::Builder::accept_log_loss)), if it found one.
    pub fn accepted_log_loss(&self) -> Option<&crate::log_problem::LogProblem> {
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
    ///
    /// ```
    /// use idemdb::{IdemDb, Key, RecordState, ReserveOutcome, Scope};
    /// use std::time::Duration;
    /// # let dir = tempfile::tempdir()?;
    /// let db = IdemDb::open(dir.path().join("db"))?;
    /// let (scope, key) = (Scope::new("POST /orders", "user-7"), Key::new("intent-1"));
    /// assert!(db.get(&scope, &key)?.is_none());
    /// let ReserveOutcome::Acquired(owner) = db.reserve(&scope, &key, b"req", Duration::from_secs(30))? else {
    ///     panic!("a fresh key is acquired");
    /// };
    /// let record = db.get(&scope, &key)?.expect("reserved");
    /// assert_eq!((record.state, record.token), (RecordState::InProgress, owner.token()));
    /// db.complete(&owner, b"201".to_vec())?;
    /// let record = db.get(&scope, &key)?.expect("completed");
    /// assert_eq!((record.state, record.response), (RecordState::Completed, b"201".to_vec()));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
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
