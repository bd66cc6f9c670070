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
//! Bounded by bytes it really holds: each shard writes its entries one after another into a
//! ring of bytes allocated once and evicts the oldest to make room (first in, first out:
//! retries of an intent come soon after its first answer), and finds them through a fixed
//! array of sets of two slots, chosen by the hash. No entry is an allocation of its own and
//! eviction only moves the ring's tail: a slot whose position the tail passed is empty.
//!
//! Admitted on second sight: a key's first answer from the snapshot only marks it in its
//! set's bits ([`ReplayCache::admit`]), and its second fills. Most intents that are replayed
//! at all are replayed once, and a fill for them would only evict the entries of keys
//! replayed again and again.
//!
//! A set (its slots' positions and tags and its admission bits) is 32 bytes aligned to 32:
//! one cache line. A miss, the common case of a first replay or a fresh key, reads that line
//! alone.

use parking_lot::RwLock;

use crate::record::Record;
use idemdb_core::fencing::FencingToken;
use idemdb_core::fingerprint::Fingerprint;
use idemdb_core::scope::RecordKey;
use idemdb_core::state::RecordState;

const SHARDS: usize = 64;

/// An entry in a ring: its hash, its length (this header included), its key's length, the
/// record's fixed fields, then the key and the response. A key length of `PADDING` marks the
/// bytes skipped to the ring's end when an entry did not fit before it.
const ENTRY_HEAD: usize = 8 + 4 + 4;
const FIELDS: usize = 1 + 16 + 8 + 8 + 8 + 8 + 4 + 8;
const PADDING: u32 = u32::MAX;

/// Ring bytes per slot: a slot (half of a 32-byte set) for every 128 bytes of ring or less
/// (the sets are rounded up to a power of two): 2.5 to 5 slots per entry of a 200-byte
/// response.
const RING_PER_SLOT: usize = 128;
const SET_BYTES: usize = std::mem::size_of::<Set>();
// Half a 64-byte line, aligned to it: a set never straddles two.
const _: () = assert!(SET_BYTES == 32 && std::mem::align_of::<Set>() == 32);
const WAYS: usize = 2;

/// Slots per mark between two clearings of the admission bits: a shard's sets are cleared
/// after half as many first sights as it has slots, one a set on average, so at most about
/// 1 key in 64 not seen since is taken for seen (1 − e^(−1/64)), and a key is remembered
/// over at least that many first sights.
const SLOTS_PER_MARK: usize = 2;

/// Which of a shard's sets a hash's slots are in (its low bits: the shard is its top six),
/// the tag kept beside them and the admission bit (bits neither picks).
fn set_of(hash: u64, sets: usize) -> usize {
    hash as usize & (sets - 1)
}

fn tag_of(hash: u64) -> u32 {
    (hash >> 26) as u32
}

fn seen_bit(hash: u64) -> u64 {
    1 << ((hash >> 20) & 63)
}

/// `WAYS` slots and the admission bits of the keys whose hashes pick them: one cache line.
#[derive(Clone, Copy, Default)]
#[repr(C, align(32))]
struct Set {
    /// 1 + the position of an entry, 0 for none. A slot is in use while its position is at
    /// least the shard's `tail` (no entry there was overwritten since).
    positions: [u64; WAYS],
    /// Hash bits of the entry each slot points at ([`tag_of`]).
    tags: [u32; WAYS],
    /// Keys seen once since the shard's last clearing ([`seen_bit`]).
    seen: u64,
}

#[derive(Default)]
struct Shard {
    /// Entries back to back, at positions `tail..head` modulo its length; allocated (zeroed,
    /// so untouched pages cost nothing) at the first fill.
    ring: Vec<u8>,
    /// Allocated at the first admission or fill.
    sets: Vec<Set>,
    /// Where the next entry goes and where the oldest one starts, counted from the ring's
    /// first fill: positions modulo the ring's length are offsets in it. `head - tail` never
    /// exceeds the length.
    head: u64,
    tail: u64,
    /// Bumped by every invalidation: a fill read before it is refused.
    generation: u64,
    /// Keys marked seen since the sets' admission bits were last cleared.
    marks: usize,
}

