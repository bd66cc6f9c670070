//! Recognised keys on disk, found by their hash, so that recognition costs no memory per key.
//!
//! Table `idemdb_recognised_keys`: a key's 64-bit index hash → `until` (ms), the latest of
//! the recognition rows (horizon.rs) that hold the hash. A fresh acquisition asks it once (a
//! B-tree lookup in the writer's snapshot). A row's hashes are entered after the commit that
//! wrote the row, in steps of [`INDEX_STEP`] (a drop of a wide partition holds millions):
//! until its last step commits, the row is named in `idemdb_recognised_unindexed` and its
//! hashes are held in memory (horizon.rs `Horizon::pending`), so that no commit in between
//! forgets them. A row's hashes leave the table when it is retired, each only if no later
//! row raised its `until` past the retiring pass's `now`.

use redb::{ReadableTable, Table, TableDefinition, TableError, WriteTransaction};

use crate::error::Error;

/// Recognised key hash → `until` (ms).
pub(crate) const RECOGNISED_KEYS: TableDefinition<u64, u64> =
    TableDefinition::new("idemdb_recognised_keys");
/// The keys of recognition rows whose hashes are not all in [`RECOGNISED_KEYS`] yet.
pub(crate) const UNINDEXED: TableDefinition<&[u8], ()> =
    TableDefinition::new("idemdb_recognised_unindexed");

/// Hashes entered or removed per durable commit: one commit holds the writer for this many
/// B-tree updates of random leaves (about 100 ms at 30 million keys held, 4 KiB of
/// pages written per key at most: docs/benchmarks.md §6).
pub(crate) const INDEX_STEP: usize = 4_096;

/// Enters `hashes` as recognised until `until`, keeping a later `until` already stored.
pub(crate) fn index(
    table: &mut Table<'_, u64, u64>,
    hashes: &[u64],
    until: u64,
) -> Result<(), Error> {
    for &hash in hashes {
        // One descent for the common case (a new hash); a later `until` is put back.
        let earlier = table.insert(hash, until)?.map(|v| v.value());
        if let Some(later) = earlier.filter(|&stored| stored > until) {
            table.insert(hash, later)?;
        }
    }
    Ok(())
}

/// Removes those of `hashes` whose stored `until` has passed at `now` (a later row keeps
/// the others). Returns how many it removed.
pub(crate) fn unindex(
    table: &mut Table<'_, u64, u64>,
    hashes: &[u64],
    now: u64,
) -> Result<u64, Error> {
    let mut removed = 0;
    for &hash in hashes {
        let passed = table.get(hash)?.is_some_and(|v| v.value() <= now);
        if passed {
            table.remove(hash)?;
            removed += 1;
        }
    }
    Ok(removed)
}

/// The `until` stored for `hash`, if any.
pub(crate) fn until_of(
    table: &impl ReadableTable<u64, u64>,
    hash: u64,
) -> Result<Option<u64>, Error> {
    Ok(table.get(hash)?.map(|v| v.value()))
}

/// Names the row `row_key` as not yet entered in [`RECOGNISED_KEYS`].
pub(crate) fn mark_unindexed(txn: &WriteTransaction, row_key: &[u8]) -> Result<(), Error> {
    txn.open_table(UNINDEXED)?.insert(row_key, ())?;
    Ok(())
}

/// Forgets that `row_key` is not entered (its last step, or its retirement).
pub(crate) fn mark_indexed(txn: &WriteTransaction, row_key: &[u8]) -> Result<(), Error> {
    txn.open_table(UNINDEXED)?.remove(row_key)?;
    Ok(())
}

/// The row keys named in [`UNINDEXED`]; `None` if the file has no [`RECOGNISED_KEYS`]
/// table (written by a build that kept every row in memory: all of its rows are unindexed
/// until the format upgrade names them).
pub(crate) fn unindexed_rows(txn: &redb::ReadTransaction) -> Result<Option<Vec<Vec<u8>>>, Error> {
    match txn.open_table(RECOGNISED_KEYS) {
        Ok(_) => {}
        Err(TableError::TableDoesNotExist(_)) => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let marks = match txn.open_table(UNINDEXED) {
        Ok(marks) => marks,
        Err(TableError::TableDoesNotExist(_)) => return Ok(Some(Vec::new())),
        Err(e) => return Err(e.into()),
    };
    let mut rows = Vec::new();
    for mark in marks.iter()? {
        rows.push(mark?.0.value().to_vec());
    }
    Ok(Some(rows))
}

#[cfg(test)]
mod tests {
    use super::*;
    use redb::ReadableDatabase;

    fn db() -> (tempfile::TempDir, redb::Database) {
        let dir = tempfile::tempdir().unwrap();
        let db = redb::Database::create(dir.path().join("db")).unwrap();
        (dir, db)
    }

    #[test]
    fn a_later_until_is_kept_and_only_passed_hashes_leave() {
        let (_dir, db) = db();
        let txn = db.begin_write().unwrap();
        {
            let mut t = txn.open_table(RECOGNISED_KEYS).unwrap();
            index(&mut t, &[1, 2, 3], 100).unwrap();
            // A later row raises 2; an earlier one lowers nothing.
            index(&mut t, &[2], 300).unwrap();
            index(&mut t, &[3], 50).unwrap();
            assert_eq!(until_of(&t, 2).unwrap(), Some(300));
            assert_eq!(until_of(&t, 3).unwrap(), Some(100));
            // Retiring the first row at 100: 1 and 3 leave, 2 is held by the later row.
            assert_eq!(unindex(&mut t, &[1, 2, 3], 100).unwrap(), 2);
            assert_eq!(until_of(&t, 1).unwrap(), None);
            assert_eq!(until_of(&t, 2).unwrap(), Some(300));
            assert_eq!(unindex(&mut t, &[2], 299).unwrap(), 0);
        }
        txn.commit().unwrap();
    }

    #[test]
    fn unindexed_rows_are_listed_and_a_file_without_the_table_has_none_indexed() {
        let (_dir, db) = db();
        assert_eq!(unindexed_rows(&db.begin_read().unwrap()).unwrap(), None);
        let txn = db.begin_write().unwrap();
        txn.open_table(RECOGNISED_KEYS).unwrap();
        mark_unindexed(&txn, b"b").unwrap();
        mark_unindexed(&txn, b"a").unwrap();
        txn.commit().unwrap();
        let rows = unindexed_rows(&db.begin_read().unwrap()).unwrap();
        assert_eq!(rows, Some(vec![b"a".to_vec(), b"b".to_vec()]));
        let txn = db.begin_write().unwrap();
        mark_indexed(&txn, b"a").unwrap();
        txn.commit().unwrap();
        let rows = unindexed_rows(&db.begin_read().unwrap()).unwrap();
        assert_eq!(rows, Some(vec![b"b".to_vec()]));
    }
}
