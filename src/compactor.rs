//! Expiry: dropping whole partitions once every record in them expired, sweeping abandoned
//! IN_PROGRESS records, and retiring horizon sets, each in a short durable transaction of its
//! own between the writer's batches. Run by a background thread and by `compact_now`.

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use redb::{ReadableDatabase, ReadableTable, ReadableTableMetadata};

use crate::engine_tables::INFLIGHT;
use crate::error::Error;
use crate::reclaim::reclaim;
use crate::recognition::{index_pending, retire_horizon};
use crate::records::filter;
use crate::records::horizon::{row_key, sweep_source, write_row};
use crate::records::key_index::KeyIndex;
use crate::records::partition::Partition;
use crate::records::retired::Retirer;
use crate::records::summary::{self, SUMMARIES, Summary};
use crate::stats::Counter;
use crate::widen::widen;
use crate::writer::{Touches, Writer};
use idemdb_core::clock::Clock;
use idemdb_core::scope::RecordKey;

/// What one compaction pass removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CompactionReport {
    /// Partitions dropped whole.
    pub partitions_dropped: u64,
    /// Records in them.
    pub records_expired: u64,
    /// Abandoned IN_PROGRESS records removed (lease end + TTL passed).
    pub in_flight_expired: u64,
    /// Horizon sets retired (their keys are no longer recognised).
    pub horizon_sets_retired: u64,
    /// Partitions whose window closed that got their summary (their keys kept beside them,
    /// so that an open and their drop need not read them).
    pub partitions_summarized: u64,
    /// Wide partitions built from the narrow partitions of their window, once it closed, and
    /// groups built from their hours (a TTL of 48 h or more; docs/design.md §8.8).
    pub wide_partitions_built: u64,
    /// Partitions merged into them (narrow ones, and a group's hours; their records moved,
    /// their tables retired).
    pub partitions_widened: u64,
    /// Tables whose pages were freed: those of partitions dropped or merged, which leave the
    /// catalog by a rename and are deleted later in steps of bounded size (docs/design.md
    /// §8.9), this pass or a later one.
    pub tables_reclaimed: u64,
}

/// Partitions dropped in one durable commit, at most, and the records in them: a pass holds
/// the writer once for what is due at a time (six 10 s partitions a minute), and a backlog (a
/// store opened after days) drops in steps that each hold it for a bounded time.
const DROPS_PER_COMMIT: usize = 64;
const RECORDS_PER_COMMIT: u64 = 1 << 16;

/// One pass at `now`. Passes are serialised by the writer's compaction lock.
pub(crate) fn compact(writer: &Writer, now: u64) -> Result<CompactionReport, Error> {
    let engine = &*writer.engine;
    let _one_at_a_time = engine.compaction.lock();
    if engine.is_poisoned() {
        return Err(engine.poisoned_error());
    }
    // Its reads outside the writer look at redb itself: with every acknowledged record in it.
    writer.settle()?;
    let mut report = CompactionReport::default();
    let due: Vec<Arc<Partition>> = writer
        .engine
        .layout
        .partitions
        .catalog()
        .parts()
        .iter()
        .filter(|p| p.name.drop_at() <= now)
        .cloned()
        .collect();
    let mut due = due.into_iter().peekable();
    while due.peek().is_some() {
        // Read outside the writer, so the batches do not wait for it; checked again below.
        let read = engine.db.begin_read()?;
        let mut step = Vec::new();
        let mut records = 0;
        while step.len() < DROPS_PER_COMMIT && records < RECORDS_PER_COMMIT {
            let Some(part) = due.next() else {
                break;
            };
            let keys = match read.open_table(part.table()) {
                Ok(table) => keys_of(&read, &part.table, &table, &engine.layout.index)?,
                Err(redb::TableError::TableDoesNotExist(_)) => Summary::default(),
                Err(e) => return Err(e.into()),
            };
            records += keys.head.count;
            step.push((part, keys));
        }
        drop(read);
        let partitions = step.len() as u64;
        report.records_expired += drop_partitions(writer, step, now)?;
        report.partitions_dropped += partitions;
    }
    report.partitions_summarized = summarize(writer, now)?;
    let widened = widen(writer, now)?;
    report.wide_partitions_built = widened.built;
    report.partitions_widened = widened.merged;
    report.tables_reclaimed = reclaim(writer)?;
    report.in_flight_expired = sweep_in_flight(writer, now)?;
    index_pending(writer, now)?;
    report.horizon_sets_retired = retire_horizon(writer, now)?;
    Ok(report)
}

