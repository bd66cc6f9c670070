//! The shared read snapshot: one open read transaction with its in-flight table and the
//! partitions it opened, replaced by the writer after every batch that committed (and after
//! every compaction step), so a replay costs a lock-free-ish load and B-tree lookups instead of
//! `begin_read` + `open_table` each time.
//!
//! Invariant: the writer installs the snapshot of its batch's commits *before* it answers any
//! caller of that batch, so a caller that starts after an acknowledged write never reads state
//! older than it. The durability tracker is still consulted after every read: a snapshot may
//! show non-durable commits, exactly as a fresh read transaction would.

use std::sync::{Arc, OnceLock};

use parking_lot::RwLock;
use redb::{Database, ReadOnlyTable, ReadTransaction, ReadableDatabase, TableHandle};

use crate::engine_tables::INFLIGHT;
use crate::error::Error;
use crate::record::Record;
use crate::records::locate::{
    Found, Layered, Layout, Lookup, PartitionReader, Partitioned, Probe, find, get_in, inflight_in,
    newest,
};
use crate::records::overlay::{Overlay, Slot};
use crate::records::partition::{Catalog, Partition};
use crate::records::recognised::{self, RECOGNISED_KEYS};
use crate::shard::{SHARDS, shard_index};
use idemdb_core::scope::RecordKey;

type RecordsTable = ReadOnlyTable<&'static [u8], &'static [u8]>;

/// One read transaction: the in-flight table, and the partitions of the catalog it was taken
/// with, each opened by the first reader that needs it.
struct Tables {
    txn: ReadTransaction,
    inflight: RecordsTable,
    catalog: Arc<Catalog>,
    /// By position in `catalog`; `None` once known not to exist in this transaction.
    parts: Box<[OnceLock<Option<RecordsTable>>]>,
    /// The recognised keys by hash (recognised.rs), opened by the first acquisition that asks.
    recognised: OnceLock<Option<ReadOnlyTable<u64, u64>>>,
}

impl Tables {
    fn open(db: &Database, layout: &Layout) -> Result<Tables, Error> {
        // The catalog after the transaction: the writer adds a partition to the catalog before
        // it commits into it, so every partition this transaction sees is in it, unless it
        // was dropped since, and then all of its records had expired.
        let txn = db.begin_read()?;
        let catalog = layout.partitions.catalog();
        Ok(Tables {
            inflight: txn.open_table(INFLIGHT)?,
            parts: catalog.parts().iter().map(|_| OnceLock::new()).collect(),
            recognised: OnceLock::new(),
            catalog,
            txn,
        })
    }

    /// The `until` stored for `hash` in the recognised keys' table.
    fn recognised_until(&self, hash: u64) -> Result<Option<u64>, Error> {
        let table = match self.recognised.get() {
            Some(t) => t,
            None => {
                let opened = match self.txn.open_table(RECOGNISED_KEYS) {
                    Ok(t) => Some(t),
                    // No drop or sweep kept a key yet.
                    Err(redb::TableError::TableDoesNotExist(_)) => None,
                    Err(e) => return Err(e.into()),
                };
                let _ = self.recognised.set(opened);
                self.recognised.get().unwrap_or(&None)
            }
        };
        match table {
            Some(t) => recognised::until_of(t, hash),
            None => Ok(None),
        }
    }

    /// What this snapshot holds for `at.key` under the overlay's `slots` for it (the newest
    /// last).
    fn find(
        &self,
        layout: &Layout,
        at: &Lookup<'_>,
        slots: &[Slot],
        probe: Probe,
    ) -> Result<Found, Error> {
        // A slot may be in a partition created after this snapshot: the current catalog has it.
        let current;
        let catalog = if slots.is_empty() {
            &*self.catalog
        } else {
            current = layout.partitions.catalog();
            &*current
        };
        let inflight = || match newest(slots, INFLIGHT.name()) {
            Some(v) => v
                .map(|v| crate::record::decode(at.key.as_bytes(), v))
                .transpose(),
            None => inflight_in(&self.inflight, at.key),
        };
        let parts = Partitioned {
            catalog,
            index: &layout.index,
            reader: &mut Layered {
                slots,
                base: SnapshotParts(self),
            },
        };
        find(inflight, parts, at, probe)
    }

    /// Whether the in-flight table holds `key`, under the overlay's `slots` for it.
    fn in_flight(&self, key: &RecordKey, slots: &[Slot]) -> Result<bool, Error> {
        match newest(slots, INFLIGHT.name()) {
            Some(v) => Ok(v.is_some()),
            None => Ok(self.inflight.get(key.as_bytes())?.is_some()),
        }
    }
}

struct SnapshotParts<'a>(&'a Tables);

impl PartitionReader for SnapshotParts<'_> {
    fn get(&mut self, part: &Partition, key: &RecordKey) -> Result<Option<Record>, Error> {
        let tables = self.0;
        let Some(slot) = tables.catalog.position(part.id).map(|i| &tables.parts[i]) else {
            return Ok(None);
        };
        let table = match slot.get() {
            Some(t) => t,
            None => {
                let opened = match tables.txn.open_table(part.table()) {
                    Ok(t) => Some(t),
                    // Created by a write that rolled back, or not committed yet.
                    Err(redb::TableError::TableDoesNotExist(_)) => None,
                    Err(e) => return Err(e.into()),
                };
                // A racing reader may have set it first; both opened the same table.
                let _ = slot.set(opened);
                slot.get().unwrap_or(&None)
            }
        };
        match table {
            Some(t) => get_in(t, key),
            None => Ok(None),
        }
    }
}

