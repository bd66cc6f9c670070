//! `stats()` counts exactly what callers were told, and its commit histograms add up.

mod common;

use idemdb::Refusal;
use std::sync::Arc;
use std::time::Duration;

use common::{LEASE, acquired, on_backend, setup};
use idemdb::{Error, ExecuteOutcome, Key, Outcome, ReserveOutcome, Scope};

#[test]
fn counters_follow_the_outcomes() {
    let (_dir, clock, db) = setup();
    let s = Scope::new("op", "p");
    let r = acquired(db.reserve(&s, &Key::new("a"), b"p", LEASE).unwrap());
    assert!(matches!(
        db.reserve(&s, &Key::new("a"), b"p", LEASE).unwrap(),
        ReserveOutcome::InProgress { .. }
    ));
    assert_eq!(
        db.reserve(&s, &Key::new("a"), b"other", LEASE).unwrap(),
        ReserveOutcome::Mismatch
    );
    db.complete(&r, b"ok".to_vec()).unwrap();
    for _ in 0..3 {
        let _ = db.reserve(&s, &Key::new("a"), b"p", LEASE).unwrap();
    }
    let r = acquired(db.reserve(&s, &Key::new("b"), b"p", LEASE).unwrap());
    db.fail(&r, b"declined".to_vec()).unwrap();
    let _ = db.reserve(&s, &Key::new("b"), b"p", LEASE).unwrap();
    let r = acquired(db.reserve(&s, &Key::new("c"), b"p", LEASE).unwrap());
    db.release(&r).unwrap();
    let stale = acquired(db.reserve(&s, &Key::new("d"), b"p", LEASE).unwrap());
    clock.advance(LEASE + Duration::from_secs(1));
    let fresh = acquired(db.reserve(&s, &Key::new("d"), b"p", LEASE).unwrap());
    assert!(fresh.is_takeover());
    assert!(matches!(
        db.complete(&stale, b"late".to_vec()),
        Err(Error::Refused(Refusal::Fenced { .. }))
    ));
    let run = || {
        db.execute(&s, &Key::new("e"), b"p", |_tx| {
            Ok::<_, Error>(Outcome::Completed(b"x".to_vec()))
        })
        .unwrap()
    };
    assert!(matches!(run(), ExecuteOutcome::Executed(_)));
    assert!(matches!(run(), ExecuteOutcome::Completed(_)));

    let stats = db.stats();
    assert_eq!(stats.acquired, 6, "a, b, c, d, d again, e: {stats:?}");
    assert_eq!(stats.takeovers, 1);
    assert_eq!(stats.in_progress, 1);
    assert_eq!(stats.mismatches, 1);
    assert_eq!(stats.replays_completed, 4);
    assert_eq!(stats.replays_failed, 1);
    assert_eq!(stats.finished, 3, "complete a, fail b, execute e");
    assert_eq!(stats.releases, 1);
    assert_eq!(stats.fenced, 1);
    // Every committing batch was one lone op here.
    assert_eq!(stats.commits, 9);
    assert_eq!(stats.batch_size.count, 9);
    assert_eq!(stats.batch_size.sum, 9);
    assert_eq!(stats.commit_latency_us.count, 9);
}

#[test]
fn concurrent_lifecycles_are_all_counted_and_batched() {
    let (_dir, _clock, db) = setup();
    let db = Arc::new(db);
    let threads: Vec<_> = (0..16)
        .map(|t| {
            let db = Arc::clone(&db);
            std::thread::spawn(move || {
                let s = Scope::new("op", "p");
                for i in 0..50 {
                    let r = acquired(
                        db.reserve(&s, &Key::new(format!("{t}-{i}")), b"p", LEASE)
                            .unwrap(),
                    );
                    db.complete(&r, b"ok".to_vec()).unwrap();
                }
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
    let stats = db.stats();
    assert_eq!(stats.acquired, 800);
    assert_eq!(stats.finished, 800);
    // 1,600 writes, each in exactly one committed batch.
    assert_eq!(stats.batch_size.sum, 1_600);
    assert_eq!(stats.batch_size.count, stats.commits);
    assert!(stats.commits <= 1_600);
    assert!(stats.batch_size.mean() >= 1.0);
}

#[test]
fn storage_figures_match_the_file_by_path_and_by_backend() {
    let (dir, _clock, db) = setup();
    let s = Scope::new("op", "p");
    for i in 0..10 {
        let r = acquired(
            db.reserve(&s, &Key::new(format!("k{i}")), b"p", LEASE)
                .unwrap(),
        );
        if i < 7 {
            db.complete(&r, vec![1; 100]).unwrap();
        }
    }
    let stats = db.stats();
    assert_eq!((stats.stored_records, stats.in_flight_records), (10, 3));
    assert_eq!((stats.partitions, stats.indexed_keys), (1, 7));
    let on_disk = std::fs::metadata(dir.path().join("test.idemdb"))
        .unwrap()
        .len();
    assert_eq!(stats.bytes_on_disk, on_disk);
    assert!(on_disk > 0);

    // Over a backend, the size is the storage's length as redb last set it.
    let backend = idemdb_testkit::FaultBackend::new();
    let db = on_backend(&backend);
    let r = acquired(db.reserve(&s, &Key::new("k"), b"p", LEASE).unwrap());
    db.complete(&r, vec![1; 100]).unwrap();
    let stats = db.stats();
    use idemdb::redb::StorageBackend;
    assert_eq!(stats.bytes_on_disk, backend.len().unwrap());
    assert!(stats.bytes_on_disk > 0);
}
