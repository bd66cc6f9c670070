//! The dispatcher: a thread that hands durable staged messages to the caller's publisher, in
//! commit order per ordering key, and marks them delivered in a later commit. Woken by every
//! durable commit that staged; a fallback timer covers the rest (design.md §15).

use std::collections::{BTreeSet, HashSet};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use redb::{ReadableDatabase, ReadableTable, ReadableTableMetadata};

use super::held::Held;
use super::outbox::open;
use crate::db::IdemDb;
use crate::engine_tables::{OUTBOX, OUTBOX_PARKED};
use crate::error::Error;
use crate::outbox_row::OutboxRow;
use idemdb_core::dispatch::{AfterFailure, DispatchOptions, RetrySchedule, publisher_panicked};
use idemdb_core::outbox::Publish;

/// Delivers the outbox of one [`IdemDb`] through a publisher, on a thread of its own, until
/// stopped or dropped. One per database at a time (per-key order needs one sender).
///
/// Each message goes to the publisher after the commit that staged it is durable; once the
/// publisher returns `Ok`, a later commit marks it delivered. A crash between the two sends
/// it again after reopen: delivery is at least once, with the message's stable
/// [`MessageId`](crate::MessageId) for the receiver to drop the duplicate (semantics.md §13).
/// A transient error is retried with exponential backoff and jitter up to
/// [`DispatchOptions::max_attempts`]; then, or at once on a permanent error, the message is
/// parked, holding back only later messages of its own ordering key.
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use idemdb::{Dispatcher, DispatchOptions, IdemDb, Key, Message, Outcome, Scope};
/// # let dir = tempfile::tempdir()?;
/// let db = Arc::new(IdemDb::open(dir.path().join("db"))?);
/// let sent = Arc::new(Mutex::new(Vec::new()));
/// let log = Arc::clone(&sent);
/// let dispatcher = Dispatcher::start(Arc::clone(&db), move |m: &idemdb::OutboxMessage| {
///     log.lock().unwrap().push((m.id, m.payload.clone())); // e.g. POST it, with m.id
///     Ok(())
/// }, DispatchOptions::default())?;
/// db.execute(&Scope::new("order", "u1"), &Key::new("k1"), b"req", |tx| {
///     tx.stage(Message::new("order-created", b"k1".to_vec()))?;
///     Ok::<_, idemdb::Error>(Outcome::Completed(b"201".to_vec()))
/// })?;
/// while db.outbox_stats()?.delivered == 0 {
///     std::thread::sleep(std::time::Duration::from_millis(1));
/// }
/// dispatcher.stop()?;
/// assert_eq!(sent.lock().unwrap()[0].1, b"k1");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Dispatcher {
    db: Arc<IdemDb>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<(), Error>>>,
}

impl std::fmt::Debug for Dispatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatcher")
            .field("running", &self.is_running())
            .finish_non_exhaustive()
    }
}

