//! Beyond-horizon recognition: the keys of every dropped partition (and of every swept
//! abandoned reservation), kept for an extended horizon, so that a redrive older than the TTL
//! is flagged instead of silently executing twice.
//!
//! On disk (table `idemdb_recognised`), one row per dropped partition or sweep: key = `until`
//! (u64 BE, ms) followed by the source's name; value = the keys' 64-bit index hashes, u64 LE
//! each, sorted and distinct: 8 bytes per key. The hashes are also entered, after the row's
//! commit, in a table keyed by hash (recognised.rs), which a fresh acquisition asks; memory
//! holds only the rows not entered yet. A key never stored is taken for a recognised one
//! with probability about n / 2^64 for n recognised keys (a billion: 5.4 × 10^-11).
//!
//! Older builds kept 32-bit tags (the hashes' upper halves) in `idemdb_horizon`, 4 bytes per
//! key, which match a fresh key with probability n / 2^32 (181 million keys: 4.1%). Such rows
//! are still read, into a map of their own compared on the upper half, and retired as they run
//! out; nothing writes them any more.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::RwLock;
use redb::{ReadableTable, TableDefinition, TableHandle, WriteTransaction};

use crate::engine_tables::INFLIGHT;
use crate::error::Error;
use crate::records::memory::{buckets_for, buckets_of_capacity, table_bytes};
use crate::records::partition::PartitionName;

/// Rows of 32-bit tags written by older builds: read and retired, never written.
pub(crate) const HORIZON: TableDefinition<&[u8], &[u8]> = TableDefinition::new("idemdb_horizon");
/// Rows of 64-bit hashes.
pub(crate) const RECOGNISED: TableDefinition<&[u8], &[u8]> =
    TableDefinition::new("idemdb_recognised");

pub(crate) fn tag(hash: u64) -> u32 {
    (hash >> 32) as u32
}

/// The row key of a horizon set.
pub(crate) fn row_key(until: u64, partition: &str) -> Vec<u8> {
    let mut key = until.to_be_bytes().to_vec();
    key.extend_from_slice(partition.as_bytes());
    key
}

/// `until` from a row key.
pub(crate) fn row_until(key: &[u8]) -> Result<u64, Error> {
    key.get(..8)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_be_bytes)
        .ok_or_else(|| Error::Corrupted(format!("horizon row key of {} bytes", key.len())))
}

/// The source a sweep's rows name: `idemdb_inflight@{now}`.
pub(crate) fn sweep_source(now: u64) -> String {
    format!("{}@{now}", INFLIGHT.name())
}

/// The table (or sweep) a row names, from its key.
pub(crate) fn row_source(key: &[u8]) -> Result<&str, Error> {
    let name = key
        .get(8..)
        .ok_or_else(|| Error::Corrupted(format!("horizon row key of {} bytes", key.len())))?;
    std::str::from_utf8(name)
        .map_err(|_| Error::Corrupted("horizon row key names no table: not UTF-8".into()))
}

/// Whether a row may name `source`: a dropped partition, or a sweep `idemdb_inflight@{now}`.
pub(crate) fn is_source(source: &str) -> bool {
    if PartitionName::parse(source).is_some() {
        return true;
    }
    source
        .strip_prefix(INFLIGHT.name())
        .and_then(|rest| rest.strip_prefix('@'))
        .is_some_and(|ms| !ms.is_empty() && ms.bytes().all(|b| b.is_ascii_digit()))
}

/// Writes the set of key `hashes` (sorted, distinct) recognised until `until`, removed from
/// `source`, merged with a row already under the same key (two passes at one instant, or a
/// partition of the same name created again after the clock went back). Names the row as not
/// yet entered in the table of recognised keys (recognised.rs) and returns its hashes, for
/// memory to hold until they are.
pub(crate) fn write_row(
    txn: &WriteTransaction,
    until: u64,
    source: &str,
    hashes: &[u64],
) -> Result<Arc<[u64]>, Error> {
    let mut table = txn.open_table(RECOGNISED)?;
    let key = row_key(until, source);
    let mut merged = hashes.to_vec();
    if let Some(old) = table.get(key.as_slice())? {
        merged.extend(decode_hashes(old.value())?);
        merged.sort_unstable();
        merged.dedup();
    }
    table.insert(key.as_slice(), encode_hashes(&merged).as_slice())?;
    crate::records::recognised::mark_unindexed(txn, &key)?;
    Ok(merged.into())
}

pub(crate) fn encode_hashes(hashes: &[u64]) -> Vec<u8> {
    hashes.iter().flat_map(|h| h.to_le_bytes()).collect()
}