/// Drops `step`'s partitions in one durable commit, keeping their keys' hashes for the extended
/// horizon. Returns their record count.
fn drop_partitions(
    writer: &Writer,
    step: Vec<(Arc<Partition>, Summary)>,
    now: u64,
) -> Result<u64, Error> {
    let engine = &*writer.engine;
    let layout = &engine.layout;
    let dropped = writer.exclusive(
        Touches::Records,
        |txn| {
            let mut dropped = Vec::with_capacity(step.len());
            let mut retirer = Retirer::new(txn)?;
            for (part, read) in step {
                let keys = match txn.open_table(part.table()) {
                    // A batch that read the clock before this pass did may have added a
                    // record (already expired) since the read: read again, under the
                    // writer's lock.
                    Ok(table) if table.len()? != read.head.count => {
                        Summary::of_table(&table, &layout.index)?
                    }
                    Ok(_) => read,
                    Err(redb::TableError::TableDoesNotExist(_)) => Summary::default(),
                    Err(e) => return Err(e.into()),
                };
                // Its pages are freed by later steps (reclaim.rs): deleting a large table
                // here would hold the writer for as long as visiting every page of it.
                retirer.retire(txn, &part.table)?;
                summary::remove(txn, &part.table)?;
                filter::remove(txn, &part.table)?;
                let until = part.name.horizon(&layout.rules);
                // Recognised by their whole hashes (sorted, distinct).
                let kept = if layout.rules.keeps(until, now) && !keys.hashes.is_empty() {
                    Some(write_row(txn, until, &part.table, &keys.hashes)?)
                } else {
                    None
                };
                dropped.push((part, keys, until, kept));
            }
            Ok(dropped)
        },
        // Under the writer's lock and after the commit, so that no batch reopens (and so
        // recreates) a table, none runs between a drop and the recognition of its keys, and
        // a drop that did not commit is not forgotten in memory. Memory holds the row until
        // its hashes are on disk by hash (recognition.rs, later in the pass).
        |dropped| {
            for (part, _, until, kept) in dropped {
                layout.partitions.remove(part.id);
                if let Some(hashes) = kept {
                    let key = row_key(*until, &part.table);
                    layout.horizon.add_pending(key, *until, Arc::clone(hashes));
                }
            }
        },
    )?;
    let mut records = 0;
    for (part, keys, _, _) in dropped {
        // After the commit, outside the writer's lock: a batch that still finds the id in
        // the index skips it, as the catalog no longer has it.
        layout.index.remove_keys(&keys.hashes, part.id);
        engine.stats.add_n(Counter::ExpiredRecords, keys.head.count);
        engine.stats.add(Counter::PartitionsDropped);
        records += keys.head.count;
    }
    Ok(records)
}

/// The keys of partition `name` (`table` in `read`): its summary if it still holds, else
/// read from the table.
fn keys_of(
    read: &redb::ReadTransaction,
    name: &str,
    table: &impl ReadableTable<&'static [u8], &'static [u8]>,
    index: &KeyIndex,
) -> Result<Summary, Error> {
    let kept = match read.open_table(SUMMARIES) {
        Ok(rows) => summary::read(&rows, name)?,
        Err(redb::TableError::TableDoesNotExist(_)) => None,
        Err(e) => return Err(e.into()),
    };
    match kept {
        Some(kept) if kept.holds_for(table, index)? => Ok(kept),
        _ => Summary::of_table(table, index),
    }
}

