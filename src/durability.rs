//! Tracks records whose latest state is visible to readers but not yet durable.
//!
//! The writer commits every transaction of a batch with `Durability::None`, which
//! readers see at once. Invariant: a key is marked here *before* such a commit makes it
//! visible and unmarked only after the batch's durability point returned (its log frame's
//! `fdatasync`, or a durable commit covering it). A reader that finds its key marked must not
//! answer from what it read: it waits for (or routes through) that point.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use parking_lot::{Condvar, Mutex};

use crate::error::Error;
use idemdb_core::scope::RecordKey;

#[derive(Default)]
pub(crate) struct DurabilityTracker {
    /// Number of marked keys; lets readers skip the lock in the common case.
    marked: AtomicUsize,
    /// The newest batch with a non-durable commit, keyed or not (a `run` has no key), and
    /// the newest durable batch: `begin_read` waits while the first is ahead.
    newest_marked: AtomicU64,
    newest_durable: AtomicU64,
    inner: Mutex<Inner>,
    durable: Condvar,
    /// Run once on the leader's thread right after the next batch that changes a record was
    /// applied (testing::after_next_commit): lets a test read before its durability point.
    #[cfg(feature = "test-hooks")]
    pub(crate) after_commit: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

#[derive(Default)]
struct Inner {
    undurable: HashMap<RecordKey, u64>,
    durable_seq: u64,
    failed: bool,
}

impl DurabilityTracker {
    /// Marks `keys` (none for a `run`) as about to become visible before batch `seq` is
    /// durable.
    pub(crate) fn mark<'a>(&self, keys: impl Iterator<Item = &'a RecordKey>, seq: u64) {
        let mut inner = self.inner.lock();
        for key in keys {
            if inner.undurable.insert(key.clone(), seq).is_none() {
                self.marked.fetch_add(1, Ordering::SeqCst);
            }
        }
        self.newest_marked.fetch_max(seq, Ordering::SeqCst);
    }

    /// Batch `seq` and every earlier one are durable.
    pub(crate) fn durable(&self, seq: u64) {
        let mut inner = self.inner.lock();
        inner.durable_seq = inner.durable_seq.max(seq);
        self.newest_durable.fetch_max(seq, Ordering::SeqCst);
        let before = inner.undurable.len();
        inner.undurable.retain(|_, s| *s > seq);
        self.marked
            .fetch_sub(before - inner.undurable.len(), Ordering::SeqCst);
        drop(inner);
        self.durable.notify_all();
    }

    /// A commit failed: what is marked may or may not be durable, and never will be known to
    /// this process. Readers of marked keys get an error.
    pub(crate) fn failed(&self) {
        self.inner.lock().failed = true;
        self.durable.notify_all();
    }

    /// The batch a reader of `key` must wait for, if the key's visible state is not durable.
    pub(crate) fn pending_for(&self, key: &RecordKey) -> Option<u64> {
        if self.marked.load(Ordering::SeqCst) == 0 {
            return None;
        }
        self.inner.lock().undurable.get(key).copied()
    }

    /// The newest batch whose non-durable commits a reader may have seen, if any is pending.
    pub(crate) fn pending_any(&self) -> Option<u64> {
        let newest = self.newest_marked.load(Ordering::SeqCst);
        (newest > self.newest_durable.load(Ordering::SeqCst)).then_some(newest)
    }

    /// Blocks until batch `seq` is durable.
    pub(crate) fn wait(&self, seq: u64) -> Result<(), Error> {
        crate::reentry::refuse_reentry()?;
        let mut inner = self.inner.lock();
        loop {
            if inner.durable_seq >= seq {
                return Ok(());
            }
            if inner.failed {
                return Err(Error::Poisoned(
                    "a commit failed, so this state may or may not be durable".into(),
                ));
            }
            self.durable.wait(&mut inner);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_clear_on_durable() {
        let t = DurabilityTracker::default();
        let k = RecordKey::from_stored(b"k");
        assert_eq!(t.pending_for(&k), None);
        t.mark([&k].into_iter(), 3);
        assert_eq!(t.pending_for(&k), Some(3));
        assert_eq!(t.pending_any(), Some(3));
        t.durable(2);
        assert_eq!(t.pending_for(&k), Some(3));
        t.durable(3);
        assert_eq!(t.pending_for(&k), None);
        assert_eq!(t.pending_any(), None);
        assert!(t.wait(3).is_ok());
    }

    #[test]
    fn failure_releases_waiters_with_an_error() {
        let t = DurabilityTracker::default();
        t.failed();
        assert!(matches!(t.wait(1), Err(Error::Poisoned(_))));
    }
}