pub(crate) fn decode_hashes(bytes: &[u8]) -> Result<impl Iterator<Item = u64> + '_, Error> {
    if !bytes.len().is_multiple_of(8) {
        return Err(Error::Corrupted(format!(
            "set of {} bytes is not whole 8-byte hashes",
            bytes.len()
        )));
    }
    Ok(bytes.chunks_exact(8).map(|c| {
        let mut b = [0u8; 8];
        b.copy_from_slice(c);
        u64::from_le_bytes(b)
    }))
}

/// Older builds' row values: only the tests and the fuzz decoders write them now.
#[cfg(any(test, feature = "test-hooks"))]
pub(crate) fn encode_tags(tags: &[u32]) -> Vec<u8> {
    tags.iter().flat_map(|t| t.to_le_bytes()).collect()
}

pub(crate) fn decode_tags(bytes: &[u8]) -> Result<impl Iterator<Item = u32> + '_, Error> {
    if !bytes.len().is_multiple_of(4) {
        return Err(Error::Corrupted(format!(
            "set of {} bytes is not whole 4-byte tags",
            bytes.len()
        )));
    }
    Ok(bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])))
}

/// A recognition row whose hashes are not all in the on-disk table yet (recognised.rs):
/// held in memory until its last step commits.
pub(crate) struct Pending {
    /// The row's key in `idemdb_recognised`.
    pub(crate) key: Vec<u8>,
    pub(crate) until: u64,
    /// Sorted and distinct.
    pub(crate) hashes: Arc<[u64]>,
}

/// Recognised keys in memory: the rows not yet in the on-disk table, and the 32-bit tags of
/// older builds' rows, tag → until. Every other recognised key is only on disk.
pub(crate) struct Horizon {
    pending: RwLock<Vec<Arc<Pending>>>,
    tags: RwLock<HashMap<u32, u64>>,
    /// `pending` or `tags` holds any: a fresh acquisition takes their locks only then.
    in_memory: AtomicBool,
    /// No tag runs out before this: a pass with nothing to retire does not walk them.
    earliest: AtomicU64,
}

impl Default for Horizon {
    fn default() -> Self {
        Horizon {
            pending: RwLock::default(),
            tags: RwLock::default(),
            in_memory: AtomicBool::new(false),
            earliest: AtomicU64::new(u64::MAX),
        }
    }
}

impl Horizon {
    /// Whether the key with this index hash is recognised at `now` by what memory holds: a
    /// row not yet on disk, or the upper half an older build's row kept. The on-disk table
    /// is asked by the caller.
    pub(crate) fn recognises(&self, hash: u64, now: u64) -> bool {
        if !self.in_memory.load(Ordering::Acquire) {
            return false;
        }
        let pending = self
            .pending
            .read()
            .iter()
            .any(|row| now < row.until && row.hashes.binary_search(&hash).is_ok());
        pending
            || self
                .tags
                .read()
                .get(&tag(hash))
                .is_some_and(|&until| now < until)
    }

    fn note_in_memory(&self, pending: &[Arc<Pending>], tags: &HashMap<u32, u64>) {
        self.in_memory
            .store(!pending.is_empty() || !tags.is_empty(), Ordering::Release);
    }

    /// Holds the row `key` (its hashes as written, merged with any row of the same key)
    /// until its hashes are on disk; replaces a row held under the same key.
    pub(crate) fn add_pending(&self, key: Vec<u8>, until: u64, hashes: Arc<[u64]>) {
        let mut pending = self.pending.write();
        pending.retain(|row| row.key != key);
        pending.push(Arc::new(Pending { key, until, hashes }));
        self.note_in_memory(&pending, &self.tags.read());
    }

    /// Forgets the row `row` once its hashes are on disk (or it was retired); a row held
    /// under its key since (merged by a later drop) stays.
    pub(crate) fn remove_pending(&self, row: &Arc<Pending>) {
        let mut pending = self.pending.write();
        pending.retain(|held| !Arc::ptr_eq(held, row));
        self.note_in_memory(&pending, &self.tags.read());
    }

    /// Forgets the row under `key`, whatever it holds (it was retired).
    pub(crate) fn remove_pending_key(&self, key: &[u8]) {
        let mut pending = self.pending.write();
        pending.retain(|held| held.key != key);
        self.note_in_memory(&pending, &self.tags.read());
    }

    /// The rows held in memory, oldest first.
    pub(crate) fn pending(&self) -> Vec<Arc<Pending>> {
        self.pending.read().clone()
    }

    /// Recognises the 32-bit `tags` of an older build's row until `until`.
    pub(crate) fn add_tags(&self, tags: impl IntoIterator<Item = u32>, until: u64) {
        let mut map = self.tags.write();
        let before = map.len();
        for t in tags {
            let e = map.entry(t).or_insert(until);
            *e = (*e).max(until);
        }
        if map.len() > before {
            self.earliest.fetch_min(until, Ordering::Relaxed);
        }
        self.note_in_memory(&self.pending.read(), &map);
    }

