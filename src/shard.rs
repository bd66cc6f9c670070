//! Per-thread sharding for hot shared state: each thread keeps to one of `SHARDS` slots, so
//! threads on different cores write different cache lines.

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

pub(crate) const SHARDS: usize = 16;

/// This thread's shard, assigned round-robin on first use.
pub(crate) fn shard_index() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static INDEX: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    INDEX.with(|i| {
        if i.get() == usize::MAX {
            i.set(NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS);
        }
        i.get()
    })
}
