//! Which partitions may hold a key: an in-memory map from a key's 64-bit keyed hash to the
//! partition ids it was written in, so that proving a key absent costs one hash probe however
//! many partitions exist, instead of one B-tree probe per partition. Wide partitions are found
//! through their filters instead (filter.rs): the index holds the keys of the others.
//!
//! Invariant (what makes it safe): the index is a superset of the truth. The writer adds an
//! entry *before* it stores a record in a partition, so no committed record lacks one; an
//! entry is removed only after its partition was dropped or replaced. Extra entries (a
//! rolled-back write, a fingerprint shared by two keys) only cost an extra probe.
//!
//! Layout: 64 shards by the hash's top 6 bits, each an open-addressed table of 8-byte entries
//! (a 32-bit tag, the hash's low bits, and a partition id) with linear probing. The table is
//! in effect a map from the 38-bit fingerprint (shard, tag) to a set of ids: an entry's home
//! slot is a function of its tag alone, so all entries of one tag lie in one run, and a key in
//! two partitions (expired and acquired again in a later window) is two entries of one run.
//! Two keys that share a fingerprint share their ids: a superset of each key's, as required.
//! Removal shifts the run back (no tombstones), so a lookup ends at the first empty slot.
//! Tables grow by half at 3/4 full and never shrink: 8 bytes per entry at 3/4, 10.7 to 16 on
//! average (an open sizes them for its keys, at 3/4 or less).

use parking_lot::RwLock;

use crate::records::partition::PartitionId;

const SHARDS: usize = 64;

/// Where to look for a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Candidates {
    Nowhere,
    /// One or two partitions (an empty slot is 0).
    In([PartitionId; 2]),
    /// More than two.
    Several(Vec<PartitionId>),
}

impl Candidates {
    /// The partition ids named (empty slots left out).
    pub(crate) fn ids(&self) -> impl Iterator<Item = PartitionId> + '_ {
        let ids: &[PartitionId] = match self {
            Candidates::Nowhere => &[],
            Candidates::In(ids) => ids,
            Candidates::Several(ids) => ids,
        };
        ids.iter().copied().filter(|&id| id != 0)
    }

    fn add(&mut self, id: PartitionId) {
        *self = match std::mem::replace(self, Candidates::Nowhere) {
            Candidates::Nowhere => Candidates::In([id, 0]),
            Candidates::In([a, 0]) => Candidates::In([a, id]),
            Candidates::In([a, b]) => Candidates::Several(vec![a, b, id]),
            Candidates::Several(mut ids) => {
                ids.push(id);
                Candidates::Several(ids)
            }
        }
    }
}

/// One (key fingerprint, partition) pair; `id` 0 marks an empty slot (no partition has id 0).
#[derive(Clone, Copy, Default)]
#[repr(C)]
struct Entry {
    tag: u32,
    id: PartitionId,
}

const ENTRY_BYTES: u64 = size_of::<Entry>() as u64;

/// One shard's open-addressed table. Invariants: at least one slot is empty (every probe
/// loop ends); every entry lies in the run that starts at or before its home slot and
/// reaches it without an empty slot between; no (tag, id) pair is held twice.
#[derive(Default)]
struct Table {
    slots: Box<[Entry]>,
    len: usize,
}

/// The slots a table needs to hold `entries` at most 3/4 full (and one empty slot).
fn slots_for(entries: usize) -> usize {
    if entries == 0 {
        return 0;
    }
    (entries.saturating_mul(4).div_ceil(3))
        .max(entries + 1)
        .max(8)
}

impl Table {
    fn with_entries(entries: usize) -> Table {
        Table {
            slots: vec![Entry::default(); slots_for(entries)].into_boxed_slice(),
            len: 0,
        }
    }

    /// The slot a run for `tag` starts its search at: the tag scaled to the table (its high
    /// bits; the low ones tell tags of one slot apart).
    fn home(&self, tag: u32) -> usize {
        ((u64::from(tag) * self.slots.len() as u64) >> 32) as usize
    }

