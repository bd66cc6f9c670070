//! What a row kept beside a partition (its summary, summary.rs; its filter, filter.rs) says of
//! the table it was made from: the record count and the index hashes of its first and last
//! keys, and whether the table still holds what the row was made from.
//!
//! Records leave a partition only when it is dropped whole, and a key already there can only
//! be written again, so a table of unchanged length holds the keys it held (a record placed in
//! it later, by a clock gone back, changes its length). The first and last keys tell apart a
//! table of the same name and length made again after a drop by a build that kept no rows.

use redb::ReadableTable;

use crate::error::Error;

/// Bytes of a head: count, first key's hash, last key's hash (`u64` little-endian each).
pub(crate) const HEAD_LEN: usize = 24;

/// A table as a row describes it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct TableHead {
    /// Records in the table.
    pub(crate) count: u64,
    /// Index hashes of its first and last keys (in key order); 0 for an empty table.
    pub(crate) first: u64,
    pub(crate) last: u64,
}

impl TableHead {
    /// Whether `table` still holds the keys the row was made from: its length, first and last
    /// keys, hashed by `hash` (the key index's), are unchanged. Reads two paths of the B-tree.
    pub(crate) fn holds_for(
        &self,
        table: &impl ReadableTable<&'static [u8], &'static [u8]>,
        hash: impl Fn(&[u8]) -> u64,
    ) -> Result<bool, Error> {
        if table.len()? != self.count {
            return Ok(false);
        }
        let first = table.first()?.map_or(0, |(k, _)| hash(k.value()));
        let last = table.last()?.map_or(0, |(k, _)| hash(k.value()));
        Ok(first == self.first && last == self.last)
    }

    pub(crate) fn encode_into(&self, out: &mut Vec<u8>) {
        for n in [self.count, self.first, self.last] {
            out.extend_from_slice(&n.to_le_bytes());
        }
    }

    /// The head at the start of `bytes` (at least [`HEAD_LEN`] long: the caller checked).
    pub(crate) fn decode(bytes: &[u8]) -> TableHead {
        TableHead {
            count: le_u64(bytes, 0),
            first: le_u64(bytes, 8),
            last: le_u64(bytes, 16),
        }
    }
}

/// The `u64` little-endian at `at` in `bytes` (at least `at + 8` long: the caller checked).
pub(crate) fn le_u64(bytes: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(w)
}
