//! In-process notification for `reserve_or_wait`: duplicates sleep on their key and are woken
//! when the owner's change is durable, instead of polling.

use std::collections::HashMap;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

use idemdb_core::scope::RecordKey;

#[derive(Default)]
pub(crate) struct WaitRegistry {
    keys: Mutex<HashMap<RecordKey, Arc<KeyWait>>>,
}

#[derive(Default)]
pub(crate) struct KeyWait {
    generation: Mutex<Generation>,
    changed: Condvar,
    waiters: Mutex<usize>,
}

#[derive(Default)]
struct Generation {
    /// Bumped on every durable change of the key.
    n: u64,
    /// Async waiters, woken (and dropped) at the next bump.
    wakers: Vec<Waker>,
}

/// A registration; dropping it unregisters.
pub(crate) struct WaitGuard<'a> {
    registry: &'a WaitRegistry,
    key: RecordKey,
    wait: Arc<KeyWait>,
}

impl WaitRegistry {
    pub(crate) fn register(&self, key: &RecordKey) -> WaitGuard<'_> {
        let wait = {
            let mut keys = self.keys.lock();
            let wait = Arc::clone(keys.entry(key.clone()).or_default());
            *wait.waiters.lock() += 1;
            wait
        };
        WaitGuard {
            registry: self,
            key: key.clone(),
            wait,
        }
    }

    /// Wakes the waiters of each key; called after the change is durable.
    pub(crate) fn notify<'a>(&self, changed: impl Iterator<Item = &'a RecordKey>) {
        let keys = self.keys.lock();
        if keys.is_empty() {
            return;
        }
        for key in changed {
            if let Some(wait) = keys.get(key) {
                let wakers = {
                    let mut generation = wait.generation.lock();
                    generation.n += 1;
                    std::mem::take(&mut generation.wakers)
                };
                wait.changed.notify_all();
                wakers.into_iter().for_each(Waker::wake);
            }
        }
    }
}

impl WaitGuard<'_> {
    /// The key's generation; read it before looking at the record.
    pub(crate) fn generation(&self) -> u64 {
        self.wait.generation.lock().n
    }

    /// Ready once the generation moved past `seen`; otherwise the task is woken when it does.
    pub(crate) fn poll_past(&self, seen: u64, cx: &mut Context<'_>) -> Poll<()> {
        let mut generation = self.wait.generation.lock();
        if generation.n != seen {
            return Poll::Ready(());
        }
        if !generation.wakers.iter().any(|w| w.will_wake(cx.waker())) {
            generation.wakers.push(cx.waker().clone());
        }
        Poll::Pending
    }

    /// Sleeps until the generation moves past `seen` or `until` passes. Returns whether it moved.
    pub(crate) fn wait_past(&self, seen: u64, until: Instant) -> bool {
        let mut generation = self.wait.generation.lock();
        while generation.n == seen {
            if self
                .wait
                .changed
                .wait_until(&mut generation, until)
                .timed_out()
            {
                return generation.n != seen;
            }
        }
        true
    }
}

impl Drop for WaitGuard<'_> {
    fn drop(&mut self) {
        let mut keys = self.registry.keys.lock();
        let mut waiters = self.wait.waiters.lock();
        *waiters -= 1;
        if *waiters == 0 {
            keys.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn notify_wakes_a_registered_waiter() {
        let registry = Arc::new(WaitRegistry::default());
        let key = RecordKey::from_stored(b"k");
        let guard = registry.register(&key);
        let seen = guard.generation();
        let r2 = Arc::clone(&registry);
        let k2 = key.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            r2.notify([&k2].into_iter());
        });
        assert!(guard.wait_past(seen, Instant::now() + Duration::from_secs(10)));
        t.join().unwrap();
        drop(guard);
        assert!(registry.keys.lock().is_empty());
    }

    #[test]
    fn times_out_without_notify() {
        let registry = WaitRegistry::default();
        let guard = registry.register(&RecordKey::from_stored(b"k"));
        let seen = guard.generation();
        assert!(!guard.wait_past(seen, Instant::now() + Duration::from_millis(10)));
    }
}
