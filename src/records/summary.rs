//! What a partition holds, kept beside it once its window closed: its record count, the hashes
//! of its first and last keys, and its keys' index hashes (sorted, distinct). An open builds
//! the key index from these rows instead of reading every key of every partition, and a drop
//! takes the horizon tags from them instead of reading the partition's pages.
//!
//! A row only speeds up what reading the partition would do, so it is used only while it
//! still describes the table (head.rs: the same length and the same first and last keys). A
//! row that no longer holds is ignored: the table is read, as without it.

use redb::{ReadableTable, TableDefinition, TableHandle, WriteTransaction};

use crate::error::Error;
use crate::records::head::{HEAD_LEN, TableHead, le_u64};
use crate::records::key_index::KeyIndex;

/// Partition table name → [`Summary::encode`].
pub(crate) const SUMMARIES: TableDefinition<&str, &[u8]> = TableDefinition::new("idemdb_keys");

/// Bytes before the hashes.
const HEAD: usize = HEAD_LEN;

/// A partition's keys as of one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Summary {
    /// The table summarised.
    pub(crate) head: TableHead,
    /// Its keys' index hashes, sorted and distinct.
    pub(crate) hashes: Vec<u64>,
}

impl Summary {
    /// The summary of a table of `count` records whose first and last keys (in key order) hash
    /// to `first` and `last`, and whose keys hash to `hashes` (sorted, distinct).
    pub(crate) fn new(head: TableHead, hashes: Vec<u64>) -> Summary {
        Summary { head, hashes }
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
        let count = table.len()?;
        Ok(Summary {
            head: TableHead { count, first, last },
            hashes,
        })
    }

    /// Whether `table` still holds the keys summarised (head.rs). Reads two paths of the
    /// B-tree.
    pub(crate) fn holds_for(
        &self,
        table: &impl ReadableTable<&'static [u8], &'static [u8]>,
        index: &KeyIndex,
    ) -> Result<bool, Error> {
        self.head.holds_for(table, |k| index.hash(k))
    }

    /// `count`, `first`, `last`, then each hash: `u64` little-endian.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEAD + 8 * self.hashes.len());
        self.head.encode_into(&mut out);
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
        let hashes: Vec<u64> = (HEAD..bytes.len())
            .step_by(8)
            .map(|at| le_u64(bytes, at))
            .collect();
        if hashes.windows(2).any(|w| w[0] >= w[1]) {
            return Err(bad("hashes not sorted and distinct"));
        }
        let head = TableHead::decode(bytes);
        if hashes.len() as u64 > head.count {
            return Err(bad("more hashes than records"));
        }
        Ok(Summary { head, hashes })
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
            head: TableHead {
                count: 5,
                first: 9,
                last: 3,
            },
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
