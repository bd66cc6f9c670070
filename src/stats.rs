//! Counters of what the engine answered, and histograms of its commits: `IdemDb::stats()`.
//!
//! Counters are kept per thread shard (shard.rs), so counting a replay writes no cache line
//! another core is writing; a snapshot sums the shards. Histograms are written by the commit
//! leader only, once per batch.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

use crate::shard::{SHARDS, shard_index};
#[cfg(feature = "metrics")]
pub(crate) use idemdb_core::counters::{COMMIT_BATCH_SIZE, COMMIT_LATENCY_SECONDS, COMMITS_TOTAL};
pub use idemdb_core::counters::{COUNTERS, Counter, HISTOGRAM_BUCKETS, Histogram};

/// The engine's memory, in bytes: what [`Builder::memory_budget`](crate::Builder::memory_budget)
/// bounds at open (docs/design.md §8.7).
///
/// The two caches are counted at their limits, which they fill as they are used; the key
/// index and the horizon map at what they hold allocated. Not counted: the overlay (records
/// durable in the log and not yet in redb, about 10 ms of writes, at most the log since the
/// last checkpoint) and the callers' own buffers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemoryUse {
    /// redb's page cache ([`Builder::cache_size`](crate::Builder::cache_size)).
    pub page_cache: u64,
    /// Finished records kept for replays ([`Builder::replay_cache`](crate::Builder::replay_cache)).
    pub replay_cache: u64,
    /// The key index: which partitions hold each finished record's key, for the records of
    /// partitions not found through a filter.
    pub key_index: u64,
    /// The wide partitions' key filters (about 1.13 bytes per record in them).
    pub key_filters: u64,
    /// The keys recognised beyond the horizon that memory holds: those of a drop not yet
    /// entered in the on-disk table of recognised keys (8 bytes each), and older builds'
    /// 32-bit tags.
    pub horizon: u64,
}

impl MemoryUse {
    /// The sum of the parts.
    pub fn total(&self) -> u64 {
        self.page_cache
            .saturating_add(self.replay_cache)
            .saturating_add(self.key_index)
            .saturating_add(self.key_filters)
            .saturating_add(self.horizon)
    }
}

/// A snapshot of the engine's counters since open.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Reservations acquired (`Acquired`, takeovers included) and one-shot executions run.
    pub acquired: u64,
    /// Of those, takeovers of an expired lease.
    pub takeovers: u64,
    /// Duplicates answered with a stored COMPLETED response.
    pub replays_completed: u64,
    /// Duplicates answered with a stored FAILED response.
    pub replays_failed: u64,
    /// Same key, different payload.
    pub mismatches: u64,
    /// Duplicates answered `InProgress` (409).
    pub in_progress: u64,
    /// Owner calls refused with [`Refusal::Fenced`](crate::Refusal::Fenced).
    pub fenced: u64,
    /// Records finished as COMPLETED or FAILED (by `complete`, `fail`, `*_with` or `execute`).
    pub finished: u64,
    /// Records released after a transient failure.
    pub releases: u64,
    /// Batches the writer made durable, each by one log append (or, when a closure wrote an
    /// unregistered table, one durable redb commit).
    pub commits: u64,
    /// Operations per commit batch.
    pub batch_size: Histogram,
    /// Time from a batch's first transaction to its durability point, in microseconds.
    pub commit_latency_us: Histogram,
    /// Keys that came back beyond their retention (a copy of the record expired, or it was
    /// dropped and is still recognised): acquired with the flag, or refused by policy.
    pub beyond_horizon: u64,
    /// Records removed by expiry since open: in dropped partitions, and abandoned
    /// IN_PROGRESS records swept from the in-flight table.
    pub expired_records: u64,
    /// Partitions dropped since open.
    pub partitions_dropped: u64,
    /// Partitions created since open for a window older than the newest of their class: the
    /// clock went back, or had once jumped ahead. Records stay in their own window, so the
    /// future partition holds back only what was written in it.
    pub clock_behind: u64,
    /// Records stored now, live or expired but not yet dropped (partitions and in-flight).
    pub stored_records: u64,
    /// Of those, IN_PROGRESS records (the in-flight table).
    pub in_flight_records: u64,
    /// Time partitions stored now.
    pub partitions: u64,
    /// Keys held for beyond-horizon recognition: of dropped partitions and swept abandoned
    /// reservations, until the pass after their horizon ends. On disk, found by hash; memory
    /// holds 8 bytes of each only until the pass that dropped it has entered it on disk.
    pub horizon_keys: u64,
    /// Entries of the in-memory key index: (key, partition) pairs of the partitions not found
    /// through a filter, a key in two partitions counting twice (8 bytes each at 3/4 full:
    /// 10.7 to 16 bytes of memory each).
    pub indexed_keys: u64,
    /// Partitions whose keys the open read to rebuild the key index: those without a summary
    /// that still held (their window had not closed, or a record was placed in them after
    /// it). The others' keys came from their summaries.
    pub partitions_read_at_open: u64,
    /// What the engine's memory goes to: the caches' limits and the index's and horizon's
    /// allocations.
    pub memory: MemoryUse,
    /// Size of the database file in bytes (of the storage, when opened over a backend).
    pub bytes_on_disk: u64,
    /// Checkpoints since open: durable redb commits after which the log is written again
    /// from its start (by size, age, close, a batch running caller code, or compaction).
    pub checkpoints: u64,
    /// Time of each checkpoint taken on its own (by size, age or close), in microseconds:
    /// writes wait for it.
    pub checkpoint_latency_us: Histogram,
    /// Log frames replayed into the file when it was opened (what the last run acknowledged
    /// after its last checkpoint).
    pub replayed_frames: u64,
    /// Size of the log file in bytes (preallocated, zero-filled; frames fill its start).
    pub log_bytes_on_disk: u64,
    /// Bytes of log frames written since the last checkpoint: what recovery would replay
    /// after a crash now.
    pub log_bytes_since_checkpoint: u64,
    /// Times, over the database's life, that an open accepted a loss of the write-ahead log
    /// ([`Builder::accept_log_loss`](crate::Builder::accept_log_loss)): a durable note, kept
    /// in the file. 0 for a database that never lost acknowledged outcomes knowingly.
    pub log_losses_accepted: u64,
    /// The last loss accepted, if any.
    pub last_log_loss: Option<LogLoss>,
}

