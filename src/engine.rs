//! The engine's shared state: the database with its clock and limits, the retention layout,
//! the read snapshots, the durability tracker, the counters, the waiters, and whether writes
//! are refused. The writer commits into it; the read path and the compactor use it directly.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use redb::Database;

use crate::config::Limits;
use crate::durability::DurabilityTracker;
use crate::error::Error;
use crate::outbox_state::OutboxState;
use crate::records::locate::Layout;
use crate::records::replay_cache::ReplayCache;
use crate::records::snapshot::Snapshots;
use crate::stats::StatsCollector;
use crate::tables::TableRegistry;
use crate::wait::WaitRegistry;
use idemdb_core::clock::Clock;

pub(crate) struct Engine {
    pub(crate) db: Arc<Database>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) limits: Limits,
    /// Stamped on every reservation issued; owner calls presenting another are refused.
    pub(crate) database_id: u64,
    pub(crate) layout: Arc<Layout>,
    pub(crate) snapshots: Snapshots,
    /// Finished records for replays without B-tree lookups (replay_cache.rs).
    pub(crate) replays: ReplayCache,
    pub(crate) durability: DurabilityTracker,
    pub(crate) stats: StatsCollector,
    pub(crate) waits: WaitRegistry,
    /// Caller tables whose writes are logged (`Builder::table`).
    pub(crate) tables: TableRegistry,
    /// Staging numbers, the dispatcher's wake-ups and the delivery counters.
    pub(crate) outbox: OutboxState,
    /// Serialises compaction passes (the background one and `compact_now`).
    pub(crate) compaction: Mutex<()>,
    /// Tests run this before the next widening switch (testing::before_next_widening_switch).
    #[cfg(feature = "test-hooks")]
    pub(crate) before_widening_switch: Mutex<Option<Box<dyn FnOnce() + Send>>>,
    /// Tests run this between two steps that enter a row's keys on disk
    /// (testing::between_next_recognition_steps).
    #[cfg(feature = "test-hooks")]
    pub(crate) between_recognition_steps: Mutex<Option<Box<dyn FnOnce() + Send>>>,
    /// Set when a commit failed or an engine thread panicked: writes are refused until reopen.
    poisoned: AtomicBool,
    /// Why, when it was not a failed commit.
    poison_reason: Mutex<Option<String>>,
}

impl Engine {
    pub(crate) fn new(
        db: Arc<Database>,
        clock: Arc<dyn Clock>,
        limits: Limits,
        database_id: u64,
        layout: Arc<Layout>,
        tables: TableRegistry,
        replay_cache_bytes: usize,
    ) -> Engine {
        Engine {
            replays: ReplayCache::new(replay_cache_bytes),
            snapshots: Snapshots::new(Arc::clone(&db), Arc::clone(&layout)),
            db,
            clock,
            limits,
            database_id,
            layout,
            durability: DurabilityTracker::default(),
            stats: StatsCollector::default(),
            waits: WaitRegistry::default(),
            tables,
            outbox: OutboxState::default(),
            compaction: Mutex::new(()),
            #[cfg(feature = "test-hooks")]
            before_widening_switch: Mutex::new(None),
            #[cfg(feature = "test-hooks")]
            between_recognition_steps: Mutex::new(None),
            poisoned: AtomicBool::new(false),
            poison_reason: Mutex::new(None),
        }
    }

    /// Refuses writes from now on (a failed commit): they get [`Error::WritesRefused`].
    pub(crate) fn poison(&self) {
        self.poisoned.store(true, Ordering::SeqCst);
        self.durability.failed();
    }

    /// Refuses all writes from now on with [`Error::Poisoned`] and `reason`.
    pub(crate) fn poison_with(&self, reason: String) {
        self.poison_reason.lock().get_or_insert(reason);
        self.poison();
    }

    /// The error a write gets once the engine is poisoned.
    pub(crate) fn poisoned_error(&self) -> Error {
        match &*self.poison_reason.lock() {
            Some(why) => Error::Poisoned(why.clone()),
            None => Error::WritesRefused,
        }
    }

    pub(crate) fn is_poisoned(&self) -> bool {
        self.poisoned.load(Ordering::SeqCst)
    }
}
