//! Reclaiming retired tables (records/retired.rs): the pages of partitions dropped or merged
//! into a wider one, and of builds a crash left, are freed in steps of at most
//! [`RECORDS_PER_STEP`] records, each one durable commit between the writer's batches, so that
//! no step holds the writer for longer than a drop or a build step does. A table of that many
//! records or fewer is deleted whole; a larger one loses its first records in key order, step
//! by step, until it is small enough. Run by a compaction pass after its drops and widening.
//!
//! Safety: a retired table is never read as a partition, so its records are already gone for
//! every lookup; a step left undone by a crash or a failed pass is done by a later pass.

use redb::{ReadableDatabase, ReadableTableMetadata, TableDefinition};

use crate::error::Error;
use crate::records::partition::partition_tables_with;
use crate::records::retired::is_retired_table;
use crate::writer::{Touches, Writer};

/// Records removed in one step at most: as many as a drop step holds.
pub(crate) const RECORDS_PER_STEP: u64 = 1 << 16;

/// Records removed in one pass at most (at least one step): the rest is left to the next
/// passes, so that a pass after a large drop does not hold the compaction lock for minutes.
const RECORDS_PER_PASS: u64 = 1 << 22;

/// Frees retired tables, oldest first, up to [`RECORDS_PER_PASS`] records; returns how many
/// tables are gone. Run by a compaction pass, which holds the compaction lock.
pub(crate) fn reclaim(writer: &Writer) -> Result<u64, Error> {
    let retired = {
        let read = writer.engine.db.begin_read()?;
        let mut names = partition_tables_with(&read, is_retired_table)?;
        names.sort_unstable();
        names
    };
    let (mut freed, mut records) = (0, 0);
    for name in retired {
        let table = TableDefinition::<&[u8], &[u8]>::new(&name);
        loop {
            if records >= RECORDS_PER_PASS {
                return Ok(freed);
            }
            let removed = writer.exclusive(
                Touches::RowsBeside,
                |txn| {
                    let mut open = match txn.open_table(table) {
                        Ok(open) => open,
                        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
                        Err(e) => return Err(e.into()),
                    };
                    let len = open.len()?;
                    if len <= RECORDS_PER_STEP {
                        drop(open);
                        txn.delete_table(table)?;
                        return Ok(Some((len, true)));
                    }
                    for _ in 0..RECORDS_PER_STEP {
                        open.pop_first()?;
                    }
                    Ok(Some((RECORDS_PER_STEP, false)))
                },
                |_| {},
            )?;
            match removed {
                Some((n, gone)) => {
                    records += n.max(1);
                    if gone {
                        freed += 1;
                        break;
                    }
                }
                None => break,
            }
        }
    }
    Ok(freed)
}
