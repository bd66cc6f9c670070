//! The record store of one write transaction: finds a key's live record (and whether an
//! expired copy exists) and stores a record where its state belongs, with its expiry. Shared
//! by the writer and the format upgrade; the snapshots find through the same lookup
//! (locate.rs).

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::Arc;

use redb::{ReadableTable, Table, TableHandle, WriteTransaction};

use crate::engine_tables::INFLIGHT;
use crate::error::Error;
use crate::record::{Record, RecordState};
use crate::records::locate::{
    Found, Layout, Lookup, PartitionReader, Partitioned, Probe, find, get_in, inflight_in,
};
use crate::records::overlay::{Slot, Written};
use crate::records::partition::{Partition, PartitionId, PartitionName};
use crate::records::recognised::{self, RECOGNISED_KEYS};
use crate::records::snapshot::Snapshots;
use crate::wal::Effect;
use idemdb_core::scope::RecordKey;

type Table2<'t> = Table<'t, &'static [u8], &'static [u8]>;

/// The record tables as one transaction of the writer (or the format upgrade) reads and writes
/// them.
///
/// Invariant: a key has at most one live record, in the in-flight table or in a partition.
pub(crate) struct Records<'t> {
    base: Base<'t>,
    pub(crate) layout: &'t Layout,
    /// The in-flight table's name, shared by the slots that name it.
    inflight_name: Arc<str>,
    created: Created,
    /// Every write, as post-images for the log (wal/).
    effects: Vec<Effect>,
}

enum Base<'t> {
    /// Writes go into a write transaction's tables (the format upgrade).
    Txn {
        inflight: Table2<'t>,
        parts: OpenParts<'t>,
    },
    /// The writer: reads the snapshot under the overlay and the batch's earlier writes, and
    /// writes only into `mine` and the effects. The log makes them durable; the applier writes
    /// them into redb later (overlay.rs).
    Deferred {
        snapshots: &'t Snapshots,
        earlier: &'t Written,
        mine: Written,
    },
}

/// What a finished transaction of the record store leaves.
pub(crate) struct Finished {
    /// The partitions it added to the catalog: forgotten unless it commits.
    pub(crate) created: Created,
    /// Every write, in order, as post-images.
    pub(crate) effects: Vec<Effect>,
    /// Its writes, newest per (table, key); empty for a transaction's store.
    pub(crate) written: Written,
}

/// The partitions a write transaction added to the catalog: forgotten unless it commits.
#[derive(Default)]
pub(crate) struct Created {
    pub(crate) ids: Vec<PartitionId>,
    /// Of those, how many were created behind a newer partition of their class (the clock
    /// is behind).
    pub(crate) behind_newest: u64,
}

/// The partitions a write transaction opened so far.
struct OpenParts<'t> {
    txn: &'t WriteTransaction,
    open: HashMap<PartitionId, Table2<'t>>,
}

impl<'t> OpenParts<'t> {
    fn table(&mut self, part: &Partition) -> Result<&mut Table2<'t>, Error> {
        Ok(match self.open.entry(part.id) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => e.insert(self.txn.open_table(part.table())?),
        })
    }
}

impl PartitionReader for OpenParts<'_> {
    fn get(&mut self, part: &Partition, key: &RecordKey) -> Result<Option<Record>, Error> {
        get_in(self.table(part)?, key)
    }
}

impl<'t> Records<'t> {
    /// The record tables of `txn`, written into directly.
    pub(crate) fn open(txn: &'t WriteTransaction, layout: &'t Layout) -> Result<Self, Error> {
        Ok(Records::with(
            Base::Txn {
                inflight: txn.open_table(INFLIGHT)?,
                parts: OpenParts {
                    txn,
                    open: HashMap::new(),
                },
            },
            layout,
        ))
    }

