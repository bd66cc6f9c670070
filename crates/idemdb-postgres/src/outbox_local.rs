//! What this instance knows of the outbox beyond the database: its dispatchers' wake-up, when
//! each message it staged was committed (for the latency histogram), and what its dispatchers
//! did since connect.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

#[cfg(feature = "metrics")]
use idemdb_core::counters as names;
use idemdb_core::counters::Histogram;
use idemdb_core::dispatch::OutboxStats;
use idemdb_core::outbox::MessageId;

/// Commit times remembered at most: a message another instance publishes is never looked up,
/// so the map is emptied when full rather than grown.
const REMEMBERED: usize = 65_536;

/// What this instance saw first of a message it staged: its commit's return, or (when the
/// dispatcher was quicker than the caller) its publication.
enum Seen {
    Committed(Instant),
    Published,
}

#[derive(Default)]
pub(crate) struct OutboxLocal {
    /// Woken by every commit of this instance that staged (a permit is kept while no
    /// dispatcher waits, so no wake-up is lost).
    pub(crate) wake: tokio::sync::Notify,
    committed_at: Mutex<HashMap<MessageId, Seen>>,
    pub(crate) delivered: AtomicU64,
    pub(crate) retried: AtomicU64,
    pub(crate) parked: AtomicU64,
    pub(crate) fenced: AtomicU64,
    /// Dispatching rounds that failed on a database error (each retried after a pause).
    pub(crate) round_errors: AtomicU64,
    pub(crate) latency_us: Mutex<Histogram>,
}

impl OutboxLocal {
    /// After the commit that staged `ids`: remembers when, and wakes a dispatcher. A message
    /// already published (its dispatcher was quicker than this caller) is timed at 0.
    pub(crate) fn committed(&self, ids: &[MessageId]) {
        if ids.is_empty() {
            return;
        }
        let now = Instant::now();
        let mut early = 0;
        {
            let mut at = self.committed_at.lock();
            if at.len().saturating_add(ids.len()) > REMEMBERED {
                at.clear();
            }
            for id in ids {
                if let Some(Seen::Published) = at.remove(id) {
                    early += 1;
                } else {
                    at.insert(*id, Seen::Committed(now));
                }
            }
        }
        for _ in 0..early {
            self.record(Duration::ZERO);
        }
        self.wake.notify_one();
    }

    /// A message's publisher answered `Ok`: its commit-to-publish latency, if this instance
    /// committed it (a message published before its caller saw the commit return is timed
    /// then).
    pub(crate) fn published(&self, id: &MessageId) {
        let seen = {
            let mut at = self.committed_at.lock();
            match at.remove(id) {
                Some(Seen::Committed(when)) => Some(when),
                _ => {
                    if at.len() < REMEMBERED {
                        at.insert(*id, Seen::Published);
                    }
                    None
                }
            }
        };
        if let Some(when) = seen {
            self.record(when.elapsed());
        }
    }

    fn record(&self, took: Duration) {
        #[cfg(feature = "metrics")]
        metrics::histogram!(names::OUTBOX_PUBLISH_LATENCY_SECONDS).record(took.as_secs_f64());
        let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        self.latency_us.lock().record(us);
    }

    /// A round's marks: delivered, rescheduled, parked, and published but fenced.
    pub(crate) fn count(&self, delivered: u64, retried: u64, parked: u64, fenced: u64) {
        self.delivered.fetch_add(delivered, Ordering::Relaxed);
        self.retried.fetch_add(retried, Ordering::Relaxed);
        self.parked.fetch_add(parked, Ordering::Relaxed);
        self.fenced.fetch_add(fenced, Ordering::Relaxed);
        #[cfg(feature = "metrics")]
        {
            metrics::counter!(names::OUTBOX_DELIVERED_TOTAL).increment(delivered);
            metrics::counter!(names::OUTBOX_RETRIED_TOTAL).increment(retried);
            metrics::counter!(names::OUTBOX_PARKED_TOTAL).increment(parked);
            metrics::counter!(names::OUTBOX_FENCED_TOTAL).increment(fenced);
        }
    }

    /// What the dispatchers counted (the table's own counts left at 0).
    pub(crate) fn counted(&self) -> OutboxStats {
        let relaxed = Ordering::Relaxed;
        let mut stats = OutboxStats::default();
        stats.delivered = self.delivered.load(relaxed);
        stats.retried = self.retried.load(relaxed);
        stats.parked_since_open = self.parked.load(relaxed);
        stats.fenced = self.fenced.load(relaxed);
        stats.round_errors = self.round_errors.load(relaxed);
        stats.publish_latency_us = self.latency_us.lock().clone();
        stats
    }

    /// The gauges of the metrics facade, from a count of the table.
    pub(crate) fn gauge(&self, backlog: u64, parked: u64, oldest_age: Option<Duration>) {
        #[cfg(feature = "metrics")]
        {
            metrics::gauge!(names::OUTBOX_BACKLOG).set(backlog as f64);
            metrics::gauge!(names::OUTBOX_PARKED).set(parked as f64);
            metrics::gauge!(names::OUTBOX_OLDEST_AGE_SECONDS)
                .set(oldest_age.map_or(0.0, |a| a.as_secs_f64()));
        }
        #[cfg(not(feature = "metrics"))]
        let _ = (backlog, parked, oldest_age);
    }
}
