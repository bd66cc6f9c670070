//! Beyond-horizon recognition: the keys of every dropped partition, kept as 32-bit tags for an
//! extended horizon, so that a redrive older than the TTL is flagged instead of silently
//! executing twice.
//!
//! On disk (table `idemdb_horizon`), one row per dropped partition: key = `until` (u64 BE,
//! ms) followed by the partition's table name; value = the tags, u32 LE each, sorted. That is 4
//! bytes per key. In memory, one map from tag to the latest `until`.
//!
//! A tag is 32 bits of the keyed record-key hash, so a key never seen is taken for a
//! recognised one with probability n / 2^32 for n recognised keys (1 million: 0.023%).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::RwLock;
use redb::{ReadableTable, TableDefinition, TableHandle, WriteTransaction};

use crate::engine_tables::INFLIGHT;
use crate::error::Error;
use crate::records::memory::{buckets_for, buckets_of_capacity, table_bytes};
use crate::records::partition::PartitionName;

pub(crate) const HORIZON: TableDefinition<&[u8], &[u8]> = TableDefinition::new("idemdb_horizon");

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

/// Writes the set of `tags` recognised until `until`, removed from `source`, merged with a
/// row already under the same key (two passes at one instant, or a partition of the same
/// name created again after the clock went back).
pub(crate) fn write_row(
    txn: &WriteTransaction,
    until: u64,
    source: &str,
    tags: &[u32],
) -> Result<(), Error> {
    let mut table = txn.open_table(HORIZON)?;
    let key = row_key(until, source);
    let mut merged = tags.to_vec();
    if let Some(old) = table.get(key.as_slice())? {
        merged.extend(decode_tags(old.value())?);
        merged.sort_unstable();
        merged.dedup();
    }
    table.insert(key.as_slice(), encode_tags(&merged).as_slice())?;
    Ok(())
}

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

pub(crate) struct Horizon {
    tags: RwLock<HashMap<u32, u64>>,
    /// No tag runs out before this: a pass with nothing to retire does not walk the map.
    earliest: AtomicU64,
}

impl Default for Horizon {
    fn default() -> Self {
        Horizon {
            tags: RwLock::default(),
            earliest: AtomicU64::new(u64::MAX),
        }
    }
}

impl Horizon {
    /// Whether a key with this tag was dropped and is still recognised at `now`.
    pub(crate) fn recognises(&self, tag: u32, now: u64) -> bool {
        self.tags.read().get(&tag).is_some_and(|&until| now < until)
    }

    pub(crate) fn add(&self, tags: impl IntoIterator<Item = u32>, until: u64) {
        let mut map = self.tags.write();
        let before = map.len();
        for t in tags {
            let e = map.entry(t).or_insert(until);
            *e = (*e).max(until);
        }
        if map.len() > before {
            self.earliest.fetch_min(until, Ordering::Relaxed);
        }
    }

    /// Forgets tags whose horizon passed.
    pub(crate) fn expire(&self, now: u64) {
        if now < self.earliest.load(Ordering::Relaxed) {
            return;
        }
        let mut map = self.tags.write();
        map.retain(|_, until| now < *until);
        let earliest = map.values().copied().min().unwrap_or(u64::MAX);
        self.earliest.store(earliest, Ordering::Relaxed);
    }

    pub(crate) fn len(&self) -> usize {
        self.tags.read().len()
    }

    /// Heap bytes the map holds now.
    pub(crate) fn memory_bytes(&self) -> u64 {
        table_bytes(
            buckets_of_capacity(self.tags.read().capacity() as u64),
            TAG_ENTRY,
        )
    }

    /// Room for `tags` more tags without growing.
    pub(crate) fn reserve(&self, tags: u64) {
        self.tags
            .write()
            .reserve(usize::try_from(tags).unwrap_or(usize::MAX));
    }
}

/// Bytes of one entry of the map (tag, until).
const TAG_ENTRY: u64 = size_of::<(u32, u64)>() as u64;

/// Heap bytes of a map of `tags` tags (at most: rows may share tags).
pub(crate) fn bytes_for(tags: u64) -> u64 {
    table_bytes(buckets_for(tags), TAG_ENTRY)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_until_the_latest_horizon() {
        let h = Horizon::default();
        h.add([1, 2], 100);
        h.add([2], 300);
        assert!(h.recognises(1, 99) && !h.recognises(1, 100));
        assert!(h.recognises(2, 299));
        assert!(!h.recognises(3, 0));
        h.expire(100);
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
