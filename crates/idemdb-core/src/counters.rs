//! What every store counts, under one set of names: the answers given (one slot per
//! [`Counter`]) and log2 histograms of commits.

/// Buckets of a [`Histogram`]: bucket 0 counts 0 and 1, bucket `i` counts `[2^i, 2^(i+1))`,
/// the last bucket everything above.
pub const HISTOGRAM_BUCKETS: usize = 24;

/// A log2 histogram.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Histogram {
    /// Counts per power-of-two bucket (see [`HISTOGRAM_BUCKETS`]).
    pub buckets: [u64; HISTOGRAM_BUCKETS],
    /// Number of values recorded.
    pub count: u64,
    /// Sum of the values recorded.
    pub sum: u64,
}

impl Histogram {
    /// Counts `value`.
    pub fn record(&mut self, value: u64) {
        let bucket = (63 - value.max(1).leading_zeros()) as usize;
        self.buckets[bucket.min(HISTOGRAM_BUCKETS - 1)] += 1;
        self.count += 1;
        self.sum = self.sum.saturating_add(value);
    }

    /// The mean of the values recorded, or 0.
    pub fn mean(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum as f64 / self.count as f64
        }
    }

    /// An upper bound of the `q`-quantile (0.0–1.0): the top of the bucket that holds it.
    pub fn quantile_upper_bound(&self, q: f64) -> u64 {
        let target = (q.clamp(0.0, 1.0) * self.count as f64).ceil() as u64;
        let mut seen = 0;
        for (i, n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= target.max(1) {
                return (1u64 << (i + 1)) - 1;
            }
        }
        u64::MAX
    }
}

/// Names of the commit metrics (each store's feature `metrics`), shared so that one dashboard
/// reads both stores: a counter of commits, and histograms of the operations each one made
/// durable and of its latency in seconds. This one: the commits.
pub const COMMITS_TOTAL: &str = "idemdb_commits_total";
/// The operations each commit made durable (a histogram).
pub const COMMIT_BATCH_SIZE: &str = "idemdb_commit_batch_size";
/// Each commit's latency in seconds (a histogram).
pub const COMMIT_LATENCY_SECONDS: &str = "idemdb_commit_latency_seconds";

/// Names of the outbox metrics (each store's feature `metrics`), shared like the commit
/// metrics'. Messages marked delivered (a counter).
pub const OUTBOX_DELIVERED_TOTAL: &str = "idemdb_outbox_delivered_total";
/// Failed attempts rescheduled (a counter).
pub const OUTBOX_RETRIED_TOTAL: &str = "idemdb_outbox_retried_total";
/// Messages parked by the dispatcher or an operator (a counter).
pub const OUTBOX_PARKED_TOTAL: &str = "idemdb_outbox_parked_total";
/// Marks of a claim that had lapsed, which changed nothing (a counter; PostgreSQL only).
pub const OUTBOX_FENCED_TOTAL: &str = "idemdb_outbox_fenced_total";
/// Undelivered messages (a gauge).
pub const OUTBOX_BACKLOG: &str = "idemdb_outbox_backlog";
/// Parked messages (a gauge).
pub const OUTBOX_PARKED: &str = "idemdb_outbox_parked";
/// The oldest undelivered message's age in seconds, 0 with none (a gauge).
pub const OUTBOX_OLDEST_AGE_SECONDS: &str = "idemdb_outbox_oldest_undelivered_age_seconds";
/// A staging commit to the publisher's `Ok`, in seconds (a histogram).
pub const OUTBOX_PUBLISH_LATENCY_SECONDS: &str = "idemdb_outbox_publish_latency_seconds";

/// The answers and events every store counts, one slot each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)] // each variant is its metric's name below
pub enum Counter {
    Acquired,
    Takeovers,
    ReplaysCompleted,
    ReplaysFailed,
    Mismatches,
    InProgress,
    Fenced,
    Finished,
    Releases,
    BeyondHorizon,
    ExpiredRecords,
    PartitionsDropped,
    ClockBehind,
    Checkpoints,
}
/// How many [`Counter`]s there are.
pub const COUNTERS: usize = 14;

impl Counter {
    /// The name under which the `metrics` feature exports it (a counter); the PostgreSQL
    /// store exports its counts of the same answers under the same names.
    pub fn metric_name(self) -> &'static str {
        match self {
            Counter::Acquired => "idemdb_acquired_total",
            Counter::Takeovers => "idemdb_takeovers_total",
            Counter::ReplaysCompleted => "idemdb_replays_completed_total",
            Counter::ReplaysFailed => "idemdb_replays_failed_total",
            Counter::Mismatches => "idemdb_mismatches_total",
            Counter::InProgress => "idemdb_in_progress_total",
            Counter::Fenced => "idemdb_fenced_total",
            Counter::Finished => "idemdb_finished_total",
            Counter::Releases => "idemdb_releases_total",
            Counter::BeyondHorizon => "idemdb_beyond_horizon_total",
            Counter::ExpiredRecords => "idemdb_expired_records_total",
            Counter::PartitionsDropped => "idemdb_partitions_dropped_total",
            Counter::ClockBehind => "idemdb_clock_behind_total",
            Counter::Checkpoints => "idemdb_checkpoints_total",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_by_power_of_two() {
        let mut h = Histogram::default();
        for v in [0, 1, 2, 3, 4, 1000, u64::MAX] {
            h.record(v);
        }
        assert_eq!(h.buckets[0], 2);
        assert_eq!(h.buckets[1], 2);
        assert_eq!(h.buckets[2], 1);
        assert_eq!(h.buckets[9], 1);
        assert_eq!(h.buckets[HISTOGRAM_BUCKETS - 1], 1);
        assert_eq!(h.count, 7);
        assert_eq!(h.quantile_upper_bound(0.5), 3);
    }
}