    fn next(&self, i: usize) -> usize {
        if i + 1 == self.slots.len() { 0 } else { i + 1 }
    }

    /// Calls `each` with every id held under `tag`.
    fn for_each(&self, tag: u32, mut each: impl FnMut(PartitionId)) {
        if self.len == 0 {
            return;
        }
        let mut i = self.home(tag);
        loop {
            let e = self.slots[i];
            if e.id == 0 {
                return;
            }
            if e.tag == tag {
                each(e.id);
            }
            i = self.next(i);
        }
    }

    fn insert(&mut self, tag: u32, id: PartitionId) {
        if slots_for(self.len + 1) > self.slots.len() {
            self.grow();
        }
        let mut i = self.home(tag);
        loop {
            let e = self.slots[i];
            if e.id == 0 {
                self.slots[i] = Entry { tag, id };
                self.len += 1;
                return;
            }
            if e.tag == tag && e.id == id {
                return;
            }
            i = self.next(i);
        }
    }

    /// Rehashes into half as many slots again (at least what 8 entries need).
    fn grow(&mut self) {
        let entries = (self.len + self.len / 2).max(8);
        let old = std::mem::replace(self, Table::with_entries(entries));
        for e in old.slots.iter().filter(|e| e.id != 0) {
            self.insert(e.tag, e.id);
        }
    }

    /// Removes every entry of `tag` whose id `gone` names, shifting the entries after each
    /// back so that none is left behind an empty slot on its way from its home.
    fn remove(&mut self, tag: u32, gone: impl Fn(PartitionId) -> bool) {
        while let Some(i) = self.position(tag, &gone) {
            self.vacate(i);
        }
    }

    fn position(&self, tag: u32, matches: impl Fn(PartitionId) -> bool) -> Option<usize> {
        if self.len == 0 {
            return None;
        }
        let mut i = self.home(tag);
        loop {
            let e = self.slots[i];
            if e.id == 0 {
                return None;
            }
            if e.tag == tag && matches(e.id) {
                return Some(i);
            }
            i = self.next(i);
        }
    }

    /// Empties slot `i` and moves back each later entry of its run that may move: one whose
    /// home does not lie cyclically in (hole, its slot].
    fn vacate(&mut self, mut i: usize) {
        self.slots[i] = Entry::default();
        self.len -= 1;
        let mut j = i;
        loop {
            j = self.next(j);
            let e = self.slots[j];
            if e.id == 0 {
                return;
            }
            let k = self.home(e.tag);
            let stays = if i <= j {
                i < k && k <= j
            } else {
                i < k || k <= j
            };
            if !stays {
                self.slots[i] = e;
                self.slots[j] = Entry::default();
                i = j;
            }
        }
    }

    fn bytes(&self) -> u64 {
        self.slots.len() as u64 * ENTRY_BYTES
    }
}

type Shard = RwLock<Table>;

/// The top 6 bits: sorted hashes come shard by shard.
fn shard_of(hash: u64) -> usize {
    (hash >> 58) as usize % SHARDS
}

/// The low 32 bits, independent of the shard's.
fn tag_of(hash: u64) -> u32 {
    hash as u32
}

/// The index hash of a stored record key under the database's `seed` (what the index, the
/// summaries, the filters and recognition compare).
pub(crate) fn index_hash(seed: u64, record_key: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64_with_seed(record_key, seed)
}

pub(crate) struct KeyIndex {
    seed: u64,
    shards: Box<[Shard]>,
}

impl KeyIndex {
    /// An empty index hashing with `seed` (secret per database, so nobody can aim keys at
    /// one slot from outside).
    pub(crate) fn new(seed: u64) -> KeyIndex {
        KeyIndex {
            seed,
            shards: (0..SHARDS).map(|_| RwLock::default()).collect(),
        }
    }

