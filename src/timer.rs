//! A timer for async waits that must end at a deadline without a runtime: one thread, started
//! on first use and joined when the database closes, wakes each registered task when its
//! instant passes.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;
use std::task::Waker;
use std::thread::JoinHandle;
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

use crate::error::Error;

#[derive(Default)]
struct State {
    due: BinaryHeap<Reverse<(Instant, u64)>>,
    wakers: HashMap<u64, Waker>,
    next_id: u64,
    shutdown: bool,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

pub(crate) struct Timer {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Timer {
    pub(crate) fn start() -> Result<Timer, Error> {
        let shared = Arc::new(Shared::default());
        let theirs = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("idemdb-timer".into())
            .spawn(move || run(&theirs))
            .map_err(|e| Error::ThreadSpawn {
                thread: "timer",
                source: Arc::new(e),
            })?;
        Ok(Timer {
            shared,
            thread: Some(thread),
        })
    }

    /// Wakes `waker` at `at` (or at once if it has passed); returns an id to update or cancel.
    pub(crate) fn register(&self, at: Instant, waker: Waker) -> u64 {
        let mut state = self.shared.state.lock();
        state.next_id += 1;
        let id = state.next_id;
        state.due.push(Reverse((at, id)));
        state.wakers.insert(id, waker);
        self.shared.changed.notify_one();
        id
    }

    /// Replaces the waker of a registration that has not fired.
    pub(crate) fn update(&self, id: u64, waker: &Waker) {
        if let Some(w) = self.shared.state.lock().wakers.get_mut(&id)
            && !w.will_wake(waker)
        {
            *w = waker.clone();
        }
    }

    pub(crate) fn cancel(&self, id: u64) {
        // The heap entry stays until its instant and is skipped then.
        self.shared.state.lock().wakers.remove(&id);
    }
}

/// A future ready at `at`, woken by the timer thread: an async sleep without a runtime.
pub(crate) struct Sleep<'t> {
    timer: &'t Timer,
    at: Instant,
    id: Option<u64>,
}

impl<'t> Sleep<'t> {
    pub(crate) fn until(timer: &'t Timer, at: Instant) -> Self {
        Sleep {
            timer,
            at,
            id: None,
        }
    }
}

impl std::future::Future for Sleep<'_> {
    type Output = ();

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        if Instant::now() >= self.at {
            if let Some(id) = self.id.take() {
                self.timer.cancel(id);
            }
            return std::task::Poll::Ready(());
        }
        match self.id {
            Some(id) => self.timer.update(id, cx.waker()),
            None => self.id = Some(self.timer.register(self.at, cx.waker().clone())),
        }
        std::task::Poll::Pending
    }
}

impl Drop for Sleep<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            self.timer.cancel(id);
        }
    }
}

impl Drop for Timer {
    fn drop(&mut self) {
        self.shared.state.lock().shutdown = true;
        self.shared.changed.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn run(shared: &Shared) {
    let mut state = shared.state.lock();
    while !state.shutdown {
        let now = Instant::now();
        let mut fired = Vec::new();
        while let Some(Reverse((at, id))) = state.due.peek().copied() {
            if at > now {
                break;
            }
            state.due.pop();
            if let Some(w) = state.wakers.remove(&id) {
                fired.push(w);
            }
        }
        if !fired.is_empty() {
            drop(state);
            fired.into_iter().for_each(Waker::wake);
            state = shared.state.lock();
            continue;
        }
        match state.due.peek().copied() {
            Some(Reverse((at, _))) => {
                shared.changed.wait_until(&mut state, at);
            }
            None => shared.changed.wait(&mut state),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;
    use std::time::Duration;

    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn wakes_at_the_deadline_and_not_when_cancelled() {
        let timer = Timer::start().unwrap();
        let fired = Arc::new(Count(AtomicUsize::new(0)));
        let cancelled = Arc::new(Count(AtomicUsize::new(0)));
        let soon = Instant::now() + Duration::from_millis(30);
        timer.register(soon, Waker::from(Arc::clone(&fired)));
        let id = timer.register(soon, Waker::from(Arc::clone(&cancelled)));
        timer.cancel(id);
        std::thread::sleep(Duration::from_millis(10));
        assert_eq!(
            fired.0.load(Ordering::SeqCst),
            0,
            "woke before its deadline"
        );
        let deadline = Instant::now() + Duration::from_secs(5);
        while fired.0.load(Ordering::SeqCst) == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(fired.0.load(Ordering::SeqCst), 1);
        assert_eq!(cancelled.0.load(Ordering::SeqCst), 0);
        drop(timer); // joins the thread
    }
}
