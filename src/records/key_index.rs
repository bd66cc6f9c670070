//! Which partitions may hold a key: an in-memory map from a 64-bit keyed hash of the record
//! key to the partition ids it was written in, so that proving a key absent costs one hash
//! probe however many partitions exist, instead of one B-tree probe per partition.
//!
//! Invariant (what makes it safe): the index is a superset of the truth. The writer adds an
//! entry *before* it stores a record in a partition, so no committed record lacks one; an
//! entry is removed only after its partition was dropped. Extra entries (a rolled-back write,
//! a hash shared by two keys) only cost an extra probe.
//!
//! A key is in one partition, or two when its record expired and it was acquired again in a
//! later window before the older partition was dropped: two ids inline. A key in more (a
//! short TTL, acquired again and again) moves to a list of its own, and back once drops leave
//! it two: it never costs a probe of every partition.
//!
//! Rebuilt at open by scanning the partitions, each shard sized for its share of the keys
//! first: 17 bytes per bucket, at most 7/8 of the buckets full (19.4 to 38.9 bytes per key).

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};

use parking_lot::RwLock;

use crate::records::memory::{buckets_for, buckets_of_capacity, table_bytes};
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
}

/// The hash is already uniform: the map only needs its bits spread over the low end.
#[derive(Clone, Copy, Default)]
struct Spread;

struct SpreadHasher(u64);

impl Hasher for SpreadHasher {
    fn finish(&self) -> u64 {
        self.0.wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 << 8) | u64::from(*b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

impl BuildHasher for Spread {
    type Hasher = SpreadHasher;
    fn build_hasher(&self) -> SpreadHasher {
        SpreadHasher(0)
    }
}

/// One shard's entries. A hash is in one of the two maps, never in both.
#[derive(Default)]
struct Entries {
    /// One or two ids (0: an empty slot).
    two: HashMap<u64, [PartitionId; 2], Spread>,
    /// Three or more.
    more: HashMap<u64, Vec<PartitionId>, Spread>,
}

type Shard = RwLock<Entries>;

/// The top 6 bits: sorted hashes come shard by shard.
fn shard_of(hash: u64) -> usize {
    (hash >> 58) as usize % SHARDS
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
            shard.write().two.reserve(per_shard);
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
        let shard = self.shard(hash).read();
        if let Some(&ids) = shard.two.get(&hash) {
            return Candidates::In(ids);
        }
        match shard.more.get(&hash) {
            Some(ids) => Candidates::Several(ids.clone()),
            None => Candidates::Nowhere,
        }
    }

    pub(crate) fn insert(&self, hash: u64, id: PartitionId) {
        insert_into(&mut self.shard(hash).write(), hash, id);
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
                insert_into(&mut shard, hash, id);
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
            let Entries { two, more } = &mut *shard;
            for hash in run {
                if let Some(slots) = two.get_mut(hash) {
                    for s in slots.iter_mut() {
                        if ids.binary_search(s).is_ok() {
                            *s = 0;
                        }
                    }
                    if *slots == [0, 0] {
                        two.remove(hash);
                    }
                } else if let Some(list) = more.get_mut(hash) {
                    list.retain(|x| ids.binary_search(x).is_err());
                    if list.len() <= 2 {
                        // Back inline (an emptied entry goes).
                        let slot = |i: usize| list.get(i).copied().unwrap_or(0);
                        let slots = [slot(0), slot(1)];
                        more.remove(hash);
                        if slots != [0, 0] {
                            two.insert(*hash, slots);
                        }
                    }
                }
            }
        }
    }

    /// Heap bytes the index holds now (its tables' buckets and the lists of keys in more than
    /// two partitions).
    pub(crate) fn memory_bytes(&self) -> u64 {
        self.shards
            .iter()
            .map(|s| {
                let s = s.read();
                let lists: u64 = s
                    .more
                    .values()
                    .map(|ids| (ids.capacity() * size_of::<PartitionId>()) as u64)
                    .sum();
                table_bytes(buckets_of_capacity(s.two.capacity() as u64), TWO_ENTRY)
                    + table_bytes(buckets_of_capacity(s.more.capacity() as u64), MORE_ENTRY)
                    + lists
            })
            .sum()
    }

    /// Number of hashes held.
    pub(crate) fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                let s = s.read();
                s.two.len() + s.more.len()
            })
            .sum()
    }
}

