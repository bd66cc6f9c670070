//! Feature `metrics`: the facade exports what `stats()` counts.

mod common;

use common::{LEASE, acquired, setup};
use idemdb::{Key, ReserveOutcome, Scope};
use metrics_util::debugging::DebuggingRecorder;

#[test]
fn metrics_follow_the_stats() {
    let (_dir, _clock, db) = setup();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let scope = Scope::new("op", "p");
    metrics::with_local_recorder(&recorder, || {
        let r = acquired(db.reserve(&scope, &Key::new("k"), b"x", LEASE).unwrap());
        db.complete(&r, b"ok".to_vec()).unwrap();
        for _ in 0..3 {
            let replay = db.reserve(&scope, &Key::new("k"), b"x", LEASE).unwrap();
            assert_eq!(replay, ReserveOutcome::Completed(b"ok".to_vec()));
        }
        assert_eq!(
            db.reserve(&scope, &Key::new("k"), b"y", LEASE).unwrap(),
            ReserveOutcome::Mismatch
        );
    });
    let metrics = common::Metrics::of(&snapshotter);
    let counter = |name: &str| metrics.counter(name);
    let stats = db.stats();
    assert_eq!(counter("idemdb_acquired_total"), Some(stats.acquired));
    assert_eq!(counter("idemdb_finished_total"), Some(stats.finished));
    assert_eq!(counter("idemdb_replays_completed_total"), Some(3));
    assert_eq!(counter("idemdb_mismatches_total"), Some(1));
    assert_eq!(counter("idemdb_commits_total"), Some(stats.commits));
    let batches = metrics.histogram_len("idemdb_commit_batch_size");
    assert_eq!(batches.map(|n| n as u64), Some(stats.commits));
}
