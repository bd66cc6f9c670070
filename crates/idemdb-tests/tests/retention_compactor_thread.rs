//! The background compactor: a named thread that drops due partitions on its own, is joined
//! when the database closes, and poisons the database (a clear error on every write) if it
//! panics, instead of dying unnoticed.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{LEASE, T0, acquired, minutes, open_retained, reopenable};
use idemdb::{Clock, Error, IdemDb, Key, ManualClock, Scope};
use parking_lot::Mutex;

/// The tests here count threads by name: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// Threads of this process named like the compactor (Linux keeps 15 bytes of a name).
fn compactor_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.trim_end() == "idemdb-compacto")
        .count()
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn drops_due_partitions_by_itself_and_is_joined_on_close() {
    let _serial = SERIAL.lock();
    let (_dir, path, clock) = reopenable();
    let every_10_ms = minutes(5).compact_interval(Some(Duration::from_millis(10)));
    let db = open_retained(&path, &clock, every_10_ms);
    // The thread names itself once it runs.
    wait_until("the named thread", || compactor_threads() == 1);
    let scope = Scope::new("op", "p");
    for i in 0..20 {
        let r = acquired(
            db.reserve(&scope, &Key::new(format!("k{i}")), b"x", LEASE)
                .unwrap(),
        );
        db.complete(&r, b"ok".to_vec()).unwrap();
    }
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(db.stats().partitions_dropped, 0, "nothing is due yet");
    clock.advance(Duration::from_secs(7 * 60));
    wait_until("the background drop", || db.stats().partitions_dropped == 1);
    let stats = db.stats();
    assert_eq!((stats.expired_records, stats.stored_records), (20, 0));
    db.close();
    assert_eq!(compactor_threads(), 0, "stopped and joined");

    // No background thread when the interval is None.
    let db = open_retained(&path, &clock, minutes(5));
    assert_eq!(compactor_threads(), 0);
    drop(db);
}

/// A clock that panics when the compactor reads it, once armed.
struct TrapClock {
    inner: ManualClock,
    armed: Arc<AtomicBool>,
}

impl Clock for TrapClock {
    fn now_ms(&self) -> u64 {
        let on_compactor = std::thread::current().name() == Some("idemdb-compactor");
        if on_compactor && self.armed.load(Ordering::SeqCst) {
            panic!("trap sprung");
        }
        self.inner.now_ms()
    }
}

#[test]
fn a_panic_in_the_compactor_poisons_the_database() {
    let _serial = SERIAL.lock();
    let dir = tempfile::tempdir().unwrap();
    let armed = Arc::new(AtomicBool::new(false));
    let clock = TrapClock {
        inner: ManualClock::new(T0),
        armed: Arc::clone(&armed),
    };
    let db = IdemDb::builder()
        .clock(clock)
        .retention(minutes(5).compact_interval(Some(Duration::from_millis(5))))
        .open(dir.path().join("db"))
        .unwrap();
    let scope = Scope::new("op", "p");
    let r = acquired(
        db.reserve(&scope, &Key::new("before"), b"x", LEASE)
            .unwrap(),
    );
    db.complete(&r, b"ok".to_vec()).unwrap();
    armed.store(true, Ordering::SeqCst);
    let mut probes = 0;
    wait_until("the poisoning", || {
        probes += 1;
        // A fresh key each time, so that the writer is asked (not the snapshot).
        let key = Key::new(format!("probe-{probes}"));
        matches!(
            db.reserve(&scope, &key, b"x", LEASE),
            Err(Error::Poisoned(_))
        )
    });
    match db.reserve(&scope, &Key::new("after"), b"x", LEASE) {
        Err(e @ Error::Poisoned(_)) => {
            let text = e.to_string();
            assert!(
                text.contains("compactor thread panicked: trap sprung"),
                "{text}"
            );
        }
        other => panic!("expected Poisoned, got {other:?}"),
    }
    assert!(matches!(db.compact_now(), Err(Error::Poisoned(_))));
    // Reads still answer from what was committed.
    assert_eq!(
        db.get(&scope, &Key::new("before"))
            .unwrap()
            .unwrap()
            .response,
        b"ok"
    );
    db.close();
    assert_eq!(compactor_threads(), 0);
    // Reopening clears it.
    let db = open_retained(&dir.path().join("db"), &ManualClock::new(T0), minutes(5));
    assert!(db.reserve(&scope, &Key::new("after"), b"x", LEASE).is_ok());
}
