//! Widening: once the window of a wide partition closed, the narrow partitions in it are
//! merged into it, in key order, and dropped. Narrow partitions keep a checkpoint cheap while
//! records arrive (their pages are few and new); once closed they only wait for their drop,
//! and one table written in key order holds the same records in fewer pages (its leaves are
//! filled, not split at random), in far fewer tables for a lookup, an open and a drop to visit.
//!
//! Under a TTL of two days or more (with the defaults), closed hours are merged again into
//! groups of 1/24 of the TTL (`PartitionName::wide`'s second level), so that a lookup asks
//! about 24 filters, not one per hour of the TTL; the narrow partitions of a group that closed
//! go into it straight. Below, "narrow" means the partitions merged, of either level.
//!
//! A wide partition is an ordinary partition (`idemdb_p_…`) whose width is a multiple of the
//! configured one (`PartitionName::wide`): it is looked up, summarised, dropped and
//! recognised like any other, and no batch ever places a record in it (a record goes to the
//! partition of the configured width). It is built under another name
//! (`PartitionName::build_table_name`) in steps that each hold the writer for a bounded
//! time, then, in one durable transaction, renamed to its own while the narrow ones are
//! retired (records/retired.rs: renamed out of the catalog, their pages freed by later
//! steps), so that every record is in exactly one of them at every commit.
//!
//! Safety:
//! - The narrow partitions' records are read outside the writer; the switch checks under the
//!   writer's lock that each still has the length it had when read (records leave a
//!   partition only when it is dropped whole, and a key already there can only be written
//!   again by itself, so an unchanged length is an unchanged set of records), else it writes
//!   nothing and the next pass starts over.
//! - The wide partition carries its keys' filter (filter.rs) into the catalog the switch
//!   installs (or, should no filter build, the key index names it for every key before the
//!   switch commits), and the key index forgets the narrow ones only after it: a lookup under
//!   either catalog finds the record.
//! - A build table left by a crash or a failed pass is never read as a partition, and is
//!   retired by the next pass before it builds anything.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::ops::Bound;
use std::sync::Arc;

use redb::{ReadableDatabase, ReadableTableMetadata, TableDefinition};

use crate::error::Error;
use crate::records::filter::{self, FilterRow, KeyFilter};
use crate::records::head::TableHead;
use crate::records::partition::{Partition, PartitionName, partition_tables_with};
use crate::records::retired::Retirer;
use crate::records::summary::{self, Summary};
use crate::writer::{Touches, Writer};

/// Bytes of records (keys and values) written in one step: one durable commit between
/// batches, holding the writer for about as long as a checkpoint of that size.
const STEP_BYTES: usize = 2 << 20;

/// Records widened in one pass, at least one wide partition: a backlog (a file written by a
/// build without widening, or a store reopened after days) is worked off over several passes.
const RECORDS_PER_PASS: u64 = 1 << 20;

/// What one pass widened.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Widened {
    /// Wide partitions built.
    pub(crate) built: u64,
    /// Narrow partitions merged into them (and dropped).
    pub(crate) merged: u64,
}

/// Builds the wide partitions whose window closed at `now` from the narrow ones in them, up to
/// [`RECORDS_PER_PASS`] records. Run by a compaction pass, which holds the compaction lock.
pub(crate) fn widen(writer: &Writer, now: u64) -> Result<Widened, Error> {
    let engine = &*writer.engine;
    let layout = &engine.layout;
    discard_stale_builds(writer)?;
    let catalog = layout.partitions.catalog();
    let rules = &layout.rules;
    let mut windows: BTreeMap<PartitionName, Vec<Arc<Partition>>> = BTreeMap::new();
    for part in catalog.parts() {
        let Some(mut wide) = part.name.wide(rules) else {
            continue;
        };
        // A narrow partition whose group (partition.rs) closed goes into it straight: its hour
        // is not built only to be merged again.
        if let Some(group) = wide.wide(rules)
            && group.start.saturating_add(group.width) <= now
        {
            wide = group;
        }
        // Closed (nothing more is placed in it unless the clock goes back), not due yet
        // (dropping the narrow ones costs less than building it).
        if part.is_closed(now)
            && wide.start.saturating_add(wide.width) <= now
            && wide.drop_at() > now
        {
            windows.entry(wide).or_default().push(Arc::clone(part));
        }
    }
    let mut widened = Widened::default();
    let mut records = 0;
    for (wide, narrow) in windows {
        // A window widened before whose narrow partitions came back (a clock gone back)
        // keeps them: the wide one is never written again.
        if narrow.len() < 2
            || layout.partitions.is_unmergeable(&wide)
            || catalog.parts().iter().any(|p| p.name == wide)
        {
            continue;
        }
        if records >= RECORDS_PER_PASS {
            break;
        }
        if let Some(count) = build(writer, wide, &narrow)? {
            records += count;
            widened.built += 1;
            widened.merged += narrow.len() as u64;
        }
    }
    Ok(widened)
}

