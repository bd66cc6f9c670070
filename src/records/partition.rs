//! Time partitions of finished records: one redb table per (window of last change, TTL),
//! named so that the set of partitions is the set of tables, with nothing else to keep in
//! step. A partition is dropped whole once every record in it has expired.
//!
//! Invariant: every record in a partition has `start ≤ updated_at < start + width` and
//! `expires_at = updated_at + ttl`, so all of them have expired once `now ≥ drop_at()`.
//! A record goes to the partition of its own window, whatever newer partitions exist, so one
//! record written under a clock that was far ahead holds back only its own partition.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::RwLock;
use redb::{ReadTransaction, TableDefinition, TableHandle};

use crate::error::Error;
use crate::records::filter::KeyFilter;
use idemdb_core::retention::Rules;

/// Table name prefix of a partition: `idemdb_p_{start:020}_{width}_{ttl}`, all in ms.
const PREFIX: &str = "idemdb_p_";

/// Table name prefix of a wide partition under construction (widen.rs): the wide partition's
/// name with this prefix instead. Never read as a partition; one left by a crash or a failed
/// pass is deleted by the next.
const BUILD_PREFIX: &str = "idemdb_b_";

/// A wide partition of the first level (narrow partitions merged) spans about this fraction
/// of its TTL (widen.rs): its records stay on disk up to 1/16 of a TTL after they expired, and
/// the records of its window wait in narrow partitions, in the key index, until it closed.
const WIDE_PER_TTL: u64 = 16;

/// A wide partition of the first level spans at most this (ms): the key index, which holds
/// the records of the window still open, holds an hour of them at most.
const WIDE_AT_MOST_MS: u64 = 3_600_000;

/// A group (the second level: wide partitions of the first merged) spans about this fraction
/// of a TTL over a day, so that a lookup asks about 24 groups' filters plus those of the open
/// group's hours (§8.3) instead of a filter per hour. A build holds its keys' hashes in memory
/// until the switch: at most about 1/24 of the records a TTL holds, as an hour of a 24 h TTL.
const GROUPS_PER_TTL: u64 = 24;

/// In-process identity of a partition, for the key index. Ids wrap back to 1 only after
/// 4 billion partitions were created in one process.
pub(crate) type PartitionId = u32;

/// What names a partition: its window of last change and the TTL of every record in it, all
/// in ms. Its table is `idemdb_p_{start:020}_{width}_{ttl}`, so tables sort by window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct PartitionName {
    /// Start of the window, ms since the epoch.
    pub(crate) start: u64,
    pub(crate) width: u64,
    pub(crate) ttl: u64,
}

impl PartitionName {
    pub(crate) fn table_name(&self) -> String {
        self.name_after(PREFIX)
    }

    fn name_after(&self, prefix: &str) -> String {
        format!("{prefix}{:020}_{}_{}", self.start, self.width, self.ttl)
    }

    /// The name of a partition table; `None` for any other table, and for a name that is not
    /// exactly as `table_name` writes it (`+5`, leading zeros in width or TTL, a short start):
    /// one partition has one table name.
    pub(crate) fn parse(table: &str) -> Option<PartitionName> {
        let mut parts = table.strip_prefix(PREFIX)?.split('_');
        let start = parts.next()?.parse().ok()?;
        let width: u64 = parts.next()?.parse().ok()?;
        let ttl: u64 = parts.next()?.parse().ok()?;
        if parts.next().is_some() || width == 0 || ttl == 0 {
            return None;
        }
        let name = PartitionName { start, width, ttl };
        (name.table_name() == table).then_some(name)
    }

    /// Whether `table` carries the partition prefix (well formed or not).
    pub(crate) fn is_partition_table(table: &str) -> bool {
        table.starts_with(PREFIX)
    }

    /// The partition a finished record last changed at `updated_at` with TTL `ttl` belongs
    /// to: the one of its own window.
    pub(crate) fn of_record(rules: &Rules, updated_at: u64, ttl: u64) -> PartitionName {
        let width = rules.width_ms.max(1);
        PartitionName {
            start: updated_at - updated_at % width,
            width,
            ttl,
        }
    }