impl Shard {
    fn offset(&self, position: u64) -> usize {
        position.checked_rem(self.ring.len() as u64).unwrap_or(0) as usize
    }

    /// The entry way `way` of `set` points at, if it is in use and its tag is `tag`.
    fn entry_in(&self, set: &Set, way: usize, tag: u32) -> Option<&[u8]> {
        let position = set.positions[way].checked_sub(1)?;
        if position < self.tail || set.tags[way] != tag {
            return None;
        }
        self.entry_at(position)
    }

    /// The bytes of the entry at `position`, if it is one (not padding) and whole.
    fn entry_at(&self, position: u64) -> Option<&[u8]> {
        let at = self.offset(position);
        let head = self.ring.get(at..at + ENTRY_HEAD)?;
        let len = u32_at(head, 8)? as usize;
        if u32_at(head, 12)? == PADDING {
            return None;
        }
        self.ring.get(at..at + len)
    }

    /// The set of `hash` (none before the first admission or fill), the way in it in use by
    /// `hash`, if any, and its entry.
    fn slot_of(&self, hash: u64, sets: usize) -> Option<(usize, usize, &[u8])> {
        let s = set_of(hash, sets);
        let set = self.sets.get(s)?;
        (0..WAYS).find_map(|way| {
            self.entry_in(set, way, tag_of(hash))
                .filter(|e| u64_at(e, 0) == Some(hash))
                .map(|e| (s, way, e))
        })
    }

    /// The way of set `s` a new entry of `hash` takes: the one holding `hash`, else a free
    /// one, else the one holding the older entry.
    fn way_for(&self, hash: u64, s: usize, sets: usize) -> usize {
        if let Some((_, way, _)) = self.slot_of(hash, sets) {
            return way;
        }
        let positions = self.sets.get(s).map_or([0; WAYS], |set| set.positions);
        (0..WAYS)
            .min_by_key(|&way| match positions[way].checked_sub(1) {
                Some(p) if p >= self.tail => p + 1,
                _ => 0,
            })
            .unwrap_or(0)
    }

    /// Moves `tail` past the oldest entry (or the padding there).
    fn evict_oldest(&mut self) {
        let at = self.offset(self.tail);
        let left = self.ring.len() - at;
        // Too few bytes before the end for an entry: skipped when the one after was written.
        let len = self
            .ring
            .get(at..at + ENTRY_HEAD)
            .and_then(|head| u32_at(head, 8))
            .map_or(left, |l| (l as usize).clamp(1, left));
        self.tail += len as u64;
    }