    /// An empty index whose shards hold `keys` keys (spread evenly) without growing: an open
    /// that knows how many keys it will insert allocates each shard once, and never holds a
    /// shard's old and new tables at the same time.
    pub(crate) fn with_capacity(seed: u64, keys: u64) -> KeyIndex {
        let index = KeyIndex::new(seed);
        if keys == 0 {
            return index;
        }
        let per_shard = usize::try_from(per_shard(keys)).unwrap_or(usize::MAX);
        for shard in index.shards.iter() {
            *shard.write() = Table::with_entries(per_shard);
        }
        index
    }

    pub(crate) fn hash(&self, record_key: &[u8]) -> u64 {
        index_hash(self.seed, record_key)
    }

    fn shard(&self, hash: u64) -> &Shard {
        &self.shards[shard_of(hash)]
    }

    pub(crate) fn candidates(&self, hash: u64) -> Candidates {
        let mut found = Candidates::Nowhere;
        self.shard(hash)
            .read()
            .for_each(tag_of(hash), |id| found.add(id));
        found
    }

    pub(crate) fn insert(&self, hash: u64, id: PartitionId) {
        self.shard(hash).write().insert(tag_of(hash), id);
    }

    /// Adds partition `id` to the entries of `hashes`, sorted (a summary's: each shard's keys
    /// come together, and its lock is taken once for them), as [`insert`](Self::insert) would
    /// one by one.
    pub(crate) fn insert_sorted(&self, hashes: &[u64], id: PartitionId) {
        for run in hashes.chunk_by(|a, b| shard_of(*a) == shard_of(*b)) {
            let Some(&first) = run.first() else {
                continue;
            };
            let mut shard = self.shard(first).write();
            for &hash in run {
                shard.insert(tag_of(hash), id);
            }
        }
    }

    /// Forgets a dropped partition: `id` leaves the entries of `hashes`, its keys' hashes,
    /// sorted (so that each shard's keys come together and its lock is taken once). Costs the
    /// partition's keys, not the index's. An id that names a key the partition did not hold
    /// (a rolled-back write) stays: an extra probe, until the next open rebuilds the index.
    pub(crate) fn remove_keys(&self, hashes: &[u64], id: PartitionId) {
        self.remove_keys_of(hashes, &[id]);
    }

    /// As [`remove_keys`](Self::remove_keys), for every partition of `ids` (sorted) at once
    /// (the narrow partitions a wide one replaced: `hashes` are all of their keys).
    pub(crate) fn remove_keys_of(&self, hashes: &[u64], ids: &[PartitionId]) {
        debug_assert!(ids.is_sorted());
        for run in hashes.chunk_by(|a, b| shard_of(*a) == shard_of(*b)) {
            let Some(&first) = run.first() else {
                continue;
            };
            let mut shard = self.shard(first).write();
            for &hash in run {
                shard.remove(tag_of(hash), |id| ids.binary_search(&id).is_ok());
            }
        }
    }

    /// Heap bytes the index holds now (its tables' slots).
    pub(crate) fn memory_bytes(&self) -> u64 {
        self.shards.iter().map(|s| s.read().bytes()).sum()
    }

    /// Number of (key, partition) entries held: a key in two partitions counts twice.
    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| s.read().len).sum()
    }
}

/// A shard's share of `keys` keys, with room for the unevenness of 64 shards (five standard
/// deviations above the mean), so that no shard outgrows what was reserved.
fn per_shard(keys: u64) -> u64 {
    let mean = keys.div_ceil(SHARDS as u64);
    mean + 5 * mean.isqrt() + 8
}

