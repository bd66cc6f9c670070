//! Feature `metrics`: the facade exports what `stats()` counts.

mod common;

use common::{LEASE, acquired, setup};
use idemdb::{Key, ReserveOutcome, Scope};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

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
    let values: Vec<(String, DebugValue)> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| (key.key().name().to_string(), value))
        .collect();
    let counter = |name: &str| {
        values.iter().find_map(|(n, v)| match v {
            DebugValue::Counter(c) if n == name => Some(*c),
            _ => None,
        })
    };
    let stats = db.stats();
    assert_eq!(counter("idemdb_acquired_total"), Some(stats.acquired));
    assert_eq!(counter("idemdb_finished_total"), Some(stats.finished));
    assert_eq!(counter("idemdb_replays_completed_total"), Some(3));
    assert_eq!(counter("idemdb_mismatches_total"), Some(1));
    assert_eq!(counter("idemdb_commits_total"), Some(stats.commits));
    let batches = values.iter().find_map(|(n, v)| match v {
        DebugValue::Histogram(h) if n == "idemdb_commit_batch_size" => Some(h.len() as u64),
        _ => None,
    });
    assert_eq!(batches, Some(stats.commits));
}