    /// Makes room for `len` bytes at `head` (skipping to the ring's start if they do not fit
    /// before its end); returns where they go.
    fn make_room(&mut self, len: usize) -> u64 {
        let at = self.offset(self.head);
        let skip = if at + len > self.ring.len() {
            self.ring.len() - at
        } else {
            0
        };
        let end = self.head + (skip + len) as u64;
        while self.tail < self.head && end - self.tail > self.ring.len() as u64 {
            self.evict_oldest();
        }
        if self.tail == self.head {
            // Empty: start the next entry at the ring's start.
            let start = self.head + (self.ring.len() - at) as u64 % self.ring.len() as u64;
            self.head = start;
            self.tail = start;
            return start;
        }
        if skip >= ENTRY_HEAD {
            let pad = &mut self.ring[at..at + ENTRY_HEAD];
            pad[8..12].copy_from_slice(&(skip as u32).to_le_bytes());
            pad[12..16].copy_from_slice(&PADDING.to_le_bytes());
        }
        self.head += skip as u64;
        self.head
    }
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(bytes: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
}

/// Writes `record` under `key` and `hash` into `out` (exactly [`entry_len`] bytes).
fn write_entry(out: &mut [u8], hash: u64, key: &[u8], record: &Record) {
    let mut fields = [0u8; ENTRY_HEAD + FIELDS];
    let mut w = 0;
    let mut put = |bytes: &[u8]| {
        fields[w..w + bytes.len()].copy_from_slice(bytes);
        w += bytes.len();
    };
    put(&hash.to_le_bytes());
    put(&(out.len() as u32).to_le_bytes());
    put(&(key.len() as u32).to_le_bytes());
    put(&[record.state.to_byte()]);
    put(&record.fingerprint.as_u128().to_le_bytes());
    put(&record.token.get().to_le_bytes());
    put(&record.lease_expires_at.to_le_bytes());
    put(&record.created_at.to_le_bytes());
    put(&record.updated_at.to_le_bytes());
    put(&record.attempts.to_le_bytes());
    put(&record.expires_at.to_le_bytes());
    let (head, rest) = out.split_at_mut(ENTRY_HEAD + FIELDS);
    head.copy_from_slice(&fields);
    let (k, response) = rest.split_at_mut(key.len());
    k.copy_from_slice(key);
    response.copy_from_slice(&record.response);
}

fn entry_len(key: &[u8], record: &Record) -> usize {
    ENTRY_HEAD + FIELDS + key.len() + record.response.len()
}

/// The record in `entry` if it was written for `key` (another key with the same hash: none).
fn read_entry(entry: &[u8], key: &[u8]) -> Option<Record> {
    let key_len = u32_at(entry, 12)? as usize;
    let body = ENTRY_HEAD + FIELDS;
    if entry.get(body..body + key_len)? != key {
        return None;
    }
    let f = entry.get(ENTRY_HEAD..body)?;
    Some(Record {
        state: RecordState::from_byte(f[0])?,
        fingerprint: Fingerprint::from_u128(u128::from_le_bytes(f.get(1..17)?.try_into().ok()?)),
        token: FencingToken::new(u64_at(f, 17)?)?,
        lease_expires_at: u64_at(f, 25)?,
        created_at: u64_at(f, 33)?,
        updated_at: u64_at(f, 41)?,
        attempts: u32_at(f, 49)?,
        expires_at: u64_at(f, 53)?,
        response: entry.get(body + key_len..)?.to_vec(),
    })
}

/// A shard's generation as a reader saw it before it took its snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Generation(u64);

pub(crate) struct ReplayCache {
    shards: Box<[RwLock<Shard>]>,
    /// Bytes of each shard's ring; 0: the cache is off.
    ring_bytes: usize,
    /// Sets of `WAYS` slots per shard: a power of two.
    sets: usize,
    /// The marks after which a shard's admission bits are cleared.
    marks_per_clearing: usize,
}

impl ReplayCache {
    /// A cache of at most about `bytes` (0: off).
    pub(crate) fn new(bytes: usize) -> ReplayCache {
        let shard = bytes / SHARDS;
        let slots = shard / (RING_PER_SLOT + SET_BYTES / WAYS);
        // Rounded up: at most twice the slots asked for, under a fourth of the bytes.
        let sets = match slots / WAYS {
            0 => 0,
            n => n.next_power_of_two(),
        };
        ReplayCache {
            shards: (0..SHARDS).map(|_| RwLock::default()).collect(),
            ring_bytes: if sets == 0 {
                0
            } else {
                shard.saturating_sub(sets * SET_BYTES)
            },
            sets,
            marks_per_clearing: (sets * WAYS).div_ceil(SLOTS_PER_MARK),
        }
    }

    fn shard(&self, hash: u64) -> &RwLock<Shard> {
        &self.shards[(hash >> 58) as usize % SHARDS]
    }

    fn enabled(&self) -> bool {
        self.ring_bytes > 0
    }

    /// The cached finished record of `key`, if any (whatever its expiry), and the shard's
    /// generation as of the probe (what [`generation`](Self::generation) would read).
    pub(crate) fn get(&self, key: &RecordKey, hash: u64) -> (Option<Record>, Generation) {
        if !self.enabled() {
            return (None, Generation(0));
        }
        let shard = self.shard(hash).read();
        let record = shard
            .slot_of(hash, self.sets)
            .and_then(|(_, _, entry)| read_entry(entry, key.as_bytes()));
        (record, Generation(shard.generation))
    }

    /// The shard's generation alone (`get` reads it with the probe).
    #[cfg(test)]
    fn generation(&self, hash: u64) -> Generation {
        Generation(self.shard(hash).read().generation)
    }