    /// The writer's record store: the overlay and `earlier` (the batch's committed
    /// transactions) over the snapshot, written into memory only.
    pub(crate) fn deferred(
        snapshots: &'t Snapshots,
        layout: &'t Layout,
        earlier: &'t Written,
    ) -> Self {
        Records::with(
            Base::Deferred {
                snapshots,
                earlier,
                mine: Written::default(),
            },
            layout,
        )
    }

    fn with(base: Base<'t>, layout: &'t Layout) -> Self {
        Records {
            base,
            layout,
            inflight_name: Arc::from(INFLIGHT.name()),
            created: Created::default(),
            effects: Vec::new(),
        }
    }

    pub(crate) fn finish(self) -> Finished {
        Finished {
            created: self.created,
            effects: self.effects,
            written: match self.base {
                Base::Deferred { mine, .. } => mine,
                Base::Txn { .. } => Written::default(),
            },
        }
    }

    /// The overlay's values for `key`, then the batch's, then this transaction's: the newest
    /// last.
    fn slots(
        snapshots: &Snapshots,
        earlier: &Written,
        mine: &Written,
        key: &[u8],
        hash: u64,
    ) -> Vec<Slot> {
        let mut slots = snapshots.overlay.lookup(key, hash);
        slots.extend_from_slice(earlier.get(key));
        slots.extend_from_slice(mine.get(key));
        slots
    }

    pub(crate) fn find(&mut self, key: &RecordKey, hash: u64, now: u64) -> Result<Found, Error> {
        let at = Lookup { key, hash, now };
        match &mut self.base {
            Base::Txn { inflight, parts } => {
                let catalog = self.layout.partitions.catalog();
                let parts = Partitioned {
                    catalog: &catalog,
                    index: &self.layout.index,
                    reader: parts,
                };
                find(|| inflight_in(&*inflight, key), parts, &at, Probe::All)
            }
            Base::Deferred {
                snapshots,
                earlier,
                mine,
            } => {
                let slots = Self::slots(snapshots, earlier, mine, key.as_bytes(), hash);
                snapshots.find_under(&at, &slots)
            }
        }
    }

    /// Writes `value` to the in-flight table. What it held before is not asked: a reserve
    /// never needs it, and the lookup would be a second one per op on the writer's path.
    fn put_inflight(&mut self, bytes: &Arc<[u8]>, value: &Arc<[u8]>) -> Result<(), Error> {
        match &mut self.base {
            Base::Txn { inflight, .. } => {
                inflight.insert(&**bytes, &**value)?;
            }
            Base::Deferred { mine, .. } => {
                mine.set(bytes, &self.inflight_name, Some(Arc::clone(value)));
            }
        }
        Ok(())
    }

    /// Removes `key` (its bytes `bytes`) from the in-flight table. Says whether it held a
    /// record.
    fn remove_inflight(
        &mut self,
        key: &RecordKey,
        bytes: &Arc<[u8]>,
        hash: u64,
    ) -> Result<bool, Error> {
        match &mut self.base {
            Base::Txn { inflight, .. } => Ok(inflight.remove(&**bytes)?.is_some()),
            Base::Deferred {
                snapshots,
                earlier,
                mine,
            } => {
                let slots = Self::slots(snapshots, earlier, mine, bytes, hash);
                let held = snapshots.in_flight_under(key, &slots)?;
                mine.set(bytes, &self.inflight_name, None);
                Ok(held)
            }
        }
    }

    fn write_partition(
        &mut self,
        part: &Partition,
        bytes: &Arc<[u8]>,
        value: &Arc<[u8]>,
    ) -> Result<(), Error> {
        match &mut self.base {
            Base::Txn { parts, .. } => {
                parts.table(part)?.insert(&**bytes, &**value)?;
            }
            Base::Deferred { mine, .. } => {
                mine.set(bytes, &part.table, Some(Arc::clone(value)));
            }
        }
        Ok(())
    }

