//! What a dispatcher of either store shares: its options, the retry schedule (exponential
//! backoff with jitter, capped), and the outbox's stats.

use std::time::Duration;

use crate::counters::Histogram;
use crate::outbox::PublishError;

/// How a dispatcher delivers (the embedded engine's `Dispatcher`, PostgreSQL's
/// `PgDispatcher`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DispatchOptions {
    /// Most messages handed to the publisher between two delivery commits (default 64).
    pub batch: usize,
    /// Failed attempts after which a message is parked (default 10).
    pub max_attempts: u32,
    /// The wait after the first failed attempt; it doubles with each (default 200 ms), with
    /// up to half of it added at random.
    pub backoff: Duration,
    /// The longest wait between attempts (default 60 s).
    pub max_backoff: Duration,
    /// How often an idle dispatcher looks anyway (default 1 s): commits wake it, so this only
    /// bounds what a lost wake-up could delay (over PostgreSQL, a message another instance
    /// staged while its own dispatcher is down).
    pub idle_check: Duration,
    /// Embedded engine: the longest a published message waits for the commit that marks it
    /// delivered (default 10 ms); [`batch`](Self::batch) published messages are marked at
    /// once. Marks share a commit, so that delivering costs the writer one commit per
    /// interval, not one per message; a crash re-sends what was published and not yet
    /// marked. Over PostgreSQL each claimed batch is marked by one commit.
    pub mark_interval: Duration,
    /// PostgreSQL: how long a claimed batch is its dispatcher's (default 30 s, by the
    /// server's clock). A dead instance's claims lapse after it; another instance then sends
    /// them again, and the first claimant's late "delivered" is fenced. Longer than a batch's
    /// publishing takes, or messages are sent twice.
    pub claim_lease: Duration,
}

impl Default for DispatchOptions {
    fn default() -> Self {
        DispatchOptions {
            batch: 64,
            max_attempts: 10,
            backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(60),
            idle_check: Duration::from_secs(1),
            mark_interval: Duration::from_millis(10),
            claim_lease: Duration::from_secs(30),
        }
    }
}

impl DispatchOptions {
    /// Sets [`batch`](Self::batch) (at least 1).
    pub fn batch(mut self, n: usize) -> Self {
        self.batch = n.max(1);
        self
    }

    /// Sets [`max_attempts`](Self::max_attempts) (at least 1).
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n.max(1);
        self
    }

    /// Sets [`backoff`](Self::backoff) and [`max_backoff`](Self::max_backoff).
    pub fn backoff(mut self, first: Duration, max: Duration) -> Self {
        self.backoff = first;
        self.max_backoff = max.max(first);
        self
    }

    /// Sets [`idle_check`](Self::idle_check).
    pub fn idle_check(mut self, every: Duration) -> Self {
        self.idle_check = every;
        self
    }

    /// Sets [`mark_interval`](Self::mark_interval).
    pub fn mark_interval(mut self, interval: Duration) -> Self {
        self.mark_interval = interval;
        self
    }

    /// Sets [`claim_lease`](Self::claim_lease) (at least 1 ms).
    pub fn claim_lease(mut self, lease: Duration) -> Self {
        self.claim_lease = lease.max(Duration::from_millis(1));
        self
    }
}

/// When a failed message is tried again, and when it is parked instead.
#[derive(Debug, Clone)]
pub struct RetrySchedule {
    first_ms: u64,
    cap_ms: u64,
    max_attempts: u32,
    rng: u64,
}

/// What a failed attempt leads to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AfterFailure {
    /// Tried again once the store's clock reaches this, ms.
    RetryAt(u64),
    /// Parked: a permanent error, or the attempt cap reached.
    Park,
}

