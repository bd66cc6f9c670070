//! 64 threads reserve the same fresh key at once, 1,000 rounds: exactly one executes per round.
//! The same code runs on the embedded engine and on PostgreSQL.

mod common;

use common::stores::{Under, embedded, postgres_with, runtime};

use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;

use idemdb::{Key, ReserveOutcome, Retention, Scope, Store};
use tokio::runtime::Handle;

const THREADS: usize = 64;
const ROUNDS: usize = 1_000;

#[derive(Debug, Default)]
struct RoundLog {
    acquired: usize,
    in_progress: usize,
    completed: usize,
    other: Vec<String>,
}

#[test]
fn exactly_one_acquires_per_round_embedded() {
    let rt = runtime();
    exactly_one_acquires_per_round(embedded(), rt.handle());
}

#[test]
fn exactly_one_acquires_per_round_postgres() {
    let rt = runtime();
    // A connection per thread, so that the threads meet at the database, not at the pool.
    let under = rt.block_on(postgres_with(Retention::default(), THREADS));
    exactly_one_acquires_per_round(under, rt.handle());
}

/// Each thread drives the store's futures itself (`Handle::block_on`): 64 callers at once.
fn exactly_one_acquires_per_round<S: Store>(under: Under<S>, rt: &Handle) {
    let db = Arc::clone(&under.db);
    let scope = Scope::new("charge", "user-1");
    let start = Arc::new(Barrier::new(THREADS));
    let logs: Arc<Vec<Mutex<RoundLog>>> = Arc::new((0..ROUNDS).map(|_| Mutex::default()).collect());

    let handles: Vec<_> = (0..THREADS)
        .map(|_| {
            let (db, scope, start, logs, rt) = (
                Arc::clone(&db),
                scope.clone(),
                Arc::clone(&start),
                Arc::clone(&logs),
                rt.clone(),
            );
            std::thread::spawn(move || {
                for round in 0..ROUNDS {
                    let key = Key::new(format!("intent-{round}"));
                    let payload = format!("payload-{round}");
                    let expected = format!("receipt-{round}").into_bytes();
                    start.wait();
                    let outcome = rt
                        .block_on(db.reserve(
                            &scope,
                            &key,
                            payload.as_bytes(),
                            Duration::from_secs(60),
                        ))
                        .unwrap();
                    let mut log = logs[round].lock().unwrap();
                    match outcome {
                        ReserveOutcome::Acquired(r) => {
                            log.acquired += 1;
                            drop(log);
                            rt.block_on(db.complete(&r, expected.clone())).unwrap();
                        }
                        ReserveOutcome::InProgress { .. } => log.in_progress += 1,
                        ReserveOutcome::Completed(bytes) if bytes == expected => log.completed += 1,
                        other => log.other.push(format!("{other:?}")),
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }

    let mut contended = 0;
    for (round, log) in logs.iter().enumerate() {
        let log = log.lock().unwrap();
        assert_eq!(log.acquired, 1, "round {round}: {log:?}");
        assert!(log.other.is_empty(), "round {round}: {log:?}");
        assert_eq!(log.acquired + log.in_progress + log.completed, THREADS);
        if log.in_progress > 0 {
            contended += 1;
        }
        // After the round, every duplicate replays the winner's bytes.
        let key = Key::new(format!("intent-{round}"));
        let payload = format!("payload-{round}");
        assert_eq!(
            rt.block_on(db.reserve(&scope, &key, payload.as_bytes(), Duration::from_secs(60)))
                .unwrap(),
            ReserveOutcome::Completed(format!("receipt-{round}").into_bytes())
        );
    }
    assert!(
        contended > 0,
        "the threads never overlapped: the test raced nothing"
    );
}
