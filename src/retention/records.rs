//! The record store of one write transaction: finds a key's live record (and whether an
//! expired copy exists) and stores a record where its state belongs, with its expiry. Shared
//! by the writer and the format upgrade; the snapshots find through the same lookup
//! (locate.rs).

use std::collections::HashMap;
use std::collections::hash_map::Entry;

use redb::{ReadableTable, Table, TableHandle, WriteTransaction};

use crate::engine_tables::INFLIGHT;
use crate::error::Error;
use crate::record::{Record, RecordState};
use crate::retention::horizon::tag;
use crate::retention::locate::{
    Found, Layout, Lookup, PartitionReader, Partitioned, Probe, find, get_in,
};
use crate::retention::partition::{Partition, PartitionId, PartitionName};
use crate::scope::RecordKey;
use crate::wal::Effect;

type Table2<'t> = Table<'t, &'static [u8], &'static [u8]>;

/// The record tables of one write transaction: the in-flight table, and the partitions it
/// opened so far (opening a table costs several µs, once per transaction).
///
/// Invariant: a key has at most one live record, in the in-flight table or in a partition.
pub(crate) struct Records<'t> {
    inflight: Table2<'t>,
    parts: OpenParts<'t>,
    pub(crate) layout: &'t Layout,
    created: Created,
    /// Every write, as post-images for the log (wal/).
    effects: Vec<Effect>,
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
    pub(crate) fn open(txn: &'t WriteTransaction, layout: &'t Layout) -> Result<Self, Error> {
        Ok(Records {
            inflight: txn.open_table(INFLIGHT)?,
            parts: OpenParts {
                txn,
                open: HashMap::new(),
            },
            layout,
            created: Created::default(),
            effects: Vec::new(),
        })
    }

    /// The partitions this transaction added to the catalog, and how many of them were
    /// created behind a newer one: the first must be forgotten unless it commits. And every
    /// write it made, in order, as post-images.
    pub(crate) fn finish(self) -> (Created, Vec<Effect>) {
        (self.created, self.effects)
    }

    pub(crate) fn find(&mut self, key: &RecordKey, hash: u64, now: u64) -> Result<Found, Error> {
        let catalog = self.layout.partitions.catalog();
        let parts = Partitioned {
            catalog: &catalog,
            index: &self.layout.index,
            reader: &mut self.parts,
        };
        find(
            &self.inflight,
            parts,
            &Lookup { key, hash, now },
            Probe::All,
        )
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
        let value = crate::record::encode(rec);
        if rec.state == RecordState::InProgress {
            self.inflight.insert(key.as_bytes(), value.as_slice())?;
            self.effects.push(Effect::Put {
                table: INFLIGHT.name().to_string(),
                key: key.as_bytes().to_vec(),
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
            if self.inflight.remove(key.as_bytes())?.is_some() {
                self.effects.push(Effect::Remove {
                    table: INFLIGHT.name().to_string(),
                    key: key.as_bytes().to_vec(),
                });
            }
            self.parts
                .table(&part)?
                .insert(key.as_bytes(), value.as_slice())?;
            self.effects.push(Effect::Put {
                table: part.table.clone(),
                key: key.as_bytes().to_vec(),
                value,
            });
        }
        Ok(())
    }

    /// Whether a key about to be acquired as new is a duplicate older than its retention: a
    /// copy of it expired, or it was dropped and is still recognised.
    pub(crate) fn beyond_horizon(&self, expired_copy: bool, hash: u64, now: u64) -> bool {
        expired_copy
            || (self.layout.rules.recognition() && self.layout.horizon.recognises(tag(hash), now))
    }

    /// Every IN_PROGRESS record, for the format upgrade.
    pub(crate) fn in_flight(&self) -> Result<Vec<(RecordKey, Record)>, Error> {
        let mut out = Vec::new();
        for entry in self.inflight.iter()? {
            let (k, v) = entry?;
            out.push((
                RecordKey::from_stored(k.value()),
                crate::record::decode(v.value())?,
            ));
        }
        Ok(out)
    }

    /// Removes an IN_PROGRESS record (release).
    pub(crate) fn remove(&mut self, key: &RecordKey) -> Result<(), Error> {
        self.inflight.remove(key.as_bytes())?;
        self.effects.push(Effect::Remove {
            table: INFLIGHT.name().to_string(),
            key: key.as_bytes().to_vec(),
        });
        Ok(())
    }
}
