//! `IdemDb::verify`: every stored entry of idemdb's tables decoded and checked against the
//! layout's invariants (docs/design.md §1–§3, §8, §9), with the problems found listed instead
//! of stopping at the first.

use redb::{
    MultimapTableHandle, ReadTransaction, ReadableTable, TableDefinition, TableError, TableHandle,
};

use crate::config::SCAN_PROGRESS_EVERY;
use crate::engine_tables::{
    INFLIGHT, META, NEXT_TOKEN_KEY, RECORDS, RESERVED_PREFIX, is_outbox_table,
};
use crate::error::Error;
use crate::outbox_row::OutboxRow;
use crate::record::{Record, RecordState};
use crate::records::filter::{FILTERS, FilterRow};
use crate::records::horizon::{
    HORIZON, RECOGNISED, decode_hashes, decode_tags, is_source, row_source, row_until,
};
use crate::records::key_index::KeyIndex;
use crate::records::partition::{PartitionName, partition_names};
use crate::records::recognised::{RECOGNISED_KEYS, UNINDEXED, unindexed_rows, until_of};
use crate::records::retired::is_retired_table;
use crate::records::summary::{SUMMARIES, Summary};
use idemdb_core::scope::RecordKey;

/// What [`IdemDb::verify`](crate::IdemDb::verify) read and what it found wrong.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct VerifyReport {
    /// Partition tables read.
    pub partitions: u64,
    /// Entries of the in-flight table read.
    pub in_flight_records: u64,
    /// Entries of the partitions read.
    pub finished_records: u64,
    /// Of the records that decoded, those expired at the verification's time (stored until
    /// their partition is dropped or the in-flight table swept).
    pub expired_records: u64,
    /// Rows of `idemdb_recognised` (and of `idemdb_horizon`, older builds' rows) read.
    pub horizon_rows: u64,
    /// Keys recognised in them (hashes, and older builds' 32-bit tags).
    pub horizon_tags: u64,
    /// Tables without idemdb's prefix (the caller's business tables): not checked.
    pub other_tables: u64,
    /// Problems found, all of them.
    pub problem_count: u64,
    /// The first problems found, at most as many as asked for.
    pub problems: Vec<Problem>,
}

impl VerifyReport {
    /// Whether nothing was found wrong.
    pub fn is_ok(&self) -> bool {
        self.problem_count == 0
    }
}

/// One thing [`IdemDb::verify`](crate::IdemDb::verify) found wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Problem {
    /// The table it is in.
    pub table: String,
    /// The stored key of the entry, if the problem is one entry's.
    pub key: Option<Vec<u8>>,
    /// What is wrong.
    pub what: String,
}

/// Checks every stored entry of idemdb's tables in `txn`, at `now` ([`IdemDb::verify`](crate::IdemDb::verify) says
/// what is checked).
pub(crate) fn verify(
    txn: &ReadTransaction,
    index: &KeyIndex,
    now: u64,
    max_problems: usize,
    progress: &mut impl FnMut(u64),
) -> Result<VerifyReport, Error> {
    let mut check = Check {
        report: VerifyReport::default(),
        max_problems,
        now,
        next_token: None,
        read: 0,
        progress: &mut *progress,
    };
    check.catalog(txn)?;
    check.next_token = check.read_next_token(txn)?;
    check.records(txn, INFLIGHT.name(), None)?;
    for part in partition_names(txn)? {
        check.report.partitions += 1;
        check.records(txn, &part.table_name(), Some(part))?;
    }
    check.horizon(txn)?;
    check.summaries(txn)?;
    check.filters(txn, index)?;
    let read = check.read;
    let report = check.report;
    progress(read);
    Ok(report)
}

struct Check<'a, P> {
    report: VerifyReport,
    max_problems: usize,
    now: u64,
    next_token: Option<u64>,
    read: u64,
    progress: &'a mut P,
}