impl RetrySchedule {
    /// The schedule of `options`, its jitter seeded from the wall clock's nanoseconds.
    pub fn new(options: &DispatchOptions) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        RetrySchedule {
            first_ms: millis(options.backoff),
            cap_ms: millis(options.max_backoff),
            max_attempts: options.max_attempts,
            rng: u64::from(nanos) | 1,
        }
    }

    /// What follows the failure `error` of attempt number `attempts` (counting it), at `now`.
    pub fn after(&mut self, error: &PublishError, attempts: u32, now: u64) -> AfterFailure {
        match error {
            PublishError::Permanent(_) => AfterFailure::Park,
            PublishError::Transient(_) if attempts >= self.max_attempts => AfterFailure::Park,
            PublishError::Transient(_) => {
                AfterFailure::RetryAt(now.saturating_add(self.delay(attempts)))
            }
        }
    }

    /// The wait before attempt `attempts + 1`: `backoff · 2^(attempts-1)`, capped, plus up
    /// to half of it at random (so that retries of many messages spread).
    pub fn delay(&mut self, attempts: u32) -> u64 {
        let shift = attempts.saturating_sub(1).min(62);
        let base = self.first_ms.saturating_mul(1u64 << shift).min(self.cap_ms);
        // xorshift64: jitter needs no cryptographic quality.
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        base.saturating_add(self.rng % (base / 2 + 1))
    }

    /// The furthest ahead any retry is scheduled: `max_backoff` plus its largest jitter.
    pub fn longest(&self) -> u64 {
        self.cap_ms.saturating_add(self.cap_ms / 2 + 1)
    }

    /// Whether a retry scheduled at `next_attempt_ms` is due at `now`. One scheduled further
    /// ahead than any backoff reaches ([`longest`](Self::longest)) was scheduled before the
    /// clock stepped back: due now, not after the step.
    pub fn is_due(&self, next_attempt_ms: u64, now: u64) -> bool {
        next_attempt_ms <= now || next_attempt_ms > now.saturating_add(self.longest())
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A panicking publisher's failure, in its own words: transient (the panic may not recur).
pub fn publisher_panicked(payload: &(dyn std::any::Any + Send)) -> PublishError {
    let what = payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-text payload".into());
    PublishError::Transient(format!("the publisher panicked: {what}"))
}

/// The outbox's state and what the dispatcher did since open (embedded) or since connect
/// (this PostgreSQL instance's dispatchers).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct OutboxStats {
    /// Messages staged by durable commits and not yet delivered (parked ones excluded).
    pub backlog: u64,
    /// Parked messages, waiting for an operator.
    pub parked: u64,
    /// How long the oldest undelivered (not parked) message has waited since its commit, by
    /// the store's clock; `None` with an empty backlog.
    pub oldest_undelivered_age: Option<Duration>,
    /// Messages delivered (published and marked) since open.
    pub delivered: u64,
    /// Publish attempts that failed and were scheduled again, since open.
    pub retried: u64,
    /// Messages parked since open (a permanent failure or the attempt cap).
    pub parked_since_open: u64,
    /// PostgreSQL: messages this instance published whose claim had lapsed and was taken by
    /// another instance before the mark (their "delivered" was fenced; the other instance
    /// sends them too). Always 0 embedded.
    pub fenced: u64,
    /// PostgreSQL: dispatching rounds that failed on a database error (a lost connection, a
    /// server restart) and were tried again after a pause. Always 0 embedded, where such an
    /// error ends the dispatcher.
    pub round_errors: u64,
    /// From the durable commit that staged a message to its publisher's `Ok`, µs (messages
    /// whose commit this process saw).
    pub publish_latency_us: Histogram,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap_with_at_most_half_of_it_added() {
        let options = DispatchOptions::default()
            .backoff(Duration::from_millis(100), Duration::from_millis(500))
            .max_attempts(5);
        let mut s = RetrySchedule::new(&options);
        for (attempts, base) in [(1, 100), (2, 200), (3, 400), (4, 500), (9, 500)] {
            for _ in 0..50 {
                let d = s.delay(attempts);
                assert!((base..=base + base / 2).contains(&d), "{attempts}: {d}");
            }
        }
        let transient = PublishError::Transient("x".into());
        assert!(matches!(s.after(&transient, 4, 1000), AfterFailure::RetryAt(t) if t >= 1500));
        assert_eq!(s.after(&transient, 5, 1000), AfterFailure::Park);
        let permanent = PublishError::Permanent("x".into());
        assert_eq!(s.after(&permanent, 1, 1000), AfterFailure::Park);
    }

    #[test]
    fn a_retry_beyond_any_backoff_is_due_at_once() {
        let options = DispatchOptions::default()
            .backoff(Duration::from_millis(100), Duration::from_millis(1000));
        let s = RetrySchedule::new(&options);
        assert!(s.is_due(1000, 1000));
        assert!(!s.is_due(1001, 1000));
        assert!(!s.is_due(1000 + s.longest(), 1000));
        assert!(s.is_due(1001 + s.longest(), 1000));
    }
}