    /// The table a wide partition of this name is built in before it is renamed to its own.
    pub(crate) fn build_table_name(&self) -> String {
        self.name_after(BUILD_PREFIX)
    }

    /// Whether `table` is a wide partition's table under construction.
    pub(crate) fn is_build_table(table: &str) -> bool {
        table.starts_with(BUILD_PREFIX)
    }

    /// The wide partition whose window holds this one's, if its records are gathered into a
    /// wider one (widen.rs), aligned on the epoch:
    /// - a partition of the configured width: the widest multiple of the width that is at
    ///   most 1/16 of the TTL and at most an hour, at least twice the width (a TTL under 32
    ///   widths gets none);
    /// - a wide partition of that first level: its group, the widest multiple of the first
    ///   level's width that is at most 1/24 of the TTL, at least twice it (a TTL of 48 hours
    ///   or more, with the defaults).
    pub(crate) fn wide(&self, rules: &Rules) -> Option<PartitionName> {
        let width = rules.width_ms;
        if width == 0 {
            return None;
        }
        let first = widest(width, (self.ttl / WIDE_PER_TTL).min(WIDE_AT_MOST_MS))?;
        let wide = if self.width == width {
            first
        } else if self.width == first {
            widest(first, self.ttl / GROUPS_PER_TTL)?
        } else {
            return None;
        };
        Some(PartitionName {
            start: self.start - self.start % wide,
            width: wide,
            ttl: self.ttl,
        })
    }

    /// Until when the keys of this partition, once dropped, are recognised: its window's end +
    /// factor × TTL.
    pub(crate) fn horizon(&self, rules: &Rules) -> u64 {
        self.start
            .saturating_add(self.width)
            .saturating_add(rules.horizon_ms(self.ttl))
    }

    /// When every record in it has expired.
    pub(crate) fn drop_at(&self) -> u64 {
        self.start
            .saturating_add(self.width)
            .saturating_add(self.ttl)
    }
}

/// The widest multiple of `unit` that is at most `at_most`, if that is at least two of them.
fn widest(unit: u64, at_most: u64) -> Option<u64> {
    let n = at_most / unit;
    if n < 2 { None } else { n.checked_mul(unit) }
}

/// A partition of the catalog: its name, and its in-process id for the key index.
#[derive(Debug)]
pub(crate) struct Partition {
    pub(crate) id: PartitionId,
    pub(crate) name: PartitionName,
    /// `name`'s table name (shared by the overlay's entries and the log's effects).
    pub(crate) table: Arc<str>,
    /// Its keys are summarised in a row of `idemdb_keys` (summary.rs), written by this
    /// process or found valid at open: the compactor does not summarise it again.
    pub(crate) summarized: AtomicBool,
    /// Its keys as a filter (filter.rs): set before it enters a catalog (a wide partition's
    /// switch) or, at open, before the first catalog that lists it as filtered; its keys are
    /// then found through it, not through the key index.
    filter: OnceLock<KeyFilter>,
}

impl Partition {
    /// Whether its window has ended at `now`: records finished from then on go to later
    /// windows (unless the clock goes back).
    pub(crate) fn is_closed(&self, now: u64) -> bool {
        now >= self.name.start.saturating_add(self.name.width)
    }

    pub(crate) fn is_summarized(&self) -> bool {
        self.summarized.load(Ordering::Acquire)
    }

    pub(crate) fn mark_summarized(&self) {
        self.summarized.store(true, Ordering::Release);
    }

    pub(crate) fn table(&self) -> TableDefinition<'_, &'static [u8], &'static [u8]> {
        TableDefinition::new(&self.table)
    }

    pub(crate) fn filter(&self) -> Option<&KeyFilter> {
        self.filter.get()
    }

    /// Gives it its filter (once: a second is ignored). A catalog made before this does not
    /// list it as filtered (see [`Partitions::refresh`]).
    pub(crate) fn set_filter(&self, filter: KeyFilter) {
        let _ = self.filter.set(filter);
    }
}

