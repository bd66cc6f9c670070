//! The database handle and its synchronous operations.

use std::fmt;
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

use redb::{Database, ReadTransaction, ReadableDatabase};

use crate::builder::{Builder, FileSize};
use crate::clock::Clock;
use crate::compactor::{CompactionReport, Compactor, compact};
use crate::config::{Limits, WriterConfig};
use crate::engine::Engine;
use crate::error::{Error, ExecuteError};
use crate::fingerprint::{Fingerprint, Fingerprinter, Payload};
use crate::locate::Layout;
use crate::meta::{self, INFLIGHT};
use crate::ops::{
    Prepared, done_answer, execute_answer, extend_answer, finish_with_answer, is_fenced,
    is_fenced_db, prepare_run, reserve_answer, run_answer,
};
use crate::outcome::{ExecuteOutcome, Outcome, ReserveOutcome};
use crate::record::{Record, RecordState};
use crate::reentry::refuse_reentry;
use crate::retention::Retention;
use crate::scope::{Key, RecordKey, Scope};
use crate::stats::Counter;
use crate::stats::Stats;
use crate::timer::Timer;
use crate::token::Reservation;
use crate::tx::Tx;
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
    committer: Option<JoinHandle<()>>,
    compactor: Option<Compactor>,
    /// Started by the first async wait that needs a deadline.
    timer: OnceLock<Timer>,
    retention: Retention,
    /// Where its size is read, for `stats`.
    file: FileSize,
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
        if let Some(committer) = self.committer.take() {
            // A panic there already poisoned the writer; nothing is left to answer.
            let _ = committer.join();
        }
    }
}

impl IdemDb {
    /// Opens (or creates) the database at `path` with default settings.
    pub fn open(path: impl AsRef<std::path::Path>) -> Result<IdemDb, Error> {
        Builder::default().open(path)
    }

    /// Settings for opening a database.
    pub fn builder() -> Builder {
        Builder::default()
    }

    pub(crate) fn from_parts(
        db: Database,
        clock: Arc<dyn Clock>,
        limits: Limits,
        config: WriterConfig,
        retention: Retention,
        file: FileSize,
    ) -> Result<IdemDb, Error> {
        let rules = retention.rules();
        let meta = meta::load_or_init(&db, &rules)?;
        let layout = Layout::load(&db, rules, meta.index_seed, clock.now_ms())?;
        let engine = Arc::new(Engine::new(
            Arc::new(db),
            Arc::clone(&clock),
            limits,
            meta.database_id,
            Arc::new(layout),
        ));
        let writer = Arc::new(Writer::new(Arc::clone(&engine), config, meta.next_token));
        let committer = {
            let writer = Arc::clone(&writer);
            std::thread::Builder::new()
                .name("idemdb-committer".into())
                .spawn(move || writer.run_committer())
                .map_err(|e| Error::ThreadSpawn {
                    thread: "committer",
                    source: Arc::new(e),
                })?
        };
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
            committer: Some(committer),
            compactor,
            timer: OnceLock::new(),
            retention,
            file,
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

    /// Reserves the intent `key` in `scope` for the request `payload`, atomically.
    ///
    /// Returns exactly one [`ReserveOutcome`]; see docs/semantics.md for the full table. On
    /// `Acquired` the IN_PROGRESS record is durable and leased for `lease`; the caller runs
    /// the work and then calls [`complete`](Self::complete), [`fail`](Self::fail) or
    /// [`release`](Self::release). Replays and in-progress answers come from a snapshot
    /// without waiting for the writer.
    pub fn reserve<'p>(
        &self,
        scope: &Scope,
        key: &Key,
        payload: impl Into<Payload<'p>>,
        lease: Duration,
    ) -> Result<ReserveOutcome, Error> {
        let outcome = match self.prepare_reserve(scope, key, payload.into(), lease)? {
            Prepared::Answer(outcome) => Ok(outcome),
            Prepared::Submit(op) => self.writer.submit(op).and_then(reserve_answer),
        };
        self.counted_reserve(outcome)
    }

