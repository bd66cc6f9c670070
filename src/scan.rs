//! Reading every stored record, for operators and tools: [`IdemDb::scan`] streams the records
//! of one read transaction to a callback, one at a time, so a file of millions of records is
//! never held in memory; [`IdemDb::verify`] (scan/verify.rs) checks every stored entry against
//! the layout's invariants.
//!
//! Tables are read in a fixed order: the in-flight table, then the partitions oldest window
//! first; within a table, by record key (so by operation, then principal, then key).

mod verify;

use std::ops::ControlFlow;

use redb::{ReadTransaction, ReadableTable, TableDefinition, TableHandle};

pub use verify::{Problem, VerifyReport};

use crate::db::IdemDb;
use crate::engine_tables::INFLIGHT;
use crate::error::Error;
use crate::record::{Record, RecordState};
use crate::retention::partition::{PartitionName, partition_tables};
use crate::scope::{Key, RecordKey, Scope};

/// How often (in entries read) a scan or verification reports its progress.
const PROGRESS_EVERY: u64 = 4096;

/// Which records [`IdemDb::scan`] visits. The default visits every record that counts (not
/// expired), of every state and operation.
///
/// ```
/// use idemdb::{RecordState, ScanFilter};
/// let finished_orders = ScanFilter::default()
///     .state(RecordState::Completed)
///     .operation("POST /orders")
///     .include_expired(true);
/// # let _ = finished_orders;
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScanFilter {
    state: Option<RecordState>,
    operation: Option<Box<[u8]>>,
    include_expired: bool,
}

impl ScanFilter {
    /// Only records in `state`. IN_PROGRESS records are read from the in-flight table alone,
    /// finished ones from the partitions alone.
    pub fn state(mut self, state: RecordState) -> Self {
        self.state = Some(state);
        self
    }

    /// Only records of `operation` (as in [`Scope::new`]): a range read of each table, not a
    /// full one.
    pub fn operation(mut self, operation: impl AsRef<[u8]>) -> Self {
        self.operation = Some(operation.as_ref().into());
        self
    }

    /// Also visit records that expired (they count as absent) but are still stored because
    /// their partition was not dropped yet. Default: `false`.
    pub fn include_expired(mut self, include: bool) -> Self {
        self.include_expired = include;
        self
    }

    /// Which keys of each table the operation filter selects.
    fn keys(&self) -> Keys {
        let Some(op) = &self.operation else {
            return Keys::All;
        };
        // No stored operation is longer than a u16 length prefix can say.
        let Ok(len) = u16::try_from(op.len()) else {
            return Keys::None;
        };
        let mut prefix = len.to_be_bytes().to_vec();
        prefix.extend_from_slice(op);
        Keys::Prefix(prefix)
    }

    fn reads_in_flight(&self) -> bool {
        matches!(self.state, None | Some(RecordState::InProgress))
    }

    fn reads_partitions(&self) -> bool {
        self.state != Some(RecordState::InProgress)
    }
}

/// The keys a scan reads in each table.
enum Keys {
    All,
    /// `u16 BE len ‖ operation`: the records of one operation (docs/design.md §2).
    Prefix(Vec<u8>),
    None,
}

/// Where a scanned record is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoredIn {
    /// The in-flight table (`idemdb_inflight`): IN_PROGRESS records.
    InFlight,
    /// A time partition: finished records last changed in `[start_ms, start_ms + width_ms)`,
    /// all with TTL `ttl_ms`.
    Partition {
        /// Start of the partition's window, ms since the Unix epoch.
        start_ms: u64,
        /// Width of the window, ms.
        width_ms: u64,
        /// The TTL of its records, ms.
        ttl_ms: u64,
    },
}

/// One record visited by [`IdemDb::scan`]: its name, decoded from the stored key, and the
/// record.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ScannedRecord {
    /// The record's scope: operation and principal bytes.
    pub scope: Scope,
    /// The record's key bytes.
    pub key: Key,
    /// The record.
    pub record: Record,
    /// Where it is stored.
    pub stored_in: StoredIn,
    /// Whether it had expired at the scan's time (only with
    /// [`ScanFilter::include_expired`]).
    pub expired: bool,
}