    /// Forgets tags whose horizon passed.
    pub(crate) fn expire(&self, now: u64) {
        if now < self.earliest.load(Ordering::Relaxed) {
            return;
        }
        let mut tags = self.tags.write();
        tags.retain(|_, until| now < *until);
        self.note_in_memory(&self.pending.read(), &tags);
        let earliest = tags.values().copied().min();
        self.earliest
            .store(earliest.unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// Recognised keys held in memory: the pending rows' hashes and older rows' tags.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        let pending: usize = self.pending.read().iter().map(|r| r.hashes.len()).sum();
        pending + self.tags_len()
    }

    /// Older builds' tags held.
    pub(crate) fn tags_len(&self) -> usize {
        self.tags.read().len()
    }

    /// Heap bytes held now (the pending rows' hashes; their keys are a few bytes a row).
    pub(crate) fn memory_bytes(&self) -> u64 {
        let pending: u64 = self
            .pending
            .read()
            .iter()
            .map(|r| (r.hashes.len() * size_of::<u64>()) as u64)
            .sum();
        pending
            + table_bytes(
                buckets_of_capacity(self.tags.read().capacity() as u64),
                TAG_ENTRY,
            )
    }

    /// Room for `tags` more tags without growing.
    pub(crate) fn reserve_tags(&self, tags: u64) {
        if tags > 0 {
            self.tags
                .write()
                .reserve(usize::try_from(tags).unwrap_or(usize::MAX));
        }
    }
}

/// Bytes of one entry of the tags map: (tag, until).
const TAG_ENTRY: u64 = size_of::<(u32, u64)>() as u64;

/// Heap bytes of `keys` pending hashes and a map of `tags` tags.
pub(crate) fn bytes_for(keys: u64, tags: u64) -> u64 {
    keys.saturating_mul(size_of::<u64>() as u64) + table_bytes(buckets_for(tags), TAG_ENTRY)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(key: &[u8], until: u64, hashes: &[u64]) -> (Vec<u8>, u64, Arc<[u64]>) {
        (key.to_vec(), until, hashes.into())
    }

    #[test]
    fn a_pending_row_is_recognised_until_its_horizon_and_forgotten_when_removed() {
        let h = Horizon::default();
        assert!(!h.recognises(1, 0));
        let (k, until, hashes) = row(b"a", 100, &[1, 2, 5]);
        h.add_pending(k, until, hashes);
        assert!(h.recognises(2, 99) && !h.recognises(2, 100));
        assert!(!h.recognises(3, 0));
        assert_eq!(h.len(), 3);
        // A merged row under the same key replaces it; removing the old one keeps the new.
        let old = h.pending().remove(0);
        let (k, until, hashes) = row(b"a", 100, &[1, 2, 3, 5]);
        h.add_pending(k, until, hashes);
        h.remove_pending(&old);
        assert!(h.recognises(3, 0));
        h.remove_pending_key(b"a");
        assert!(!h.recognises(3, 0));
        assert_eq!((h.len(), h.memory_bytes()), (0, 0));
    }

    #[test]
    fn a_hash_is_recognised_whole_and_an_older_rows_tag_by_its_upper_half() {
        let h = Horizon::default();
        let k = 0xAAAA_BBBB_0000_0001;
        let (key, until, hashes) = row(b"r", 100, &[k]);
        h.add_pending(key, until, hashes);
        assert!(h.recognises(k, 0));
        // The same upper half, another key: not recognised by a whole hash.
        assert!(!h.recognises(k ^ 1, 0));
        h.add_tags([tag(0x1234_5678_0000_0000)], 50);
        assert!(h.recognises(0x1234_5678_FFFF_FFFF, 49));
        assert!(!h.recognises(0x1234_5678_FFFF_FFFF, 50));
        assert_eq!(h.len(), 2);
        h.expire(50);
        assert_eq!(h.len(), 1);
    }

    #[test]
    fn horizon_sources() {
        let part = PartitionName {
            start: 1_000,
            width: 1_000,
            ttl: 5,
        };
        assert!(is_source(&part.table_name()));
        assert!(is_source(&sweep_source(1_700_000_000_000)));
        for bad in [
            "idemdb_inflight@",
            "idemdb_inflight@12x",
            "idemdb_p_1_0_5",
            "x",
        ] {
            assert!(!is_source(bad), "{bad}");
        }
    }

    #[test]
    fn rows_round_trip() {
        let key = row_key(42, "idemdb_p_x");
        assert_eq!(row_until(&key).unwrap(), 42);
        assert_eq!(row_source(&key).unwrap(), "idemdb_p_x");
        assert!(row_source(&key[..7]).is_err());
        assert!(row_until(&key[..7]).is_err());
        let tags = [7, u32::MAX, 0];
        let back: Vec<u32> = decode_tags(&encode_tags(&tags)).unwrap().collect();
        assert_eq!(back, tags);
        assert!(decode_tags(&[1, 2, 3]).is_err());
    }
}