/// Retires build tables left by a crash or a failed pass (their pages are freed by reclaim.rs):
/// no build is under way between passes, and passes are serialised.
fn discard_stale_builds(writer: &Writer) -> Result<(), Error> {
    let stale = {
        let read = writer.engine.db.begin_read()?;
        partition_tables_with(&read, PartitionName::is_build_table)?
    };
    if stale.is_empty() {
        return Ok(());
    }
    writer.exclusive(
        Touches::RowsBeside,
        |txn| {
            let mut retirer = Retirer::new(txn)?;
            for name in &stale {
                retirer.retire(txn, name)?;
            }
            Ok(())
        },
        |_| {},
    )
}

/// Builds `wide` from `narrow` (all of its window's partitions of the configured width) and
/// switches to it. Returns the records moved, or `None` if the switch found a narrow partition
/// changed (or two holding one key: only a clock gone back far does that), which leaves them
/// as they were.
fn build(
    writer: &Writer,
    wide: PartitionName,
    narrow: &[Arc<Partition>],
) -> Result<Option<u64>, Error> {
    let engine = &*writer.engine;
    let layout = &engine.layout;
    let build_name = wide.build_table_name();
    let build_table: TableDefinition<&[u8], &[u8]> = TableDefinition::new(&build_name);
    // Each narrow partition's length when first read, and the keys' hashes.
    let mut lens: Vec<u64> = Vec::new();
    let mut hashes: Vec<u64> = Vec::new();
    let mut after: Option<Vec<u8>> = None;
    let mut first = None;
    let mut count = 0u64;
    loop {
        let step = match merge_step(&engine.db.begin_read()?, narrow, after.as_deref())? {
            Merged::Records { records, lens: now } => {
                if lens.is_empty() {
                    lens = now;
                    hashes.reserve(usize::try_from(lens.iter().sum::<u64>()).unwrap_or(0));
                }
                records
            }
            // Dropped or not written yet: leave this window for a later pass.
            Merged::Gone => return Ok(None),
            // One key in two of them: a clock gone back far. Left as it is.
            Merged::Twice => {
                layout.partitions.mark_unmergeable(wide);
                return Ok(None);
            }
        };
        let Some((last_key, _)) = step.last() else {
            break;
        };
        for (key, _) in &step {
            let hash = layout.index.hash(key);
            hashes.push(hash);
            first.get_or_insert(hash);
        }
        after = Some(last_key.clone());
        let fresh = count == 0;
        count += step.len() as u64;
        writer.exclusive(
            Touches::RowsBeside,
            |txn| {
                if fresh {
                    txn.delete_table(build_table)?;
                }
                let mut table = txn.open_table(build_table)?;
                for (k, v) in &step {
                    table.insert(k.as_slice(), v.as_slice())?;
                }
                Ok(())
            },
            |_| {},
        )?;
    }
    if count == 0 {
        return Ok(None);
    }
    let first = first.unwrap_or(0);
    let last = after.as_deref().map_or(0, |k| layout.index.hash(k));
    hashes.sort_unstable();
    hashes.dedup();
    let head = TableHead { count, first, last };
    let summary = Summary::new(head, hashes);
    let part = layout.partitions.detached(wide);
    // Before the switch, a lookup under the new catalog finds every key in the wide one:
    // through the filter it carries into that catalog, or (no seed peeled) the key index.
    let filter_row = match KeyFilter::build(&summary.hashes) {
        Some(filter) => {
            let row = FilterRow::new(head, filter);
            let encoded = row.encode();
            part.set_filter(row.filter);
            Some(encoded)
        }
        None => {
            layout.index.insert_sorted(&summary.hashes, part.id);
            None
        }
    };
    let indexed = filter_row.is_none();
    let mut narrow_ids: Vec<_> = narrow.iter().map(|p| p.id).collect();
    narrow_ids.sort_unstable();
    // The key index names a partition only if it has no filter (a narrow one, or a wide one
    // whose filter did not build): a group's hours are found through their filters.
    let mut indexed_ids: Vec<_> = narrow
        .iter()
        .filter(|p| p.filter().is_none())
        .map(|p| p.id)
        .collect();
    indexed_ids.sort_unstable();
    #[cfg(feature = "test-hooks")]
    if let Some(hook) = engine.before_widening_switch.lock().take() {
        hook();
    }
    let switched = writer.exclusive(
        Touches::RowsBeside,
        |txn| {
            for (p, &len) in narrow.iter().zip(&lens) {
                match txn.open_table(p.table()) {
                    Ok(t) if t.len()? == len => {}
                    // A record placed since the read (a clock gone back), or the table gone.
                    Ok(_) | Err(redb::TableError::TableDoesNotExist(_)) => return Ok(false),
                    Err(e) => return Err(e.into()),
                }
            }
            // Retired, not deleted: their pages are freed by later steps (reclaim.rs).
            let mut retirer = Retirer::new(txn)?;
            for p in narrow {
                retirer.retire(txn, &p.table)?;
                summary::remove(txn, &p.table)?;
                filter::remove(txn, &p.table)?;
            }
            txn.rename_table(build_table, part.table())?;
            summary::write(txn, &part.table, &summary)?;
            if let Some(row) = &filter_row {
                filter::write(txn, &part.table, row)?;
            }
            Ok(true)
        },
        |switched| {
            if *switched {
                part.mark_summarized();
                layout
                    .partitions
                    .replace(&narrow_ids, Some(Arc::clone(&part)));
            }
        },
    );
    match switched {
        Ok(true) => {
            // After the commit: a lookup that still finds a narrow id skips it, as the
            // catalog no longer has it.
            if !indexed_ids.is_empty() {
                layout.index.remove_keys_of(&summary.hashes, &indexed_ids);
            }
            Ok(Some(count))
        }
        Ok(false) => {
            if indexed {
                layout.index.remove_keys(&summary.hashes, part.id);
            }
            Ok(None)
        }
        Err(e) => {
            if indexed {
                layout.index.remove_keys(&summary.hashes, part.id);
            }
            Err(e)
        }
    }
}

