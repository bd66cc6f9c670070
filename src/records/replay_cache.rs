//! Finished records kept in memory for replays: a duplicate of a COMPLETED or FAILED intent
//! is answered from a hash probe instead of the snapshot's B-tree lookups.
//!
//! Invariants (what makes an entry safe to answer from):
//! - An entry is the newest durable record of its key at the time it was filled: only the
//!   snapshot path fills it, with a record it would have answered itself (durable, live, not
//!   pending), and only if the key's shard was not invalidated since the reader took its
//!   snapshot (`generation`).
//! - The writer invalidates every key a batch changed after it installs the batch's snapshot
//!   and before it answers anyone, and anything that rewrites records outside batches
//!   (compaction, partition drops) clears the cache. So no entry survives a newer version.
//! - A hit is still judged at the caller's `now`: an expired entry is a miss, and the caller
//!   takes the snapshot path, which knows about copies, horizons and clocks gone back.
//!
//! Bounded by bytes (keys + responses + a fixed overhead per entry), evicted first in, first
//! out per shard: retries of an intent come soon after its first answer.

use std::collections::{HashMap, VecDeque};

use parking_lot::RwLock;

use crate::record::Record;
use idemdb_core::scope::RecordKey;
use idemdb_core::state::RecordState;

const SHARDS: usize = 64;
/// What an entry costs beside its key and response: the record's fixed fields, the map slot
/// and the queue slot.
const ENTRY_OVERHEAD: usize = 128;

/// The key and the response share one allocation: a hit touches the map's slot and it.
struct Entry {
    /// The record, its response moved to `key_then_response`.
    record: Record,
    key_len: usize,
    key_then_response: Box<[u8]>,
}

impl Entry {
    fn new(key: &RecordKey, record: &Record) -> Entry {
        let key = key.as_bytes();
        let mut bytes = Vec::with_capacity(key.len() + record.response.len());
        bytes.extend_from_slice(key);
        bytes.extend_from_slice(&record.response);
        Entry {
            record: with_response(record, Vec::new()),
            key_len: key.len(),
            key_then_response: bytes.into_boxed_slice(),
        }
    }

    fn key(&self) -> &[u8] {
        &self.key_then_response[..self.key_len]
    }

    fn record(&self) -> Record {
        with_response(
            &self.record,
            self.key_then_response[self.key_len..].to_vec(),
        )
    }

    fn bytes(&self) -> usize {
        self.key_then_response.len() + ENTRY_OVERHEAD
    }
}

/// `record`'s fields with `response`, without copying its own.
fn with_response(record: &Record, response: Vec<u8>) -> Record {
    Record {
        state: record.state,
        fingerprint: record.fingerprint,
        token: record.token,
        lease_expires_at: record.lease_expires_at,
        created_at: record.created_at,
        updated_at: record.updated_at,
        attempts: record.attempts,
        expires_at: record.expires_at,
        response,
    }
}

#[derive(Default)]
struct Shard {
    entries: HashMap<u64, Entry>,
    /// Hashes in fill order; may hold hashes no longer in `entries`.
    order: VecDeque<u64>,
    bytes: usize,
    /// Bumped by every invalidation: a fill read before it is refused.
    generation: u64,
}

impl Shard {
    fn remove(&mut self, hash: u64) {
        if let Some(old) = self.entries.remove(&hash) {
            self.bytes -= old.bytes();
        }
    }

    fn evict_to(&mut self, budget: usize) {
        while self.bytes > budget {
            let Some(hash) = self.order.pop_front() else {
                break;
            };
            self.remove(hash);
        }
        // Stale hashes (invalidated entries) must not grow the queue without bound.
        if self.order.len() > 2 * self.entries.len() + 64 {
            let entries = &self.entries;
            self.order.retain(|h| entries.contains_key(h));
        }
    }
}

/// A shard's generation as a reader saw it before it took its snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Generation(u64);

pub(crate) struct ReplayCache {
    shards: Box<[RwLock<Shard>]>,
    /// Bytes each shard may hold; 0: the cache is off.
    shard_budget: usize,
}

impl ReplayCache {
    /// A cache of at most about `bytes` (0: off).
    pub(crate) fn new(bytes: usize) -> ReplayCache {
        ReplayCache {
            shards: (0..SHARDS).map(|_| RwLock::default()).collect(),
            shard_budget: bytes / SHARDS,
        }
    }

    fn shard(&self, hash: u64) -> &RwLock<Shard> {
        &self.shards[(hash >> 58) as usize % SHARDS]
    }

    fn enabled(&self) -> bool {
        self.shard_budget > 0
    }

    /// The cached finished record of `key`, if any (whatever its expiry).
    pub(crate) fn get(&self, key: &RecordKey, hash: u64) -> Option<Record> {
        if !self.enabled() {
            return None;
        }
        let shard = self.shard(hash).read();
        let entry = shard.entries.get(&hash)?;
        (entry.key() == key.as_bytes()).then(|| entry.record())
    }

    /// Read before the snapshot the record to fill with comes from.
    pub(crate) fn generation(&self, hash: u64) -> Generation {
        Generation(self.shard(hash).read().generation)
    }

    /// Keeps `record`, the newest durable record of `key` as a snapshot taken after `seen`
    /// showed it, unless the key's shard was invalidated since. Only finished records.
    pub(crate) fn fill(&self, key: &RecordKey, hash: u64, record: &Record, seen: Generation) {
        if !self.enabled() || record.state == RecordState::InProgress {
            return;
        }
        let entry = Entry::new(key, record);
        if entry.bytes() > self.shard_budget {
            return;
        }
        let mut shard = self.shard(hash).write();
        if shard.generation != seen.0 {
            return;
        }
        shard.remove(hash);
        shard.bytes += entry.bytes();
        shard.entries.insert(hash, entry);
        shard.order.push_back(hash);
        shard.evict_to(self.shard_budget);
    }

