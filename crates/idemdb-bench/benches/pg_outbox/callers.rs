//! Caller threads: kept alive across criterion's iterations and the alternated rounds (each
//! drives its async calls with `Handle::block_on`), and a one-off pool of threads that share
//! a fixed number of calls (the backlog's staging).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Barrier};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::shared::keys::fresh_id;

/// What a caller does once, given a fresh key id.
pub type Op = Arc<dyn Fn(u64) + Send + Sync>;

/// `threads` callers waiting for work.
pub struct Callers {
    commands: Vec<Sender<u64>>,
    done: Receiver<(Instant, Instant)>,
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
            let (op, done_tx) = (Arc::clone(&op), done_tx.clone());
            let handle = std::thread::Builder::new()
                .name(format!("caller-{t}"))
                .spawn(move || {
                    while let Ok(n) = rx.recv() {
                        let start = Instant::now();
                        for _ in 0..n {
                            op(fresh_id());
                        }
                        if done_tx.send((start, Instant::now())).is_err() {
                            break;
                        }
                    }
                })
                .expect("spawn caller");
            handles.push(handle);
        }
        Callers {
            commands,
            done,
            handles,
        }
    }

    pub fn threads(&self) -> usize {
        self.commands.len()
    }

    /// Every thread runs `per_thread` calls; the wall time from the first thread's start to
    /// the last one's end.
    pub fn run(&self, per_thread: u64) -> Duration {
        for c in &self.commands {
            c.send(per_thread).expect("caller alive");
        }
        let (mut first, mut last): (Option<Instant>, Option<Instant>) = (None, None);
        for _ in &self.commands {
            let (start, end) = self.done.recv().expect("caller finished");
            first = Some(first.map_or(start, |f| f.min(start)));
            last = Some(last.map_or(end, |l| l.max(end)));
        }
        match (first, last) {
            (Some(f), Some(l)) => l - f,
            _ => Duration::ZERO,
        }
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

/// `threads` threads running `op` on fresh ids until `n` calls were made between them (each
/// takes the next call as it finishes one); the wall time from their common start.
pub fn share(threads: usize, n: u64, op: &(dyn Fn(u64) + Sync)) -> Duration {
    let taken = AtomicU64::new(0);
    let ready = Barrier::new(threads + 1);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    ready.wait();
                    while taken.fetch_add(1, Ordering::Relaxed) < n {
                        op(fresh_id());
                    }
                })
            })
            .collect();
        ready.wait();
        let start = Instant::now();
        for w in workers {
            w.join().expect("caller");
        }
        start.elapsed()
    })
}
