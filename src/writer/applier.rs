//! The applier thread: writes the overlay into redb every few milliseconds (settle.rs), and
//! takes the checkpoints due by age or asked for by size (checkpoint.rs), all off the batches'
//! critical path and off the committer thread, which leads them. Nothing depends on it for
//! correctness: every checkpoint writes whatever the overlay still holds, and a leader takes
//! a checkpoint itself once the log holds twice `checkpoint_bytes`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::group_commit::Writer;
use crate::config::APPLY_INTERVAL;

impl Writer {
    /// Starts the applier thread. Without it (it could not be spawned), checkpoints write the
    /// overlay alone.
    pub(super) fn start_applier(&self) {
        let Some(writer) = self.this.upgrade() else {
            return;
        };
        let spawned = std::thread::Builder::new()
            .name("idemdb-applier".into())
            .spawn(move || writer.run_applier(APPLY_INTERVAL));
        if let Ok(thread) = spawned {
            self.applier.lock().thread = Some(thread);
        }
    }

    /// Every `interval`: a checkpoint when one is due (by age, or asked for by size), else a
    /// pass that writes the overlay into redb.
    fn run_applier(self: Arc<Self>, interval: Duration) {
        lower_own_priority();
        let every = self.config.checkpoint_interval;
        let mut next_checkpoint = Instant::now() + every;
        let mut state = self.applier.lock();
        loop {
            // Before waiting too: a stop asked for before this thread first took the lock
            // notified nobody (a database closed right after its open).
            if state.stop {
                return;
            }
            if !state.checkpoint_requested {
                let wake = next_checkpoint.min(Instant::now() + interval);
                self.apply_wake.wait_until(&mut state, wake);
            }
            if state.stop {
                return;
            }
            let due = std::mem::take(&mut state.checkpoint_requested)
                || Instant::now() >= next_checkpoint;
            drop(state);
            // A failure poisoned the engine: later passes do nothing.
            if due {
                let _ = self.checkpoint();
                next_checkpoint = Instant::now() + every;
            } else {
                let _ = self.settle();
            }
            state = self.applier.lock();
        }
    }

    /// Stops the applier thread and waits for it: at close, before the last checkpoint.
    pub(crate) fn stop_applier(&self) {
        let thread = {
            let mut state = self.applier.lock();
            state.stop = true;
            self.apply_wake.notify_one();
            state.thread.take()
        };
        if let Some(t) = thread {
            // A panic in it would have been in redb or here; the checkpoint at close follows.
            let _ = t.join();
        }
    }
}

/// The applier's work is off the callers' path; its CPU bursts (a pass over the overlay every
/// few ms, a checkpoint's commit) must not delay a caller whose `fdatasync` just returned, which
/// on a 2-core machine they did. Not the lowest priority: its passes hold redb's write lock,
/// which a closure's batch waits for, and other processes' CPU-bound work would starve it
/// (design.md §5.7 has both measurements). For this thread only (on Linux a thread's nice
/// value is its own). Best effort: a refusal leaves the priority as it was.
fn lower_own_priority() {
    #[cfg(target_os = "linux")]
    {
        use rustix::process::{getpriority_process, setpriority_process};
        let me = Some(rustix::thread::gettid());
        // Relative to what it inherited from the thread that opened the database.
        if let Ok(nice) = getpriority_process(me) {
            let _ = setpriority_process(me, (nice + crate::config::APPLIER_NICE).min(19));
        }
    }
}
