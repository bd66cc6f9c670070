//! Reading every stored record, for operators and tools: `IdemDb::scan` (ops/scan.rs) streams the records
//! of one read transaction to a callback, one at a time, so a file of millions of records is
//! never held in memory; `IdemDb::verify` (scan/verify.rs) checks every stored entry against
//! the layout's invariants.
//!
//! Tables are read in a fixed order: the in-flight table, then the partitions oldest window
//! first; within a table, by record key (so by operation, then principal, then key).

pub(crate) mod verify;

use std::ops::ControlFlow;

use redb::{ReadTransaction, ReadableTable, TableDefinition, TableHandle};

pub use verify::{Problem, VerifyReport};

use crate::config::SCAN_PROGRESS_EVERY;
use crate::engine_tables::INFLIGHT;
use crate::error::Error;
use crate::record::{Record, RecordState};
use crate::records::partition::partition_names;
use idemdb_core::scope::{Key, RecordKey, Scope};

/// Which records [`IdemDb::scan`](crate::IdemDb::scan) visits. The default visits every record that counts (not
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

/// One record visited by [`IdemDb::scan`](crate::IdemDb::scan): its name, decoded from the stored key, and the
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

/// Visits the records of `txn` that `filter` selects, expiry judged at `now` ([`IdemDb::scan`](crate::IdemDb::scan)
/// says what a caller sees).
pub(crate) fn scan(
    txn: &ReadTransaction,
    now: u64,
    filter: &ScanFilter,
    progress: &mut impl FnMut(u64),
    visit: &mut impl FnMut(ScannedRecord) -> ControlFlow<()>,
) -> Result<ScanSummary, Error> {
    let mut run = Run {
        filter,
        now,
        summary: ScanSummary::default(),
        progress: &mut *progress,
        visit,
    };
    let keys = filter.keys();
    for (name, stored_in) in tables_to_scan(txn, filter)? {
        if run.table(txn, &name, stored_in, &keys)?.is_break() {
            run.summary.stopped = true;
            break;
        }
    }
    let summary = run.summary;
    progress(summary.entries_read);
    Ok(summary)
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
        tables.extend(partition_names(txn)?.into_iter().map(|part| {
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
            if self
                .summary
                .entries_read
                .is_multiple_of(SCAN_PROGRESS_EVERY)
            {
                (self.progress)(self.summary.entries_read);
            }
            let (operation, principal, key) = RecordKey::split(key).ok_or_else(|| {
                Error::Corrupted(format!(
                    "{name}: a stored record key of {} bytes does not split into operation, \
                     principal and key",
                    key.len()
                ))
            })?;
            let record =
                crate::record::decode(k.value(), v.value()).map_err(|e| in_table(name, e))?;
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