    /// Like [`reserve`](Self::reserve), but a duplicate that finds the intent IN_PROGRESS waits,
    /// in this process, until the owner completes, fails or releases it (it is woken by the
    /// owner's commit, not by polling), or until its lease runs out and it may take over, or
    /// until `timeout` passes, when it returns `InProgress`.
    ///
    /// The timeout is measured in real time; lease expiry by the database's clock.
    pub fn reserve_or_wait<'p>(
        &self,
        scope: &Scope,
        key: &Key,
        payload: impl Into<Payload<'p>>,
        lease: Duration,
        timeout: Duration,
    ) -> Result<ReserveOutcome, Error> {
        let wait = self.prepare_wait(scope, key, payload.into(), lease, timeout)?;
        let waiter = self.engine.waits.register(&wait.key);
        loop {
            let seen = waiter.generation();
            let outcome = match self.prepare_attempt(&wait)? {
                Prepared::Answer(outcome) => outcome,
                Prepared::Submit(op) => reserve_answer(self.writer.submit(op)?)?,
            };
            let Some(until) = wait.next_look(&outcome) else {
                return self.counted_reserve(Ok(outcome));
            };
            waiter.wait_past(seen, until);
        }
    }

    /// Finishes the reservation with success: the record becomes COMPLETED and `response` is
    /// replayed, byte for byte, to every duplicate.
    ///
    /// Refused with [`Error::Fenced`] if the reservation was taken over,
    /// [`Error::UnknownRecord`] if it was released or expired, [`Error::NotInProgress`] if it was already
    /// finished; nothing changes then.
    pub fn complete(
        &self,
        reservation: &Reservation,
        response: impl Into<Vec<u8>>,
    ) -> Result<(), Error> {
        let op = self.prepare_finish(reservation, RecordState::Completed, response.into())?;
        let done = self.writer.submit(op).and_then(done_answer);
        self.counted_owner(done, Some(Counter::Finished), is_fenced)
    }

    /// Finishes the reservation with a deterministic failure (a declined card): the record
    /// becomes FAILED and `response` is replayed to every duplicate, which never re-executes.
    /// Refused as [`complete`](Self::complete) is.
    pub fn fail(
        &self,
        reservation: &Reservation,
        response: impl Into<Vec<u8>>,
    ) -> Result<(), Error> {
        let op = self.prepare_finish(reservation, RecordState::Failed, response.into())?;
        let done = self.writer.submit(op).and_then(done_answer);
        self.counted_owner(done, Some(Counter::Finished), is_fenced)
    }

    /// Gives the intent up after a transient failure: the record is removed, so the next retry
    /// executes. Refused as [`complete`](Self::complete) is.
    pub fn release(&self, reservation: &Reservation) -> Result<(), Error> {
        let done = self
            .prepare_release(reservation)
            .and_then(|op| self.writer.submit(op))
            .and_then(done_answer);
        self.counted_owner(done, Some(Counter::Releases), is_fenced)
    }

    /// Renews the lease for long work: it now runs out `lease` from now. Updates
    /// `reservation`'s expiry. Refused as [`complete`](Self::complete) is; an owner whose lease
    /// ran out but who was not taken over may still extend, until the record expires (a TTL
    /// after the lease's end).
    pub fn extend(&self, reservation: &mut Reservation, lease: Duration) -> Result<(), Error> {
        let op = self.prepare_extend(reservation, lease)?;
        let done = self
            .writer
            .submit(op)
            .and_then(|out| extend_answer(out, reservation));
        self.counted_owner(done, None, is_fenced)
    }

    /// The two-step flow's second step: runs `business` and marks the record COMPLETED with
    /// `response`, in one commit. If `business` returns `Err`, nothing it wrote commits and the
    /// record stays IN_PROGRESS (retry, or release). Refused, without running `business`, as
    /// [`complete`](Self::complete) is.
    ///
    /// The closure may run on another caller's thread (the one leading the group commit), so it
    /// must be `Send + 'static`: move what it needs into it. It runs inside the commit: it must
    /// not call this database (such a call fails with [`Error::Reentrant`]); write through the
    /// [`Tx`]. A panic in it is resumed on the calling thread, after its writes were rolled
    /// back.
    pub fn complete_with<F, E>(
        &self,
        reservation: &Reservation,
        response: impl Into<Vec<u8>>,
        business: F,
    ) -> Result<(), ExecuteError<E>>
    where
        F: FnOnce(&mut Tx<'_>) -> Result<(), E> + Send + 'static,
        E: Send + 'static,
    {
        let (op, error) = self.prepare_finish_with(
            reservation,
            RecordState::Completed,
            response.into(),
            business,
        )?;
        self.counted_owner(
            finish_with_answer(self.writer.submit(op), &error),
            Some(Counter::Finished),
            is_fenced_db,
        )
    }

    /// As [`complete_with`](Self::complete_with), but the record becomes FAILED: a
    /// deterministic failure recorded together with the business writes that go with it.
    pub fn fail_with<F, E>(
        &self,
        reservation: &Reservation,
        response: impl Into<Vec<u8>>,
        business: F,
    ) -> Result<(), ExecuteError<E>>
    where
        F: FnOnce(&mut Tx<'_>) -> Result<(), E> + Send + 'static,
        E: Send + 'static,
    {
        let (op, error) =
            self.prepare_finish_with(reservation, RecordState::Failed, response.into(), business)?;
        self.counted_owner(
            finish_with_answer(self.writer.submit(op), &error),
            Some(Counter::Finished),
            is_fenced_db,
        )
    }

    /// The one-shot flow: reserves, runs `body` and records its [`Outcome`], all in one write
    /// transaction and one commit, so the record and `body`'s own writes are durable together
    /// or not at all.
    ///
    /// A duplicate gets the stored outcome (or `Mismatch`, or `InProgress` if a two-step owner
    /// holds the key) and `body` does not run. If `body` returns `Err`, nothing is committed
    /// and the error is returned: the next retry runs it again. `body` must be `Send +
    /// 'static` and must not call this database, as for [`complete_with`](Self::complete_with).
    ///
    /// `body` should be pure database work: if it also calls an outside system, that call is
    /// not undone when the transaction rolls back (a closure error, a response over
    /// [`Limits::max_response_len`], a failed commit). Use the two-step flow for outside side
    /// effects.
    pub fn execute<'p, F, E>(
        &self,
        scope: &Scope,
        key: &Key,
        payload: impl Into<Payload<'p>>,
        body: F,
    ) -> Result<ExecuteOutcome, ExecuteError<E>>
    where
        F: FnOnce(&mut Tx<'_>) -> Result<Outcome, E> + Send + 'static,
        E: Send + 'static,
    {
        match self.prepare_execute(scope, key, payload.into(), body)? {
            (Prepared::Answer(outcome), _) => self.counted_execute(Ok(outcome)),
            (Prepared::Submit(op), error) => {
                self.counted_execute(execute_answer(self.writer.submit(op), &error))
            }
        }
    }

    /// Runs `body` in a write transaction of its own with no dedupe record, and commits it
    /// durably (group-committed with other callers' writes). For writes that are idempotent
    /// by construction: the version guards on [`Tx`] ([`Tx::apply_if_newer`],
    /// [`Tx::compare_and_set`], [`Tx::upsert`]). If `body` returns `Err`, nothing it wrote
    /// commits. `body` must be `Send + 'static` and must not call this database, as for
    /// [`complete_with`](Self::complete_with).
    pub fn run<T, E, F>(&self, body: F) -> Result<T, ExecuteError<E>>
    where
        F: FnOnce(&mut Tx<'_>) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: Send + 'static,
    {
        let (op, error) = prepare_run(body);
        run_answer(self.writer.submit(op), &error)
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
    /// only durable state: if the writer has non-durable commits in flight, this waits for the
    /// durable commit that covers them.
    pub fn begin_read(&self) -> Result<ReadTransaction, Error> {
        let txn = self.engine.db.begin_read()?;
        if let Some(seq) = self.engine.durability.pending_any() {
            self.engine.durability.wait(seq)?;
        }
        Ok(txn)
    }
}
