//! The outbox's in-memory state: the next sequence number to stage under, the wake-up of the
//! dispatcher by each durable commit that staged, when those commits became durable (for the
//! commit-to-publish latency), and the delivery counters.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

#[cfg(feature = "metrics")]
use idemdb_core::counters as names;
use idemdb_core::counters::Histogram;
use redb::{ReadableDatabase, ReadableTable, TableError};

use crate::engine_tables::{OUTBOX, OUTBOX_PARKED};
use crate::error::Error;

/// Durable staging commits remembered for the latency: beyond this many undelivered, the
/// oldest are forgotten (their messages are then not timed).
const REMEMBERED_COMMITS: usize = 4096;

#[derive(Default)]
pub(crate) struct OutboxState {
    /// The sequence number the next staged message takes. Above every row in the outbox
    /// tables (set at open); numbers of rolled-back stagings are skipped, never reused.
    next_seq: AtomicU64,
    /// Every message numbered up to this one was staged by a durable commit (or rolled back):
    /// batches become durable in order, each announced after its durability point.
    durable_up_to: AtomicU64,
    /// Bumped by every durable commit that staged, and by `poke`.
    wakes: Mutex<u64>,
    woken: Condvar,
    /// (lowest, highest seq a durable batch staged, when it became durable), oldest first.
    durable_at: Mutex<VecDeque<(u64, u64, Instant)>>,
    /// An operator's commits that parked, unparked or purged messages, counted after each
    /// commit: the dispatcher's view of the held keys is stale when this moved (I27).
    holds_changed: AtomicU64,
    /// A dispatcher runs: at most one per database, for the per-key order.
    dispatching: AtomicBool,
    pub(crate) delivered: AtomicU64,
    pub(crate) retried: AtomicU64,
    pub(crate) parked: AtomicU64,
    /// Durable commit to the publisher's `Ok`, µs.
    pub(crate) latency_us: Mutex<Histogram>,
}

impl OutboxState {
    /// After open: stage above `highest` (the highest seq stored, if any).
    pub(crate) fn start_above(&self, highest: Option<u64>) {
        let next = highest.map_or(1, |h| h.saturating_add(1));
        self.next_seq.fetch_max(next, Ordering::Relaxed);
        // What the file holds at open is durable.
        self.durable_up_to.fetch_max(next - 1, Ordering::Release);
    }

    /// A sequence number for one staged message. Called on the leader's thread only, so
    /// numbers follow commit order.
    pub(crate) fn allocate(&self) -> u64 {
        self.next_seq.fetch_add(1, Ordering::Relaxed)
    }

    /// The number the next staged message will take.
    pub(crate) fn peek_next(&self) -> u64 {
        self.next_seq.load(Ordering::Relaxed)
    }

    /// A batch that staged the messages `lowest..=highest` is durable: wake the dispatcher.
    pub(crate) fn committed(&self, lowest: u64, highest: u64) {
        self.durable_up_to.fetch_max(highest, Ordering::Release);
        let mut at = self.durable_at.lock();
        if at.len() == REMEMBERED_COMMITS {
            at.pop_front();
        }
        at.push_back((lowest, highest, Instant::now()));
        drop(at);
        self.poke();
    }

    /// Every message numbered up to this was staged by a durable commit (I24).
    pub(crate) fn durable_up_to(&self) -> u64 {
        self.durable_up_to.load(Ordering::Acquire)
    }

    /// An operator's commit parked, unparked or purged messages; called once it is visible.
    pub(crate) fn hold_changed(&self) {
        self.holds_changed.fetch_add(1, Ordering::AcqRel);
    }

    /// How many such commits there were.
    pub(crate) fn holds_changed(&self) -> u64 {
        self.holds_changed.load(Ordering::Acquire)
    }

    /// Wakes the dispatcher (a commit, an operator's retry, a stop).
    pub(crate) fn poke(&self) {
        *self.wakes.lock() += 1;
        self.woken.notify_all();
    }

    /// The wake-up count now.
    pub(crate) fn wakes(&self) -> u64 {
        *self.wakes.lock()
    }

    /// Sleeps until a wake-up after `seen` or `timeout`; the count then.
    pub(crate) fn wait(&self, seen: u64, timeout: Duration) -> u64 {
        let mut wakes = self.wakes.lock();
        if *wakes == seen {
            let _ = self.woken.wait_for(&mut wakes, timeout);
        }
        *wakes
    }

