//! What a `PgStore`'s callers were told, counted by this instance (each instance counts its
//! own calls; the database holds no counters), its commits, and its pool's state.
//!
//! Feature `metrics`: every count is also a `metrics` counter of the name the embedded
//! engine gives the same answer (`idemdb_core::counters::Counter::metric_name`), each commit of a
//! record's write records the embedded engine's commit metrics, and the pool's state is
//! four gauges, set after every counted call (its connection back in the pool), at every
//! `stats()` and at every compactor tick.

use idemdb_core::error::Refusal;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

use crate::error::PgError;
use idemdb_core::counters::{COUNTERS, Counter, Histogram};
use idemdb_core::dispatch::OutboxStats;
use idemdb_core::error::ExecuteError;
use idemdb_core::outcome::{ExecuteOutcome, ReserveOutcome};

/// A snapshot of [`PgStore::stats`](crate::PgStore::stats): answers since connect, as the
/// embedded engine's `Stats` counts them, and the connection pool now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PgStats {
    /// Reservations and executions that acquired the key (takeovers and beyond-horizon
    /// acquisitions included).
    pub acquired: u64,
    /// Of `acquired`, takeovers of an expired lease.
    pub takeovers: u64,
    /// Keys acquired beyond their horizon, or refused for it.
    pub beyond_horizon: u64,
    /// Duplicates answered with a stored success.
    pub replays_completed: u64,
    /// Duplicates answered with a stored failure.
    pub replays_failed: u64,
    /// Same key, other payload.
    pub mismatches: u64,
    /// Duplicates told to retry later (a `reserve_or_wait` counts its final answer only).
    pub in_progress: u64,
    /// Owner calls refused with [`Refusal::Fenced`](crate::Refusal::Fenced).
    pub fenced: u64,
    /// Records finished (COMPLETED or FAILED written), by owners and by `execute`.
    pub finished: u64,
    /// Keys released.
    pub releases: u64,
    /// Calls answered [`PgError::OutcomeUnknown`].
    pub outcome_unknown: u64,
    /// Transactions run again after a serialization failure, a deadlock or a record that
    /// changed between a read and its guarded write.
    pub retried: u64,
    /// Connections the pool holds now, idle or in use.
    pub pool_connections: usize,
    /// The pool's limit (`PgStoreBuilder::pool_size`).
    pub pool_max: usize,
    /// Idle connections in the pool now.
    pub pool_idle: usize,
    /// Calls waiting for a connection now.
    pub pool_waiting: usize,
    /// Commits that made records' writes durable: a reservation's insert, a takeover, an
    /// owner's finish, release or extension, an execution's transaction, or a batch of
    /// concurrent calls' reserves and finishes (one commit for all of them).
    pub commits: u64,
    /// Batches of concurrent calls' reserves and finishes that answered their calls
    /// (`PgStoreBuilder::max_batch`); a batch cut or refused is not counted.
    pub batches: u64,
    /// Calls answered by those batches (their mean size: `batched_calls / batches`).
    pub batched_calls: u64,
    /// Time of each of those commits, in microseconds: the round trip of the `COMMIT`, or of
    /// the statement that commits by itself, the server's WAL flush included.
    pub commit_latency_us: Histogram,
    /// This instance's clock minus the server's, in ms, at the last statement that read the
    /// server's (a round trip's error). For the operator only: the store judges every lease
    /// and expiry by the server's clock, so a skewed instance stays correct.
    pub clock_skew_ms: i64,
    /// What this instance's outbox dispatchers did since connect: `delivered`, `retried`,
    /// `parked_since_open`, `fenced`, `round_errors` and the commit-to-publish latency.
    /// The table's backlog, parked count and oldest undelivered age are 0 / `None` here: they
    /// take a count of the table, [`PgStore::outbox_stats`](crate::PgStore::outbox_stats).
    pub outbox: OutboxStats,
}

/// What an owner's call does when it succeeds.
#[derive(Clone, Copy)]
pub(crate) enum Owned {
    Finished,
    Released,
    Extended,
}

/// One count of [`PgStats`]: an answer the embedded engine counts too, or one of the
/// PostgreSQL store's own.
#[derive(Clone, Copy)]
enum Count {
    Answer(Counter),
    OutcomeUnknown,
    Retried,
}
/// Slots: one per embedded [`Counter`] (those this store never answers stay 0), then its own.
const COUNTS: usize = COUNTERS + 2;

impl From<Counter> for Count {
    fn from(c: Counter) -> Count {
        Count::Answer(c)
    }
}

