//! A wide partition's keys as a filter: a binary fuse filter (Graf and Lemire, "Binary Fuse
//! Filters: Fast and Smaller Than Xor Filters", 2022) of 8-bit fingerprints over the keys'
//! index hashes, about 1.13 bytes a key, that answers "maybe here" for every key it was built
//! from and for about 1 key in 256 of the others. A wide partition found through its filter
//! needs no entry in the key index (16 to 39 bytes a key); a false "maybe" costs one B-tree
//! probe that finds nothing.
//!
//! Each hash is mixed with the filter's seed and picks three slots, one in each of three
//! consecutive segments; the XOR of the three slots is the hash's fingerprint. Building peels
//! the slot graph (a slot that one key alone uses is that key's, and the key leaves the graph)
//! and assigns the slots in the reverse order; a seed whose graph does not peel whole is
//! replaced by the next.
//!
//! Row (table `idemdb_filters`, see [`FilterRow`]): the table's count, first and last key
//! hashes (as a summary's), then the filter, then an XXH3-64 checksum of everything before it.
//! A filter that lost a key would hide a record, so a row whose checksum or shape is wrong is
//! never used.

use redb::{TableDefinition, TableHandle, WriteTransaction};

use crate::error::Error;
use crate::records::head::{HEAD_LEN, TableHead, le_u64};

/// Partition table name → [`FilterRow::encode`].
pub(crate) const FILTERS: TableDefinition<&str, &[u8]> = TableDefinition::new("idemdb_filters");

/// Seeds tried before a build gives up (a graph fails to peel with a probability of a few
/// percent at most, and independently for each seed).
const ATTEMPTS: u64 = 64;

/// The widest segment (slots): wider ones gain nothing and cost locality.
const MAX_SEGMENT: u32 = 1 << 18;

/// Bytes of a row around the fingerprints: the table's head (count, first, last), seed,
/// segment length, segment count length (`u32` each), then the checksum.
const HEAD: usize = HEAD_LEN + 8 + 4 * 2;
const TAIL: usize = 8;

/// The membership filter of a set of 64-bit hashes.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct KeyFilter {
    seed: u64,
    /// Slots per segment: a power of two.
    segment_length: u32,
    /// Slots in the segments a key's first slot may fall in (a multiple of the segment
    /// length); the array has two segments more.
    segment_count_length: u32,
    fingerprints: Box<[u8]>,
}

impl std::fmt::Debug for KeyFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyFilter")
            .field("seed", &self.seed)
            .field("segment_length", &self.segment_length)
            .field("slots", &self.fingerprints.len())
            .finish()
    }
}

