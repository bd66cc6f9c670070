//! Caller threads kept alive across criterion's iterations (as in `benches/compare/pool.rs`),
//! and a timed load beside which a compaction runs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Barrier, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::shared::callers::{Done, gather, load_caller};
use crate::shared::keys::fresh_id;
use crate::shared::nanos;

/// What a caller does once: one lifecycle of the fresh key it is given.
pub type Op = Arc<dyn Fn(u64) + Send + Sync>;

/// `threads` callers waiting for work.
pub struct Callers {
    commands: Vec<Sender<u64>>,
    done: Receiver<Done>,
    handles: Vec<JoinHandle<()>>,
}

impl Callers {
    pub fn new(threads: usize, op: Op) -> Callers {
        let (done_tx, done) = channel();
        let mut commands = Vec::with_capacity(threads);
        let mut handles = Vec::with_capacity(threads);
        for t in 0..threads {
            let (tx, rx) = channel::<u64>();
            commands.push(tx);
            let op = Arc::clone(&op);
            let done_tx = done_tx.clone();
            handles.push(
                std::thread::Builder::new()
                    .name(format!("caller-{t}"))
                    .spawn(move || {
                        while let Ok(n) = rx.recv() {
                            let mut latencies = Vec::with_capacity(n as usize);
                            let start = Instant::now();
                            let mut before = start;
                            for _ in 0..n {
                                op(fresh_id());
                                let now = Instant::now();
                                latencies.push(nanos(now - before));
                                before = now;
                            }
                            let end = Instant::now();
                            let done = Done {
                                start,
                                end,
                                latencies,
                            };
                            if done_tx.send(done).is_err() {
                                break;
                            }
                        }
                    })
                    .expect("spawn caller"),
            );
        }
        Callers {
            commands,
            done,
            handles,
        }
    }

    /// Every thread runs `per_thread` lifecycles; returns the wall time from the first
    /// thread's start to the last one's end and appends the latencies to `latencies`.
    pub fn run(&self, per_thread: u64, latencies: &mut Vec<u64>) -> Duration {
        for c in &self.commands {
            c.send(per_thread).expect("caller alive");
        }
        gather(&self.done, self.commands.len(), latencies)
    }
}

impl Drop for Callers {
    fn drop(&mut self) {
        self.commands.clear();
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

/// What a timed load did: every reserve's start (ns since the load began) and latency, and
/// when the side task (the compaction) ran.
pub struct LoadRun {
    pub reserves: Vec<(u64, u64)>,
    pub wall: Duration,
    /// Start and end of the side task, ns since the load began.
    pub side: Option<(u64, u64)>,
}

/// `threads` threads run `op` on fresh ids (returning the reserve's start and latency) for at
/// least `min`. With a side task `(lead, f)`, `f` runs on this thread `lead` after the load
/// began, and the load goes on until `lead` after `f` returned.
pub fn run_load(
    threads: usize,
    min: Duration,
    op: &(dyn Fn(u64) -> (Instant, Duration) + Sync),
    side: Option<(Duration, &dyn Fn())>,
) -> LoadRun {
    let stop = AtomicBool::new(false);
    let ready = Barrier::new(threads + 1);
    let t0 = OnceLock::new();
    std::thread::scope(|s| {
        let callers: Vec<_> = (0..threads)
            .map(|_| s.spawn(|| load_caller(op, &ready, &t0, &stop)))
            .collect();
        let start = Instant::now();
        t0.set(start).expect("set once");
        ready.wait();
        let mut until = min;
        let side = side.map(|(lead, f)| {
            std::thread::sleep(lead);
            let a = start.elapsed();
            f();
            let b = start.elapsed();
            until = until.max(b + lead);
            (nanos(a), nanos(b))
        });
        if let Some(rest) = until.checked_sub(start.elapsed()) {
            std::thread::sleep(rest);
        }
        stop.store(true, Ordering::Relaxed);
        let wall = start.elapsed();
        let mut reserves = Vec::new();
        for c in callers {
            reserves.extend(c.join().expect("caller"));
        }
        LoadRun {
            reserves,
            wall,
            side,
        }
    })
}