    /// Whether a fill of the key whose hash is `hash` may be kept: it was seen since the
    /// shard's admission array was last cleared. If not, marks it (a fill follows its next
    /// sighting). The snapshot path asks this before [`fill`](Self::fill).
    pub(crate) fn admit(&self, hash: u64) -> bool {
        if !self.enabled() {
            return false;
        }
        let mut shard = self.shard(hash).write();
        if shard.sets.is_empty() {
            shard.sets = vec![Set::default(); self.sets];
        }
        let s = set_of(hash, self.sets);
        let bit = seen_bit(hash);
        if shard.sets[s].seen & bit != 0 {
            return true;
        }
        if shard.marks >= self.marks_per_clearing {
            for set in &mut shard.sets {
                set.seen = 0;
            }
            shard.marks = 0;
        }
        shard.sets[s].seen |= bit;
        shard.marks += 1;
        false
    }

    /// Keeps `record`, the newest durable record of `key` as a snapshot taken after `seen`
    /// showed it, unless the key's shard was invalidated since. Only finished records.
    pub(crate) fn fill(&self, key: &RecordKey, hash: u64, record: &Record, seen: Generation) {
        if !self.enabled() || record.state == RecordState::InProgress {
            return;
        }
        let len = entry_len(key.as_bytes(), record);
        if len > self.ring_bytes || u32::try_from(len).is_err() {
            return;
        }
        let mut shard = self.shard(hash).write();
        if shard.generation != seen.0 {
            return;
        }
        if shard.ring.is_empty() {
            shard.ring = vec![0; self.ring_bytes];
        }
        if shard.sets.is_empty() {
            shard.sets = vec![Set::default(); self.sets];
        }
        let position = shard.make_room(len);
        let at = shard.offset(position);
        write_entry(&mut shard.ring[at..at + len], hash, key.as_bytes(), record);
        shard.head = position + len as u64;
        // Chosen after the eviction: a slot whose entry it passed is free.
        let s = set_of(hash, self.sets);
        let way = shard.way_for(hash, s, self.sets);
        let set = &mut shard.sets[s];
        set.positions[way] = position + 1;
        set.tags[way] = tag_of(hash);
    }

    /// Forgets `key` (the writer changed it) and refuses fills read before now.
    pub(crate) fn invalidate(&self, hash: u64) {
        if !self.enabled() {
            return;
        }
        let mut shard = self.shard(hash).write();
        shard.generation += 1;
        if let Some((s, way, _)) = shard.slot_of(hash, self.sets) {
            shard.sets[s].positions[way] = 0;
        }
    }

