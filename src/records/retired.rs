//! Retired tables. A partition that is dropped or merged into a wider one, and a build a crash
//! left, leave the catalog by a rename to `idemdb_x_{n:020}` in the commit that removes them:
//! one entry of redb's table of tables rewritten, whatever the table holds. Their pages are
//! freed later, in steps that each hold the writer for a bounded time (reclaim.rs): redb
//! deletes a table by visiting every page of it, under the write lock (1.2 s for the 360
//! narrow partitions of an hour of 2M records on the 2-vCPU VM).
//!
//! A retired name is not a partition's, so a retired table is never read as one: its records
//! are gone for every lookup from the commit that retired it.

use redb::{TableDefinition, TableHandle, WriteTransaction};

use crate::error::Error;

const PREFIX: &str = "idemdb_x_";

/// Whether `table` is a retired table.
pub(crate) fn is_retired_table(table: &str) -> bool {
    table.starts_with(PREFIX)
}

/// Retires tables within one write transaction, each under a name no table has: one above
/// every retired table's number, so that a partition retired, made again (a clock gone back)
/// and retired again before the first was reclaimed takes another name.
pub(crate) struct Retirer {
    next: u64,
}

impl Retirer {
    pub(crate) fn new(txn: &WriteTransaction) -> Result<Retirer, Error> {
        let next = txn
            .list_tables()?
            .filter_map(|t| t.name().strip_prefix(PREFIX)?.parse::<u64>().ok())
            .max()
            .map_or(0, |n| n.saturating_add(1));
        Ok(Retirer { next })
    }

    /// Renames `table` to a retired name; whether it existed.
    pub(crate) fn retire(&mut self, txn: &WriteTransaction, table: &str) -> Result<bool, Error> {
        let name = format!("{PREFIX}{:020}", self.next);
        match txn.rename_table(
            TableDefinition::<&[u8], &[u8]>::new(table),
            TableDefinition::<&[u8], &[u8]>::new(&name),
        ) {
            Ok(()) => {
                self.next = self.next.saturating_add(1);
                Ok(true)
            }
            Err(redb::TableError::TableDoesNotExist(_)) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }
}