/// murmur3's 64-bit finaliser: a bijection, so distinct hashes stay distinct.
fn mix(hash: u64, seed: u64) -> u64 {
    let mut h = hash.wrapping_add(seed);
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

fn fingerprint(mixed: u64) -> u8 {
    (mixed ^ (mixed >> 32)) as u8
}

impl KeyFilter {
    /// The filter of `hashes` (distinct), or `None` if no seed of [`ATTEMPTS`] peeled (never
    /// seen; the caller keeps the keys in the key index instead).
    pub(crate) fn build(hashes: &[u64]) -> Option<KeyFilter> {
        let n = u32::try_from(hashes.len()).ok()?;
        let (segment_length, segment_count_length) = shape(n)?;
        let slots = (segment_count_length + 2 * segment_length) as usize;
        let mut filter = KeyFilter {
            seed: 0,
            segment_length,
            segment_count_length,
            fingerprints: vec![0; slots].into_boxed_slice(),
        };
        if n == 0 {
            return Some(filter);
        }
        let mut mixed = Vec::with_capacity(hashes.len());
        let mut count = vec![0u32; slots];
        let mut xor = vec![0u64; slots];
        let mut queue = Vec::new();
        let mut peeled: Vec<(u64, u32)> = Vec::with_capacity(hashes.len());
        for attempt in 0..ATTEMPTS {
            filter.seed = mix(attempt, 0x9e37_79b9_7f4a_7c15);
            mixed.clear();
            mixed.extend(hashes.iter().map(|&h| mix(h, filter.seed)));
            // In the order of their first slot: the graph is built and peeled front to back.
            mixed.sort_unstable();
            count.fill(0);
            xor.fill(0);
            for &h in &mixed {
                for s in filter.slots(h) {
                    count[s] += 1;
                    xor[s] ^= h;
                }
            }
            queue.clear();
            queue.extend((0..slots).filter(|&s| count[s] == 1));
            peeled.clear();
            while let Some(s) = queue.pop() {
                if count[s] != 1 {
                    continue;
                }
                let h = xor[s];
                peeled.push((h, s as u32));
                for t in filter.slots(h) {
                    count[t] -= 1;
                    xor[t] ^= h;
                    if count[t] == 1 {
                        queue.push(t);
                    }
                }
            }
            if peeled.len() == mixed.len() {
                // Each key's own slot is assigned after the other two keep their final value.
                for &(h, s) in peeled.iter().rev() {
                    let [a, b, c] = filter.slots(h);
                    let f = &mut filter.fingerprints;
                    f[s as usize] = 0;
                    f[s as usize] = fingerprint(h) ^ f[a] ^ f[b] ^ f[c];
                }
                return Some(filter);
            }
        }
        None
    }

    /// The three slots of a mixed hash: one in each of three consecutive segments.
    fn slots(&self, mixed: u64) -> [usize; 3] {
        let mask = self.segment_length - 1;
        let first = ((u128::from(mixed) * u128::from(self.segment_count_length)) >> 64) as u32;
        let second = (first + self.segment_length) ^ ((mixed >> 18) as u32 & mask);
        let third = (first + 2 * self.segment_length) ^ (mixed as u32 & mask);
        [first as usize, second as usize, third as usize]
    }

    /// False only if `hash` was not among those the filter was built from.
    pub(crate) fn may_contain(&self, hash: u64) -> bool {
        if self.segment_count_length == 0 {
            return false;
        }
        let h = mix(hash, self.seed);
        let [a, b, c] = self.slots(h);
        let f = &self.fingerprints;
        fingerprint(h) ^ f[a] ^ f[b] ^ f[c] == 0
    }

    /// Heap bytes.
    pub(crate) fn memory_bytes(&self) -> u64 {
        self.fingerprints.len() as u64
    }
}

/// Segment length and segment count length for `n` keys: the paper's sizing (segments of
/// 2^⌊log₃.₃₃ n + 2.25⌋ slots, 1.125 slots a key for a million keys and more, more for fewer).
/// `None` if the array would not be indexable by `u32` (some 3.8 billion keys).
fn shape(n: u32) -> Option<(u32, u32)> {
    if n == 0 {
        return Some((1, 0));
    }
    let nf = f64::from(n);
    let segment_length = if n == 1 {
        1
    } else {
        let bits = (nf.ln() / 3.33f64.ln() + 2.25).floor().max(0.0) as u32;
        (1u32 << bits.min(18)).min(MAX_SEGMENT)
    };
    let factor = if n <= 1 {
        1.0
    } else {
        (0.875 + 0.25 * 1_000_000f64.ln() / nf.ln()).max(1.125)
    };
    let capacity = (nf * factor).round() as u64;
    let segments = capacity
        .div_ceil(u64::from(segment_length))
        .saturating_sub(2)
        .max(1);
    let segment_count_length = segments * u64::from(segment_length);
    if segment_count_length + 2 * u64::from(segment_length) > u64::from(u32::MAX) {
        return None;
    }
    Some((segment_length, segment_count_length as u32))
}

/// What a row holds: the filter, and the table it was built for (head.rs: it is used only
/// while the table still holds the keys it was built from).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FilterRow {
    pub(crate) head: TableHead,
    pub(crate) filter: KeyFilter,
}

impl FilterRow {
    pub(crate) fn new(head: TableHead, filter: KeyFilter) -> FilterRow {
        FilterRow { head, filter }
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        let f = &self.filter;
        let mut out = Vec::with_capacity(HEAD + f.fingerprints.len() + TAIL);
        self.head.encode_into(&mut out);
        out.extend_from_slice(&f.seed.to_le_bytes());
        out.extend_from_slice(&f.segment_length.to_le_bytes());
        out.extend_from_slice(&f.segment_count_length.to_le_bytes());
        out.extend_from_slice(&f.fingerprints);
        let sum = xxhash_rust::xxh3::xxh3_64(&out);
        out.extend_from_slice(&sum.to_le_bytes());
        out
    }