/// Copies of the current snapshot, one per shard (shard.rs), each on its own cache lines:
/// readers on different threads take different read locks, so concurrent replays share no
/// written memory.
#[repr(align(128))]
struct Shard(RwLock<Option<Arc<Tables>>>);

pub(crate) struct Snapshots {
    db: Arc<Database>,
    layout: Arc<Layout>,
    /// Record writes durable in the log and not yet in redb: looked up before the snapshot.
    pub(crate) overlay: Arc<Overlay>,
    /// `None` when the last refresh failed: readers then open their own transaction.
    shards: [Shard; SHARDS],
    /// Held from opening a snapshot until it is installed: refreshes run on several threads
    /// (the leader, the applier), and one that opened earlier must not install its older
    /// snapshot over a newer one, whose entries the overlay may have forgotten already.
    refreshing: parking_lot::Mutex<()>,
    /// Tests make every refresh fail, to exercise the fallback (testing::fail_snapshot_refresh).
    #[cfg(feature = "test-hooks")]
    pub(crate) fail_refresh: std::sync::atomic::AtomicBool,
    /// Tests run this at the start of the next refresh (testing::before_next_refresh).
    #[cfg(feature = "test-hooks")]
    pub(crate) before_refresh: parking_lot::Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl Snapshots {
    pub(crate) fn new(db: Arc<Database>, layout: Arc<Layout>) -> Self {
        let snapshots = Snapshots {
            db,
            layout,
            overlay: Arc::new(Overlay::default()),
            shards: std::array::from_fn(|_| Shard(RwLock::new(None))),
            refreshing: parking_lot::Mutex::new(()),
            #[cfg(feature = "test-hooks")]
            fail_refresh: std::sync::atomic::AtomicBool::new(false),
            #[cfg(feature = "test-hooks")]
            before_refresh: parking_lot::Mutex::new(None),
        };
        snapshots.refresh();
        snapshots
    }

    /// Installs a snapshot of the newest commit. The one it replaces is released when its
    /// last reader is done with it (it pins pages freed since until then).
    pub(crate) fn refresh(&self) {
        #[cfg(feature = "test-hooks")]
        if let Some(hook) = self.before_refresh.lock().take() {
            hook();
        }
        let _one_at_a_time = self.refreshing.lock();
        #[cfg(feature = "test-hooks")]
        if self.fail_refresh.load(std::sync::atomic::Ordering::SeqCst) {
            for shard in &self.shards {
                *shard.0.write() = None;
            }
            return;
        }
        // A failure (or a panic on a damaged page) leaves readers to open their own.
        let fresh =
            crate::contain::contained("a snapshot", || Tables::open(&self.db, &self.layout))
                .ok()
                .map(Arc::new);
        for shard in &self.shards {
            *shard.0.write() = fresh.clone();
        }
    }

    /// What the database holds for `key` at `now`: the overlay's values first, then the newest
    /// installed snapshot (in that order: an entry leaves the overlay only once a snapshot
    /// that holds it is installed).
    pub(crate) fn find(&self, key: &RecordKey, now: u64) -> Result<Found, Error> {
        let hash = self.layout.index.hash(key.as_bytes());
        let slots = self.overlay.lookup(key.as_bytes(), hash);
        let at = Lookup { key, hash, now };
        self.with_tables(|t| t.find(&self.layout, &at, &slots, self.layout.snapshot_probe()))
    }

    /// What the writer finds for `at.key` under `slots`: the overlay's values and the batch's
    /// own writes, the newest last (looked up before this call).
    pub(crate) fn find_under(&self, at: &Lookup<'_>, slots: &[Slot]) -> Result<Found, Error> {
        self.with_tables(|t| t.find(&self.layout, at, slots, Probe::All))
    }

    /// Whether the in-flight table holds `key`, under `slots` as for [`find_under`].
    pub(crate) fn in_flight_under(&self, key: &RecordKey, slots: &[Slot]) -> Result<bool, Error> {
        self.with_tables(|t| t.in_flight(key, slots))
    }

    /// The `until` the newest snapshot's table of recognised keys holds for `hash`: the
    /// writer asks it for a key about to be acquired as new, under its lock, after every
    /// commit that wrote the table was installed (the writer's exclusive steps refresh).
    pub(crate) fn recognised_until(&self, hash: u64) -> Result<Option<u64>, Error> {
        self.with_tables(|t| t.recognised_until(hash))
    }

    fn with_tables<T>(&self, f: impl FnOnce(&Tables) -> Result<T, Error>) -> Result<T, Error> {
        use crate::contain::contained;
        let shard = self.shards[shard_index()].0.read();
        match &*shard {
            Some(t) => contained("a record", || f(t)),
            None => {
                drop(shard);
                contained("a record", || f(&Tables::open(&self.db, &self.layout)?))
            }
        }
    }
}