/// The names of the partition tables in `txn`: the tables are the catalog, there is no other
/// list to keep in step.
pub(crate) fn partition_tables(txn: &ReadTransaction) -> Result<Vec<String>, Error> {
    partition_tables_with(txn, PartitionName::is_partition_table)
}

/// The names of the tables in `txn` that `wanted` picks.
pub(crate) fn partition_tables_with(
    txn: &ReadTransaction,
    wanted: impl Fn(&str) -> bool,
) -> Result<Vec<String>, Error> {
    Ok(txn
        .list_tables()?
        .map(|t| t.name().to_string())
        .filter(|n| wanted(n))
        .collect())
}

/// The partitions that exist, oldest window first. Immutable: a change installs a new one.
#[derive(Debug, Default)]
pub(crate) struct Catalog {
    parts: Vec<Arc<Partition>>,
    positions: HashMap<PartitionId, usize>,
    /// The partitions that had a filter when this catalog was made: a lookup asks each.
    filtered: Vec<Arc<Partition>>,
}

impl Catalog {
    fn new(mut parts: Vec<Arc<Partition>>) -> Catalog {
        parts.sort_by_key(|p| p.name);
        let positions = parts.iter().enumerate().map(|(i, p)| (p.id, i)).collect();
        let filtered = parts
            .iter()
            .filter(|p| p.filter().is_some())
            .cloned()
            .collect();
        Catalog {
            parts,
            positions,
            filtered,
        }
    }

    pub(crate) fn parts(&self) -> &[Arc<Partition>] {
        &self.parts
    }

    /// The partitions found through their filters rather than the key index.
    pub(crate) fn filtered(&self) -> &[Arc<Partition>] {
        &self.filtered
    }

    /// Where partition `id` is in [`parts`](Self::parts).
    pub(crate) fn position(&self, id: PartitionId) -> Option<usize> {
        self.positions.get(&id).copied()
    }

    pub(crate) fn get(&self, id: PartitionId) -> Option<&Arc<Partition>> {
        self.position(id).map(|i| &self.parts[i])
    }

    /// This catalog with `part` added. A partition of the newest window (almost always: the
    /// clock moves forward) goes last and moves nobody, so the positions are copied rather
    /// than hashed again: thousands of partitions are usual (10 s windows), and the writer
    /// waits for this once per window.
    fn with(&self, part: Arc<Partition>) -> Catalog {
        let mut parts = self.parts.clone();
        if self.parts.last().is_none_or(|last| last.name < part.name) {
            let mut positions = self.positions.clone();
            positions.insert(part.id, parts.len());
            let mut filtered = self.filtered.clone();
            if part.filter().is_some() {
                filtered.push(Arc::clone(&part));
            }
            parts.push(part);
            return Catalog {
                parts,
                positions,
                filtered,
            };
        }
        parts.push(part);
        Catalog::new(parts)
    }
}

/// Where [`Partitions::place`] put a record.
pub(crate) struct Placement {
    pub(crate) partition: Arc<Partition>,
    /// The partition is new in the catalog: forget it if the transaction does not commit.
    pub(crate) created: bool,
    /// A partition of a later window of the same class exists: the clock is behind a time it
    /// showed before (it went back, or it had jumped ahead).
    pub(crate) behind_newest: bool,
}

/// The current catalog, shared by the writer (which adds partitions), the compactor (which
/// removes them) and the snapshots (which read the one they were taken with).
pub(crate) struct Partitions {
    current: RwLock<Arc<Catalog>>,
    next_id: RwLock<PartitionId>,
    /// Wide windows whose narrow partitions hold one key twice (widen.rs): left as they are
    /// by this process.
    unmergeable: RwLock<BTreeSet<PartitionName>>,
}

