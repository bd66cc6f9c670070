//! Which partitions may hold a key: an in-memory map from a 64-bit keyed hash of the record
//! key to at most two partition ids, so that proving a key absent costs one hash probe
//! however many partitions exist, instead of one B-tree probe per partition.
//!
//! Invariant (what makes it safe): the index is a superset of the truth. The writer adds an
//! entry *before* it stores a record in a partition, so no committed record lacks one; an
//! entry is removed only after its partition was dropped. Extra entries (a rolled-back write,
//! a hash shared by two keys) only cost an extra probe. A hash that would need a third
//! partition becomes `Anywhere`: every partition is probed for it.
//!
//! Rebuilt at open by scanning the partitions; about 16 bytes of memory per stored key.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};

use parking_lot::RwLock;

use crate::retention::partition::PartitionId;

const SHARDS: usize = 64;
/// Slot value meaning "probe every partition".
const ANYWHERE: PartitionId = PartitionId::MAX;

/// Where to look for a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Candidates {
    Nowhere,
    /// One or two partitions (an empty slot is 0).
    In([PartitionId; 2]),
    Anywhere,
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

type Shard = RwLock<HashMap<u64, [PartitionId; 2], Spread>>;

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
            shards: (0..SHARDS)
                .map(|_| RwLock::new(HashMap::with_hasher(Spread)))
                .collect(),
        }
    }

    pub(crate) fn hash(&self, record_key: &[u8]) -> u64 {
        xxhash_rust::xxh3::xxh3_64_with_seed(record_key, self.seed)
    }

    fn shard(&self, hash: u64) -> &Shard {
        &self.shards[(hash >> 58) as usize % SHARDS]
    }

    pub(crate) fn candidates(&self, hash: u64) -> Candidates {
        match self.shard(hash).read().get(&hash) {
            None => Candidates::Nowhere,
            Some(&[ANYWHERE, _]) => Candidates::Anywhere,
            Some(&slots) => Candidates::In(slots),
        }
    }

    pub(crate) fn insert(&self, hash: u64, id: PartitionId) {
        let mut shard = self.shard(hash).write();
        let slots = shard.entry(hash).or_insert([0, 0]);
        match *slots {
            [ANYWHERE, _] => {}
            [a, b] if a == id || b == id => {}
            [0, b] => *slots = [id, b],
            [a, 0] => *slots = [a, id],
            _ => *slots = [ANYWHERE, 0],
        }
    }

    /// Forgets a dropped partition. Shard by shard, so readers wait for one shard at most.
    pub(crate) fn remove_partition(&self, id: PartitionId) {
        for shard in self.shards.iter() {
            shard.write().retain(|_, slots| {
                for s in slots.iter_mut() {
                    if *s == id {
                        *s = 0;
                    }
                }
                *slots != [0, 0]
            });
        }
    }

    /// Number of hashes held.
    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| s.read().len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_fill_then_overflow_to_anywhere() {
        let index = KeyIndex::new(7);
        let h = index.hash(b"key");
        assert_eq!(index.candidates(h), Candidates::Nowhere);
        index.insert(h, 3);
        index.insert(h, 3);
        assert_eq!(index.candidates(h), Candidates::In([3, 0]));
        index.insert(h, 5);
        assert_eq!(index.candidates(h), Candidates::In([3, 5]));
        index.remove_partition(3);
        assert_eq!(index.candidates(h), Candidates::In([0, 5]));
        index.insert(h, 6);
        index.insert(h, 7);
        assert_eq!(index.candidates(h), Candidates::Anywhere);
        index.remove_partition(5);
        assert_eq!(
            index.candidates(h),
            Candidates::Anywhere,
            "cannot tell: stays"
        );
        assert_eq!(index.len(), 1);
    }

    #[test]
    fn removal_empties_entries() {
        let index = KeyIndex::new(1);
        for i in 0..1000u32 {
            index.insert(index.hash(&i.to_le_bytes()), 1 + i % 2);
        }
        assert_eq!(index.len(), 1000);
        index.remove_partition(1);
        assert_eq!(index.len(), 500);
        index.remove_partition(2);
        assert_eq!(index.len(), 0);
    }
}