impl<P: FnMut(u64)> Check<'_, P> {
    fn problem(&mut self, table: &str, key: Option<&[u8]>, what: String) {
        self.report.problem_count += 1;
        if self.report.problems.len() < self.max_problems {
            self.report.problems.push(Problem {
                table: table.to_string(),
                key: key.map(<[u8]>::to_vec),
                what,
            });
        }
    }

    /// Every table with idemdb's prefix is one idemdb knows.
    fn catalog(&mut self, txn: &ReadTransaction) -> Result<(), Error> {
        let names: Vec<String> = txn.list_tables()?.map(|t| t.name().to_string()).collect();
        for name in names {
            if !name.starts_with(RESERVED_PREFIX) {
                self.report.other_tables += 1;
            } else if name == RECORDS.name() {
                let what = "the format-2 records table is still present in a format-3 file";
                self.problem(&name, None, what.to_string());
            } else if PartitionName::is_partition_table(&name) {
                if PartitionName::parse(&name).is_none() {
                    let what = "named like a partition but the name does not parse (start, \
                                width, ttl): the catalog ignores it, its records are never read";
                    self.problem(&name, None, what.to_string());
                }
            } else if is_outbox_table(&name) {
                self.outbox_rows(txn, &name)?;
            } else if PartitionName::is_build_table(&name) || is_retired_table(&name) {
                // A wide partition being built, or one a crash left: the next compaction
                // pass retires it. A retired table: later passes free its pages. Neither is
                // ever read as a partition.
            } else if ![
                META.name(),
                INFLIGHT.name(),
                HORIZON.name(),
                SUMMARIES.name(),
                FILTERS.name(),
                RECOGNISED.name(),
                RECOGNISED_KEYS.name(),
                UNINDEXED.name(),
            ]
            .contains(&name.as_str())
            {
                let what = "unknown table with idemdb's reserved prefix";
                self.problem(&name, None, what.to_string());
            }
        }
        let multimaps: Vec<String> = txn
            .list_multimap_tables()?
            .map(|t| t.name().to_string())
            .collect();
        for name in multimaps {
            if name.starts_with(RESERVED_PREFIX) {
                let what = "multimap table with idemdb's reserved prefix";
                self.problem(&name, None, what.to_string());
            } else {
                self.report.other_tables += 1;
            }
        }
        Ok(())
    }

    /// Every row of an outbox table reads back whole (its checksum covers its key).
    fn outbox_rows(&mut self, txn: &ReadTransaction, name: &str) -> Result<(), Error> {
        let table = txn.open_table(TableDefinition::<u64, &[u8]>::new(name))?;
        for entry in table.iter()? {
            let (seq, value) = entry?;
            if let Err(e) = OutboxRow::decode(seq.value(), value.value()) {
                let key = seq.value().to_le_bytes();
                self.problem(name, Some(&key), e.to_string());
            }
        }
        Ok(())
    }

    /// The token ceiling, if the meta table holds a well-formed one (open checked it).
    fn read_next_token(&mut self, txn: &ReadTransaction) -> Result<Option<u64>, Error> {
        let meta = match txn.open_table(META) {
            Ok(meta) => meta,
            Err(e) => return self.unreadable(META.name(), e).map(|()| None),
        };
        let value = meta.get(NEXT_TOKEN_KEY)?.map(|v| v.value().to_vec());
        match value.as_deref().map(<[u8; 8]>::try_from) {
            Some(Ok(bytes)) if u64::from_le_bytes(bytes) != 0 => {
                Ok(Some(u64::from_le_bytes(bytes)))
            }
            _ => {
                let what = "meta entry next_token is missing or malformed".to_string();
                self.problem(META.name(), Some(NEXT_TOKEN_KEY.as_bytes()), what);
                Ok(None)
            }
        }
    }

    /// A table that idemdb needs but cannot open with its types.
    fn unreadable(&mut self, name: &str, e: TableError) -> Result<(), Error> {
        match e {
            TableError::TableDoesNotExist(_) => {
                self.problem(name, None, "table is missing".to_string());
                Ok(())
            }
            TableError::TableTypeMismatch { .. } | TableError::TableIsMultimap(_) => {
                self.problem(name, None, format!("table has foreign types: {e}"));
                Ok(())
            }
            other => Err(other.into()),
        }
    }

    /// The in-flight table (`part` = `None`) or one partition.
    fn records(
        &mut self,
        txn: &ReadTransaction,
        name: &str,
        part: Option<PartitionName>,
    ) -> Result<(), Error> {
        let table = match txn.open_table(TableDefinition::<&[u8], &[u8]>::new(name)) {
            Ok(table) => table,
            Err(e) => return self.unreadable(name, e),
        };
        for entry in table.iter()? {
            let (k, v) = entry?;
            self.read += 1;
            if self.read.is_multiple_of(SCAN_PROGRESS_EVERY) {
                (self.progress)(self.read);
            }
            match part {
                None => self.report.in_flight_records += 1,
                Some(_) => self.report.finished_records += 1,
            }
            let key = k.value();
            match RecordKey::split(key) {
                None => self.problem(name, Some(key), "record key does not split".to_string()),
                Some(([], _, _)) => self.problem(name, Some(key), "empty operation".to_string()),
                Some((_, _, [])) => self.problem(name, Some(key), "empty key".to_string()),
                Some(_) => {}
            }
            match crate::record::decode(key, v.value()) {
                Ok(record) => self.record(name, key, &record, part),
                Err(e) => self.problem(name, Some(key), format!("record does not decode: {e}")),
            }
        }
        Ok(())
    }

    fn record(&mut self, name: &str, key: &[u8], rec: &Record, part: Option<PartitionName>) {
        if rec.is_expired(self.now) {
            self.report.expired_records += 1;
        }
        if let Some(next) = self.next_token
            && rec.token.get() >= next
        {
            let what = format!("token {} is not below next_token {next}", rec.token);
            self.problem(name, Some(key), what);
        }
        let finished = rec.state != RecordState::InProgress;
        match part {
            None if finished => {
                let what = format!("{} record in the in-flight table", rec.state.as_str());
                self.problem(name, Some(key), what);
            }
            None => {
                if rec.expires_at <= rec.lease_expires_at && rec.expires_at != u64::MAX {
                    let what = format!(
                        "expires_at {} is not after the lease's end {}",
                        rec.expires_at, rec.lease_expires_at
                    );
                    self.problem(name, Some(key), what);
                }
            }
            Some(_) if !finished => {
                let what = "in_progress record in a partition".to_string();
                self.problem(name, Some(key), what);
            }
            Some(PartitionName { start, width, ttl }) => {
                if rec.updated_at >= start.saturating_add(width) {
                    let what = format!(
                        "updated_at {} is after the partition's window [{start}, {})",
                        rec.updated_at,
                        start.saturating_add(width)
                    );
                    self.problem(name, Some(key), what);
                }
                if rec.expires_at != rec.updated_at.saturating_add(ttl) {
                    let what = format!(
                        "expires_at {} is not updated_at {} + the partition's TTL {ttl}",
                        rec.expires_at, rec.updated_at
                    );
                    self.problem(name, Some(key), what);
                }
            }
        }
    }

    /// The beyond-horizon rows: `until ‖ name` → sorted distinct u64 LE hashes in
    /// `idemdb_recognised` (absent until a first drop or sweep), u32 LE tags in
    /// `idemdb_horizon` (older builds').
    fn horizon(&mut self, txn: &ReadTransaction) -> Result<(), Error> {
        let name = RECOGNISED.name();
        let unindexed = unindexed_rows(txn)?;
        let keys = match txn.open_table(RECOGNISED_KEYS) {
            Ok(keys) => Some(keys),
            Err(TableError::TableDoesNotExist(_)) => None,
            Err(e) => return self.unreadable(RECOGNISED_KEYS.name(), e),
        };
        match txn.open_table(RECOGNISED) {
            Ok(table) => {
                for row in table.iter()? {
                    let (k, v) = row?;
                    let decoded = decode_hashes(v.value()).map(Iterator::collect::<Vec<u64>>);
                    if let (Ok(hashes), Some(keys), Some(unindexed)) = (&decoded, &keys, &unindexed)
                        && !unindexed.iter().any(|u| u.as_slice() == k.value())
                    {
                        self.entered(k.value(), hashes, keys)?;
                    }
                    self.horizon_row(name, k.value(), decoded)?;
                }
            }
            Err(TableError::TableDoesNotExist(_)) => {}
            Err(e) => self.unreadable(name, e)?,
        }
        let name = HORIZON.name();
        let table = match txn.open_table(HORIZON) {
            Ok(table) => table,
            Err(e) => return self.unreadable(name, e),
        };
        for row in table.iter()? {
            let (k, v) = row?;
            let decoded = decode_tags(v.value()).map(Iterator::collect::<Vec<u32>>);
            self.horizon_row(name, k.value(), decoded)?;
        }
        Ok(())
    }

    /// A row in force that is not named unindexed: every hash of it is in the table of
    /// recognised keys until the row's `until` or later (a missing one would be forgotten).
    fn entered(
        &mut self,
        key: &[u8],
        hashes: &[u64],
        keys: &redb::ReadOnlyTable<u64, u64>,
    ) -> Result<(), Error> {
        let Ok(until) = row_until(key) else {
            return Ok(()); // Listed by horizon_row.
        };
        if until <= self.now {
            return Ok(());
        }
        let mut missing = 0u64;
        for &hash in hashes {
            if until_of(keys, hash)?.is_none_or(|stored| stored < until) {
                missing += 1;
            }
        }
        if missing > 0 {
            let what = format!(
                "{missing} of the row's {} hashes are not recognised until {until} in {}",
                hashes.len(),
                RECOGNISED_KEYS.name()
            );
            self.problem(RECOGNISED.name(), Some(key), what);
        }
        Ok(())
    }

    /// One row of `table`: its key names a source, its set is sorted and distinct.
    fn horizon_row<T: Ord>(
        &mut self,
        table: &str,
        key: &[u8],
        set: Result<Vec<T>, Error>,
    ) -> Result<(), Error> {
        self.report.horizon_rows += 1;
        match row_source(key) {
            Err(e) => self.problem(table, Some(key), corrupted_text(e)),
            Ok(source) if !is_source(source) => {
                let what = format!("row key names {source:?}, not a partition or a sweep");
                self.problem(table, Some(key), what);
            }
            Ok(_) => {}
        }
        let set = match set {
            Ok(set) => set,
            Err(e) => {
                self.problem(table, Some(key), corrupted_text(e));
                return Ok(());
            }
        };
        self.report.horizon_tags += set.len() as u64;
        if set.windows(2).any(|w| w[0] >= w[1]) {
            let what = "tags are not sorted and distinct".to_string();
            self.problem(table, Some(key), what);
        }
        Ok(())
    }
}