impl Partitions {
    /// The catalog of the partition tables named in `names`; other names are ignored.
    pub(crate) fn from_names<'a>(names: impl IntoIterator<Item = &'a str>) -> Partitions {
        let parts: Vec<Arc<Partition>> = names
            .into_iter()
            .filter_map(|table| Some((PartitionName::parse(table)?, Arc::<str>::from(table))))
            .enumerate()
            .map(|(i, (name, table))| {
                Arc::new(Partition {
                    id: i as PartitionId + 1,
                    name,
                    table,
                    summarized: AtomicBool::new(false),
                    filter: OnceLock::new(),
                })
            })
            .collect();
        let next_id = parts.len() as PartitionId + 1;
        Partitions {
            current: RwLock::new(Arc::new(Catalog::new(parts))),
            next_id: RwLock::new(next_id),
            unmergeable: RwLock::default(),
        }
    }

    pub(crate) fn catalog(&self) -> Arc<Catalog> {
        Arc::clone(&self.current.read())
    }

    /// A fresh id, for a partition not yet in the catalog.
    fn allocate_id(&self) -> PartitionId {
        let mut next = self.next_id.write();
        let id = *next;
        // 0 is the key index's empty slot, never an id.
        *next = if *next >= PartitionId::MAX - 1 {
            1
        } else {
            *next + 1
        };
        id
    }

    /// A partition named `name` with a fresh id, not yet in the catalog (a new window's, or a
    /// wide partition being built: the key index names it before the catalog does).
    pub(crate) fn detached(&self, name: PartitionName) -> Arc<Partition> {
        Arc::new(Partition {
            id: self.allocate_id(),
            table: name.table_name().into(),
            name,
            summarized: AtomicBool::new(false),
            filter: OnceLock::new(),
        })
    }

    /// Remembers that the narrow partitions of wide window `wide` cannot be merged.
    pub(crate) fn mark_unmergeable(&self, wide: PartitionName) {
        self.unmergeable.write().insert(wide);
    }

    pub(crate) fn is_unmergeable(&self, wide: &PartitionName) -> bool {
        self.unmergeable.read().contains(wide)
    }

    /// Forgets the partitions `removed` (sorted) and installs `added`, if any, in their place
    /// (a wide partition that holds their records now).
    pub(crate) fn replace(&self, removed: &[PartitionId], added: Option<Arc<Partition>>) {
        let mut current = self.current.write();
        let mut parts: Vec<Arc<Partition>> = current
            .parts
            .iter()
            .filter(|p| removed.binary_search(&p.id).is_err())
            .cloned()
            .collect();
        parts.extend(added);
        *current = Arc::new(Catalog::new(parts));
    }

    /// The partition `name` (a record's own window: `PartitionName::of_record`), created if
    /// needed, and whether it was created. Called by the writer only, so the catalog cannot
    /// change between the look and the install.
    ///
    /// Always the record's own window, even when a newer partition of its class exists (the
    /// clock went back, or once jumped ahead): a record placed in a future window would keep
    /// that whole partition, and every later record put beside it, until the future date.
    pub(crate) fn place(&self, name: PartitionName) -> Placement {
        let catalog = self.catalog();
        // The current window is the newest one almost always: search from the end, down to
        // the windows that start before `name`'s (sorted by start first: none of them is it).
        let mut newer_exists = false;
        for p in catalog.parts.iter().rev() {
            if p.name.start < name.start {
                break;
            }
            if p.name.width != name.width || p.name.ttl != name.ttl {
                continue;
            }
            if p.name.start == name.start {
                return Placement {
                    partition: Arc::clone(p),
                    created: false,
                    behind_newest: newer_exists,
                };
            }
            newer_exists |= p.name.start > name.start;
        }
        let part = self.detached(name);
        *self.current.write() = Arc::new(catalog.with(Arc::clone(&part)));
        Placement {
            partition: part,
            created: true,
            behind_newest: newer_exists,
        }
    }

    /// Makes the catalog again from the same partitions, so that it lists those given a filter
    /// since (the open, before anything reads it).
    pub(crate) fn refresh(&self) {
        self.replace(&[], None);
    }

    /// Forgets a dropped partition.
    pub(crate) fn remove(&self, id: PartitionId) {
        self.replace(&[id], None);
    }
}

