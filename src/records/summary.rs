//! What a partition holds, kept beside it once its window closed: its record count, the hashes
//! of its first and last keys, and its keys' index hashes (sorted, distinct). An open builds
//! the key index from these rows instead of reading every key of every partition, and a drop
//! takes the horizon tags from them instead of reading the partition's pages.
//!
//! A row only speeds up what reading the partition would do, so it is used only while it
//! still describes the table: the same length and the same first and last keys. Records leave
//! a partition only when it is dropped whole, and a key already there can only be written
//! again, so a table of unchanged length holds the keys it held (a record placed in it later,
//! by a clock gone back, changes its length). The first and last keys tell apart a table of
//! the same name and length made again after a drop by a build that kept no rows. A row that
//! no longer holds is ignored: the table is read, as without it.

use redb::{ReadableTable, TableDefinition, TableHandle, WriteTransaction};

use crate::error::Error;
use crate::records::key_index::KeyIndex;

/// Partition table name → [`Summary::encode`].
pub(crate) const SUMMARIES: TableDefinition<&str, &[u8]> = TableDefinition::new("idemdb_keys");

/// Bytes before the hashes: count, first key's hash, last key's hash.
const HEAD: usize = 24;

/// A partition's keys as of one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Summary {
    /// Records in the table.
    pub(crate) count: u64,
    /// Index hashes of its first and last keys (in key order); 0 for an empty table.
    first: u64,
    last: u64,
    /// Its keys' index hashes, sorted and distinct.
    pub(crate) hashes: Vec<u64>,
}

impl Summary {
    /// The summary of a table of `count` records whose first and last keys (in key order) hash
    /// to `first` and `last`, and whose keys hash to `hashes` (sorted, distinct).
    pub(crate) fn new(count: u64, first: u64, last: u64, hashes: Vec<u64>) -> Summary {
        Summary {
            count,
            first,
            last,
            hashes,
        }
    }

    /// Reads every key of `table`.
    pub(crate) fn of_table(
        table: &impl ReadableTable<&'static [u8], &'static [u8]>,
        index: &KeyIndex,
    ) -> Result<Summary, Error> {
        let mut hashes = Vec::with_capacity(usize::try_from(table.len()?).unwrap_or(0));
        for entry in table.iter()? {
            hashes.push(index.hash(entry?.0.value()));
        }
        let (first, last) = match (hashes.first(), hashes.last()) {
            (Some(&f), Some(&l)) => (f, l),
            _ => (0, 0),
        };
        hashes.sort_unstable();
        hashes.dedup();
        Ok(Summary {
            count: table.len()?,
            first,
            last,
            hashes,
        })
    }

    /// Whether `table` still holds the keys summarised: its length, first and last keys are
    /// unchanged (see the module's comment). Reads two paths of the B-tree.
    pub(crate) fn holds_for(
        &self,
        table: &impl ReadableTable<&'static [u8], &'static [u8]>,
        index: &KeyIndex,
    ) -> Result<bool, Error> {
        if table.len()? != self.count {
            return Ok(false);
        }
        let first = table.first()?.map_or(0, |(k, _)| index.hash(k.value()));
        let last = table.last()?.map_or(0, |(k, _)| index.hash(k.value()));
        Ok(first == self.first && last == self.last)
    }

    /// `count`, `first`, `last`, then each hash: `u64` little-endian.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEAD + 8 * self.hashes.len());
        for n in [self.count, self.first, self.last] {
            out.extend_from_slice(&n.to_le_bytes());
        }
        for h in &self.hashes {
            out.extend_from_slice(&h.to_le_bytes());
        }
        out
    }

    /// The row of `table`; `Corrupted` naming it if its length is not a head and whole
    /// hashes, or its hashes are not sorted and distinct or outnumber its records.
    pub(crate) fn decode(bytes: &[u8], table: &str) -> Result<Summary, Error> {
        let bad = |why: &str| {
            Error::Corrupted(format!("{}: the row of {table}: {why}", SUMMARIES.name()))
        };
        if bytes.len() < HEAD || !(bytes.len() - HEAD).is_multiple_of(8) {
            return Err(bad(&format!(
                "{} bytes are not a head and whole hashes",
                bytes.len()
            )));
        }
        let word = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&bytes[i..i + 8]);
            u64::from_le_bytes(w)
        };
        let hashes: Vec<u64> = (HEAD..bytes.len()).step_by(8).map(word).collect();
        if hashes.windows(2).any(|w| w[0] >= w[1]) {
            return Err(bad("hashes not sorted and distinct"));
        }
        let count = word(0);
        if hashes.len() as u64 > count {
            return Err(bad("more hashes than records"));
        }
        Ok(Summary {
            count,
            first: word(8),
            last: word(16),
            hashes,
        })
    }
}

/// The row of partition table `table`, if there is one.
pub(crate) fn read(
    rows: &impl ReadableTable<&'static str, &'static [u8]>,
    table: &str,
) -> Result<Option<Summary>, Error> {
    match rows.get(table)? {
        Some(v) => Ok(Some(Summary::decode(v.value(), table)?)),
        None => Ok(None),
    }
}

/// Writes the row of partition table `table`.
pub(crate) fn write(txn: &WriteTransaction, table: &str, summary: &Summary) -> Result<(), Error> {
    txn.open_table(SUMMARIES)?
        .insert(table, summary.encode().as_slice())?;
    Ok(())
}

/// Removes the row of partition table `table` (its table is dropped).
pub(crate) fn remove(txn: &WriteTransaction, table: &str) -> Result<(), Error> {
    txn.open_table(SUMMARIES)?.remove(table)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_decodes_to_what_was_encoded_and_damage_is_refused_naming_the_table() {
        let s = Summary {
            count: 5,
            first: 9,
            last: 3,
            hashes: vec![1, 3, 9, u64::MAX],
        };
        assert_eq!(Summary::decode(&s.encode(), "t").unwrap(), s);
        let bytes = s.encode();
        for (damaged, why) in [
            (bytes[..HEAD - 1].to_vec(), "are not a head"),
            (bytes[..bytes.len() - 1].to_vec(), "are not a head"),
            (
                [&bytes[..HEAD], &3u64.to_le_bytes(), &1u64.to_le_bytes()].concat(),
                "not sorted",
            ),
            (
                [&bytes[..HEAD], &1u64.to_le_bytes(), &1u64.to_le_bytes()].concat(),
                "not sorted",
            ),
            (
                [&0u64.to_le_bytes()[..], &bytes[8..]].concat(),
                "more hashes than records",
            ),
        ] {
            match Summary::decode(&damaged, "idemdb_p_x") {
                Err(Error::Corrupted(m)) => {
                    assert!(m.contains("idemdb_keys: the row of idemdb_p_x"), "{m}");
                    assert!(m.contains(why), "{m}");
                }
                other => panic!("{other:?}"),
            }
        }
    }
}