/// What a scan read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ScanSummary {
    /// Stored entries read, including those the filter skipped.
    pub entries_read: u64,
    /// Records handed to the callback.
    pub visited: u64,
    /// Whether the callback stopped the scan with [`ControlFlow::Break`].
    pub stopped: bool,
}

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
        let mut run = Run {
            filter,
            now: self.engine.clock.now_ms(),
            summary: ScanSummary::default(),
            progress: &mut progress,
            visit: &mut visit,
        };
        let keys = filter.keys();
        for (name, stored_in) in tables_to_scan(&txn, filter)? {
            if run.table(&txn, &name, stored_in, &keys)?.is_break() {
                run.summary.stopped = true;
                break;
            }
        }
        let summary = run.summary;
        progress(summary.entries_read);
        Ok(summary)
    }
}

/// The record tables a filter reads, in scan order.
fn tables_to_scan(
    txn: &ReadTransaction,
    filter: &ScanFilter,
) -> Result<Vec<(String, StoredIn)>, Error> {
    let mut tables = Vec::new();
    if filter.reads_in_flight() {
        tables.push((INFLIGHT.name().to_string(), StoredIn::InFlight));
    }
    if filter.reads_partitions() {
        tables.extend(partitions(txn)?.into_iter().map(|part| {
            let stored_in = StoredIn::Partition {
                start_ms: part.start,
                width_ms: part.width,
                ttl_ms: part.ttl,
            };
            (part.table_name(), stored_in)
        }));
    }
    Ok(tables)
}

/// The partition tables of a transaction, oldest window first, as the catalog orders them.
pub(crate) fn partitions(txn: &ReadTransaction) -> Result<Vec<PartitionName>, Error> {
    let mut parts: Vec<PartitionName> = partition_tables(txn)?
        .iter()
        .filter_map(|table| PartitionName::parse(table))
        .collect();
    parts.sort();
    Ok(parts)
}

struct Run<'a, P, V> {
    filter: &'a ScanFilter,
    now: u64,
    summary: ScanSummary,
    progress: &'a mut P,
    visit: &'a mut V,
}

impl<P, V> Run<'_, P, V>
where
    P: FnMut(u64),
    V: FnMut(ScannedRecord) -> ControlFlow<()>,
{
    fn table(
        &mut self,
        txn: &ReadTransaction,
        name: &str,
        stored_in: StoredIn,
        keys: &Keys,
    ) -> Result<ControlFlow<()>, Error> {
        let prefix = match keys {
            Keys::All => None,
            Keys::Prefix(prefix) => Some(prefix.as_slice()),
            Keys::None => return Ok(ControlFlow::Continue(())),
        };
        let table = txn.open_table(TableDefinition::<&[u8], &[u8]>::new(name))?;
        let entries = match prefix {
            Some(p) => table.range::<&[u8]>(p..)?,
            None => table.iter()?,
        };
        for entry in entries {
            let (k, v) = entry?;
            let key = k.value();
            if prefix.is_some_and(|p| !key.starts_with(p)) {
                break;
            }
            self.summary.entries_read += 1;
            if self.summary.entries_read.is_multiple_of(PROGRESS_EVERY) {
                (self.progress)(self.summary.entries_read);
            }
            let (operation, principal, key) = RecordKey::split(key).ok_or_else(|| {
                Error::Corrupted(format!(
                    "{name}: a stored record key of {} bytes does not split into operation, \
                     principal and key",
                    key.len()
                ))
            })?;
            let record = crate::record::decode(v.value()).map_err(|e| in_table(name, e))?;
            if self.filter.state.is_some_and(|s| s != record.state) {
                continue;
            }
            let expired = record.is_expired(self.now);
            if expired && !self.filter.include_expired {
                continue;
            }
            self.summary.visited += 1;
            let scanned = ScannedRecord {
                scope: Scope::new(operation, principal),
                key: Key::new(key),
                record,
                stored_in,
                expired,
            };
            if (self.visit)(scanned).is_break() {
                return Ok(ControlFlow::Break(()));
            }
        }
        Ok(ControlFlow::Continue(()))
    }
}

/// Names the table in a decoding error.
fn in_table(name: &str, e: Error) -> Error {
    match e {
        Error::Corrupted(why) => Error::Corrupted(format!("{name}: {why}")),
        other => other,
    }
}