    /// Times the publish of message `seq`: from its commit's durability point, when this
    /// process saw that commit.
    pub(crate) fn published(&self, seq: u64) {
        let at = self.durable_at.lock();
        let first = at.partition_point(|(_, highest, _)| *highest < seq);
        if let Some((_, _, when)) = at.get(first).filter(|(lowest, _, _)| *lowest <= seq) {
            let took = when.elapsed();
            #[cfg(feature = "metrics")]
            metrics::histogram!(names::OUTBOX_PUBLISH_LATENCY_SECONDS).record(took.as_secs_f64());
            let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
            self.latency_us.lock().record(us);
        }
    }

    /// Counts what one delivery commit did (and exports it, feature `metrics`).
    pub(crate) fn count(&self, delivered: u64, retried: u64, parked: u64) {
        self.delivered.fetch_add(delivered, Ordering::Relaxed);
        self.retried.fetch_add(retried, Ordering::Relaxed);
        self.parked.fetch_add(parked, Ordering::Relaxed);
        #[cfg(feature = "metrics")]
        {
            metrics::counter!(names::OUTBOX_DELIVERED_TOTAL).increment(delivered);
            metrics::counter!(names::OUTBOX_RETRIED_TOTAL).increment(retried);
            metrics::counter!(names::OUTBOX_PARKED_TOTAL).increment(parked);
        }
    }

    /// Exports the backlog as the dispatcher last read it (feature `metrics`; a no-op
    /// without).
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn gauge(&self, backlog: u64, parked: u64, oldest_age: Option<Duration>) {
        #[cfg(feature = "metrics")]
        {
            metrics::gauge!(names::OUTBOX_BACKLOG).set(backlog as f64);
            metrics::gauge!(names::OUTBOX_PARKED).set(parked as f64);
            metrics::gauge!(names::OUTBOX_OLDEST_AGE_SECONDS)
                .set(oldest_age.map_or(0.0, |a| a.as_secs_f64()));
        }
    }

    /// Forgets the durable times of commits whose messages are all below `seq` (delivered or
    /// parked).
    pub(crate) fn forget_below(&self, seq: u64) {
        let mut at = self.durable_at.lock();
        while at.front().is_some_and(|(_, highest, _)| *highest < seq) {
            at.pop_front();
        }
    }

    /// Claims the database's one dispatcher; false if one runs.
    pub(crate) fn claim_dispatcher(&self) -> bool {
        !self.dispatching.swap(true, Ordering::AcqRel)
    }

    pub(crate) fn release_dispatcher(&self) {
        self.dispatching.store(false, Ordering::Release);
    }
}

/// The highest sequence number either outbox table holds (after recovery, at open).
pub(crate) fn highest_staged(db: &redb::Database) -> Result<Option<u64>, Error> {
    let read = db.begin_read()?;
    let mut highest = None;
    for table in [OUTBOX, OUTBOX_PARKED] {
        let table = match read.open_table(table) {
            Ok(t) => t,
            Err(TableError::TableDoesNotExist(_)) => continue,
            Err(e) => return Err(e.into()),
        };
        if let Some((seq, _)) = table.last()? {
            highest = highest.max(Some(seq.value()));
        }
    }
    Ok(highest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_start_above_what_is_stored_and_never_go_back() {
        let s = OutboxState::default();
        s.start_above(Some(41));
        assert_eq!(s.allocate(), 42);
        s.start_above(Some(10));
        assert_eq!(s.allocate(), 43);
        let fresh = OutboxState::default();
        fresh.start_above(None);
        assert_eq!(fresh.allocate(), 1);
    }

    #[test]
    fn a_delivery_is_timed_from_the_commit_that_staged_it() {
        let s = OutboxState::default();
        s.committed(4, 5);
        s.committed(7, 9);
        s.published(8);
        s.published(6); // staged by a commit this process did not see (recovered): not timed
        s.published(12);
        assert_eq!(s.latency_us.lock().count, 1);
        s.forget_below(6);
        assert_eq!(s.durable_at.lock().len(), 1);
    }

    #[test]
    fn a_wait_returns_at_a_wake_up_or_the_timeout() {
        let s = std::sync::Arc::new(OutboxState::default());
        let seen = s.wakes();
        assert_eq!(s.wait(seen, Duration::from_millis(5)), seen);
        let s2 = std::sync::Arc::clone(&s);
        let t = std::thread::spawn(move || s2.wait(seen, Duration::from_secs(30)));
        std::thread::sleep(Duration::from_millis(20));
        s.poke();
        assert_eq!(t.join().unwrap(), seen + 1);
    }
}
