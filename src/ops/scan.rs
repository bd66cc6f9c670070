//! Reading every stored record, for operators and tools: [`IdemDb::scan`] and
//! [`IdemDb::verify`] over one read transaction (the reading itself is scan.rs's).

use std::ops::ControlFlow;

use crate::contain::{CallerPanic, contained};
use crate::db::IdemDb;
use crate::error::Error;
use crate::scan::verify::VerifyReport;
use crate::scan::{ScanFilter, ScanSummary, ScannedRecord};

impl IdemDb {
    /// Visits the stored records that `filter` selects, one at a time, until `visit` returns
    /// [`ControlFlow::Break`]; streaming, so memory does not grow with the file.
    ///
    /// All records come from one read transaction (waiting, as [`begin_read`](Self::begin_read)
    /// does, until any write in flight is durable), so they are one consistent
    /// state; expiry is judged at one reading of the database clock. The transaction is held
    /// for the whole scan, which keeps the pages it reads from being reused: on a database
    /// that is being written, keep `visit` quick. A stored key or record that does not decode
    /// stops the scan with [`Error::Corrupted`] (use [`verify`](Self::verify) to list every
    /// such entry).
    ///
    /// ```
    /// use idemdb::{IdemDb, Key, RecordState, ReserveOutcome, ScanFilter, Scope};
    /// use std::ops::ControlFlow;
    /// use std::time::Duration;
    /// # let dir = tempfile::tempdir()?;
    /// let db = IdemDb::open(dir.path().join("db"))?;
    /// let lease = Duration::from_secs(30);
    /// for (op, key) in [("order", "a"), ("order", "b"), ("refund", "c")] {
    ///     if let ReserveOutcome::Acquired(r) = db.reserve(&Scope::new(op, "u1"), &Key::new(key), b"x", lease)? {
    ///         if key != "b" {
    ///             db.complete(&r, format!("done {key}"))?;
    ///         }
    ///     }
    /// }
    /// let mut done = Vec::new();
    /// let filter = ScanFilter::default().operation("order").state(RecordState::Completed);
    /// let summary = db.scan(&filter, |rec| {
    ///     done.push((rec.key.as_bytes().to_vec(), rec.record.response));
    ///     ControlFlow::Continue(())
    /// })?;
    /// assert_eq!(done, [(b"a".to_vec(), b"done a".to_vec())]);
    /// assert_eq!(summary.visited, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn scan(
        &self,
        filter: &ScanFilter,
        visit: impl FnMut(ScannedRecord) -> ControlFlow<()>,
    ) -> Result<ScanSummary, Error> {
        self.scan_with_progress(filter, |_| {}, visit)
    }

    /// [`scan`](Self::scan), also calling `progress` with the number of stored entries read so
    /// far (filtered out or not) every few thousand entries and once at the end, for a
    /// progress bar whose total is [`Stats::stored_records`](crate::Stats::stored_records).
    pub fn scan_with_progress(
        &self,
        filter: &ScanFilter,
        mut progress: impl FnMut(u64),
        mut visit: impl FnMut(ScannedRecord) -> ControlFlow<()>,
    ) -> Result<ScanSummary, Error> {
        let txn = self.begin_read()?;
        let now = self.engine.clock.now_ms();
        let caller = CallerPanic::default();
        let scanned = contained("the records scanned", || {
            crate::scan::scan(
                &txn,
                now,
                filter,
                &mut |n| caller.call(|| progress(n), ()),
                &mut |r| caller.call(|| visit(r), ControlFlow::Break(())),
            )
        });
        caller.resume(scanned)
    }

    /// Checks every stored entry of idemdb's tables, in one read transaction, and reports the
    /// problems found (the first `max_problems` of them, and how many in all); `progress` is
    /// called with the number of records read so far every few thousand records and once at
    /// the end.
    ///
    /// Page checksums are verified when the database is opened (unless
    /// [`Builder::verify_on_open`](crate::Builder::verify_on_open) turned that off); this
    /// checks what the pages hold: every in-flight and partition entry's key splits into a
    /// non-empty operation, a principal and a non-empty key; every record decodes; IN_PROGRESS
    /// records are in the in-flight table only and expire after their lease ends, finished ones
    /// are in partitions only and were last changed in their partition's window with its TTL;
    /// every token is below the meta table's `next_token`; every horizon row has an 8-byte
    /// `until`, names a partition or an in-flight sweep, and holds distinct sorted hashes (or
    /// an older build's 4-byte tags); every partition summary and filter row decodes, and a
    /// filter that still describes its table admits every key of it; no table with idemdb's
    /// prefix is unknown. Only a storage error is returned as `Err`.
    ///
    /// ```
    /// use idemdb::{IdemDb, Key, ReserveOutcome, Scope};
    /// use std::time::Duration;
    /// # let dir = tempfile::tempdir()?;
    /// let db = IdemDb::open(dir.path().join("db"))?;
    /// let lease = Duration::from_secs(30);
    /// if let ReserveOutcome::Acquired(r) = db.reserve(&Scope::new("op", "p"), &Key::new("k"), b"x", lease)? {
    ///     db.complete(&r, b"ok".to_vec())?;
    /// }
    /// let report = db.verify(10, |_| {})?;
    /// assert!(report.is_ok(), "{:?}", report.problems);
    /// assert_eq!((report.partitions, report.finished_records), (1, 1));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn verify(
        &self,
        max_problems: usize,
        mut progress: impl FnMut(u64),
    ) -> Result<VerifyReport, Error> {
        let txn = self.begin_read()?;
        let now = self.engine.clock.now_ms();
        let caller = CallerPanic::default();
        let verified = contained("the file being verified", || {
            crate::scan::verify::verify(
                &txn,
                &self.engine.layout.index,
                now,
                max_problems,
                &mut |n| caller.call(|| progress(n), ()),
            )
        });
        caller.resume(verified)
    }
}
