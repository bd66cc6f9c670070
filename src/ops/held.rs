//! What the dispatcher knows of the pending table between rounds, so that a round costs the
//! messages it can send, not the backlog held back behind parked or retrying keys
//! (design.md §15.1, "What a round reads").
//!
//! Below `clear_below`, every pending message is one the dispatcher cannot send now: its key
//! is held (by a parked message or a retry not yet due), it waits for its own retry, or it
//! is published and waits for its mark. A round starts its scan there. The view is rebuilt
//! from the parked table and a scan from the start whenever it may have gone stale:
//! - an operator's commit parked, unparked or purged a message (`OutboxState::holds_changed`
//!   counts them, after their commit). The dispatcher's own parks and retries are of
//!   messages at or past the frontier, as every message it sends is; it adds the keys it
//!   parks;
//! - a retry below the frontier came due (`wake_ms`);
//! - the clock went back (a retry far ahead of the clock is due at once, `RetrySchedule::is_due`).
//!
//! Nothing below the frontier can change otherwise: messages are numbered in commit order and a
//! round reads only numbers every staging commit of which is durable (I24), so no message ever
//! appears below a number already read; a delivered message only leaves.

use std::collections::HashSet;

use redb::ReadableTable;

use crate::error::Error;
use crate::outbox_row::OutboxRow;

/// The dispatcher's view of the pending table below `clear_below`.
pub(super) struct Held {
    /// `OutboxState::holds_changed` when the view was built.
    generation: u64,
    /// The latest clock reading a message was judged by.
    judged_at_ms: u64,
    /// Every message numbered below this one cannot be sent now (module doc).
    clear_below: u64,
    /// Ordering keys held back: by a parked message, or by a message below `clear_below`
    /// waiting for its retry.
    keys: HashSet<Vec<u8>>,
    /// The earliest retry below `clear_below`: the view is stale once it is due.
    wake_ms: Option<u64>,
}

impl Held {
    /// A view that is rebuilt at its first use.
    pub(super) fn stale() -> Held {
        Held {
            generation: u64::MAX,
            judged_at_ms: u64::MAX,
            clear_below: 0,
            keys: HashSet::new(),
            wake_ms: None,
        }
    }

    /// Whether the view still holds at `now`, for holds counted `generation`; `is_due` is the
    /// retry schedule's rule.
    pub(super) fn holds(&self, generation: u64, now: u64, is_due: impl Fn(u64) -> bool) -> bool {
        generation == self.generation
            && now >= self.judged_at_ms
            && !self.wake_ms.is_some_and(is_due)
    }

    /// Starts again from the parked table: its messages' keys are held, and nothing is known
    /// of the pending table.
    pub(super) fn rebuild(
        &mut self,
        generation: u64,
        now: u64,
        parked: Option<&redb::ReadOnlyTable<u64, &'static [u8]>>,
    ) -> Result<(), Error> {
        self.generation = generation;
        self.judged_at_ms = now;
        self.clear_below = 0;
        self.wake_ms = None;
        self.keys.clear();
        if let Some(parked) = parked {
            for entry in parked.iter()? {
                let (seq, v) = entry?;
                if let Some(k) = OutboxRow::decode(seq.value(), v.value())?
                    .message
                    .ordering_key
                {
                    self.keys.insert(k);
                }
            }
        }
        Ok(())
    }

    /// Where a round's scan starts.
    pub(super) fn clear_below(&self) -> u64 {
        self.clear_below
    }

    /// The earliest retry below the frontier.
    pub(super) fn wake_ms(&self) -> Option<u64> {
        self.wake_ms
    }

    /// Whether `key` is held back below the frontier.
    pub(super) fn holds_key(&self, key: &[u8]) -> bool {
        self.keys.contains(key)
    }

    /// The dispatcher parked a message of `key` (at or past the frontier).
    pub(super) fn hold(&mut self, key: Vec<u8>) {
        self.keys.insert(key);
    }

    /// A round judged messages at `now`.
    pub(super) fn judged(&mut self, now: u64) {
        self.judged_at_ms = self.judged_at_ms.max(now);
    }

    /// Message `seq` cannot be sent now and every message before it from the frontier on was
    /// the same: the frontier moves past it. `waiting` is its retry time if it waits for one,
    /// and `key` its ordering key if that key is now held.
    pub(super) fn pass(&mut self, seq: u64, waiting: Option<u64>, key: Option<&[u8]>) {
        self.clear_below = self.clear_below.max(seq.saturating_add(1));
        if let Some(t) = waiting {
            self.wake_ms = Some(self.wake_ms.map_or(t, |w| w.min(t)));
        }
        if let Some(k) = key
            && !self.keys.contains(k)
        {
            self.keys.insert(k.to_vec());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_view_goes_stale_on_a_hold_change_a_due_retry_or_a_step_back() {
        let mut held = Held::stale();
        let due = |now: u64| move |t: u64| now >= t;
        assert!(!held.holds(0, 100, due(100)));
        held.rebuild(0, 100, None).unwrap();
        assert!(held.holds(0, 100, due(100)));
        held.pass(7, Some(150), Some(b"k"));
        held.pass(9, None, None);
        assert_eq!(held.clear_below(), 10);
        assert!(held.holds_key(b"k"));
        assert!(held.holds(0, 149, due(149)));
        assert!(!held.holds(0, 150, due(150)), "the retry came due");
        assert!(!held.holds(1, 120, due(120)), "a hold changed");
        held.judged(130);
        assert!(!held.holds(0, 120, due(120)), "the clock went back");
    }
}
