//! A write load of `THREADS` callers with every reserve timed, and one more thread beside it
//! doing timed expiry steps on a schedule.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Barrier, OnceLock};
use std::time::{Duration, Instant};

use crate::settings::THREADS;
use crate::shared::callers::load_caller;

/// One expiry step run beside a load: its start (ns since the load began), duration, and the
/// records it removed.
pub struct Step {
    pub start_ns: u64,
    pub took_ns: u64,
    pub records: u64,
}

/// What a load did: every reserve's start (ns since the load began) and latency.
pub struct LoadRun {
    pub reserves: Vec<(u64, u64)>,
    pub lifecycles: u64,
    pub wall: Duration,
    pub steps: Vec<Step>,
}

/// `THREADS` threads run `op` on fresh ids for `dur`, while `side` runs on one more thread
/// (given the load's start and a stop flag) and returns its steps.
pub fn run_load(
    dur: Duration,
    op: &(dyn Fn(u64) -> (Instant, Duration) + Sync),
    side: &(dyn Fn(Instant, &AtomicBool) -> Vec<Step> + Sync),
) -> LoadRun {
    let stop = AtomicBool::new(false);
    let ready = Barrier::new(THREADS + 2);
    let t0 = OnceLock::new();
    std::thread::scope(|s| {
        let callers: Vec<_> = (0..THREADS)
            .map(|_| s.spawn(|| load_caller(op, &ready, &t0, &stop)))
            .collect();
        let side = s.spawn(|| {
            ready.wait();
            side(*t0.get().expect("set before the barrier"), &stop)
        });
        let start = Instant::now();
        t0.set(start).expect("set once");
        ready.wait();
        std::thread::sleep(dur);
        stop.store(true, Ordering::Relaxed);
        let wall = start.elapsed();
        let mut reserves = Vec::new();
        for c in callers {
            reserves.extend(c.join().expect("caller"));
        }
        LoadRun {
            lifecycles: reserves.len() as u64,
            reserves,
            wall,
            steps: side.join().expect("side"),
        }
    })
}

/// Waits until `at` after `t0`, or until stopped; false if stopped.
pub fn sleep_until(t0: Instant, at: Duration, stop: &AtomicBool) -> bool {
    loop {
        if stop.load(Ordering::Relaxed) {
            return false;
        }
        let now = t0.elapsed();
        if now >= at {
            return true;
        }
        std::thread::sleep((at - now).min(Duration::from_millis(5)));
    }
}

pub fn no_side(_: Instant, _: &AtomicBool) -> Vec<Step> {
    Vec::new()
}

/// The schedule of `n` expiry steps spread over a load of `dur`: the first after a lead of
/// `dur / 16`, the last a lead before the end.
pub fn schedule(dur: Duration, n: usize, i: usize) -> Duration {
    let lead = dur / 16;
    let span = dur.saturating_sub(lead * 2);
    lead + span.mul_f64(i as f64 / n.max(1) as f64)
}
