//! The recognition steps of a compaction pass: entering the hashes of each row that memory
//! holds into the table of recognised keys (records/recognised.rs), and retiring the rows
//! whose horizon passed. Each runs in durable steps of at most [`INDEX_STEP`] hashes between
//! the writer's batches, so that a drop of millions of keys never holds the writer for long.
//!
//! Invariant: every hash of a row in force is recognised by memory or by the table at every
//! commit. Memory lets a row go only in the commit step that enters its last hashes, and a
//! retiring step removes a hash only if its stored `until` has passed.

use redb::{ReadableDatabase, ReadableTable};

use crate::error::Error;
use crate::records::horizon::{HORIZON, RECOGNISED, decode_hashes, row_until};
use crate::records::locate::named;
use crate::records::recognised::{INDEX_STEP, RECOGNISED_KEYS, index, mark_indexed, unindex};
use crate::writer::{Touches, Writer};

/// The steps of `hashes`: at most [`INDEX_STEP`] each, and one (empty) for none, whose
/// commit still does the last step's work.
fn steps(hashes: &[u64]) -> Vec<&[u64]> {
    if hashes.is_empty() {
        vec![hashes]
    } else {
        hashes.chunks(INDEX_STEP).collect()
    }
}

/// Enters the hashes of every row memory holds whose horizon has not passed at `now` (the
/// others are retired next).
pub(crate) fn index_pending(writer: &Writer, now: u64) -> Result<(), Error> {
    let horizon = &writer.engine.layout.horizon;
    for row in horizon.pending() {
        if row.until <= now {
            continue;
        }
        let steps = steps(&row.hashes);
        let last = steps.len() - 1;
        for (i, step) in steps.into_iter().enumerate() {
            writer.exclusive(
                Touches::RowsBeside,
                |txn| {
                    index(&mut txn.open_table(RECOGNISED_KEYS)?, step, row.until)?;
                    if i == last {
                        mark_indexed(txn, &row.key)?;
                    }
                    Ok(())
                },
                // Under the writer's lock, before the snapshot that holds the table is
                // installed: no batch runs in between.
                |_| {
                    if i == last {
                        horizon.remove_pending(&row);
                    }
                },
            )?;
            #[cfg(feature = "test-hooks")]
            if i < last
                && let Some(hook) = writer.engine.between_recognition_steps.lock().take()
            {
                hook();
            }
        }
    }
    Ok(())
}

/// Deletes the recognition rows whose horizon passed at `now`, and their hashes from the
/// table of recognised keys where no later row holds them. Returns how many rows it deleted.
pub(crate) fn retire_horizon(writer: &Writer, now: u64) -> Result<u64, Error> {
    let engine = &*writer.engine;
    let mut due = Vec::new();
    let mut due_tags = Vec::new();
    {
        let txn = engine.db.begin_read()?;
        for (table, keys) in [(RECOGNISED, &mut due), (HORIZON, &mut due_tags)] {
            let rows = match txn.open_table(table) {
                Ok(rows) => rows,
                Err(redb::TableError::TableDoesNotExist(_)) => continue,
                Err(e) => return Err(e.into()),
            };
            for row in rows.iter()? {
                let (k, _) = row?;
                if row_until(k.value())? > now {
                    break; // Rows are in `until` order.
                }
                keys.push(k.value().to_vec());
            }
        }
    }
    engine.layout.horizon.expire(now);
    for key in &due {
        let hashes: Vec<u64> = {
            let txn = engine.db.begin_read()?;
            match txn.open_table(RECOGNISED)?.get(key.as_slice())? {
                Some(v) => named(RECOGNISED, decode_hashes(v.value()))?.collect(),
                None => Vec::new(),
            }
        };
        let steps = steps(&hashes);
        let last = steps.len() - 1;
        for (i, step) in steps.into_iter().enumerate() {
            writer.exclusive(
                Touches::RowsBeside,
                |txn| {
                    unindex(&mut txn.open_table(RECOGNISED_KEYS)?, step, now)?;
                    if i == last {
                        txn.open_table(RECOGNISED)?.remove(key.as_slice())?;
                        mark_indexed(txn, key)?;
                    }
                    Ok(())
                },
                |_| {
                    if i == last {
                        engine.layout.horizon.remove_pending_key(key);
                    }
                },
            )?;
        }
    }
    if !due_tags.is_empty() {
        writer.exclusive(
            Touches::RowsBeside,
            |txn| {
                let mut table = txn.open_table(HORIZON)?;
                for key in &due_tags {
                    table.remove(key.as_slice())?;
                }
                Ok(())
            },
            |_| {},
        )?;
    }
    Ok((due.len() + due_tags.len()) as u64)
}
