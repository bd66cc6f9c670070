//! Moves record writes from the overlay (durable in the log) into redb: inside every
//! checkpoint and exclusive step, and in `Durability::None` commits of their own (`settle`)
//! before a reader that reads redb directly, so that it sees them.

use std::collections::HashMap;
use std::collections::hash_map::Entry;

use redb::{Durability, TableDefinition, WriteTransaction};

use super::group_commit::Writer;
use crate::error::Error;
use crate::records::overlay::{Taken, Written};

type RecordTable<'t> = redb::Table<'t, &'static [u8], &'static [u8]>;

impl Writer {
    /// Writes every overlay entry, then `batch`'s records (newer), into `txn`. Returns the
    /// entries taken, to forget once a snapshot that holds them is installed. The caller holds
    /// the apply lock, so that no other pass writes an older value after a newer one.
    pub(super) fn write_overlay(
        &self,
        txn: &WriteTransaction,
        batch: Option<&Written>,
    ) -> Result<Vec<Taken>, Error> {
        let taken = self.engine.snapshots.overlay.take_all();
        let mut tables: HashMap<&str, RecordTable<'_>> = HashMap::new();
        let entries = taken
            .iter()
            .map(|t| (&*t.key, &t.slot))
            .chain(batch.into_iter().flat_map(Written::iter));
        for (key, slot) in entries {
            let table = match tables.entry(&slot.table) {
                Entry::Occupied(e) => e.into_mut(),
                Entry::Vacant(e) => e.insert(txn.open_table(TableDefinition::new(&slot.table))?),
            };
            match &slot.value {
                Some(v) => table.insert(key, &**v)?,
                None => table.remove(key)?,
            };
        }
        Ok(taken)
    }

    /// Forgets the entries in `taken` that no newer batch replaced: a snapshot holding them
    /// is installed.
    pub(super) fn forget_written(&self, taken: &[Taken]) {
        let index = &self.engine.layout.index;
        self.engine
            .snapshots
            .overlay
            .forget_applied(taken, |k| index.hash(k));
    }

    /// Writes the overlay into redb with a `Durability::None` commit (its entries are durable
    /// in the log already) and installs the snapshot: readers of redb itself (`begin_read`,
    /// `scan`, `verify`, `stats`, the compactor's reads) then see every acknowledged record.
    /// A failed commit poisons the engine, as a batch's would; the overlay keeps the entries.
    /// Not from inside a closure (its thread holds redb's write lock): there it does nothing.
    pub(crate) fn settle(&self) -> Result<(), Error> {
        let engine = &*self.engine;
        // A closure's thread holds redb's write lock: waiting for it would wait for itself.
        if engine.snapshots.overlay.len() == 0
            || engine.is_poisoned()
            || crate::reentry::committing()
        {
            return Ok(());
        }
        let _applying = self.apply_lock.lock();
        // On a caller's thread too (`stats`, `begin_read`): a panic on a damaged page poisons
        // the engine, as a failure does.
        let done = crate::contain::contained("the records written into redb", || {
            let mut txn = engine.db.begin_write()?;
            txn.set_durability(Durability::None)?;
            let taken = self.write_overlay(&txn, None)?;
            txn.commit()?;
            Ok::<_, Error>(taken)
        });
        match done {
            Ok(taken) => {
                engine.snapshots.refresh();
                self.forget_written(&taken);
                Ok(())
            }
            Err(e) => {
                engine.poison();
                Err(e)
            }
        }
    }
}
