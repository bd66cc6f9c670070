//! The engine's settings: the shared writer's, and its defaults; the input limits are
//! idemdb-core's.

pub use idemdb_core::Limits;

/// Settings of the shared writer, set through [`Builder::max_batch`](crate::Builder::max_batch),
/// [`max_queue`](crate::Builder::max_queue) and
/// [`quick_repair`](crate::Builder::quick_repair).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WriterConfig {
    /// Most operations one commit batch may carry (default 256).
    pub(crate) max_batch: usize,
    /// Most operations waiting for a commit (default 4,096). Past it, callers wait for room
    /// (backpressure); no request is dropped.
    pub(crate) max_queue: usize,
    /// redb's quick-repair on every durable redb commit, i.e. every checkpoint (default off;
    /// see docs/design.md).
    pub(crate) quick_repair: bool,
    /// A checkpoint is taken once this many bytes of frames follow the last one (32 MiB by
    /// default: each checkpoint writes the pages its frames dirtied, so fewer, larger ones
    /// write fewer in all and slow the log's syncs less often; at 16 MiB, one caller had twice
    /// as many reserves above 5x the floor).
    pub(crate) checkpoint_bytes: u64,
    /// ... or once frames are this old (checked by the applier thread).
    pub(crate) checkpoint_interval: std::time::Duration,
    /// Tokens each raise of the durable token ceiling reserves (design.md §7).
    pub(crate) token_block: u64,
    /// The log's size at creation and the unit it grows by (design.md §5.6).
    pub(crate) log_step: u64,
    /// The committer thread starts when first needed (an async caller, a checkpoint by size)
    /// instead of at open (test hooks: [`Builder::lazy_committer`](crate::Builder)).
    pub(crate) lazy_committer: bool,
    /// The applier thread is started at open (test hooks: [`Builder::without_applier`](crate::Builder)
    /// turns it off, so that only the leaders take checkpoints by size).
    pub(crate) applier: bool,
    /// How long the committer thread spins for the next async op after leading a batch.
    pub(crate) committer_spin: std::time::Duration,
}

/// Tokens reserved on disk at a time (by default): the meta entry `next_token` (meta.rs) is a ceiling
/// above every token issued, raised by a block when issued tokens reach it (by a batch, which
/// then ends with a durable commit), when they come within half a block of it (by a
/// checkpoint), and at every open, so most batches do neither. After a reopen, tokens resume
/// at the ceiling; up to this many are skipped, never reused. Half a block lasts the default
/// `checkpoint_interval` (5 s) at 100,000 acquisitions/s, so the applier's checkpoints keep it
/// ahead and no batch raises it itself: that raise is a durable commit under the leader lock,
/// which every caller waits for (issue 24).
pub(crate) const TOKEN_BLOCK: u64 = 1 << 20;
/// How long the committer thread spins for the next async op after a batch that held one
/// (default; [`Builder::committer_spin`](crate::Builder::committer_spin)).
pub(crate) const COMMITTER_SPIN: std::time::Duration = std::time::Duration::from_micros(100);
/// Memory for finished records kept for replays (default; `Builder::replay_cache`).
pub(crate) const REPLAY_CACHE_BYTES: usize = 32 << 20;
/// redb's page cache (default; `Builder::cache_size`): an edge box's share, not redb's own
/// default of 1 GiB. Replays of keys whose pages it does not hold read them from the
/// operating system's page cache (docs/benchmarks.md §6).
pub(crate) const PAGE_CACHE_BYTES: usize = 64 << 20;
/// The longest spin a builder accepts.
pub(crate) const COMMITTER_SPIN_MAX: std::time::Duration = std::time::Duration::from_millis(1);

/// The log file (wal/) preallocated at creation, and the step it grows by (by default): zero-filled,
/// so that an append's `fdatasync` has no block allocation or file size to write.
pub(crate) const GROW_STEP: u64 = 1 << 20;

impl Default for WriterConfig {
    fn default() -> Self {
        WriterConfig {
            max_batch: 256,
            max_queue: 4096,
            quick_repair: false,
            checkpoint_bytes: 32 << 20,
            checkpoint_interval: std::time::Duration::from_secs(5),
            token_block: TOKEN_BLOCK,
            log_step: GROW_STEP,
            lazy_committer: false,
            applier: true,
            committer_spin: COMMITTER_SPIN,
        }
    }
}

/// How often the applier thread writes the overlay into redb (writer/applier.rs): often enough
/// that a checkpoint finds little left, seldom enough that each pass's commit is shared by
/// many records.
pub(crate) const APPLY_INTERVAL: std::time::Duration = std::time::Duration::from_millis(10);

/// How far the applier thread lowers its priority (Linux; added to the nice value it inherits
/// from the thread that opened the database, at most 19): low enough that a caller waking
/// from its `fdatasync` preempts it, high enough that CPU-bound work elsewhere does not starve
/// it while it holds redb's write lock (design.md §5.7, "Its priority").
#[cfg(target_os = "linux")]
pub(crate) const APPLIER_NICE: i32 = 5;

/// The partition width where `Retention::partition_width` is not set
/// (`Builder::DEFAULT_PARTITION_WIDTH` says why it is narrow).
pub(crate) const DEFAULT_PARTITION_WIDTH: std::time::Duration = std::time::Duration::from_secs(10);

/// How often (in entries read) a scan or verification reports its progress.
pub(crate) const SCAN_PROGRESS_EVERY: u64 = 4096;
