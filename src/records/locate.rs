//! Where records live and how one is found: IN_PROGRESS records in the in-flight table,
//! finished ones in time partitions, located through the key index. Shared by the writer
//! (inside its write transaction) and the snapshots (inside a read transaction).
//!
//! Expiry is checked here, on every read: an expired record is reported as expired, never as
//! live, whether or not its partition was dropped yet.

use std::collections::HashMap;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use redb::{
    Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition, TableHandle,
};

use crate::engine_tables::INFLIGHT;
use crate::error::Error;
use crate::record::Record;
use crate::records::filter::{FILTERS, FilterRow};
use crate::records::horizon::{
    self, HORIZON, Horizon, RECOGNISED, decode_hashes, decode_tags, row_until,
};
use crate::records::key_index::{self, KeyIndex};
use crate::records::overlay::Slot;
use crate::records::partition::{Catalog, Partition, Partitions, partition_tables};
use crate::records::recognised;
use crate::records::summary::{self, SUMMARIES};
use crate::stats::MemoryUse;
use idemdb_core::retention::Rules;
use idemdb_core::scope::RecordKey;

/// Retention state shared by the writer, the snapshots and the compactor.
pub(crate) struct Layout {
    pub(crate) rules: Rules,
    pub(crate) partitions: Partitions,
    pub(crate) index: KeyIndex,
    pub(crate) horizon: Horizon,
    /// No stored record was written later than this (ms): the writer raises it before each
    /// batch. A record that expired at or before it may have a newer copy beside it, which a
    /// clock gone back would show as live too (see [`Probe::UntilLive`]).
    latest_write: AtomicU64,
    /// Partitions whose keys the open read, for want of a summary that still held.
    pub(crate) partitions_read: u64,
}

impl Layout {
    /// The layout of an opened database: partitions from the table names, their filters
    /// where a filter row still holds (filter.rs), the key index rebuilt for the others from
    /// each partition's summary where it still holds (summary.rs) and by reading the keys of
    /// the rest, the recognition rows in force at `now` that are not on disk by hash yet, and
    /// older builds' tags. Each map is allocated once, at the
    /// size its count (taken first) needs.
    pub(crate) fn load(db: &Database, rules: Rules, seed: u64, now: u64) -> Result<Layout, Error> {
        let txn = db.begin_read()?;
        let (
            partitions,
            filters,
            Counted {
                records,
                horizon_tags,
                ..
            },
        ) = counted_catalog(&txn, seed, now)?;
        for (part, row) in filters {
            part.set_filter(row.filter);
            part.mark_summarized();
        }
        partitions.refresh();
        let index = KeyIndex::with_capacity(seed, records);
        let rows = match txn.open_table(SUMMARIES) {
            Ok(rows) => Some(rows),
            // A file no build with summaries wrote yet.
            Err(redb::TableError::TableDoesNotExist(_)) => None,
            Err(e) => return Err(e.into()),
        };
        let mut partitions_read = 0;
        for part in partitions.catalog().parts() {
            if part.filter().is_some() {
                continue;
            }
            let table = txn.open_table(part.table())?;
            let summary = match &rows {
                Some(rows) => summary::read(rows, &part.table)?,
                None => None,
            };
            match summary {
                Some(summary) if summary.holds_for(&table, &index)? => {
                    index.insert_sorted(&summary.hashes, part.id);
                    part.mark_summarized();
                }
                _ => {
                    partitions_read += 1;
                    for entry in table.iter()? {
                        let (k, _) = entry?;
                        index.insert(index.hash(k.value()), part.id);
                    }
                }
            }
        }
        // Every record in a partition was written within the partition's window (its
        // `updated_at` names the window), so the windows' ends bound the writes before the
        // open: a lookup that stops at a live copy never misses a newer one written earlier.
        let windows_end = partitions
            .catalog()
            .parts()
            .iter()
            .map(|p| p.name.start.saturating_add(p.name.width))
            .max()
            .unwrap_or(0);
        let latest_write = copies_expire_by(&txn, &partitions, &index)?.max(windows_end);
        let horizon = Horizon::default();
        horizon.reserve_tags(horizon_tags);
        pending_rows(&txn, &mut |key, until, bytes| {
            let hashes: Vec<u64> = named(RECOGNISED, decode_hashes(bytes))?.collect();
            horizon.add_pending(key.to_vec(), until, hashes.into());
            Ok(())
        })?;
        horizon_rows(&txn, HORIZON, now, &mut |bytes, until| {
            horizon.add_tags(named(HORIZON, decode_tags(bytes))?, until);
            Ok(())
        })?;
        Ok(Layout {
            rules,
            partitions,
            index,
            horizon,
            latest_write: AtomicU64::new(latest_write),
            partitions_read,
        })
    }

