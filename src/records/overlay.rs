//! Record writes that are durable in the log and not yet applied to redb: the newest
//! post-image of each (record table, key), kept in memory until the applier writes it into
//! redb and the snapshot shows it (docs/design.md §5.7).
//!
//! Invariants:
//! - An entry is installed only after the frame that holds it is durable (its `fdatasync`
//!   returned), so nothing here is ever taken back by a crash.
//! - An entry is removed only after a redb commit holding its value is visible in the installed
//!   snapshot, and only if no newer value replaced it meanwhile (its version is unchanged).
//!   So a reader that looks here first and at the snapshot after finds the newest value.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::RwLock;

const SHARDS: usize = 64;

/// What a record table holds under a key: a value, or nothing (removed).
pub(crate) type Value = Option<Arc<[u8]>>;

/// The newest value of one record table under one key.
#[derive(Clone, Debug)]
pub(crate) struct Slot {
    pub(crate) table: Arc<str>,
    pub(crate) value: Value,
    /// The batch that wrote it: a removal after an apply checks it is still this one.
    version: u64,
}

impl Slot {
    /// A batch's own write, before it has a version.
    pub(crate) fn new(table: &Arc<str>, value: Value) -> Slot {
        Slot {
            table: Arc::clone(table),
            value,
            version: 0,
        }
    }
}

/// The record writes of one transaction or batch, newest per (table, key): read by the ops
/// after them in the batch, installed in the overlay once the batch is durable. A key is one
/// allocation, shared with the log's effects and then the overlay's entry.
#[derive(Default)]
pub(crate) struct Written(HashMap<Arc<[u8]>, Vec<Slot>>);

impl Written {
    pub(crate) fn set(&mut self, key: &Arc<[u8]>, table: &Arc<str>, value: Value) {
        let slots = self.0.entry(Arc::clone(key)).or_default();
        match slots.iter_mut().find(|s| s.table == *table) {
            Some(s) => s.value = value,
            None => slots.push(Slot::new(table, value)),
        }
    }

    pub(crate) fn get(&self, key: &[u8]) -> &[Slot] {
        self.0.get(key).map(Vec::as_slice).unwrap_or_default()
    }

    /// `later`'s writes over these.
    pub(crate) fn absorb(&mut self, later: Written) {
        // A batch of plain ops is one transaction: its writes become the batch's as they are.
        if self.0.is_empty() {
            *self = later;
            return;
        }
        for (key, slots) in later.0 {
            for s in slots {
                self.set(&key, &s.table, s.value);
            }
        }
    }

    /// Every (key, slot).
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&[u8], &Slot)> {
        self.0
            .iter()
            .flat_map(|(k, slots)| slots.iter().map(move |s| (&**k, s)))
    }
}

/// One entry as the applier takes it.
pub(crate) struct Taken {
    pub(crate) key: Arc<[u8]>,
    pub(crate) slot: Slot,
}

#[repr(align(128))]
#[derive(Default)]
struct Shard(RwLock<HashMap<Arc<[u8]>, Vec<Slot>>>);

pub(crate) struct Overlay {
    shards: Box<[Shard]>,
    /// Entries held, counted over every (table, key).
    len: AtomicUsize,
}

impl Default for Overlay {
    fn default() -> Self {
        Overlay {
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
            len: AtomicUsize::new(0),
        }
    }
}

impl Overlay {
    fn shard(&self, hash: u64) -> &Shard {
        // The high bits: the key index uses the low ones for its own slots.
        &self.shards[(hash >> 58) as usize % SHARDS]
    }