    /// Writes `rec` where its state belongs, setting its expiry: an IN_PROGRESS record to the
    /// in-flight table, a finished one to the current partition of its TTL (and out of the
    /// in-flight table). A live finished record is never rewritten (an expired copy may be,
    /// when the key's next record lands in the same partition).
    pub(crate) fn store(
        &mut self,
        key: &RecordKey,
        hash: u64,
        rec: &mut Record,
    ) -> Result<(), Error> {
        let rules = &self.layout.rules;
        let ttl = rules.ttl_ms(key);
        rec.expires_at = rules.expires_at(rec, ttl);
        // One copy each of the key and the encoded record, shared by the overlay's entries
        // and the log's effects.
        let bytes: Arc<[u8]> = Arc::from(key.as_bytes());
        let value: Arc<[u8]> = Arc::from(rec.encode(key.as_bytes()));
        if rec.state == RecordState::InProgress {
            self.put_inflight(&bytes, &value)?;
            self.effects.push(Effect::Put {
                table: Arc::clone(&self.inflight_name),
                key: bytes,
                value,
            });
        } else {
            let placed =
                self.layout
                    .partitions
                    .place(PartitionName::of_record(rules, rec.updated_at, ttl));
            let part = placed.partition;
            if placed.created {
                self.created.ids.push(part.id);
                if placed.behind_newest {
                    self.created.behind_newest += 1;
                    crate::observe::clock_behind(&part.table);
                }
            }
            // Before the write: the index must never miss a stored record.
            self.layout.index.insert(hash, part.id);
            if self.remove_inflight(key, &bytes, hash)? {
                self.effects.push(Effect::Remove {
                    table: Arc::clone(&self.inflight_name),
                    key: Arc::clone(&bytes),
                });
            }
            self.write_partition(&part, &bytes, &value)?;
            self.effects.push(Effect::Put {
                table: Arc::clone(&part.table),
                key: bytes,
                value,
            });
        }
        Ok(())
    }

    /// Whether a key about to be acquired as new is a duplicate older than its retention: a
    /// copy of it expired, or it was dropped and is still recognised.
    pub(crate) fn beyond_horizon(
        &self,
        expired_copy: bool,
        hash: u64,
        now: u64,
    ) -> Result<bool, Error> {
        if expired_copy {
            return Ok(true);
        }
        if !self.layout.rules.recognition() {
            return Ok(false);
        }
        if self.layout.horizon.recognises(hash, now) {
            return Ok(true);
        }
        let until = match &self.base {
            Base::Txn { parts, .. } => match parts.txn.open_table(RECOGNISED_KEYS) {
                Ok(table) => recognised::until_of(&table, hash)?,
                Err(e) => return Err(e.into()),
            },
            Base::Deferred { snapshots, .. } => snapshots.recognised_until(hash)?,
        };
        Ok(until.is_some_and(|until| now < until))
    }

    /// Every IN_PROGRESS record, for the format upgrade (a transaction's store only).
    pub(crate) fn in_flight(&self) -> Result<Vec<(RecordKey, Record)>, Error> {
        let Base::Txn { inflight, .. } = &self.base else {
            return Err(Error::Internal(
                "in_flight() of the writer's record store".into(),
            ));
        };
        let mut out = Vec::new();
        for entry in inflight.iter()? {
            let (k, v) = entry?;
            out.push((
                RecordKey::from_stored(k.value()),
                crate::record::decode_any_version(k.value(), v.value())?,
            ));
        }
        Ok(out)
    }

    /// Removes an IN_PROGRESS record (release).
    pub(crate) fn remove(&mut self, key: &RecordKey, hash: u64) -> Result<(), Error> {
        let bytes: Arc<[u8]> = Arc::from(key.as_bytes());
        self.remove_inflight(key, &bytes, hash)?;
        self.effects.push(Effect::Remove {
            table: Arc::clone(&self.inflight_name),
            key: bytes,
        });
        Ok(())
    }
}