impl Count {
    fn slot(self) -> usize {
        match self {
            Count::Answer(c) => c as usize,
            Count::OutcomeUnknown => COUNTERS,
            Count::Retried => COUNTERS + 1,
        }
    }

    /// The `metrics` counter it increments: the embedded engine's name for the same answer,
    /// so that one dashboard reads both stores; the PostgreSQL store's own in that style.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    fn metric_name(self) -> &'static str {
        match self {
            Count::Answer(c) => c.metric_name(),
            Count::OutcomeUnknown => "idemdb_outcome_unknown_total",
            Count::Retried => "idemdb_retried_total",
        }
    }
}

/// Names of the pool gauges (feature `metrics`): the [`PgStats`] fields of the same names.
#[cfg(feature = "metrics")]
const POOL_GAUGES: [&str; 4] = [
    "idemdb_pool_connections",
    "idemdb_pool_max",
    "idemdb_pool_idle",
    "idemdb_pool_waiting",
];

pub(crate) struct Counters {
    counts: [AtomicU64; COUNTS],
    /// Commits and their latency (µs); a lock per commit, which waits on a round trip anyway.
    commits: Mutex<(u64, Histogram)>,
    /// Batches run, and the calls they answered.
    batches: [AtomicU64; 2],
    /// The store's pool (a handle of it), read for its state.
    pool: deadpool_postgres::Pool,
}

impl Counters {
    pub(crate) fn new(pool: deadpool_postgres::Pool) -> Counters {
        Counters {
            counts: Default::default(),
            commits: Mutex::default(),
            batches: Default::default(),
            pool,
        }
    }

    fn add(&self, count: impl Into<Count>) {
        let count: Count = count.into();
        self.counts[count.slot()].fetch_add(1, Ordering::Relaxed);
        #[cfg(feature = "metrics")]
        metrics::counter!(count.metric_name()).increment(1);
    }

    fn get(&self, count: impl Into<Count>) -> u64 {
        self.counts[count.into().slot()].load(Ordering::Relaxed)
    }

    pub(crate) fn retried(&self) {
        self.add(Count::Retried);
    }

    /// A commit that made a record's write durable, `took` its round trip: counted in
    /// `commits` and `commit_latency_us`, and as the embedded engine's commit metrics (a
    /// batch of one operation). Not for a commit that failed: its outcome is unknown.
    pub(crate) fn committed(&self, took: Duration) {
        self.committed_batch(took, 1);
    }

    /// As [`committed`](Self::committed), for a commit holding `writes` records' writes (a
    /// `consume_batch` poll).
    pub(crate) fn committed_batch(&self, took: Duration, writes: usize) {
        #[cfg(feature = "metrics")]
        {
            use idemdb_core::counters::{COMMIT_BATCH_SIZE, COMMIT_LATENCY_SECONDS, COMMITS_TOTAL};
            metrics::counter!(COMMITS_TOTAL).increment(1);
            metrics::histogram!(COMMIT_BATCH_SIZE).record(writes as f64);
            metrics::histogram!(COMMIT_LATENCY_SECONDS).record(took.as_secs_f64());
        }
        // The batch size goes to the metrics facade only.
        #[cfg(not(feature = "metrics"))]
        let _ = writes;
        let mut commits = self.commits.lock();
        commits.0 += 1;
        commits
            .1
            .record(u64::try_from(took.as_micros()).unwrap_or(u64::MAX));
    }

    /// A batch of `calls` calls' operations ran.
    pub(crate) fn batch(&self, calls: usize) {
        self.batches[0].fetch_add(1, Ordering::Relaxed);
        self.batches[1].fetch_add(calls as u64, Ordering::Relaxed);
    }

    /// Sets the pool gauges (feature `metrics`) from the pool's state now. Called after
    /// every counted call, when its connection is back, so that a scrape sees the state at
    /// the last answer; and by `stats()` and the compactor, so that an idle store's gauges
    /// still catch up.
    pub(crate) fn pool_seen(&self) {
        #[cfg(feature = "metrics")]
        {
            let status = self.pool.status();
            let values = [
                status.size,
                status.max_size,
                status.available,
                status.waiting,
            ];
            for (name, value) in POOL_GAUGES.into_iter().zip(values) {
                metrics::gauge!(name).set(value as f64);
            }
        }
    }