    /// Entries held.
    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::SeqCst)
    }

    /// The values held for `key` (its key-index hash `hash`), one per table written.
    pub(crate) fn lookup(&self, key: &[u8], hash: u64) -> Vec<Slot> {
        if self.len() == 0 {
            return Vec::new();
        }
        self.shard(hash)
            .0
            .read()
            .get(key)
            .cloned()
            .unwrap_or_default()
    }

    /// Installs a durable batch's writes, as written by batch `version`. A key new to the
    /// overlay takes the batch's own key and slots: nothing is copied on the writer's path.
    pub(crate) fn install_all(&self, written: Written, version: u64, hash: impl Fn(&[u8]) -> u64) {
        for (key, mut slots) in written.0 {
            let mut shard = self.shard(hash(&key)).0.write();
            match shard.entry(key) {
                Entry::Vacant(e) => {
                    slots.iter_mut().for_each(|s| s.version = version);
                    self.len.fetch_add(slots.len(), Ordering::SeqCst);
                    e.insert(slots);
                }
                Entry::Occupied(mut e) => {
                    for s in slots {
                        Self::set_slot(&self.len, e.get_mut(), s.table, s.value, version);
                    }
                }
            }
        }
    }

    /// Makes `value` the newest of `table` under `key`, written by batch `version`.
    #[cfg(test)]
    pub(crate) fn install(
        &self,
        key: &[u8],
        hash: u64,
        table: &Arc<str>,
        value: Value,
        version: u64,
    ) {
        let mut shard = self.shard(hash).0.write();
        let slots = shard.entry(Arc::from(key)).or_default();
        Self::set_slot(&self.len, slots, Arc::clone(table), value, version);
    }

    /// Makes `value` the newest of `table` in `slots` (one key's), counting a new entry.
    fn set_slot(
        len: &AtomicUsize,
        slots: &mut Vec<Slot>,
        table: Arc<str>,
        value: Value,
        version: u64,
    ) {
        match slots.iter_mut().find(|s| s.table == table) {
            Some(s) => {
                s.value = value;
                s.version = version;
            }
            None => {
                slots.push(Slot {
                    table,
                    value,
                    version,
                });
                len.fetch_add(1, Ordering::SeqCst);
            }
        }
    }

    /// Every entry, for the applier to write into redb. Entries installed meanwhile are newer
    /// and stay for the next pass.
    pub(crate) fn take_all(&self) -> Vec<Taken> {
        let mut out = Vec::with_capacity(self.len());
        for shard in self.shards.iter() {
            for (key, slots) in shard.0.read().iter() {
                for slot in slots {
                    out.push(Taken {
                        key: Arc::clone(key),
                        slot: slot.clone(),
                    });
                }
            }
        }
        out
    }

    /// Forgets the entries in `applied` that no newer value replaced: the caller installed a
    /// snapshot that holds them.
    pub(crate) fn forget_applied(&self, applied: &[Taken], hash: impl Fn(&[u8]) -> u64) {
        for t in applied {
            let mut shard = self.shard(hash(&t.key)).0.write();
            let Some(slots) = shard.get_mut(&t.key) else {
                continue;
            };
            let before = slots.len();
            slots.retain(|s| !(s.table == t.slot.table && s.version == t.slot.version));
            let removed = before - slots.len();
            if slots.is_empty() {
                shard.remove(&t.key);
            }
            self.len.fetch_sub(removed, Ordering::SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(name: &str) -> Arc<str> {
        Arc::from(name)
    }

    fn hash(key: &[u8]) -> u64 {
        xxhash_rust::xxh3::xxh3_64(key)
    }

    #[test]
    fn the_newest_value_of_each_table_is_kept() {
        let o = Overlay::default();
        let (a, b) = (table("a"), table("b"));
        o.install(b"k", hash(b"k"), &a, Some(Arc::from(&b"1"[..])), 1);
        o.install(b"k", hash(b"k"), &a, Some(Arc::from(&b"2"[..])), 2);
        o.install(b"k", hash(b"k"), &b, None, 2);
        assert_eq!(o.len(), 2);
        let slots = o.lookup(b"k", hash(b"k"));
        assert_eq!(slots.len(), 2);
        assert_eq!(slots[0].value.as_deref(), Some(&b"2"[..]));
        assert!(slots[1].value.is_none());
        assert!(o.lookup(b"other", hash(b"other")).is_empty());
    }

    #[test]
    fn a_batch_installs_new_keys_whole_and_merges_into_held_ones() {
        let o = Overlay::default();
        let (a, b) = (table("a"), table("b"));
        o.install(b"held", hash(b"held"), &a, Some(Arc::from(&b"old"[..])), 1);
        let mut w = Written::default();
        let (held, new): (Arc<[u8]>, Arc<[u8]>) = (Arc::from(&b"held"[..]), Arc::from(&b"new"[..]));
        w.set(&held, &a, None);
        w.set(&held, &b, Some(Arc::from(&b"moved"[..])));
        w.set(&new, &a, Some(Arc::from(&b"1"[..])));
        w.set(&new, &a, Some(Arc::from(&b"2"[..])));
        o.install_all(w, 7, hash);
        // held: a replaced, b added; new: one entry, the newest value.
        assert_eq!(o.len(), 3);
        let held = o.lookup(b"held", hash(b"held"));
        assert_eq!(held.len(), 2);
        assert!(held[0].value.is_none());
        assert_eq!(held[1].value.as_deref(), Some(&b"moved"[..]));
        let new = o.lookup(b"new", hash(b"new"));
        assert_eq!(new.len(), 1);
        assert_eq!(new[0].value.as_deref(), Some(&b"2"[..]));
        // Every installed slot carries the batch's version: taken and applied, all go.
        assert!(o.take_all().iter().all(|t| t.slot.version == 7));
        o.forget_applied(&o.take_all(), hash);
        assert_eq!(o.len(), 0);
    }

    #[test]
    fn an_entry_replaced_after_it_was_taken_is_not_forgotten() {
        let o = Overlay::default();
        let a = table("a");
        o.install(b"k", hash(b"k"), &a, Some(Arc::from(&b"1"[..])), 1);
        o.install(b"j", hash(b"j"), &a, Some(Arc::from(&b"1"[..])), 1);
        let taken = o.take_all();
        assert_eq!(taken.len(), 2);
        // A newer batch writes k while the applier works.
        o.install(b"k", hash(b"k"), &a, Some(Arc::from(&b"2"[..])), 2);
        o.forget_applied(&taken, hash);
        assert_eq!(o.len(), 1);
        assert_eq!(
            o.lookup(b"k", hash(b"k"))[0].value.as_deref(),
            Some(&b"2"[..])
        );
        assert!(o.lookup(b"j", hash(b"j")).is_empty());
        o.forget_applied(&o.take_all(), hash);
        assert_eq!(o.len(), 0);
    }
}