/// A loss of the write-ahead log that an open accepted knowingly (see
/// [`Stats::last_log_loss`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LogLoss {
    /// When, in ms since the Unix epoch, by the database's clock.
    pub at_ms: u64,
    /// What the open found (the refusal's words).
    pub what: String,
}

#[repr(align(128))]
#[derive(Default)]
struct Shard([AtomicU64; COUNTERS]);

#[derive(Default)]
pub(crate) struct StatsCollector {
    shards: [Shard; SHARDS],
    commits: Mutex<(u64, Histogram, Histogram)>,
    checkpoint_latency: Mutex<Histogram>,
}

impl StatsCollector {
    pub(crate) fn add(&self, counter: Counter) {
        self.add_n(counter, 1);
    }

    pub(crate) fn add_n(&self, counter: Counter, n: u64) {
        self.shards[shard_index()].0[counter as usize].fetch_add(n, Ordering::Relaxed);
        #[cfg(feature = "metrics")]
        metrics::counter!(counter.metric_name()).increment(n);
    }

    pub(crate) fn record_batch(&self, ops: usize, took: Duration) {
        #[cfg(feature = "metrics")]
        {
            metrics::counter!(COMMITS_TOTAL).increment(1);
            metrics::histogram!(COMMIT_BATCH_SIZE).record(ops as f64);
            metrics::histogram!(COMMIT_LATENCY_SECONDS).record(took.as_secs_f64());
        }
        let mut commits = self.commits.lock();
        commits.0 += 1;
        commits.1.record(ops as u64);
        commits
            .2
            .record(u64::try_from(took.as_micros()).unwrap_or(u64::MAX));
    }

    pub(crate) fn record_checkpoint(&self, took: Duration) {
        #[cfg(feature = "metrics")]
        metrics::histogram!("idemdb_checkpoint_latency_seconds").record(took.as_secs_f64());
        self.checkpoint_latency
            .lock()
            .record(u64::try_from(took.as_micros()).unwrap_or(u64::MAX));
    }

    pub(crate) fn snapshot(&self) -> Stats {
        let sum = |c: Counter| -> u64 {
            self.shards
                .iter()
                .map(|s| s.0[c as usize].load(Ordering::Relaxed))
                .sum()
        };
        let (commits, batch_size, commit_latency_us) = self.commits.lock().clone();
        Stats {
            acquired: sum(Counter::Acquired),
            takeovers: sum(Counter::Takeovers),
            replays_completed: sum(Counter::ReplaysCompleted),
            replays_failed: sum(Counter::ReplaysFailed),
            mismatches: sum(Counter::Mismatches),
            in_progress: sum(Counter::InProgress),
            fenced: sum(Counter::Fenced),
            finished: sum(Counter::Finished),
            releases: sum(Counter::Releases),
            commits,
            batch_size,
            commit_latency_us,
            beyond_horizon: sum(Counter::BeyondHorizon),
            expired_records: sum(Counter::ExpiredRecords),
            partitions_dropped: sum(Counter::PartitionsDropped),
            clock_behind: sum(Counter::ClockBehind),
            checkpoints: sum(Counter::Checkpoints),
            checkpoint_latency_us: self.checkpoint_latency.lock().clone(),
            replayed_frames: 0,
            log_bytes_on_disk: 0,
            log_bytes_since_checkpoint: 0,
            log_losses_accepted: 0,
            last_log_loss: None,
            // Filled in by IdemDb::stats from the file.
            stored_records: 0,
            in_flight_records: 0,
            partitions: 0,
            horizon_keys: 0,
            indexed_keys: 0,
            partitions_read_at_open: 0,
            memory: MemoryUse::default(),
            bytes_on_disk: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_sum_over_shards() {
        let c = std::sync::Arc::new(StatsCollector::default());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let c = std::sync::Arc::clone(&c);
                std::thread::spawn(move || (0..100).for_each(|_| c.add(Counter::Mismatches)))
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        assert_eq!(c.snapshot().mismatches, 400);
    }
}
