//! What the record store's in-memory maps cost: heap bytes of a `std` hash map (hashbrown) of
//! a given capacity, so that an open can tell what its key index and horizon map will take
//! before it builds them, and `stats()` can tell what they take.
//!
//! hashbrown keeps a power-of-two number of buckets, at most 7/8 of them full, each with its
//! entry and one control byte, plus one group (16 bytes) of trailing control bytes.

/// Control bytes after the last bucket (hashbrown's group width, at most 16).
const GROUP: u64 = 16;

/// The buckets a map allocates to hold `items` entries without growing.
pub(crate) fn buckets_for(items: u64) -> u64 {
    match items {
        0 => 0,
        1..=3 => 4,
        4..=7 => 8,
        n => n.saturating_mul(8).div_ceil(7).next_power_of_two(),
    }
}

/// The buckets behind a map whose `capacity()` is `capacity` (7/8 of its buckets, or one
/// less than them below 8).
pub(crate) fn buckets_of_capacity(capacity: u64) -> u64 {
    match capacity {
        0 => 0,
        c if c < 8 => c + 1,
        c => c / 7 * 8,
    }
}

/// Heap bytes of `buckets` buckets of `entry` bytes each.
pub(crate) fn table_bytes(buckets: u64, entry: u64) -> u64 {
    if buckets == 0 {
        return 0;
    }
    buckets.saturating_mul(entry + 1).saturating_add(GROUP)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn buckets_match_what_std_allocates() {
        for items in [
            0u64,
            1,
            3,
            4,
            7,
            8,
            13,
            14,
            15,
            100,
            1000,
            57_344,
            57_345,
            1 << 20,
        ] {
            let map: HashMap<u64, u64> = HashMap::with_capacity(items as usize);
            let buckets = buckets_of_capacity(map.capacity() as u64);
            assert_eq!(buckets, buckets_for(items), "{items} items");
            assert!(map.capacity() as u64 >= items);
        }
        // A map grown entry by entry ends with the buckets a reserved one starts with.
        let mut grown: HashMap<u64, u64> = HashMap::new();
        for i in 0..100_000 {
            grown.insert(i, i);
        }
        assert_eq!(
            buckets_of_capacity(grown.capacity() as u64),
            buckets_for(100_000)
        );
    }
}