/// Names partition `id` in the entry of `hash` (a no-op if it does already).
fn insert_into(shard: &mut Entries, hash: u64, id: PartitionId) {
    let Entries { two, more } = shard;
    if let Some(ids) = more.get_mut(&hash) {
        if !ids.contains(&id) {
            ids.push(id);
        }
        return;
    }
    let [a, b] = two.get(&hash).copied().unwrap_or([0, 0]);
    let slots = match [a, b] {
        _ if a == id || b == id => return,
        [0, b] => [id, b],
        [a, 0] => [a, id],
        [a, b] => {
            two.remove(&hash);
            more.insert(hash, vec![a, b, id]);
            return;
        }
    };
    two.insert(hash, slots);
}

/// Bytes of one entry of the `two` map, and of the `more` map (its list aside).
const TWO_ENTRY: u64 = size_of::<(u64, [PartitionId; 2])>() as u64;
const MORE_ENTRY: u64 = size_of::<(u64, Vec<PartitionId>)>() as u64;

/// A shard's share of `keys` keys, with room for the unevenness of 64 shards (five standard
/// deviations above the mean), so that no shard outgrows what was reserved.
fn per_shard(keys: u64) -> u64 {
    let mean = keys.div_ceil(SHARDS as u64);
    mean + 5 * mean.isqrt() + 8
}

/// Heap bytes of an index built for `keys` keys (each in one or two partitions): what an
/// open allocates before it reads them.
pub(crate) fn bytes_for(keys: u64) -> u64 {
    if keys == 0 {
        return 0;
    }
    table_bytes(buckets_for(per_shard(keys)), TWO_ENTRY) * SHARDS as u64
}

#[cfg(test)]
mod tests {
    use super::*;

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
        // 200,000 keys: about 20 to 40 bytes each.
        let per_key = bytes_for(200_000) as f64 / 200_000.0;
        assert!((19.0..40.0).contains(&per_key), "{per_key}");
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
        assert_eq!(index.candidates(h), Candidates::In([3, 5]));
        index.remove_keys(&[h], 3);
        assert_eq!(index.candidates(h), Candidates::In([0, 5]));
        index.insert(h, 6);
        assert_eq!(index.candidates(h), Candidates::In([6, 5]));
        index.insert(h, 7);
        index.insert(h, 8);
        index.insert(h, 7);
        assert_eq!(index.candidates(h), Candidates::Several(vec![6, 5, 7, 8]));
        assert_eq!(index.len(), 1);
        index.remove_keys(&[h], 5);
        assert_eq!(index.candidates(h), Candidates::Several(vec![6, 7, 8]));
        // Down to two: inline again, and the next id finds a free slot.
        index.remove_keys(&[h], 7);
        assert_eq!(index.candidates(h), Candidates::In([6, 8]));
        index.remove_keys(&[h], 6);
        index.insert(h, 9);
        assert_eq!(index.candidates(h), Candidates::In([9, 8]));
        assert_eq!(index.len(), 1);
        // A key the partition does not hold keeps its entry.
        index.remove_keys(&[index.hash(b"other")], 8);
        assert_eq!(index.candidates(h), Candidates::In([9, 8]));
        index.remove_keys(&[h], 8);
        index.remove_keys(&[h], 9);
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
    fn keys_spilled_and_inline_share_a_shard_and_drop_alone() {
        let index = KeyIndex::new(3);
        // 3,000 keys over 64 shards: every shard holds keys of both kinds.
        for i in 0..3000u32 {
            let h = index.hash(&i.to_le_bytes());
            let parts = if i % 3 == 0 { 1..=5 } else { 1..=2 };
            for id in parts {
                index.insert(h, id);
            }
        }
        assert_eq!(index.len(), 3000);
        let all = hashes(&index, 0..3000);
        let spilled = hashes(&index, (0..3000).filter(|i| i % 3 == 0));
        index.remove_keys(&all, 1);
        for id in [3, 4] {
            index.remove_keys(&spilled, id);
        }
        for i in 0..3000u32 {
            let h = index.hash(&i.to_le_bytes());
            let want = if i % 3 == 0 { [2, 5] } else { [0, 2] };
            let mut got: Vec<_> = index.candidates(h).ids().collect();
            got.sort_unstable();
            let want: Vec<_> = want.into_iter().filter(|&id| id != 0).collect();
            assert_eq!(got, want, "key {i}");
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
            assert_eq!(one.candidates(h), runs.candidates(h), "key {i}");
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
    }
}
