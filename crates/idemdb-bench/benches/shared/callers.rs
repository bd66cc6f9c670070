//! What the benches' caller threads share: an iteration's report and its gathering, and the
//! loop of a timed load's caller.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::{Barrier, OnceLock};
use std::time::{Duration, Instant};

use super::keys::fresh_id;
use super::nanos;

/// What one caller thread did in one iteration.
pub struct Done {
    pub start: Instant,
    pub end: Instant,
    /// Per-operation latencies in ns (empty where not recorded).
    pub latencies: Vec<u64>,
}

/// The reports of `callers` threads: the wall time from the first one's start to the last
/// one's end (thread wake-up before the start is not counted); their latencies are appended
/// to `latencies`.
pub fn gather(done: &Receiver<Done>, callers: usize, latencies: &mut Vec<u64>) -> Duration {
    let mut first: Option<Instant> = None;
    let mut last: Option<Instant> = None;
    for _ in 0..callers {
        let d = done.recv().expect("caller finished");
        first = Some(first.map_or(d.start, |f| f.min(d.start)));
        last = Some(last.map_or(d.end, |l| l.max(d.end)));
        latencies.extend_from_slice(&d.latencies);
    }
    match (first, last) {
        (Some(f), Some(l)) => l - f,
        _ => Duration::ZERO,
    }
}

/// One caller of a timed load: after `ready`, runs `op` on fresh ids until `stop`; every
/// op's start (ns since the load's start, `t0`) and latency.
pub fn load_caller(
    op: &(dyn Fn(u64) -> (Instant, Duration) + Sync),
    ready: &Barrier,
    t0: &OnceLock<Instant>,
    stop: &AtomicBool,
) -> Vec<(u64, u64)> {
    let mut out = Vec::with_capacity(1 << 12);
    ready.wait();
    let t0: Instant = *t0.get().expect("set before the barrier");
    while !stop.load(Ordering::Relaxed) {
        let (start, took) = op(fresh_id());
        out.push((nanos(start.saturating_duration_since(t0)), nanos(took)));
    }
    out
}