impl<P: FnMut(u64)> Check<'_, P> {
    /// The partitions' summaries (optional: a file no build with summaries wrote has none):
    /// each row decodes. A row that no longer holds for its table is not a problem: the open
    /// and the drop read that table instead.
    fn summaries(&mut self, txn: &ReadTransaction) -> Result<(), Error> {
        let name = SUMMARIES.name();
        let table = match txn.open_table(SUMMARIES) {
            Ok(table) => table,
            Err(TableError::TableDoesNotExist(_)) => return Ok(()),
            Err(e) => return self.unreadable(name, e),
        };
        for row in table.iter()? {
            let (k, v) = row?;
            if let Err(e) = Summary::decode(v.value(), k.value()) {
                self.problem(name, Some(k.value().as_bytes()), corrupted_text(e));
            }
        }
        Ok(())
    }
}

impl<P: FnMut(u64)> Check<'_, P> {
    /// The wide partitions' filters (optional): each row decodes, and a row that holds for its
    /// table (the open uses it) answers "maybe" for every key of it: a key it lacked would be
    /// a record no lookup finds.
    fn filters(&mut self, txn: &ReadTransaction, index: &KeyIndex) -> Result<(), Error> {
        let name = FILTERS.name();
        let rows = match txn.open_table(FILTERS) {
            Ok(rows) => rows,
            Err(TableError::TableDoesNotExist(_)) => return Ok(()),
            Err(e) => return self.unreadable(name, e),
        };
        for row in rows.iter()? {
            let (k, v) = row?;
            let part = k.value();
            let row = match FilterRow::decode(v.value(), part) {
                Ok(row) => row,
                Err(e) => {
                    self.problem(name, Some(part.as_bytes()), corrupted_text(e));
                    continue;
                }
            };
            let table = match txn.open_table(TableDefinition::<&[u8], &[u8]>::new(part)) {
                Ok(table) => table,
                // A row of a table that is gone is never read.
                Err(TableError::TableDoesNotExist(_)) => continue,
                Err(e) => return self.unreadable(part, e),
            };
            if !row.head.holds_for(&table, |k| index.hash(k))? {
                continue;
            }
            let mut lacked = 0u64;
            for entry in table.iter()? {
                if !row.filter.may_contain(index.hash(entry?.0.value())) {
                    lacked += 1;
                }
            }
            if lacked > 0 {
                let what = format!("the filter lacks {lacked} keys of the table it describes");
                self.problem(name, Some(part.as_bytes()), what);
            }
        }
        Ok(())
    }
}

/// The reason of a validation failure, as a problem's text.
fn corrupted_text(e: Error) -> String {
    match e {
        Error::Corrupted(why) => why,
        other => other.to_string(),
    }
}
