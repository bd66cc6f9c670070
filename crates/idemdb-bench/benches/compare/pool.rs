//! Caller threads kept alive across criterion's iterations, and a background write load.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Barrier};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::engines::Engine;
use crate::shared::callers::{Done, gather};
use crate::shared::keys::{Rng, fresh_id};
use crate::shared::nanos;

/// What each caller thread does per iteration.
#[derive(Clone, Copy, Debug)]
pub enum Work {
    /// reserve + complete of a fresh key.
    Lifecycle,
    /// one-shot execute of a fresh key with one business insert.
    Execute,
    /// reserve of a random completed key among `0..keys`.
    Replay { keys: u64 },
}

/// `threads` callers, each with its own session (its own SQLite connection), waiting for work.
pub struct Pool {
    commands: Vec<Sender<u64>>,
    done: Receiver<Done>,
    handles: Vec<JoinHandle<()>>,
}

impl Pool {
    pub fn new(engine: &Arc<dyn Engine>, threads: usize, work: Work) -> Pool {
        let (done_tx, done) = channel();
        let ready = Arc::new(Barrier::new(threads + 1));
        let mut commands = Vec::with_capacity(threads);
        let mut handles = Vec::with_capacity(threads);
        for t in 0..threads {
            let (tx, rx) = channel::<u64>();
            commands.push(tx);
            let engine = Arc::clone(engine);
            let done_tx = done_tx.clone();
            let ready = Arc::clone(&ready);
            handles.push(
                std::thread::Builder::new()
                    .name(format!("caller-{t}"))
                    .spawn(move || {
                        let mut session = engine.session();
                        drop(engine);
                        ready.wait();
                        let mut rng = Rng::new(t as u64 + 1);
                        while let Ok(n) = rx.recv() {
                            let record = !matches!(work, Work::Replay { .. });
                            let mut latencies =
                                Vec::with_capacity(if record { n as usize } else { 0 });
                            let start = Instant::now();
                            let mut before = start;
                            for _ in 0..n {
                                match work {
                                    Work::Lifecycle => session.lifecycle(fresh_id()),
                                    Work::Execute => session.execute(fresh_id()),
                                    Work::Replay { keys } => {
                                        std::hint::black_box(session.replay(rng.below(keys)));
                                    }
                                }
                                if record {
                                    let now = Instant::now();
                                    latencies.push(nanos(now - before));
                                    before = now;
                                }
                            }
                            let end = Instant::now();
                            if done_tx
                                .send(Done {
                                    start,
                                    end,
                                    latencies,
                                })
                                .is_err()
                            {
                                break;
                            }
                        }
                    })
                    .expect("spawn caller"),
            );
        }
        ready.wait();
        Pool {
            commands,
            done,
            handles,
        }
    }

    /// Every thread runs `per_thread` operations; returns the wall time from the first
    /// thread's start to the last one's end (thread wake-up before the start is not counted)
    /// and appends the per-operation latencies to `latencies`.
    pub fn run(&self, per_thread: u64, latencies: &mut Vec<u64>) -> Duration {
        for c in &self.commands {
            c.send(per_thread).expect("caller alive");
        }
        gather(&self.done, self.commands.len(), latencies)
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.commands.clear();
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

/// A write load: `threads` callers doing lifecycles of fresh keys until stopped.
pub struct Load {
    stop: Arc<AtomicBool>,
    lifecycles: Arc<AtomicU64>,
    handles: Vec<JoinHandle<()>>,
    started: Instant,
    process_cpu_start: Duration,
    this_thread_cpu_start: Duration,
}

/// What a load did while it ran.
pub struct LoadStats {
    pub wall: Duration,
    pub lifecycles: u64,
    /// CPU time of the whole process minus the measuring thread's: the load's cost (its
    /// callers, and whatever helper threads the engine runs).
    pub load_cpu: Duration,
    /// CPU time of the thread that started the load (the replay thread) meanwhile.
    pub measuring_thread_cpu: Duration,
}

impl Load {
    pub fn start(engine: &Arc<dyn Engine>, threads: usize) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let lifecycles = Arc::new(AtomicU64::new(0));
        let ready = Arc::new(Barrier::new(threads + 1));
        let handles = (0..threads)
            .map(|t| {
                let engine = Arc::clone(engine);
                let stop = Arc::clone(&stop);
                let lifecycles = Arc::clone(&lifecycles);
                let ready = Arc::clone(&ready);
                std::thread::Builder::new()
                    .name(format!("load-{t}"))
                    .spawn(move || {
                        let mut session = engine.session();
                        drop(engine);
                        ready.wait();
                        while !stop.load(Ordering::Relaxed) {
                            session.lifecycle(fresh_id());
                            lifecycles.fetch_add(1, Ordering::Relaxed);
                        }
                    })
                    .expect("spawn load")
            })
            .collect();
        ready.wait();
        Load {
            stop,
            lifecycles,
            handles,
            started: Instant::now(),
            process_cpu_start: process_cpu(),
            this_thread_cpu_start: thread_cpu(),
        }
    }

    /// Stops the load; call on the thread that started it.
    pub fn stop(self) -> LoadStats {
        let wall = self.started.elapsed();
        let process = process_cpu().saturating_sub(self.process_cpu_start);
        let this_thread = thread_cpu().saturating_sub(self.this_thread_cpu_start);
        let lifecycles = self.lifecycles.load(Ordering::Relaxed);
        self.stop.store(true, Ordering::Relaxed);
        for h in self.handles {
            let _ = h.join();
        }
        LoadStats {
            wall,
            lifecycles,
            load_cpu: process.saturating_sub(this_thread),
            measuring_thread_cpu: this_thread,
        }
    }
}

/// CPU time (user + system) of the whole process, from /proc/self/stat (10 ms ticks).
fn process_cpu() -> Duration {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return Duration::ZERO;
    };
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // `rest` starts at field 3 (state): field n is at index n - 3.
    let total = ticks(14 - 3) + ticks(15 - 3);
    Duration::from_millis(total * 10)
}

/// CPU time of the calling thread, from /proc/thread-self/schedstat (ns).
fn thread_cpu() -> Duration {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(Duration::ZERO, Duration::from_nanos)
}