    /// A layout with no partitions, for the format upgrade's record store.
    pub(crate) fn empty(rules: Rules, seed: u64) -> Layout {
        Layout {
            rules,
            partitions: Partitions::from_names([]),
            index: KeyIndex::new(seed),
            horizon: Horizon::default(),
            latest_write: AtomicU64::new(0),
            partitions_read: 0,
        }
    }

    /// Called by the writer with the time of a batch, before it writes anything at it.
    pub(crate) fn note_write_time(&self, now: u64) {
        self.latest_write.fetch_max(now, Ordering::SeqCst);
    }

    /// How far a snapshot lookup must go (see [`Probe::UntilLive`]).
    pub(crate) fn snapshot_probe(&self) -> Probe {
        Probe::UntilLive {
            latest_write: self.latest_write.load(Ordering::SeqCst),
        }
    }
}

/// What the maps of a layout will hold: finished records stored outside the filtered
/// partitions (a partition's length is in its B-tree's header), the keys of the recognition
/// rows that memory holds until they are on disk by hash (8 bytes each),
/// and the tags of older builds' rows (4 bytes each); and what the filters take.
struct Counted {
    records: u64,
    horizon_keys: u64,
    horizon_tags: u64,
    filter_bytes: u64,
}

/// A partition and the filter row that holds for its table.
type Filtered = Vec<(Arc<Partition>, FilterRow)>;

/// The partition catalog of `txn` (from its table names), the filter rows that hold for its
/// tables (keys hashed with `seed`), and what its maps will hold at `now`.
fn counted_catalog(
    txn: &redb::ReadTransaction,
    seed: u64,
    now: u64,
) -> Result<(Partitions, Filtered, Counted), Error> {
    let names = partition_tables(txn)?;
    let partitions = Partitions::from_names(names.iter().map(String::as_str));
    let filters = filters_that_hold(txn, &partitions, seed)?;
    let counted = count(txn, &partitions, &filters, now)?;
    Ok((partitions, filters, counted))
}

/// The partitions whose filter row holds for their table, with the row. A row that does not
/// decode refuses the open (`Corrupted` naming it), as a summary's does.
fn filters_that_hold(
    txn: &redb::ReadTransaction,
    partitions: &Partitions,
    seed: u64,
) -> Result<Filtered, Error> {
    let rows = match txn.open_table(FILTERS) {
        Ok(rows) => rows,
        // A file no build with filters wrote yet.
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
        Err(e) => return Err(e.into()),
    };
    let hash = |k: &[u8]| key_index::index_hash(seed, k);
    let catalog = partitions.catalog();
    let parts: HashMap<&str, &Arc<Partition>> =
        catalog.parts().iter().map(|p| (&*p.table, p)).collect();
    let mut held = Vec::new();
    // One pass over the rows: a lookup per partition would read, for every table without a
    // row, the leaf where its name would be, and a leaf holding a filter is megabytes long.
    for row in rows.iter()? {
        let (table, bytes) = row?;
        let Some(part) = parts.get(table.value()) else {
            // A row left by a table no longer there: never used.
            continue;
        };
        let row = FilterRow::decode(bytes.value(), table.value())?;
        if row.head.holds_for(&txn.open_table(part.table())?, hash)? {
            held.push((Arc::clone(part), row));
        }
    }
    Ok(held)
}