/// Heap bytes of an index built for `keys` keys (each in one partition): what an open
/// allocates before it reads them.
pub(crate) fn bytes_for(keys: u64) -> u64 {
    if keys == 0 {
        return 0;
    }
    let per_shard = usize::try_from(per_shard(keys)).unwrap_or(usize::MAX);
    slots_for(per_shard) as u64 * ENTRY_BYTES * SHARDS as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, BTreeSet};

    fn ids(c: &Candidates) -> Vec<PartitionId> {
        let mut v: Vec<_> = c.ids().collect();
        v.sort_unstable();
        v
    }

    #[test]
    fn an_index_sized_for_its_keys_holds_them_in_the_bytes_foretold() {
        for keys in [0u64, 1, 1000, 200_000] {
            let index = KeyIndex::with_capacity(9, keys);
            let foretold = index.memory_bytes();
            assert_eq!(foretold, bytes_for(keys), "{keys} keys");
            for i in 0..keys {
                index.insert(index.hash(&i.to_le_bytes()), 1);
            }
            assert_eq!(index.len() as u64, keys);
            // No shard grew past what was reserved.
            assert_eq!(index.memory_bytes(), foretold, "{keys} keys");
        }
        // 200,000 keys: 8 bytes an entry at 3/4 full, and the shards' slack.
        let per_key = bytes_for(200_000) as f64 / 200_000.0;
        assert!((10.6..12.0).contains(&per_key), "{per_key}");
    }

    #[test]
    fn an_index_grown_key_by_key_stays_within_16_bytes_a_key() {
        let index = KeyIndex::new(4);
        for i in 0..300_000u64 {
            index.insert(index.hash(&i.to_le_bytes()), 1);
            if i % 10_000 == 9_999 {
                let per_key = index.memory_bytes() as f64 / (i + 1) as f64;
                assert!(per_key <= 16.5, "{per_key} bytes a key at {}", i + 1);
            }
        }
        for i in 0..300_000u64 {
            assert_eq!(ids(&index.candidates(index.hash(&i.to_le_bytes()))), [1]);
        }
    }

    #[test]
    fn a_key_in_more_than_two_partitions_names_each_and_only_them() {
        let index = KeyIndex::new(7);
        let h = index.hash(b"key");
        assert_eq!(index.candidates(h), Candidates::Nowhere);
        index.insert(h, 3);
        index.insert(h, 3);
        assert_eq!(index.candidates(h), Candidates::In([3, 0]));
        index.insert(h, 5);
        assert_eq!(ids(&index.candidates(h)), [3, 5]);
        index.remove_keys(&[h], 3);
        assert_eq!(index.candidates(h), Candidates::In([5, 0]));
        index.insert(h, 6);
        index.insert(h, 7);
        index.insert(h, 8);
        index.insert(h, 7);
        assert!(matches!(index.candidates(h), Candidates::Several(_)));
        assert_eq!(ids(&index.candidates(h)), [5, 6, 7, 8]);
        assert_eq!(index.len(), 4);
        index.remove_keys_of(&[h], &[5, 7]);
        assert_eq!(ids(&index.candidates(h)), [6, 8]);
        // A key the partition does not hold keeps its entry.
        index.remove_keys(&[index.hash(b"other")], 8);
        assert_eq!(ids(&index.candidates(h)), [6, 8]);
        index.remove_keys(&[h], 8);
        index.remove_keys(&[h], 6);
        assert_eq!(index.candidates(h), Candidates::Nowhere);
        assert_eq!(index.len(), 0);
    }

    /// The hashes of keys `keys`, sorted, as a dropped partition gives them.
    fn hashes(index: &KeyIndex, keys: impl Iterator<Item = u32>) -> Vec<u64> {
        let mut out: Vec<u64> = keys.map(|i| index.hash(&i.to_le_bytes())).collect();
        out.sort_unstable();
        out
    }

    #[test]
    fn keys_in_one_and_in_many_partitions_share_a_shard_and_drop_alone() {
        let index = KeyIndex::new(3);
        // 3,000 keys over 64 shards: every shard holds keys of both kinds.
        for i in 0..3000u32 {
            let h = index.hash(&i.to_le_bytes());
            let parts = if i % 3 == 0 { 1..=5 } else { 1..=2 };
            for id in parts {
                index.insert(h, id);
            }
        }
        assert_eq!(index.len(), 1000 * 5 + 2000 * 2);
        let all = hashes(&index, 0..3000);
        let spilled = hashes(&index, (0..3000).filter(|i| i % 3 == 0));
        index.remove_keys(&all, 1);
        index.remove_keys_of(&spilled, &[3, 4]);
        for i in 0..3000u32 {
            let h = index.hash(&i.to_le_bytes());
            let want: &[PartitionId] = if i % 3 == 0 { &[2, 5] } else { &[2] };
            assert_eq!(ids(&index.candidates(h)), want, "key {i}");
        }
        index.remove_keys(&all, 2);
        assert_eq!(index.len(), 1000);
        index.remove_keys(&spilled, 5);
        assert_eq!(index.len(), 0);
    }

    #[test]
    fn sorted_inserts_name_what_single_inserts_do() {
        let one = KeyIndex::new(5);
        let runs = KeyIndex::new(5);
        for id in 1..=4u32 {
            // Overlapping key sets: keys in one, two and more partitions.
            let mut h = hashes(&one, (0..2000).filter(|i| i % (id + 1) != 0));
            for &x in &h {
                one.insert(x, id);
            }
            h.dedup();
            runs.insert_sorted(&h, id);
        }
        assert_eq!(one.len(), runs.len());
        for i in 0..2000u32 {
            let h = one.hash(&i.to_le_bytes());
            assert_eq!(ids(&one.candidates(h)), ids(&runs.candidates(h)), "key {i}");
        }
    }

    #[test]
    fn removal_empties_entries() {
        let index = KeyIndex::new(1);
        for i in 0..1000u32 {
            index.insert(index.hash(&i.to_le_bytes()), 1 + i % 2);
        }
        assert_eq!(index.len(), 1000);
        index.remove_keys(&hashes(&index, (0..1000).filter(|i| i % 2 == 0)), 1);
        assert_eq!(index.len(), 500);
        index.remove_keys(&hashes(&index, (0..1000).filter(|i| i % 2 == 1)), 2);
        assert_eq!(index.len(), 0);
        assert!(
            index
                .shards
                .iter()
                .all(|s| s.read().slots.iter().all(|e| e.id == 0))
        );
    }

    /// Inserts and removals in random order against a plain map of sets, in one shard whose
    /// tags crowd a few homes (long runs that wrap around the table's end, shifted back by
    /// every removal): every key's ids are exactly the model's.
    #[test]
    fn runs_that_wrap_and_shift_keep_every_key_findable() {
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for round in 0..40 {
            let index = KeyIndex::new(0);
            let mut model: BTreeMap<u64, BTreeSet<PartitionId>> = BTreeMap::new();
            // Shard 0; tags near 0 and near u32::MAX (homes at both ends of the table).
            let keys: Vec<u64> = (0..200u64)
                .map(|i| {
                    let tag = if i % 2 == 0 {
                        i
                    } else {
                        u64::from(u32::MAX) - i
                    };
                    tag | ((round as u64) << 32)
                })
                .collect();
            for step in 0..4_000 {
                let key = keys[(next() % keys.len() as u64) as usize];
                let id = 1 + (next() % 6) as PartitionId;
                if next() % 3 == 0 {
                    index.remove_keys(&[key], id);
                    if let Some(set) = model.get_mut(&key) {
                        set.remove(&id);
                    }
                } else {
                    index.insert(key, id);
                    model.entry(key).or_default().insert(id);
                }
                if step % 97 == 0 {
                    for &k in &keys {
                        let want: Vec<_> = model.get(&k).into_iter().flatten().copied().collect();
                        assert_eq!(ids(&index.candidates(k)), want, "round {round} step {step}");
                    }
                }
            }
            let held: usize = model.values().map(BTreeSet::len).sum();
            assert_eq!(index.len(), held);
        }
    }

    #[test]
    fn keys_sharing_a_fingerprint_share_their_ids() {
        // Same shard and low 32 bits, different middle bits: one fingerprint.
        let index = KeyIndex::new(0);
        let (a, b) = (0x0000_0001_0000_00AAu64, 0x0000_0002_0000_00AAu64);
        index.insert(a, 1);
        index.insert(b, 2);
        assert_eq!(ids(&index.candidates(a)), [1, 2]);
        assert_eq!(ids(&index.candidates(b)), [1, 2]);
        index.remove_keys(&[a], 1);
        assert_eq!(ids(&index.candidates(b)), [2]);
    }
}
