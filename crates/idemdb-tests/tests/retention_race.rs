//! Reservation stays atomic across partitions and expiry: many threads race on one key whose
//! previous record just expired (and is being dropped by a concurrent compaction); in every
//! round exactly one acquires, and nobody is served the expired record.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use common::{LEASE, minutes, setup_retained};
use idemdb::{Key, ReserveOutcome, Scope};

const THREADS: usize = 32;
const ROUNDS: usize = 150;

#[test]
fn one_winner_per_round_while_partitions_expire_and_drop() {
    let (_dir, clock, db) = setup_retained(minutes(1));
    let db = Arc::new(db);
    let start = Arc::new(Barrier::new(THREADS + 1));
    let done = Arc::new(Barrier::new(THREADS + 1));
    let stop = Arc::new(AtomicBool::new(false));
    let compactor = {
        let (db, stop) = (Arc::clone(&db), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut dropped = 0;
            while !stop.load(Ordering::SeqCst) {
                dropped += db.compact_now().unwrap().partitions_dropped;
            }
            dropped
        })
    };
    let racers: Vec<_> = (0..THREADS)
        .map(|_| {
            let (db, start, done) = (Arc::clone(&db), Arc::clone(&start), Arc::clone(&done));
            std::thread::spawn(move || {
                let (scope, key) = (Scope::new("op", "p"), Key::new("the-key"));
                let mut outcomes = Vec::new();
                for round in 0..ROUNDS {
                    start.wait();
                    // Another payload every round: serving the expired record would be a
                    // Mismatch.
                    let payload = format!("round-{round}");
                    let outcome = db.reserve(&scope, &key, payload.as_str(), LEASE).unwrap();
                    if let ReserveOutcome::Acquired(r) = &outcome {
                        assert_eq!(r.is_beyond_horizon(), round > 0);
                        db.complete(r, payload.into_bytes()).unwrap();
                    }
                    outcomes.push(outcome);
                    done.wait();
                }
                outcomes
            })
        })
        .collect();
    for _ in 0..ROUNDS {
        start.wait();
        done.wait();
        // Past the TTL and the partition's window: the record expires, its partition is due.
        clock.advance(Duration::from_secs(121));
    }
    let per_thread: Vec<Vec<ReserveOutcome>> =
        racers.into_iter().map(|t| t.join().unwrap()).collect();
    stop.store(true, Ordering::SeqCst);
    let dropped = compactor.join().unwrap();
    for round in 0..ROUNDS {
        let round_outcomes = per_thread.iter().map(|o| &o[round]);
        let winners = round_outcomes
            .clone()
            .filter(|o| matches!(o, ReserveOutcome::Acquired(_)))
            .count();
        assert_eq!(winners, 1, "round {round}");
        for o in round_outcomes {
            assert!(
                matches!(
                    o,
                    ReserveOutcome::Acquired(_)
                        | ReserveOutcome::InProgress { .. }
                        | ReserveOutcome::Completed(_)
                ),
                "round {round}: {o:?}"
            );
        }
    }
    let stats = db.stats();
    assert_eq!(stats.acquired, ROUNDS as u64);
    assert_eq!(stats.beyond_horizon, ROUNDS as u64 - 1);
    assert!(dropped > 0, "the concurrent compaction dropped nothing");
}