/// What one read of the narrow partitions gave.
enum Merged {
    /// The next records in key order after the last step's (none: the build is complete),
    /// and each partition's length in this read.
    Records {
        records: Vec<(Vec<u8>, Vec<u8>)>,
        lens: Vec<u64>,
    },
    /// A narrow partition's table is not there.
    Gone,
    /// Two of them hold one key.
    Twice,
}

/// Merges, in `read`, the records of `narrow` after key `after` in key order, up to
/// [`STEP_BYTES`] of keys and values: a heap of one range per partition.
fn merge_step(
    read: &redb::ReadTransaction,
    narrow: &[Arc<Partition>],
    after: Option<&[u8]>,
) -> Result<Merged, Error> {
    let mut tables = Vec::with_capacity(narrow.len());
    for part in narrow {
        match read.open_table(part.table()) {
            Ok(t) => tables.push(t),
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Merged::Gone),
            Err(e) => return Err(e.into()),
        }
    }
    let lens = tables.iter().map(|t| t.len()).collect::<Result<_, _>>()?;
    let from = after.map_or(Bound::Unbounded, Bound::Excluded);
    let mut ranges = Vec::with_capacity(tables.len());
    for t in &tables {
        ranges.push(t.range::<&[u8]>((from, Bound::Unbounded))?);
    }
    // The smallest key of each range, and which range it came from.
    let mut heads = BinaryHeap::new();
    let mut advance = |heads: &mut BinaryHeap<_>, i: usize| -> Result<(), Error> {
        if let Some(entry) = ranges[i].next() {
            let (k, v) = entry?;
            heads.push(Reverse((k.value().to_vec(), i, v.value().to_vec())));
        }
        Ok(())
    };
    for i in 0..tables.len() {
        advance(&mut heads, i)?;
    }
    let mut records: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    let mut bytes = 0;
    while bytes < STEP_BYTES {
        let Some(Reverse((key, i, value))) = heads.pop() else {
            break;
        };
        if records.last().is_some_and(|(last, _)| *last == key) {
            return Ok(Merged::Twice);
        }
        advance(&mut heads, i)?;
        bytes += key.len() + value.len();
        records.push((key, value));
    }
    // The next step starts after this one's last key: a key equal to it in another range
    // (among the heads left) would be skipped there.
    if let Some(Reverse((key, _, _))) = heads.peek()
        && records.last().is_some_and(|(last, _)| last == key)
    {
        return Ok(Merged::Twice);
    }
    Ok(Merged::Records { records, lens })
}
