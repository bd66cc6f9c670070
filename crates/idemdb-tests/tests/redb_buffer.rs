//! redb's write buffer written out once nothing is being written (docs/design.md §5.8): a
//! read-only phase, after the open or after the last checkpoint, writes nothing to the file.
//! While pages of a non-durable commit (one redb makes of its own after a durable commit that
//! freed pages) stay buffered, a read that misses a full page cache tries every stripe of the
//! buffer and writes out what it finds there: the writes counted here stand for that cost.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::LEASE;
use idemdb::testing::redb_buffer_pending;
use idemdb::{IdemDb, Key, ReserveOutcome, Retention, Scope};
use idemdb_testkit::FaultBackend;

const KEYS: usize = 3_000;

/// A page cache far smaller than the records, no replay cache and no compactor: every replay
/// reads redb's pages, and nothing but the writer commits.
fn open(backend: &FaultBackend) -> Arc<IdemDb> {
    Arc::new(
        IdemDb::builder()
            .cache_size(256 << 10)
            .replay_cache(0)
            .checkpoint_interval(Duration::from_millis(20))
            .retention(Retention::default().compact_interval(None))
            .open_with_backend(backend.clone(), backend.log())
            .unwrap(),
    )
}

fn scope() -> Scope {
    Scope::new("op", "p")
}

fn fill(db: &IdemDb) {
    for i in 0..KEYS {
        let r = common::acquired(
            db.reserve(&scope(), &Key::new(format!("k-{i}")), b"p", LEASE)
                .unwrap(),
        );
        db.complete(&r, vec![7u8; 300]).unwrap();
    }
}

/// Replays every key; returns the writes the backend saw meanwhile.
fn writes_during_replays(db: &IdemDb, backend: &FaultBackend) -> u64 {
    let before = backend.writes();
    for i in 0..KEYS {
        assert_eq!(
            db.reserve(&scope(), &Key::new(format!("k-{i}")), b"p", LEASE)
                .unwrap(),
            ReserveOutcome::Completed(vec![7u8; 300]),
            "key {i}"
        );
    }
    backend.writes() - before
}

/// Waits for a checkpoint after `checkpoints` (the count before the writes) and the applier's
/// write-out after it.
fn wait_for_write_out(db: &IdemDb, checkpoints: u64) {
    let until = Instant::now() + Duration::from_secs(10);
    while db.stats().checkpoints == checkpoints || redb_buffer_pending(db) {
        assert!(Instant::now() < until, "no checkpoint and write-out came");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn replays_after_an_idle_checkpoint_write_nothing_to_the_file() {
    let backend = FaultBackend::new();
    let db = open(&backend);
    let checkpoints = db.stats().checkpoints;
    fill(&db);
    // The applier's checkpoint by age, then its write-out on the pass after it.
    wait_for_write_out(&db, checkpoints);
    assert_eq!(writes_during_replays(&db, &backend), 0);
    // And the records are still all there after a reopen.
    drop(db);
    let db = open(&backend);
    assert_eq!(writes_during_replays(&db, &backend), 0);
}

#[test]
fn replays_right_after_an_open_write_nothing_to_the_file() {
    let backend = FaultBackend::new();
    let db = open(&backend);
    fill(&db);
    drop(db);
    // The open's commit is written out before the open returns: nothing is pending.
    let db = open(&backend);
    assert!(!redb_buffer_pending(&db));
    assert_eq!(writes_during_replays(&db, &backend), 0);
}

#[test]
fn writes_after_a_write_out_are_checkpointed_and_written_out_again() {
    let backend = FaultBackend::new();
    let db = open(&backend);
    fill(&db);
    wait_for_write_out(&db, 0);
    let checkpoints = db.stats().checkpoints;
    let r = common::acquired(
        db.reserve(&scope(), &Key::new("late"), b"p", LEASE)
            .unwrap(),
    );
    db.complete(&r, b"late".to_vec()).unwrap();
    // The write's checkpoint makes the buffer pending again, and the pass after writes it out.
    wait_for_write_out(&db, checkpoints);
    assert_eq!(writes_during_replays(&db, &backend), 0);
    assert_eq!(
        db.reserve(&scope(), &Key::new("late"), b"p", LEASE)
            .unwrap(),
        ReserveOutcome::Completed(b"late".to_vec())
    );
}
