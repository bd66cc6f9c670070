//! What a `PgStore`'s callers were told, counted by this instance (each instance counts its
//! own calls; the database holds no counters), and its pool's state.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, ExecuteError};
use crate::outcome::{ExecuteOutcome, ReserveOutcome};

/// A snapshot of [`PgStore::stats`](super::PgStore::stats): answers since connect, as the
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
    /// Owner calls refused with [`Error::Fenced`].
    pub fenced: u64,
    /// Records finished (COMPLETED or FAILED written), by owners and by `execute`.
    pub finished: u64,
    /// Keys released.
    pub releases: u64,
    /// Calls answered [`Error::OutcomeUnknown`].
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
    /// This instance's clock minus the server's, in ms, at the last statement that read the
    /// server's (a round trip's error). For the operator only: the store judges every lease
    /// and expiry by the server's clock, so a skewed instance stays correct.
    pub clock_skew_ms: i64,
}

/// What an owner's call does when it succeeds.
#[derive(Clone, Copy)]
pub(crate) enum Owned {
    Finished,
    Released,
    Extended,
}

#[derive(Default)]
pub(crate) struct Counters {
    acquired: AtomicU64,
    takeovers: AtomicU64,
    beyond_horizon: AtomicU64,
    replays_completed: AtomicU64,
    replays_failed: AtomicU64,
    mismatches: AtomicU64,
    in_progress: AtomicU64,
    fenced: AtomicU64,
    finished: AtomicU64,
    releases: AtomicU64,
    outcome_unknown: AtomicU64,
    retried: AtomicU64,
}

fn add(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

impl Counters {
    pub(crate) fn retried(&self) {
        add(&self.retried);
    }

    fn error(&self, e: &Error) {
        match e {
            Error::Fenced { .. } => add(&self.fenced),
            Error::OutcomeUnknown(_) => add(&self.outcome_unknown),
            _ => {}
        }
    }

    pub(crate) fn reserved(&self, result: &Result<ReserveOutcome, Error>) {
        match result {
            Ok(ReserveOutcome::Acquired(r)) => {
                add(&self.acquired);
                if r.is_takeover() {
                    add(&self.takeovers);
                }
                if r.is_beyond_horizon() {
                    add(&self.beyond_horizon);
                }
            }
            Ok(ReserveOutcome::Completed(_)) => add(&self.replays_completed),
            Ok(ReserveOutcome::Failed(_)) => add(&self.replays_failed),
            Ok(ReserveOutcome::Mismatch) => add(&self.mismatches),
            Ok(ReserveOutcome::InProgress { .. }) => add(&self.in_progress),
            Ok(ReserveOutcome::BeyondHorizon) => add(&self.beyond_horizon),
            Err(e) => self.error(e),
        }
    }

    /// An `execute` that committed after taking over an expired lease, or beyond its
    /// horizon (its outcome does not say).
    pub(crate) fn executed_as(&self, takeover: bool, beyond: bool) {
        if takeover {
            add(&self.takeovers);
        }
        if beyond {
            add(&self.beyond_horizon);
        }
    }

    /// An `execute` (or `consume`).
    pub(crate) fn executed<E>(&self, result: &Result<ExecuteOutcome, ExecuteError<E>>) {
        match result {
            Ok(ExecuteOutcome::Executed(_)) => {
                add(&self.acquired);
                add(&self.finished);
            }
            Ok(ExecuteOutcome::Completed(_)) => add(&self.replays_completed),
            Ok(ExecuteOutcome::Failed(_)) => add(&self.replays_failed),
            Ok(ExecuteOutcome::Mismatch) => add(&self.mismatches),
            Ok(ExecuteOutcome::InProgress { .. }) => add(&self.in_progress),
            Ok(ExecuteOutcome::BeyondHorizon) => add(&self.beyond_horizon),
            Err(ExecuteError::Db(e)) => self.error(e),
            Err(ExecuteError::Closure(_)) => {}
        }
    }

    /// A `run`: only its error is counted (it answers no key).
    pub(crate) fn ran<T, E>(&self, result: &Result<T, ExecuteError<E>>) {
        if let Err(ExecuteError::Db(e)) = result {
            self.error(e);
        }
    }

    /// An owner's call: what it did when it succeeded (`finished`, `releases`, or nothing
    /// for `extend`), or its error.
    pub(crate) fn owned(&self, result: Result<(), &Error>, done: Owned) {
        match (result, done) {
            (Ok(()), Owned::Finished) => add(&self.finished),
            (Ok(()), Owned::Released) => add(&self.releases),
            (Ok(()), Owned::Extended) => {}
            (Err(e), _) => self.error(e),
        }
    }

    pub(crate) fn snapshot(&self, pool: &deadpool_postgres::Pool) -> PgStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let status = pool.status();
        PgStats {
            acquired: get(&self.acquired),
            takeovers: get(&self.takeovers),
            beyond_horizon: get(&self.beyond_horizon),
            replays_completed: get(&self.replays_completed),
            replays_failed: get(&self.replays_failed),
            mismatches: get(&self.mismatches),
            in_progress: get(&self.in_progress),
            fenced: get(&self.fenced),
            finished: get(&self.finished),
            releases: get(&self.releases),
            outcome_unknown: get(&self.outcome_unknown),
            retried: get(&self.retried),
            pool_connections: status.size,
            pool_max: status.max_size,
            pool_idle: status.available,
            pool_waiting: status.waiting,
            clock_skew_ms: 0,
        }
    }
}