fn count(
    txn: &redb::ReadTransaction,
    partitions: &Partitions,
    filters: &Filtered,
    now: u64,
) -> Result<Counted, Error> {
    let mut records = 0u64;
    for part in partitions.catalog().parts() {
        if !filters.iter().any(|(p, _)| p.id == part.id) {
            records = records.saturating_add(txn.open_table(part.table())?.len()?);
        }
    }
    let filter_bytes = filters.iter().map(|(_, r)| r.filter.memory_bytes()).sum();
    let mut horizon_keys = 0u64;
    pending_rows(txn, &mut |_, _, bytes| {
        horizon_keys += named(RECOGNISED, decode_hashes(bytes))?.count() as u64;
        Ok(())
    })?;
    let mut horizon_tags = 0u64;
    horizon_rows(txn, HORIZON, now, &mut |bytes, _| {
        horizon_tags += named(HORIZON, decode_tags(bytes))?.count() as u64;
        Ok(())
    })?;
    Ok(Counted {
        records,
        horizon_keys,
        horizon_tags,
        filter_bytes,
    })
}

/// Refuses with [`Error::MemoryBudget`] if the caches (`caches`) plus the key index and the
/// horizon map that the records stored in `db` need at `now` would exceed `budget`. Reads
/// only: an open checks this before it writes anything.
pub(crate) fn check_budget(
    db: &Database,
    seed: u64,
    now: u64,
    caches: MemoryUse,
    budget: u64,
) -> Result<(), Error> {
    let txn = db.begin_read()?;
    let (
        _,
        _,
        Counted {
            records,
            horizon_keys,
            horizon_tags,
            filter_bytes,
        },
    ) = counted_catalog(&txn, seed, now)?;
    let needed = MemoryUse {
        key_index: key_index::bytes_for(records),
        key_filters: filter_bytes,
        horizon: horizon::bytes_for(horizon_keys, horizon_tags),
        ..caches
    };
    if needed.total() > budget {
        return Err(Error::MemoryBudget {
            needed,
            budget,
            records,
            horizon_keys: horizon_keys + horizon_tags,
        });
    }
    Ok(())
}

/// What [`pending_rows`] calls with each row's key, `until` and value.
type PendingVisitor<'a> = dyn FnMut(&[u8], u64, &[u8]) -> Result<(), Error> + 'a;