    fn error(&self, e: &PgError) {
        match e {
            PgError::Refused(Refusal::Fenced { .. }) => self.add(Counter::Fenced),
            PgError::OutcomeUnknown(_) => self.add(Count::OutcomeUnknown),
            _ => {}
        }
    }

    pub(crate) fn reserved(&self, result: &Result<ReserveOutcome, PgError>) {
        match result {
            Ok(ReserveOutcome::Acquired(r)) => {
                self.add(Counter::Acquired);
                if r.is_takeover() {
                    self.add(Counter::Takeovers);
                }
                if r.is_beyond_horizon() {
                    self.add(Counter::BeyondHorizon);
                }
            }
            Ok(ReserveOutcome::Completed(_)) => self.add(Counter::ReplaysCompleted),
            Ok(ReserveOutcome::Failed(_)) => self.add(Counter::ReplaysFailed),
            Ok(ReserveOutcome::Mismatch) => self.add(Counter::Mismatches),
            Ok(ReserveOutcome::InProgress { .. }) => self.add(Counter::InProgress),
            Ok(ReserveOutcome::BeyondHorizon) => self.add(Counter::BeyondHorizon),
            Err(e) => self.error(e),
        }
        self.pool_seen();
    }

    /// An `execute` that committed after taking over an expired lease, or beyond its
    /// horizon (its outcome does not say).
    pub(crate) fn executed_as(&self, takeover: bool, beyond: bool) {
        if takeover {
            self.add(Counter::Takeovers);
        }
        if beyond {
            self.add(Counter::BeyondHorizon);
        }
    }

    /// An `execute` (or `consume`).
    pub(crate) fn executed<E>(&self, result: &Result<ExecuteOutcome, ExecuteError<E, PgError>>) {
        match result {
            Ok(ExecuteOutcome::Executed(_)) => {
                self.add(Counter::Acquired);
                self.add(Counter::Finished);
            }
            Ok(ExecuteOutcome::Completed(_)) => self.add(Counter::ReplaysCompleted),
            Ok(ExecuteOutcome::Failed(_)) => self.add(Counter::ReplaysFailed),
            Ok(ExecuteOutcome::Mismatch) => self.add(Counter::Mismatches),
            Ok(ExecuteOutcome::InProgress { .. }) => self.add(Counter::InProgress),
            Ok(ExecuteOutcome::BeyondHorizon) => self.add(Counter::BeyondHorizon),
            Err(ExecuteError::Db(e)) => self.error(e),
            Err(ExecuteError::Closure(_)) => {}
        }
        self.pool_seen();
    }

    /// A `run`: only its error is counted (it answers no key).
    pub(crate) fn ran<T, E>(&self, result: &Result<T, ExecuteError<E, PgError>>) {
        if let Err(ExecuteError::Db(e)) = result {
            self.error(e);
        }
    }

    /// An owner's call: what it did when it succeeded (`finished`, `releases`, or nothing
    /// for `extend`), or its error.
    pub(crate) fn owned(&self, result: Result<(), &PgError>, done: Owned) {
        match (result, done) {
            (Ok(()), Owned::Finished) => self.add(Counter::Finished),
            (Ok(()), Owned::Released) => self.add(Counter::Releases),
            (Ok(()), Owned::Extended) => {}
            (Err(e), _) => self.error(e),
        }
        self.pool_seen();
    }

    pub(crate) fn snapshot(&self) -> PgStats {
        self.pool_seen();
        let status = self.pool.status();
        let (commits, commit_latency_us) = self.commits.lock().clone();
        PgStats {
            acquired: self.get(Counter::Acquired),
            takeovers: self.get(Counter::Takeovers),
            beyond_horizon: self.get(Counter::BeyondHorizon),
            replays_completed: self.get(Counter::ReplaysCompleted),
            replays_failed: self.get(Counter::ReplaysFailed),
            mismatches: self.get(Counter::Mismatches),
            in_progress: self.get(Counter::InProgress),
            fenced: self.get(Counter::Fenced),
            finished: self.get(Counter::Finished),
            releases: self.get(Counter::Releases),
            outcome_unknown: self.get(Count::OutcomeUnknown),
            retried: self.get(Count::Retried),
            pool_connections: status.size,
            pool_max: status.max_size,
            pool_idle: status.available,
            pool_waiting: status.waiting,
            commits,
            batches: self.batches[0].load(Ordering::Relaxed),
            batched_calls: self.batches[1].load(Ordering::Relaxed),
            commit_latency_us,
            clock_skew_ms: 0,
            outbox: OutboxStats::default(),
        }
    }
}
