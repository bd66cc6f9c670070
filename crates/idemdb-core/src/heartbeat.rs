//! Leases that outlive a slow owner while it lives: the lease is renewed (`extend`) every
//! third of it for as long as the owner's renewal runs, so that a duplicate takes over only
//! from an owner that stopped (its process died, or it dropped its [`Heartbeat`]), not from
//! one that was merely slower than the lease.
//!
//! Two forms: [`Store::renew_lease`], a future to run beside the work (the HTTP layer polls
//! it with the handler), and [`Heartbeat`], a guard that renews on a thread of its own.

use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::Mutex;

use crate::error::StoreError;
use crate::store::Store;
use crate::token::Reservation;

/// Renews a reservation's lease in the background, on a thread of its own, until it is
/// stopped or dropped (see [`Store::renew_lease`] for what a renewal does). Start it after
/// `reserve` and stop it before `complete`, `fail` or `release`:
///
/// ```
/// # use idemdb::{Heartbeat, IdemDb, Key, ReserveOutcome, Scope};
/// # use std::{sync::Arc, time::Duration};
/// # let dir = tempfile::tempdir()?;
/// let db = Arc::new(IdemDb::open(dir.path().join("db"))?);
/// let lease = Duration::from_millis(300);
/// let scope = Scope::new("POST /reports", "u1");
/// if let ReserveOutcome::Acquired(r) = db.reserve(&scope, &Key::new("k"), b"req", lease)? {
///     let beat = Heartbeat::start(Arc::clone(&db), &r, lease)?;
///     std::thread::sleep(Duration::from_millis(900)); // three leases of work
///     beat.stop()?; // Err if the lease was lost meanwhile
///     db.complete(&r, b"done".to_vec())?;
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// A `PgStore` renews on the tokio runtime it was connected on; the guard waits on a thread.
pub struct Heartbeat<E: StoreError> {
    stop: Arc<Stop>,
    thread: Option<JoinHandle<Option<E>>>,
}

impl<E: StoreError> Heartbeat<E> {
    /// Starts renewing `reservation`'s lease of `lease` (a third of it apart) on `store`.
    pub fn start<S: Store<Error = E>>(
        store: Arc<S>,
        reservation: &Reservation,
        lease: Duration,
    ) -> Result<Heartbeat<E>, E> {
        let stop = Arc::new(Stop::default());
        let reservation = reservation.clone();
        let theirs = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("idemdb-heartbeat".into())
            .spawn(move || {
                let renewal = store.renew_lease(&reservation, lease);
                block_on(Until {
                    stop: &theirs,
                    renewal: pin!(renewal),
                })
            })
            .map_err(|e| E::internal(format!("cannot start the heartbeat thread: {e}")))?;
        Ok(Heartbeat {
            stop,
            thread: Some(thread),
        })
    }

    /// Whether renewal ended because the lease was lost (see [`stop`](Self::stop)).
    pub fn is_lost(&self) -> bool {
        self.thread.as_ref().is_some_and(JoinHandle::is_finished) && !self.stop.is_set()
    }

    /// Stops renewing. `Err` with the refusal that ended renewal, if the lease was lost
    /// before (taken over: the owner must not finish as if it held it).
    pub fn stop(mut self) -> Result<(), E> {
        match self.halt() {
            Some(lost) => Err(lost),
            None => Ok(()),
        }
    }

    fn halt(&mut self) -> Option<E> {
        self.stop.set();
        let thread = self.thread.take()?;
        thread
            .join()
            .unwrap_or_else(|_| Some(E::internal("the heartbeat thread panicked".into())))
    }
}

impl<E: StoreError> Drop for Heartbeat<E> {
    fn drop(&mut self) {
        let _ = self.halt();
    }
}

impl<E: StoreError> std::fmt::Debug for Heartbeat<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Heartbeat")
            .field("stopped", &self.stop.is_set())
            .finish_non_exhaustive()
    }
}

/// The stop signal of a [`Heartbeat`], and the task to wake for it.
#[derive(Default)]
struct Stop {
    set: AtomicBool,
    waker: Mutex<Option<Waker>>,
}

impl Stop {
    fn set(&self) {
        self.set.store(true, Ordering::SeqCst);
        if let Some(w) = self.waker.lock().take() {
            w.wake();
        }
    }

    fn is_set(&self) -> bool {
        self.set.load(Ordering::SeqCst)
    }
}

/// The renewal until the stop signal: `None` when stopped, else the renewal's loss.
struct Until<'a, F> {
    stop: &'a Stop,
    renewal: Pin<&'a mut F>,
}

impl<E, F: Future<Output = E>> Future for Until<'_, F> {
    type Output = Option<E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<E>> {
        *self.stop.waker.lock() = Some(cx.waker().clone());
        if self.stop.is_set() {
            return Poll::Ready(None);
        }
        self.renewal.as_mut().poll(cx).map(Some)
    }
}

/// Wakes a parked thread.
struct Unpark(std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Runs `future` to completion on this thread.
fn block_on<F: Future>(future: F) -> F::Output {
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut future = pin!(future);
    loop {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
        std::thread::park();
    }
}
