//! Caller threads kept alive across criterion's iterations, what they spend, and a background
//! write load.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Barrier};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::interface::Engine;
use crate::shared::callers::{Done, gather};
use crate::shared::cpu;
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
    runs: Runs<Sender<u64>>,
    handles: Vec<JoinHandle<()>>,
}

/// Callers' command channels, where they report, and what their runs spent: a [`Pool`]'s
/// threads' or the async cells' tasks' (`tasks.rs`).
pub struct Runs<C> {
    commands: Vec<C>,
    done: Receiver<Done>,
    /// The engine's server processes (none for an embedded engine).
    server_pids: Vec<u32>,
    /// The engine's durable commits so far, where it counts them.
    commits: Box<dyn Fn() -> Option<u64> + Send>,
    spent: Spent,
}

/// What a pool's runs took, summed over them.
#[derive(Clone, Copy, Default)]
pub struct Spent {
    pub ops: u64,
    pub wall: Duration,
    /// This process's CPU time.
    pub process: Duration,
    /// The server processes' CPU time.
    pub servers: Duration,
    /// This process's context switches (every thread's).
    pub process_switches: u64,
    /// The server processes' context switches.
    pub server_switches: u64,
    /// The engine's durable commits (idemdb's log appends), where it counts them.
    pub commits: Option<u64>,
}

/// The CPU time of each of `pids` (`None`: gone, or not on this machine).
fn servers_cpu(pids: &[u32]) -> Vec<Option<Duration>> {
    pids.iter().map(|&pid| cpu::of_pid(pid)).collect()
}

/// The context switches of each of `pids`, as [`servers_cpu`].
fn servers_switches(pids: &[u32]) -> Vec<Option<u64>> {
    pids.iter().map(|&pid| cpu::switches_of_pid(pid)).collect()
}

impl Spent {
    /// Runs `run` (which returns its wall time) and adds what it spent, for `ops` operations
    /// on an engine served by `server_pids` that has made `commits()` durable commits so far
    /// (`None`: it does not count them), to these sums. Returns `run`'s wall time.
    pub fn measure(
        &mut self,
        server_pids: &[u32],
        ops: u64,
        commits: impl Fn() -> Option<u64>,
        run: impl FnOnce() -> Duration,
    ) -> Duration {
        // The servers are read outside this process's window: reading /proc costs CPU (and
        // a thread may sleep on the read, which would count as a switch).
        let servers_before = (servers_cpu(server_pids), servers_switches(server_pids));
        let commits_before = commits();
        let process_before = (cpu::process(), cpu::process_switches());
        let wall = run();
        let process = cpu::process().saturating_sub(process_before.0);
        let process_switches = cpu::process_switches().saturating_sub(process_before.1);
        let commits_after = commits();
        let servers_after = (servers_cpu(server_pids), servers_switches(server_pids));
        let servers: Duration = servers_before
            .0
            .iter()
            .zip(&servers_after.0)
            .filter_map(|(b, a)| Some(a.as_ref()?.saturating_sub(*b.as_ref()?)))
            .sum();
        let server_switches: u64 = servers_before
            .1
            .iter()
            .zip(&servers_after.1)
            .filter_map(|(b, a)| Some(a.as_ref()?.saturating_sub(*b.as_ref()?)))
            .sum();
        self.ops += ops;
        self.wall += wall;
        self.process += process;
        self.servers += servers;
        self.process_switches += process_switches;
        self.server_switches += server_switches;
        if let (Some(before), Some(after)) = (commits_before, commits_after) {
            *self.commits.get_or_insert(0) += after.saturating_sub(before);
        }
        wall
    }
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
        let counted = Arc::clone(engine);
        Pool {
            // Every session is connected: a server's backends for them exist now.
            runs: Runs::new(
                commands,
                done,
                engine.server_pids(),
                Box::new(move || counted.commits()),
            ),
            handles,
        }
    }

    /// Every thread runs `per_thread` operations: see [`Runs::run`].
    pub fn run(&mut self, per_thread: u64, latencies: &mut Vec<u64>) -> Duration {
        self.runs.run(per_thread, latencies)
    }

    /// The CPU and wall time of every [`run`](Pool::run) so far.
    pub fn spent(&self) -> Spent {
        self.runs.spent()
    }
}

/// A caller's command channel: a [`Pool`]'s thread's, or a task's (`tasks.rs`).
pub trait Command {
    /// Tells the caller to run `n` operations.
    fn start(&self, n: u64);
}

impl Command for Sender<u64> {
    fn start(&self, n: u64) {
        self.send(n).expect("caller alive");
    }
}

impl<C: Command> Runs<C> {
    pub fn new(
        commands: Vec<C>,
        done: Receiver<Done>,
        server_pids: Vec<u32>,
        commits: Box<dyn Fn() -> Option<u64> + Send>,
    ) -> Runs<C> {
        Runs {
            commands,
            done,
            server_pids,
            commits,
            spent: Spent::default(),
        }
    }

    /// Every caller runs `per_caller` operations; returns the wall time from the first
    /// caller's start to the last one's end (its wake-up before the start is not counted) and
    /// appends the per-operation latencies to `latencies`. What it spent is added to `spent`.
    pub fn run(&mut self, per_caller: u64, latencies: &mut Vec<u64>) -> Duration {
        let ops = per_caller * self.commands.len() as u64;
        let (commands, done) = (&self.commands, &self.done);
        self.spent
            .measure(&self.server_pids, ops, &*self.commits, || {
                for c in commands {
                    c.start(per_caller);
                }
                gather(done, commands.len(), latencies)
            })
    }

    /// What every [`run`](Runs::run) so far spent.
    pub fn spent(&self) -> Spent {
        self.spent
    }

    /// Ends every caller's commands: each caller returns once it sees that.
    pub fn close(&mut self) {
        self.commands.clear();
    }
}

/// Callers kept alive across criterion's iterations: a [`Pool`]'s threads, or the async cells'
/// tasks (`tasks.rs`).
pub trait Callers {
    /// Every caller runs `per_caller` operations: see [`Pool::run`].
    fn run(&mut self, per_caller: u64, latencies: &mut Vec<u64>) -> Duration;
    /// What every run so far spent.
    fn spent(&self) -> Spent;
}

impl Callers for Pool {
    fn run(&mut self, per_caller: u64, latencies: &mut Vec<u64>) -> Duration {
        Pool::run(self, per_caller, latencies)
    }

    fn spent(&self) -> Spent {
        Pool::spent(self)
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.runs.close();
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
            process_cpu_start: cpu::process(),
            this_thread_cpu_start: cpu::thread(),
        }
    }

    /// Stops the load; call on the thread that started it.
    pub fn stop(self) -> LoadStats {
        let wall = self.started.elapsed();
        let process = cpu::process().saturating_sub(self.process_cpu_start);
        let this_thread = cpu::thread().saturating_sub(self.this_thread_cpu_start);
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