/// Writes the summary of every partition whose window closed and that has none, in steps of
/// at most [`DROPS_PER_COMMIT`] partitions and [`RECORDS_PER_COMMIT`] records: each read
/// outside the writer, then, in one durable commit between batches, written for those whose
/// table still holds what was read (a record placed since, by a clock gone back, makes the
/// table read again at the next pass). Returns how many were written.
fn summarize(writer: &Writer, now: u64) -> Result<u64, Error> {
    let engine = &*writer.engine;
    let layout = &engine.layout;
    let pending: Vec<Arc<Partition>> = layout
        .partitions
        .catalog()
        .parts()
        .iter()
        .filter(|p| p.is_closed(now) && !p.is_summarized())
        .cloned()
        .collect();
    let mut pending = pending.into_iter().peekable();
    let mut written = 0;
    while pending.peek().is_some() {
        let read = engine.db.begin_read()?;
        let mut step = Vec::new();
        let mut records = 0;
        while step.len() < DROPS_PER_COMMIT && records < RECORDS_PER_COMMIT {
            let Some(part) = pending.next() else {
                break;
            };
            match read.open_table(part.table()) {
                Ok(table) => {
                    let summary = Summary::of_table(&table, &layout.index)?;
                    records += summary.head.count;
                    step.push((part, summary));
                }
                // Made by a batch whose records are not in redb yet: the next pass.
                Err(redb::TableError::TableDoesNotExist(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        drop(read);
        if step.is_empty() {
            continue;
        }
        let done = writer.exclusive(
            Touches::RowsBeside,
            |txn| {
                let mut done = Vec::with_capacity(step.len());
                for (part, summary) in step {
                    let table = txn.open_table(part.table())?;
                    if summary.holds_for(&table, &layout.index)? {
                        drop(table);
                        summary::write(txn, &part.table, &summary)?;
                        done.push(part);
                    }
                }
                Ok(done)
            },
            |done| done.iter().for_each(|p| p.mark_summarized()),
        )?;
        written += done.len() as u64;
    }
    Ok(written)
}

/// Removes IN_PROGRESS records whose lease ended more than a TTL ago: their owner is gone.
fn sweep_in_flight(writer: &Writer, now: u64) -> Result<u64, Error> {
    let engine = &*writer.engine;
    let layout = &engine.layout;
    let mut expired = Vec::new();
    {
        let txn = engine.db.begin_read()?;
        for entry in txn.open_table(INFLIGHT)?.iter()? {
            let (k, v) = entry?;
            if crate::record::decode(k.value(), v.value())?.is_expired(now) {
                expired.push(k.value().to_vec());
            }
        }
    }
    if expired.is_empty() {
        return Ok(0);
    }
    let name = sweep_source(now);
    let (count, _) = writer.exclusive(
        Touches::Records,
        |txn| {
            let mut table = txn.open_table(INFLIGHT)?;
            let mut removed = Vec::new();
            for key in &expired {
                // Looked at again: a takeover may have renewed it since the read.
                let stale = match table.get(key.as_slice())? {
                    Some(v) => crate::record::decode(key, v.value())?.is_expired(now),
                    None => false,
                };
                if stale && let Some(rec) = table.remove(key.as_slice())? {
                    removed.push((key.clone(), crate::record::decode(key, rec.value())?));
                }
            }
            // Each swept key is recognised until its own horizon (lease end + factor × TTL):
            // one horizon row per distinct horizon.
            let mut sets: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
            for (key, rec) in &removed {
                let ttl = layout.rules.ttl_ms(&RecordKey::from_stored(key));
                let until = layout.rules.swept_horizon(rec, ttl);
                if layout.rules.keeps(until, now) {
                    sets.entry(until).or_default().push(layout.index.hash(key));
                }
            }
            let mut rows = Vec::with_capacity(sets.len());
            for (until, mut hashes) in sets {
                hashes.sort_unstable();
                hashes.dedup();
                rows.push((until, write_row(txn, until, &name, &hashes)?));
            }
            Ok((removed.len() as u64, rows))
        },
        |(_, rows)| {
            for (until, hashes) in rows {
                let key = row_key(*until, &name);
                layout.horizon.add_pending(key, *until, Arc::clone(hashes));
            }
        },
    )?;
    engine.stats.add_n(Counter::ExpiredRecords, count);
    Ok(count)
}

/// The background compactor: a named thread that runs a pass every interval (real time; the
/// pass itself reads the database's clock), stopped and joined on close. A panic in it
/// poisons the database: writes are then refused with [`Error::Poisoned`] naming it.
pub(crate) struct Compactor {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

impl Compactor {
    pub(crate) fn start(
        writer: Arc<Writer>,
        clock: Arc<dyn Clock>,
        interval: Duration,
    ) -> Result<Compactor, Error> {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let signal = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("idemdb-compactor".into())
            .spawn(move || run(&writer, &*clock, interval, &signal))
            .map_err(|e| Error::ThreadSpawn {
                thread: "compactor",
                source: Arc::new(e),
            })?;
        Ok(Compactor {
            stop,
            thread: Some(thread),
        })
    }

    /// Stops the thread and waits for it; a pass under way finishes first.
    pub(crate) fn stop(&mut self) {
        *self.stop.0.lock() = true;
        self.stop.1.notify_all();
        if let Some(thread) = self.thread.take() {
            // Its panic was caught and reported inside it.
            let _ = thread.join();
        }
    }
}

impl Drop for Compactor {
    fn drop(&mut self) {
        self.stop();
    }
}

fn run(writer: &Writer, clock: &dyn Clock, interval: Duration, stop: &(Mutex<bool>, Condvar)) {
    loop {
        {
            let mut stopped = stop.0.lock();
            if !*stopped {
                stop.1.wait_for(&mut stopped, interval);
            }
            if *stopped {
                return;
            }
        }
        match catch_unwind(AssertUnwindSafe(|| compact(writer, clock.now_ms()))) {
            Ok(Ok(_)) => {}
            // A poisoned writer refuses every pass from now on.
            Ok(Err(_)) if writer.engine.is_poisoned() => return,
            // Anything else (a read failed) is tried again next interval.
            Ok(Err(_)) => {}
            Err(panic) => {
                writer.engine.poison_with(format!(
                    "the compactor thread panicked: {}",
                    crate::contain::panic_words(&*panic)
                ));
                return;
            }
        }
    }
}