/// Calls `each` with every row of `idemdb_recognised` whose hashes are not all in the table
/// of recognised keys (recognised.rs): those named unindexed, or every row of a file written
/// before that table (the format upgrade names them all). Rows whose horizon passed are
/// included: they are held (and counted) until the next pass retires them, as on disk.
fn pending_rows(txn: &redb::ReadTransaction, each: &mut PendingVisitor<'_>) -> Result<(), Error> {
    let rows = match txn.open_table(RECOGNISED) {
        Ok(rows) => rows,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    match recognised::unindexed_rows(txn)? {
        None => {
            for row in rows.iter()? {
                let (k, v) = row?;
                each(k.value(), row_until(k.value())?, v.value())?;
            }
        }
        Some(keys) => {
            for key in keys {
                // A mark whose row is gone is stale: nothing to hold.
                if let Some(v) = rows.get(key.as_slice())? {
                    each(&key, row_until(&key)?, v.value())?;
                }
            }
        }
    }
    Ok(())
}

/// What [`horizon_rows`] calls with each row's value and `until`.
type RowVisitor<'a> = dyn FnMut(&[u8], u64) -> Result<(), Error> + 'a;

/// Calls `each` with the value and `until` of every row of `table` (a recognition table) in
/// force at `now`; a table not there (never written) has none.
fn horizon_rows(
    txn: &redb::ReadTransaction,
    table: TableDefinition<&[u8], &[u8]>,
    now: u64,
    each: &mut RowVisitor<'_>,
) -> Result<(), Error> {
    let rows = match txn.open_table(table) {
        Ok(rows) => rows,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    for row in rows.iter()? {
        let (k, v) = row?;
        let until = row_until(k.value())?;
        if now < until {
            each(v.value(), until)?;
        }
    }
    Ok(())
}

/// A row value's decoding, its failure named as `table`'s.
pub(crate) fn named<T>(
    table: TableDefinition<&[u8], &[u8]>,
    decoded: Result<T, Error>,
) -> Result<T, Error> {
    decoded.map_err(|e| match e {
        Error::Corrupted(why) => Error::Corrupted(format!("{}: {why}", table.name())),
        other => other,
    })
}

/// Part of the bound [`Layout::latest_write`] starts from at open: the latest expiry of a
/// finished record whose key was acquired again (an IN_PROGRESS copy beside it). A write that
/// acquired over an expired copy happened at or after that copy's expiry. (The partitions'
/// windows bound the finished copies' writes.)
fn copies_expire_by(
    txn: &redb::ReadTransaction,
    partitions: &Partitions,
    index: &KeyIndex,
) -> Result<u64, Error> {
    let catalog = partitions.catalog();
    let mut tables = std::collections::HashMap::new();
    let mut latest = 0;
    for entry in txn.open_table(INFLIGHT)?.iter()? {
        let (k, _) = entry?;
        let key = RecordKey::from_stored(k.value());
        holders(&catalog, index, index.hash(k.value()), |part| {
            let table = match tables.entry(part.id) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(e) => {
                    e.insert(txn.open_table(part.table())?)
                }
            };
            // A copy that does not decode is never served (reading it is an error), so it
            // needs no bound; open must not fail on it (`verify` lists it).
            if let Ok(Some(rec)) = get_in(table, &key) {
                latest = latest.max(rec.expires_at);
            }
            Ok(ControlFlow::Continue(()))
        })?;
    }
    Ok(latest)
}

/// What a lookup found for one key.
#[derive(Debug, Default)]
pub(crate) struct Found {
    /// The live record, if any. Should two copies look live (the clock went back past an
    /// expiry), the one with the newer token wins, for the writer and the snapshots alike:
    /// it was written last.
    pub(crate) live: Option<Record>,
    /// Some copy of the key had expired: the key is older than its retention.
    pub(crate) expired: bool,
}

impl Found {
    fn consider(&mut self, rec: Record, now: u64) {
        if rec.is_expired(now) {
            self.expired = true;
        } else if self.live.as_ref().is_none_or(|l| rec.token > l.token) {
            self.live = Some(rec);
        }
    }
}

/// Reads a key from one partition.
pub(crate) trait PartitionReader {
    fn get(&mut self, part: &Partition, key: &RecordKey) -> Result<Option<Record>, Error>;
}

/// How far a lookup goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Probe {
    /// Every place the key may be: the writer, which must also see expired copies and two
    /// live ones should the clock have gone back.
    All,
    /// Stop at a live finished record that expires after `latest_write`, so a replay costs
    /// one B-tree probe: no newer copy can exist beside it, since a key is acquired again
    /// only once its record expired, and nothing was written after `latest_write`. A live
    /// record that expires earlier may have been expired when a newer copy was acquired and
    /// look live again only because the clock went back: then the in-flight table is probed
    /// too, and the newest copy (highest token) wins, as for the writer. The snapshots.
    UntilLive {
        /// The latest time anything was written ([`Layout::note_write_time`]).
        latest_write: u64,
    },
}

/// One key to look up: its bytes, its key-index hash, and the time expiry is judged at.
pub(crate) struct Lookup<'a> {
    pub(crate) key: &'a RecordKey,
    pub(crate) hash: u64,
    pub(crate) now: u64,
}

/// Where finished records are: the catalog of partitions, the index into them, and a reader.
pub(crate) struct Partitioned<'a, R> {
    pub(crate) catalog: &'a Catalog,
    pub(crate) index: &'a KeyIndex,
    pub(crate) reader: &'a mut R,
}