impl Dispatcher {
    /// Starts delivering `db`'s outbox through `publisher`. Refused with
    /// [`Error::DispatcherRunning`] while another dispatcher of the same database runs.
    pub fn start(
        db: Arc<IdemDb>,
        publisher: impl Publish,
        options: DispatchOptions,
    ) -> Result<Dispatcher, Error> {
        if !db.engine.outbox.claim_dispatcher() {
            return Err(Error::DispatcherRunning);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let schedule = RetrySchedule::new(&options);
        let run = Delivery {
            schedule,
            db: Arc::clone(&db),
            stop: Arc::clone(&stop),
            options,
            publisher: Box::new(publisher),
            unmarked: BTreeSet::new(),
            unmarked_since: None,
            held: Held::stale(),
        };
        let thread = std::thread::Builder::new()
            .name("idemdb-outbox".into())
            .spawn(move || run.run())
            .map_err(|e| {
                db.engine.outbox.release_dispatcher();
                Error::ThreadSpawn {
                    thread: "idemdb-outbox",
                    source: Arc::new(e),
                }
            })?;
        Ok(Dispatcher {
            db,
            stop,
            thread: Some(thread),
        })
    }

    /// Whether its thread still runs (it ends on a storage error, or after `stop`).
    pub fn is_running(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// Stops after the message being published (if any) and its delivery commit; the error
    /// that ended the thread early, if one did.
    pub fn stop(mut self) -> Result<(), Error> {
        self.halt()
    }

    fn halt(&mut self) -> Result<(), Error> {
        self.stop.store(true, Ordering::Release);
        self.db.engine.outbox.poke();
        match self.thread.take().map(JoinHandle::join) {
            None => Ok(()),
            Some(Ok(result)) => result,
            Some(Err(_)) => Err(Error::Internal("the outbox dispatcher panicked".into())),
        }
    }
}

impl Drop for Dispatcher {
    fn drop(&mut self) {
        let _ = self.halt();
    }
}

/// The dispatcher thread's state.
struct Delivery {
    db: Arc<IdemDb>,
    stop: Arc<AtomicBool>,
    options: DispatchOptions,
    publisher: Box<dyn Publish>,
    schedule: RetrySchedule,
    /// Published, their delivery commit not yet made: skipped by the reads, counted as sent
    /// for their key's order.
    unmarked: BTreeSet<u64>,
    /// When the oldest of them was published.
    unmarked_since: Option<Instant>,
    /// The pending table as far as the rounds have read it (held.rs).
    held: Held,
}

/// What one round read: the messages due, in commit order, and when the next is due.
struct Round {
    due: Vec<OutboxRow>,
    next_due_ms: Option<u64>,
}

/// The failures of one round, committed with the marks waiting.
#[derive(Default)]
struct Decided {
    retry: Vec<OutboxRow>,
    park: Vec<OutboxRow>,
}

impl Delivery {
    fn run(mut self) -> Result<(), Error> {
        let result = self.rounds();
        self.db.engine.outbox.release_dispatcher();
        result
    }

    fn rounds(&mut self) -> Result<(), Error> {
        let db = Arc::clone(&self.db);
        let state = &db.engine.outbox;
        let mut seen = state.wakes();
        while !self.stop.load(Ordering::Acquire) {
            // Read the wake-up count first: a commit after it wakes the next wait.
            seen = state.wakes().max(seen);
            if self.marks_due() {
                self.commit(Decided::default())?;
            }
            let now = self.db.engine.clock.now_ms();
            let round = self.read(now)?;
            if round.due.is_empty() {
                let mut wait = round
                    .next_due_ms
                    .map_or(self.options.idle_check, |t| {
                        Duration::from_millis(t.saturating_sub(now))
                    })
                    .min(self.options.idle_check);
                if let Some(since) = self.unmarked_since {
                    wait = wait.min(self.options.mark_interval.saturating_sub(since.elapsed()));
                }
                seen = state.wait(seen, wait);
                continue;
            }
            let decided = self.publish(round.due, now);
            if !decided.retry.is_empty() || !decided.park.is_empty() {
                self.commit(decided)?;
            }
        }
        // Stopping: what was published is marked before the thread ends.
        if !self.unmarked.is_empty() {
            self.commit(Decided::default())?;
        }
        Ok(())
    }

    /// Whether the published messages waiting for their mark should be marked now.
    fn marks_due(&self) -> bool {
        self.unmarked_since.is_some_and(|since| {
            self.unmarked.len() >= self.options.batch
                || since.elapsed() >= self.options.mark_interval
        })
    }

    /// The messages due now, oldest commit first, skipping every ordering key held back by a
    /// parked message or an earlier message waiting for its retry (per-key order, I25). The
    /// scan starts where the last round's left off unless that view went stale (held.rs).
    fn read(&mut self, now: u64) -> Result<Round, Error> {
        let state = &self.db.engine.outbox;
        // Counts and numbers first, then the snapshot: a hold changed after the count is seen
        // next round; every row numbered up to `durable` that the snapshot holds was staged by
        // a durable commit (I24), rows above it wait for their batch's wake-up. No wait on the
        // durability tracker: a closure's non-durable commit of the callers' next batch is
        // always pending under load.
        let generation = state.holds_changed();
        let durable = state.durable_up_to();
        let read = self.db.engine.db.begin_read()?;
        let parked = open(&read, OUTBOX_PARKED)?;
        let parked_n = match &parked {
            Some(t) => t.len()?,
            None => 0,
        };
        let schedule = &self.schedule;
        if !self
            .held
            .holds(generation, now, |t| schedule.is_due(t, now))
        {
            self.held.rebuild(generation, now, parked.as_ref())?;
        }
        self.held.judged(now);
        let mut round = Round {
            due: Vec::new(),
            next_due_ms: self.held.wake_ms(),
        };
        let Some(pending) = open(&read, OUTBOX)? else {
            state.gauge(0, parked_n, None);
            return Ok(round);
        };
        let oldest = match pending.first()? {
            Some((seq, v)) => Some(
                OutboxRow::decode(seq.value(), v.value())?
                    .message
                    .staged_at_ms,
            ),
            None => None,
        };
        let age = oldest.map(|at| Duration::from_millis(now.saturating_sub(at)));
        state.gauge(pending.len()?, parked_n, age);
        // Keys held by retries above the frontier, this round only.
        let mut held_here: HashSet<Vec<u8>> = HashSet::new();
        for entry in pending.range(self.held.clear_below()..)? {
            let (seq, v) = entry?;
            let seq = seq.value();
            if seq > durable {
                break;
            }
            // Until the first message due, everything read moves the frontier past it.
            let behind = round.due.is_empty();
            if self.unmarked.contains(&seq) {
                if behind {
                    self.held.pass(seq, None, None);
                }
                continue;
            }
            let row = OutboxRow::decode(seq, v.value())?;
            let key = row.message.ordering_key.as_deref();
            if key.is_some_and(|k| self.held.holds_key(k) || held_here.contains(k)) {
                if behind {
                    self.held.pass(seq, None, None);
                }
                continue;
            }
            if !self.schedule.is_due(row.next_attempt_ms, now) {
                let at = row.next_attempt_ms;
                round.next_due_ms = Some(round.next_due_ms.map_or(at, |t| t.min(at)));
                if behind {
                    self.held.pass(seq, Some(at), key);
                } else if let Some(k) = key {
                    held_here.insert(k.to_vec());
                }
                continue;
            }
            round.due.push(row);
            if round.due.len() >= self.options.batch {
                break;
            }
        }
        Ok(round)
    }

    /// Hands each due message to the publisher, in order; after a failure, later messages of
    /// the same ordering key wait for the next round.
    fn publish(&mut self, due: Vec<OutboxRow>, now: u64) -> Decided {
        let mut decided = Decided::default();
        let mut failed: HashSet<Vec<u8>> = HashSet::new();
        for mut row in due {
            // Marks due end the round (the rest is read again next round): a published
            // message waits at most `mark_interval` plus one publish, or `batch` messages.
            if self.stop.load(Ordering::Acquire) || self.marks_due() {
                break;
            }
            let key = row.message.ordering_key.clone();
            if key.as_ref().is_some_and(|k| failed.contains(k)) {
                continue;
            }
            let publisher = &mut self.publisher;
            let sent = catch_unwind(AssertUnwindSafe(|| publisher.publish(&row.message)))
                .unwrap_or_else(|p| Err(publisher_panicked(&*p)));
            let error = match sent {
                Ok(()) => {
                    self.db.engine.outbox.published(row.message.seq);
                    self.unmarked.insert(row.message.seq);
                    self.unmarked_since.get_or_insert_with(Instant::now);
                    continue;
                }
                Err(e) => e,
            };
            row.message.attempts = row.message.attempts.saturating_add(1);
            // The backoff runs from the failure, not from the round's start.
            let failed_at = self.db.engine.clock.now_ms().max(now);
            match self.schedule.after(&error, row.message.attempts, failed_at) {
                AfterFailure::RetryAt(at) => {
                    row.next_attempt_ms = at;
                    row.message.last_error = Some(error.into_reason());
                    decided.retry.push(row);
                }
                AfterFailure::Park => {
                    row.message.last_error = Some(error.into_reason());
                    decided.park.push(row);
                }
            }
            if let Some(k) = key {
                failed.insert(k);
            }
        }
        decided
    }

    /// One commit: the published messages removed (marked delivered), failed ones
    /// rescheduled or parked.
    fn commit(&mut self, decided: Decided) -> Result<(), Error> {
        let delivered: Vec<u64> = std::mem::take(&mut self.unmarked).into_iter().collect();
        self.unmarked_since = None;
        let (n_delivered, n_retry) = (delivered.len(), decided.retry.len());
        let highest = delivered.last().copied();
        // Its own parks and retries are of messages at or past the frontier (every message
        // due is): the view below it stands, and the parked keys join it.
        let parked_keys: Vec<Vec<u8>> = decided
            .park
            .iter()
            .filter_map(|row| row.message.ordering_key.clone())
            .collect();
        let parked = self.db.outbox_write(move |tx| {
            tx.outbox_delivered(&delivered)?;
            for row in &decided.retry {
                tx.outbox_retry_later(row)?;
            }
            let mut parked = 0u64;
            for row in &decided.park {
                parked += u64::from(tx.outbox_park(row)?);
            }
            Ok(parked)
        })?;
        for key in parked_keys {
            self.held.hold(key);
        }
        let state = &self.db.engine.outbox;
        state.count(n_delivered as u64, n_retry as u64, parked);
        if let Some(h) = highest {
            state.forget_below(h);
        }
        Ok(())
    }
}