    /// The row of partition table `table`; `Corrupted` naming it if its checksum does not
    /// match or its shape is not one [`KeyFilter::build`] makes.
    pub(crate) fn decode(bytes: &[u8], table: &str) -> Result<FilterRow, Error> {
        let bad = |why: String| {
            Error::Corrupted(format!("{}: the row of {table}: {why}", FILTERS.name()))
        };
        if bytes.len() < HEAD + TAIL {
            return Err(bad(format!("{} bytes are shorter than a row", bytes.len())));
        }
        let body = &bytes[..bytes.len() - TAIL];
        let half = |i: usize| {
            let mut w = [0u8; 4];
            w.copy_from_slice(&bytes[i..i + 4]);
            u32::from_le_bytes(w)
        };
        if xxhash_rust::xxh3::xxh3_64(body) != le_u64(bytes, body.len()) {
            return Err(bad("checksum mismatch".to_string()));
        }
        let head = TableHead::decode(bytes);
        let segment_length = half(HEAD_LEN + 8);
        let segment_count_length = half(HEAD_LEN + 12);
        let fingerprints = &body[HEAD..];
        let count = head.count;
        // An empty filter answers "not here" to every key: only an empty table has one.
        let shaped = (segment_count_length > 0 || count == 0)
            && segment_length.is_power_of_two()
            && segment_length <= MAX_SEGMENT
            && segment_count_length.is_multiple_of(segment_length)
            && u64::from(segment_count_length) + 2 * u64::from(segment_length)
                == fingerprints.len() as u64;
        if !shaped {
            return Err(bad(format!(
                "segments of {segment_length} slots, {segment_count_length} slots of first \
                 choices and {} fingerprints are not a filter's shape",
                fingerprints.len()
            )));
        }
        Ok(FilterRow {
            head,
            filter: KeyFilter {
                seed: le_u64(bytes, HEAD_LEN),
                segment_length,
                segment_count_length,
                fingerprints: fingerprints.into(),
            },
        })
    }
}

/// Writes the row of partition table `table`, encoded ([`FilterRow::encode`]).
pub(crate) fn write(txn: &WriteTransaction, table: &str, row: &[u8]) -> Result<(), Error> {
    txn.open_table(FILTERS)?.insert(table, row)?;
    Ok(())
}

/// Removes the row of partition table `table` (its table is dropped or replaced).
pub(crate) fn remove(txn: &WriteTransaction, table: &str) -> Result<(), Error> {
    txn.open_table(FILTERS)?.remove(table)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Distinct pseudo-random hashes, none shared by two salts below 2^20.
    fn hashes(n: usize, salt: u64) -> Vec<u64> {
        let mut v: Vec<u64> = (0..n as u64).map(|i| mix(i, salt << 40)).collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    #[test]
    fn every_key_built_from_is_found_at_every_size() {
        for n in [0, 1, 2, 3, 4, 5, 7, 10, 31, 100, 1_000, 10_000, 250_000] {
            let keys = hashes(n, 7);
            let filter = KeyFilter::build(&keys).expect("peels");
            assert!(keys.iter().all(|&h| filter.may_contain(h)), "{n} keys");
            if n >= 100_000 {
                let per_key = filter.memory_bytes() as f64 / n as f64;
                assert!(per_key < 1.2, "{per_key} bytes a key");
            }
        }
    }

    #[test]
    fn about_one_key_in_256_of_the_others_is_a_false_maybe() {
        let filter = KeyFilter::build(&hashes(100_000, 1)).expect("peels");
        let others = hashes(1_000_000, 2);
        let maybe = others.iter().filter(|&&h| filter.may_contain(h)).count();
        let rate = maybe as f64 / others.len() as f64;
        assert!((0.0025..0.0055).contains(&rate), "false rate {rate}");
        assert!(!KeyFilter::build(&[]).expect("empty").may_contain(5));
    }

    #[test]
    fn a_row_decodes_to_what_was_encoded_and_damage_is_refused_naming_the_table() {
        let head = TableHead {
            count: 3,
            first: 9,
            last: 4,
        };
        let row = FilterRow::new(head, KeyFilter::build(&[4, 9, 11]).expect("peels"));
        let bytes = row.encode();
        assert_eq!(FilterRow::decode(&bytes, "t").expect("decodes"), row);
        let mut flipped = bytes.clone();
        flipped[HEAD] ^= 1;
        // A shape that cannot be indexed, with a checksum that matches it.
        let mut misshaped = bytes[..bytes.len() - TAIL].to_vec();
        misshaped[32..36].copy_from_slice(&3u32.to_le_bytes());
        let sum = xxhash_rust::xxh3::xxh3_64(&misshaped);
        misshaped.extend_from_slice(&sum.to_le_bytes());
        for (damaged, why) in [
            (bytes[..HEAD].to_vec(), "shorter than a row"),
            (flipped, "checksum mismatch"),
            (bytes[..bytes.len() - 1].to_vec(), "checksum mismatch"),
            (misshaped, "not a filter's shape"),
        ] {
            match FilterRow::decode(&damaged, "idemdb_p_x") {
                Err(Error::Corrupted(m)) => {
                    assert!(m.contains("idemdb_filters: the row of idemdb_p_x"), "{m}");
                    assert!(m.contains(why), "{m}");
                }
                other => panic!("{other:?}"),
            }
        }
    }
}