    /// Forgets `key` (the writer changed it) and refuses fills read before now.
    pub(crate) fn invalidate(&self, hash: u64) {
        if !self.enabled() {
            return;
        }
        let mut shard = self.shard(hash).write();
        shard.generation += 1;
        shard.remove(hash);
    }

    /// Records held.
    #[cfg(feature = "test-hooks")]
    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| s.read().entries.len()).sum()
    }

    /// Forgets everything and refuses fills read before now (records were rewritten or
    /// dropped outside a batch).
    pub(crate) fn clear(&self) {
        for shard in self.shards.iter() {
            let mut shard = shard.write();
            shard.generation += 1;
            shard.entries.clear();
            shard.order.clear();
            shard.bytes = 0;
        }
    }

    #[cfg(test)]
    fn bytes(&self) -> usize {
        self.shards.iter().map(|s| s.read().bytes).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idemdb_core::fingerprint::Fingerprint;
    use idemdb_core::scope::{Key, Scope};

    fn key(i: u32) -> RecordKey {
        RecordKey::encode(
            &Scope::new("op", "p"),
            &Key::new(format!("k{i}")),
            &crate::config::Limits::default(),
        )
        .unwrap()
    }

    fn hash(k: &RecordKey) -> u64 {
        xxhash_rust::xxh3::xxh3_64(k.as_bytes())
    }

    fn record(state: RecordState, response: &[u8]) -> Record {
        Record {
            state,
            fingerprint: Fingerprint::from_u128(1),
            token: idemdb_core::fencing::FencingToken::new(7).unwrap(),
            lease_expires_at: 10,
            created_at: 1,
            updated_at: 2,
            attempts: 1,
            expires_at: 1_000,
            response: response.to_vec(),
        }
    }

    #[test]
    fn a_fill_read_before_an_invalidation_is_refused() {
        let cache = ReplayCache::new(1 << 20);
        let k = key(1);
        let h = hash(&k);
        let seen = cache.generation(h);
        cache.invalidate(h);
        cache.fill(&k, h, &record(RecordState::Completed, b"old"), seen);
        assert!(cache.get(&k, h).is_none());
        let seen = cache.generation(h);
        cache.fill(&k, h, &record(RecordState::Completed, b"new"), seen);
        assert_eq!(cache.get(&k, h).unwrap().response, b"new");
        cache.invalidate(h);
        assert!(cache.get(&k, h).is_none());
    }

    #[test]
    fn a_clear_forgets_everything_and_refuses_earlier_fills() {
        let cache = ReplayCache::new(1 << 20);
        let (a, b) = (key(1), key(2));
        let seen_b = cache.generation(hash(&b));
        cache.fill(
            &a,
            hash(&a),
            &record(RecordState::Failed, b"x"),
            cache.generation(hash(&a)),
        );
        cache.clear();
        cache.fill(&b, hash(&b), &record(RecordState::Completed, b"y"), seen_b);
        assert!(cache.get(&a, hash(&a)).is_none());
        assert!(cache.get(&b, hash(&b)).is_none());
        assert_eq!(cache.bytes(), 0);
    }

    #[test]
    fn in_progress_records_and_other_keys_with_the_same_hash_are_never_answered() {
        let cache = ReplayCache::new(1 << 20);
        let (a, b) = (key(1), key(2));
        let h = hash(&a);
        cache.fill(
            &a,
            h,
            &record(RecordState::InProgress, b""),
            cache.generation(h),
        );
        assert!(cache.get(&a, h).is_none());
        cache.fill(
            &a,
            h,
            &record(RecordState::Completed, b"a"),
            cache.generation(h),
        );
        // Same slot, other key bytes: a miss, never a's record.
        assert!(cache.get(&b, h).is_none());
    }

    #[test]
    fn the_cache_stays_within_its_bytes_evicting_the_oldest() {
        let budget = 64 * 4096;
        let cache = ReplayCache::new(budget);
        let response = vec![9u8; 1000];
        for i in 0..5_000 {
            let k = key(i);
            let h = hash(&k);
            cache.fill(
                &k,
                h,
                &record(RecordState::Completed, &response),
                cache.generation(h),
            );
            assert!(cache.bytes() <= budget);
        }
        let newest = key(4_999);
        assert!(cache.get(&newest, hash(&newest)).is_some());
        let oldest = key(0);
        assert!(cache.get(&oldest, hash(&oldest)).is_none());
        for shard in cache.shards.iter() {
            let s = shard.read();
            assert!(s.order.len() <= 2 * s.entries.len() + 64 + 1);
        }
    }

    #[test]
    fn an_entry_larger_than_a_shard_s_share_is_not_kept() {
        let cache = ReplayCache::new(64 * 1_000);
        let k = key(1);
        let h = hash(&k);
        cache.fill(
            &k,
            h,
            &record(RecordState::Completed, &[7; 2_000]),
            cache.generation(h),
        );
        assert!(cache.get(&k, h).is_none());
        assert_eq!(cache.bytes(), 0);
        cache.fill(
            &k,
            h,
            &record(RecordState::Completed, &[7; 100]),
            cache.generation(h),
        );
        assert!(cache.get(&k, h).is_some());
    }

    #[test]
    fn a_zero_budget_turns_the_cache_off() {
        let cache = ReplayCache::new(0);
        let k = key(1);
        let h = hash(&k);
        cache.fill(
            &k,
            h,
            &record(RecordState::Completed, b"a"),
            cache.generation(h),
        );
        assert!(cache.get(&k, h).is_none());
    }
}