/// The partitions of a transaction, oldest window first, as the catalog orders them.
pub(crate) fn partition_names(txn: &ReadTransaction) -> Result<Vec<PartitionName>, Error> {
    let mut parts: Vec<PartitionName> = partition_tables(txn)?
        .iter()
        .filter_map(|table| PartitionName::parse(table))
        .collect();
    parts.sort();
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(start: u64, width: u64, ttl: u64) -> PartitionName {
        PartitionName { start, width, ttl }
    }

    /// The partition a record changed at `t` goes to (as `PartitionName::of_record`).
    fn window(t: u64, width: u64, ttl: u64) -> PartitionName {
        name(t - t % width, width, ttl)
    }

    #[test]
    fn names_round_trip_and_sort_by_window() {
        let a = name(3_600_000, 3_600_000, 60_000);
        assert_eq!(
            a.table_name(),
            "idemdb_p_00000000000003600000_3600000_60000"
        );
        assert_eq!(PartitionName::parse(&a.table_name()), Some(a));
        assert!(name(999, 1, 1).table_name() < name(1000, 1, 1).table_name());
        assert!(name(999, 1, 1) < name(1000, 1, 1));
        for bad in [
            "idemdb_p_1_2",
            "idemdb_p_1_0_5",
            "idemdb_p_x_1_1",
            "idemdb_p_1_1_1_1",
            "t",
            // Not as table_name writes them: one partition has one name.
            "idemdb_p_1_1_1",
            "idemdb_p_+0000000000000000001_1_1",
            "idemdb_p_00000000000000000001_01_1",
            "idemdb_p_00000000000000000001_1_+1",
        ] {
            assert_eq!(PartitionName::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_wide_window_is_a_sixteenth_of_the_ttl_at_most_an_hour_and_a_group_a_24th_in_whole_widths()
    {
        use idemdb_core::retention::Retention;
        use std::time::Duration;
        let rules = |width_s: u64, ttl_s: u64| {
            Retention::default()
                .partition_width(Duration::from_secs(width_s))
                .ttl(Duration::from_secs(ttl_s))
                .rules(Duration::from_secs(10))
        };
        let wide =
            |r: &Rules, start: u64, ttl_s: u64| name(start, r.width_ms, ttl_s * 1000).wide(r);
        // The defaults: 10 s under 24 h (a sixteenth: 1 h 30 min) and under 7 days: an hour.
        let day = rules(10, 86_400);
        assert_eq!(
            wide(&day, 7_210_000, 86_400),
            Some(name(7_200_000, 3_600_000, 86_400_000))
        );
        assert_eq!(
            wide(&day, 7_210_000, 7 * 86_400).map(|w| w.width),
            Some(3_600_000)
        );
        // Under 7 days, the hours in groups of 7 (a 24th), aligned on the
        // epoch; under 30 days, 30 h; under 47 h, none (a 24th is under two hours).
        let week = 7 * 86_400_000;
        let hour = |start: u64, ttl: u64| name(start, 3_600_000, ttl);
        assert_eq!(
            hour(8 * 3_600_000, week).wide(&day),
            Some(name(7 * 3_600_000, 7 * 3_600_000, week))
        );
        assert_eq!(
            hour(6 * 3_600_000, week).wide(&day).map(|w| w.start),
            Some(0)
        );
        assert_eq!(
            hour(0, 30 * 86_400_000).wide(&day).map(|w| w.width),
            Some(30 * 3_600_000)
        );
        assert_eq!(hour(0, 47 * 3_600_000).wide(&day), None);
        assert_eq!(
            hour(0, 48 * 3_600_000).wide(&day).map(|w| w.width),
            Some(7_200_000)
        );
        // A group is widened no further; an hour under a 24 h TTL neither.
        assert_eq!(name(0, 7 * 3_600_000, week).wide(&day), None);
        assert_eq!(hour(0, 86_400_000).wide(&day), None);
        // 1 min under 60 min: 3 min 45 s, in whole widths 3 min, aligned on the epoch.
        let hour = rules(60, 3_600);
        assert_eq!(
            wide(&hour, 420_000, 3_600),
            Some(name(360_000, 180_000, 3_600_000))
        );
        // Under 32 widths of TTL: none (10 s under 5 min is a sixteenth of 18.75 s).
        assert_eq!(wide(&rules(10, 300), 0, 300), None);
        assert_eq!(wide(&rules(10, 320), 0, 320).map(|w| w.width), Some(20_000));
        // A partition of another width than the configured one (an older setting): none.
        assert_eq!(name(0, 5_000, 86_400_000).wide(&day), None);
    }

    #[test]
    fn placement_follows_the_window_even_when_the_clock_went_back() {
        let parts = Partitions::from_names([]);
        let a = parts.place(window(10_500, 1_000, 50));
        assert!(a.created && !a.behind_newest);
        let a = a.partition;
        assert_eq!((a.name.start, a.name.drop_at()), (10_000, 11_050));
        let again = parts.place(window(10_999, 1_000, 50));
        assert_eq!(again.partition.id, a.id);
        assert!(!again.created);
        let other_ttl = parts.place(window(10_999, 1_000, 70)).partition;
        assert_ne!(other_ttl.id, a.id);
        let b = parts.place(window(11_000, 1_000, 50)).partition;
        assert_eq!(b.name.start, 11_000);
        let back = parts.place(window(10_200, 1_000, 50));
        assert_eq!(back.partition.id, a.id, "its own window, not the newest");
        assert!(back.behind_newest && !back.created);
        // A window older than any partition: created, and flagged as behind.
        let older = parts.place(window(9_100, 1_000, 50));
        assert!(older.created && older.behind_newest);
        assert_eq!(older.partition.name.start, 9_000);
        assert_eq!(parts.catalog().parts().len(), 4);
        assert_sorted_with_positions(&parts.catalog());
        parts.remove(a.id);
        assert_sorted_with_positions(&parts.catalog());
        assert!(parts.catalog().get(a.id).is_none());
        assert!(parts.catalog().get(b.id).is_some());
    }

    /// The catalog's order and its position map agree, whatever order partitions came in.
    fn assert_sorted_with_positions(catalog: &Catalog) {
        let parts = catalog.parts();
        assert!(parts.windows(2).all(|w| w[0].name < w[1].name));
        for (i, p) in parts.iter().enumerate() {
            assert_eq!(catalog.position(p.id), Some(i), "{:?}", p.name);
            assert_eq!(catalog.get(p.id).map(|q| q.id), Some(p.id));
        }
    }

    #[test]
    fn windows_added_in_any_order_keep_the_catalog_sorted_and_indexed() {
        let parts = Partitions::from_names([]);
        // Forward in time (appended), then back (inserted), then forward past the newest.
        for t in (0..50)
            .map(|i| i * 1_000)
            .chain([7_500, 500, 49_999, 60_000])
        {
            for ttl in [50, 70] {
                parts.place(window(t, 1_000, ttl));
            }
        }
        let catalog = parts.catalog();
        assert_eq!(catalog.parts().len(), 2 * 51);
        assert_sorted_with_positions(&catalog);
        // Each window found again, not made twice.
        let again = parts.place(window(7_999, 1_000, 70));
        assert!(!again.created && again.behind_newest);
        assert_eq!(parts.catalog().parts().len(), 2 * 51);
    }

    #[test]
    fn reopening_reads_the_catalog_from_table_names() {
        let names = [
            name(2_000, 1_000, 5).table_name(),
            "idemdb_meta".to_string(),
            name(1_000, 1_000, 5).table_name(),
        ];
        let parts = Partitions::from_names(names.iter().map(String::as_str));
        let catalog = parts.catalog();
        let starts: Vec<u64> = catalog.parts().iter().map(|p| p.name.start).collect();
        assert_eq!(starts, [1_000, 2_000]);
        assert_eq!(
            parts.place(window(2_500, 1_000, 5)).partition.name.start,
            2_000
        );
    }
}