/// Looks a key up in the partitions the index points at and in the in-flight table (read by
/// `inflight`, only if the probe goes that far).
pub(crate) fn find(
    inflight: impl FnOnce() -> Result<Option<Record>, Error>,
    parts: Partitioned<'_, impl PartitionReader>,
    at: &Lookup<'_>,
    probe: Probe,
) -> Result<Found, Error> {
    // A live finished record that expires after `latest_write` is the newest copy of its key
    // (see `Probe::UntilLive`): the partitions not asked yet can only hold older ones.
    let settled = |found: &Found| match probe {
        Probe::All => false,
        Probe::UntilLive { latest_write } => found
            .live
            .as_ref()
            .is_some_and(|live| live.expires_at > latest_write),
    };
    let mut found = Found::default();
    in_partitions(&mut found, parts, at, settled)?;
    let look_further = !settled(&found);
    if look_further && let Some(rec) = inflight()? {
        found.consider(rec, at.now);
    }
    Ok(found)
}

/// Reads a key from the in-flight table.
pub(crate) fn inflight_in(
    table: &impl ReadableTable<&'static [u8], &'static [u8]>,
    key: &RecordKey,
) -> Result<Option<Record>, Error> {
    get_in(table, key)
}

/// Record tables as the log says they are, over what redb holds: the overlay's values for one
/// key (overlay.rs), then a batch's own writes, each newer than the one before.
pub(crate) struct Layered<'a, R> {
    /// The newest value per table last: later slots win.
    pub(crate) slots: &'a [Slot],
    pub(crate) base: R,
}

/// The value `table` holds according to `slots` (the newest last), if one says: `Some(None)`
/// when it holds nothing.
pub(crate) fn newest<'s>(slots: &'s [Slot], table: &str) -> Option<Option<&'s [u8]>> {
    slots
        .iter()
        .rev()
        .find(|s| &*s.table == table)
        .map(|s| s.value.as_deref())
}

impl<R: PartitionReader> PartitionReader for Layered<'_, R> {
    fn get(&mut self, part: &Partition, key: &RecordKey) -> Result<Option<Record>, Error> {
        match newest(self.slots, &part.table) {
            Some(v) => v
                .map(|v| crate::record::decode(key.as_bytes(), v))
                .transpose(),
            None => self.base.get(part, key),
        }
    }
}

/// Reads the key from the partitions that may hold it, until `settled` says what was found
/// is the answer.
fn in_partitions(
    found: &mut Found,
    parts: Partitioned<'_, impl PartitionReader>,
    at: &Lookup<'_>,
    settled: impl Fn(&Found) -> bool,
) -> Result<(), Error> {
    holders(parts.catalog, parts.index, at.hash, |part| {
        if let Some(rec) = parts.reader.get(part, at.key)? {
            found.consider(rec, at.now);
        }
        Ok(if settled(found) {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        })
    })
}

/// Calls `each` with every partition of `catalog` that may hold the key whose index hash is
/// `hash`, once each, until it breaks: those the key index names (ids no longer in the
/// catalog skipped), then the filtered ones whose filter says it may, the newest first (a
/// retry comes soon after its first answer, and a replay stops at the copy it answers).
pub(crate) fn holders(
    catalog: &Catalog,
    index: &KeyIndex,
    hash: u64,
    mut each: impl FnMut(&Partition) -> Result<ControlFlow<()>, Error>,
) -> Result<(), Error> {
    let named = index.candidates(hash);
    for id in named.ids() {
        if let Some(part) = catalog.get(id)
            && each(part)?.is_break()
        {
            return Ok(());
        }
    }
    for part in catalog.filtered().iter().rev() {
        if part.filter().is_some_and(|f| f.may_contain(hash))
            && !named.ids().any(|id| id == part.id)
            && each(part)?.is_break()
        {
            return Ok(());
        }
    }
    Ok(())
}

/// Reads a record from an open partition table.
pub(crate) fn get_in(
    table: &impl ReadableTable<&'static [u8], &'static [u8]>,
    key: &RecordKey,
) -> Result<Option<Record>, Error> {
    match table.get(key.as_bytes())? {
        Some(v) => Ok(Some(crate::record::decode(key.as_bytes(), v.value())?)),
        None => Ok(None),
    }
}