    /// Records held.
    #[cfg(any(test, feature = "test-hooks"))]
    pub(crate) fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                let s = s.read();
                s.sets
                    .iter()
                    .flat_map(|set| set.positions)
                    .filter(|&p| p.checked_sub(1).is_some_and(|p| p >= s.tail))
                    .count()
            })
            .sum()
    }

    /// Forgets everything and refuses fills read before now (records were rewritten or
    /// dropped outside a batch).
    pub(crate) fn clear(&self) {
        for shard in self.shards.iter() {
            let mut shard = shard.write();
            shard.generation += 1;
            let head = shard.head;
            shard.tail = head;
        }
    }

    /// The bytes the shards hold: their rings and sets.
    #[cfg(test)]
    fn bytes(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                let s = s.read();
                s.ring.len() + s.sets.len() * SET_BYTES
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idemdb_core::fingerprint::Fingerprint;
    use idemdb_core::scope::{Key, Scope};
    use std::collections::HashMap;

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
        assert!(cache.get(&k, h).0.is_none());
        let seen = cache.generation(h);
        cache.fill(&k, h, &record(RecordState::Completed, b"new"), seen);
        assert_eq!(cache.get(&k, h).0.unwrap().response, b"new");
        cache.invalidate(h);
        assert!(cache.get(&k, h).0.is_none());
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
        assert!(cache.get(&a, hash(&a)).0.is_none());
        assert!(cache.get(&b, hash(&b)).0.is_none());
        assert_eq!(cache.len(), 0);
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
        assert!(cache.get(&a, h).0.is_none());
        cache.fill(
            &a,
            h,
            &record(RecordState::Completed, b"a"),
            cache.generation(h),
        );
        // Same slot, other key bytes: a miss, never a's record.
        assert!(cache.get(&b, h).0.is_none());
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
        assert!(cache.get(&newest, hash(&newest)).0.is_some());
        let oldest = key(0);
        assert!(cache.get(&oldest, hash(&oldest)).0.is_none());
    }

    #[test]
    fn small_responses_fill_no_more_entries_than_the_slots_hold() {
        let budget = 64 * 4096;
        let cache = ReplayCache::new(budget);
        for i in 0..20_000 {
            let k = key(i);
            let h = hash(&k);
            cache.fill(
                &k,
                h,
                &record(RecordState::Completed, b""),
                cache.generation(h),
            );
        }
        assert!(cache.bytes() <= budget, "{} > {budget}", cache.bytes());
        assert!(cache.len() <= 64 * cache.sets * WAYS);
        let newest = key(19_999);
        assert!(cache.get(&newest, hash(&newest)).0.is_some());
    }

    /// Entries of every size wrap around the rings many times: every key answers the record
    /// it was last filled with or nothing, the newest fill always, never another's bytes.
    #[test]
    fn entries_of_any_size_wrapping_around_answer_their_own_record_or_nothing() {
        let cache = ReplayCache::new(64 * 2048);
        let mut last: HashMap<u32, Vec<u8>> = HashMap::new();
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for step in 0..50_000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let i = (x % 300) as u32;
            let k = key(i);
            let h = hash(&k);
            if x.is_multiple_of(11) {
                cache.invalidate(h);
                last.remove(&i);
                continue;
            }
            let response: Vec<u8> = (0..(x >> 20) % 200)
                .map(|b| (b as u32 ^ step) as u8)
                .collect();
            cache.fill(
                &k,
                h,
                &record(RecordState::Completed, &response),
                cache.generation(h),
            );
            last.insert(i, response.clone());
            assert_eq!(cache.get(&k, h).0.unwrap().response, response);
            for shard in cache.shards.iter() {
                let s = shard.read();
                // No entry still in use was written over.
                assert!(s.head - s.tail <= s.ring.len() as u64);
            }
            if step.is_multiple_of(97) {
                for (j, want) in &last {
                    let kj = key(*j);
                    if let Some(got) = cache.get(&kj, hash(&kj)).0 {
                        assert_eq!(&got.response, want, "key {j}");
                        assert_eq!(got, record(RecordState::Completed, want));
                    }
                }
            }
        }
        assert!(cache.bytes() <= 64 * 2048);
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
        assert!(cache.get(&k, h).0.is_none());
        assert_eq!(cache.bytes(), 0);
        cache.fill(
            &k,
            h,
            &record(RecordState::Completed, &[7; 100]),
            cache.generation(h),
        );
        assert!(cache.get(&k, h).0.is_some());
    }

    #[test]
    fn a_key_is_admitted_at_its_second_sight_and_the_marks_stay_bounded() {
        let cache = ReplayCache::new(64 * 4096);
        let k = key(1);
        let h = hash(&k);
        assert!(!cache.admit(h));
        assert!(cache.admit(h));
        assert!(cache.admit(h));
        // Many more first sightings than a clearing allows: the array is cleared (key 1 is
        // forgotten), the marks never pass their bound, and the bytes stay in the budget.
        let mut admitted = 0;
        for i in 2..20_000 {
            let kh = hash(&key(i));
            admitted += usize::from(cache.admit(kh));
            if i % 2 == 0 {
                let k = key(i);
                cache.fill(
                    &k,
                    kh,
                    &record(RecordState::Completed, &[1; 100]),
                    cache.generation(kh),
                );
            }
            for shard in cache.shards.iter() {
                assert!(shard.read().marks <= cache.marks_per_clearing);
            }
        }
        assert!(!cache.admit(h), "never forgotten");
        // Keys taken for seen without having been: about 1 in 64 at most, per the sizing.
        assert!(admitted < 20_000 / 40, "{admitted} admitted at first sight");
        assert!(cache.bytes() <= 64 * 4096, "{}", cache.bytes());
        assert!(!ReplayCache::new(0).admit(h));
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
        assert!(cache.get(&k, h).0.is_none());
    }
}
