//! The shared read snapshot: one open read transaction and records table, replaced by the
//! writer after every batch that committed, so a replay costs a lock-free-ish load and one
//! B-tree lookup instead of `begin_read` + `open_table` each time.
//!
//! Invariant: the writer installs the snapshot of its batch's commits *before* it answers any
//! caller of that batch, so a caller that starts after an acknowledged write never reads state
//! older than it. The durability tracker is still consulted after every read: a snapshot may
//! show non-durable commits, exactly as a fresh read transaction would.

use std::sync::Arc;

use parking_lot::RwLock;
use redb::{Database, ReadOnlyTable, ReadableDatabase};

use crate::error::Error;
use crate::meta::{INFLIGHT, RECORDS};
use crate::record::Record;
use crate::scope::RecordKey;
use crate::shard::{SHARDS, shard_index};
use crate::writer::load;

type RecordsTable = ReadOnlyTable<&'static [u8], &'static [u8]>;

/// Both record tables of one read transaction.
struct Tables {
    finished: RecordsTable,
    inflight: RecordsTable,
}

impl Tables {
    fn open(db: &Database) -> Result<Tables, Error> {
        let txn = db.begin_read()?;
        Ok(Tables {
            finished: txn.open_table(RECORDS)?,
            inflight: txn.open_table(INFLIGHT)?,
        })
    }
}

/// Copies of the current snapshot, one per shard (shard.rs), each on its own cache lines:
/// readers on different threads take different read locks, so concurrent replays share no
/// written memory.
#[repr(align(128))]
struct Shard(RwLock<Option<Arc<Tables>>>);

pub(crate) struct Snapshots {
    db: Arc<Database>,
    /// `None` when the last refresh failed: readers then open their own transaction.
    shards: [Shard; SHARDS],
}

impl Snapshots {
    pub(crate) fn new(db: Arc<Database>) -> Self {
        let snapshots = Snapshots {
            db,
            shards: std::array::from_fn(|_| Shard(RwLock::new(None))),
        };
        snapshots.refresh();
        snapshots
    }

    /// Installs a snapshot of the newest commit. The one it replaces is released when its
    /// last reader is done with it (it pins pages freed since until then).
    pub(crate) fn refresh(&self) {
        let fresh = Tables::open(&self.db).ok().map(Arc::new);
        for shard in &self.shards {
            *shard.0.write() = fresh.clone();
        }
    }

    /// The record stored for `key` in the newest installed snapshot.
    pub(crate) fn load(&self, key: &RecordKey) -> Result<Option<Record>, Error> {
        let shard = self.shards[shard_index()].0.read();
        match &*shard {
            Some(t) => load(&t.finished, &t.inflight, key),
            None => {
                drop(shard);
                let t = Tables::open(&self.db)?;
                load(&t.finished, &t.inflight, key)
            }
        }
    }
}
