//! What the engine is started with: the builder's settings, handed to the database it opens.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::config::{Limits, WriterConfig};
use crate::tables::TableRegistry;
use idemdb_core::clock::Clock;
use idemdb_core::retention::Retention;

/// What the engine is started with.
pub(crate) struct Settings {
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) limits: Limits,
    pub(crate) writer: WriterConfig,
    pub(crate) retention: Retention,
    pub(crate) tables: TableRegistry,
    pub(crate) accept_log_loss: bool,
    /// Bytes of finished records kept for replays (0: none).
    pub(crate) replay_cache: usize,
    /// redb's page cache, in bytes.
    pub(crate) page_cache: usize,
    /// `Builder::memory_budget`.
    pub(crate) memory_budget: Option<u64>,
}

/// Where `stats()` finds the size of the database.
pub(crate) enum FileSize {
    Path(PathBuf),
    Backend(Arc<AtomicU64>),
}

impl FileSize {
    pub(crate) fn bytes(&self) -> u64 {
        match self {
            FileSize::Path(path) => std::fs::metadata(path).map(|m| m.len()).unwrap_or(0),
            FileSize::Backend(len) => len.load(Ordering::Relaxed),
        }
    }
}
