//! An async reservation whose future is dropped after its op was queued still commits; what it
//! acquired is released, so the key is not left IN_PROGRESS (refusing every retry) until its
//! lease runs out. Covered at both moments: while the commit is running, and after the answer
//! arrived but before it was read.

mod common;

use common::{fresh_shared, on_backend};

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use idemdb::{IdemDb, Key, ReserveOutcome, Scope};
use idemdb_testkit::FaultBackend;

const LEASE: Duration = Duration::from_secs(3600);

fn scope() -> Scope {
    Scope::new("op", "p")
}

/// Reserves `key` until it is acquired: the detached release committed. With a lease of an
/// hour, nothing else frees the key within the deadline.
fn acquire_when_released(db: &IdemDb, key: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match db.reserve(&scope(), &Key::new(key), b"x", LEASE).unwrap() {
            ReserveOutcome::Acquired(_) => return,
            ReserveOutcome::InProgress { .. } => {}
            other => panic!("{key}: {other:?}"),
        }
        assert!(Instant::now() < deadline, "{key} was never released");
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn poll_once<F: Future>(f: std::pin::Pin<&mut F>) -> Poll<F::Output> {
    f.poll(&mut Context::from_waker(Waker::noop()))
}

#[test]
fn dropped_while_its_commit_runs() {
    let backend = FaultBackend::new();
    let db = Arc::new(on_backend(&backend));
    backend.hold_syncs(true);
    {
        let (scope, key) = (scope(), Key::new("k"));
        let mut reserve = pin!(db.reserve_async(&scope, &key, b"x", LEASE));
        assert!(poll_once(reserve.as_mut()).is_pending(), "queued");
        assert!(
            backend.wait_for_held(1, Duration::from_secs(10)),
            "its commit is syncing"
        );
    } // dropped here, mid-commit
    backend.hold_syncs(false);
    backend.release_held();
    acquire_when_released(&db, "k");
}

#[test]
fn dropped_after_its_answer_came_but_before_it_was_read() {
    let (_dir, db) = fresh_shared();
    {
        let (scope, key) = (scope(), Key::new("k"));
        let mut reserve = pin!(db.reserve_async(&scope, &key, b"x", LEASE));
        assert!(poll_once(reserve.as_mut()).is_pending(), "queued");
        // The committer commits it; the answer waits in the future, unread.
        let deadline = Instant::now() + Duration::from_secs(10);
        while db.get(&scope, &key).unwrap().is_none() {
            assert!(Instant::now() < deadline, "never committed");
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    acquire_when_released(&db, "k");
    // A future read to the end keeps what it acquired.
    let key = Key::new("kept");
    let outcome = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(db.reserve_async(&scope(), &key, b"x", LEASE))
        .unwrap();
    assert!(matches!(outcome, ReserveOutcome::Acquired(_)));
    std::thread::sleep(Duration::from_millis(50));
    assert!(db.get(&scope(), &key).unwrap().is_some());
}
