//! Many instances under faults: three instances (three `PgStore`s, each with its own pool and
//! listener, as three processes would have) on one server, each through a proxy that cuts
//! connections at random points, their clocks 10 minutes apart (+10, 0, −10 min), one
//! `pg_ctl restart -m immediate` of the server midway. 5,000 intents, each sent three times,
//! to the three instances, at once; the side effect is counted here, outside the store.
//!
//! Checked: each intent's side effect ran once, or, where a later run took over a lease
//! whose owner could not finish in time (the restart), every earlier run was fenced and the
//! answer is the last run's, of the highest token; every acknowledged answer is stored byte
//! for byte and every instance replays it; every send got that answer; no token was issued
//! twice.

mod common;

use idemdb_postgres::Refusal;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::chaos::ChaosProxy;
use common::stores::{Skewed, runtime};
use idemdb_postgres::{
    FencingToken, Key, PgError, PgStore, RecordState, ReserveOutcome, Scope, Store,
};
use idemdb_testkit::postgres::TestServer;
use parking_lot::Mutex;

const INTENTS: usize = 5_000;
const SENDS: usize = 3;
const WORKERS: usize = 48;
const LEASE: Duration = Duration::from_secs(2);
/// Chunks cut, per million carried.
const CUT_RATE: u32 = 2_000;
const MINUTE: i64 = 60_000;

/// How one run of an intent's side effect ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Run {
    Running,
    /// Its `complete` was acknowledged (or found committed after an unknown outcome).
    Acked,
    /// Its `complete` was refused: another run took its lease over.
    Fenced,
}

#[derive(Default)]
struct Ledger {
    /// Intent → its side effect's runs: the token each ran under, and how it ended.
    runs: HashMap<usize, Vec<(FencingToken, Run)>>,
    /// Intent → the answer acknowledged to its owner.
    acked: HashMap<usize, Vec<u8>>,
    /// Intent → the answers its sends were given.
    answers: HashMap<usize, Vec<Vec<u8>>>,
    /// Every token a reservation was given.
    tokens: Vec<FencingToken>,
}

fn scope() -> Scope {
    Scope::new("POST /transfers", "tenant-9")
}

fn key(i: usize) -> Key {
    Key::new(format!("intent-{i}"))
}

fn payload(i: usize) -> Vec<u8> {
    format!("transfer {i}").into_bytes()
}

/// Whether an error is one a client retries (the store or the connection failed).
fn transient(e: &PgError) -> bool {
    matches!(e, PgError::Database(_) | PgError::OutcomeUnknown(_))
}

fn set_run(ledger: &Mutex<Ledger>, i: usize, token: FencingToken, to: Run) {
    let mut ledger = ledger.lock();
    let run = ledger
        .runs
        .get_mut(&i)
        .and_then(|runs| runs.iter_mut().find(|(t, _)| *t == token))
        .expect("a run of this token");
    run.1 = to;
}

/// One send of intent `i` to `store`, retried like a client until it has an answer.
async fn send(store: &PgStore, i: usize, ledger: &Mutex<Ledger>) -> Vec<u8> {
    loop {
        let r = match store
            .reserve(&scope(), &key(i), payload(i).as_slice(), LEASE)
            .await
        {
            Ok(ReserveOutcome::Acquired(r)) => r,
            Ok(ReserveOutcome::Completed(answer)) => return answer,
            Ok(ReserveOutcome::InProgress { retry_after }) => {
                tokio::time::sleep(retry_after.min(Duration::from_millis(50))).await;
                continue;
            }
            Ok(other) => panic!("intent {i}: {other:?}"),
            Err(e) if transient(&e) => {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
            Err(e) => panic!("intent {i}: reserve: {e}"),
        };
        // The side effect, counted outside the store.
        {
            let mut l = ledger.lock();
            l.tokens.push(r.token());
            l.runs.entry(i).or_default().push((r.token(), Run::Running));
        }
        let answer = format!("receipt {i} by {}", r.token()).into_bytes();
        loop {
            match store.complete(&r, answer.clone()).await {
                Ok(()) => {
                    set_run(ledger, i, r.token(), Run::Acked);
                    ledger.lock().acked.insert(i, answer.clone());
                    return answer;
                }
                // An earlier try committed without an answer: read it back.
                Err(PgError::Refused(Refusal::NotInProgress {
                    state: RecordState::Completed,
                })) => {
                    let stored = loop {
                        // The read goes through the same cut connections: retried like a client.
                        match store.get(&scope(), &key(i)).await {
                            Ok(record) => break record.map(|rec| rec.response),
                            Err(e) if transient(&e) => {
                                tokio::time::sleep(Duration::from_millis(20)).await;
                            }
                            Err(e) => panic!("intent {i}: get: {e}"),
                        }
                    };
                    assert_eq!(stored.as_ref(), Some(&answer), "intent {i}");
                    set_run(ledger, i, r.token(), Run::Acked);
                    ledger.lock().acked.insert(i, answer.clone());
                    return answer;
                }
                Err(PgError::Refused(Refusal::Fenced { .. })) => {
                    set_run(ledger, i, r.token(), Run::Fenced);
                    break;
                }
                Err(e) if transient(&e) => tokio::time::sleep(Duration::from_millis(20)).await,
                Err(e) => panic!("intent {i}: complete: {e}"),
            }
        }
    }
}

#[test]
fn three_instances_through_cut_connections_a_restart_and_skewed_clocks_run_each_intent_once() {
    let began = Instant::now();
    let server = Arc::new(TestServer::start().unwrap());
    let url = server.fresh_database().unwrap();
    let port: u16 = url
        .rsplit(':')
        .next()
        .and_then(|r| r.split('/').next())
        .unwrap()
        .parse()
        .unwrap();
    runtime().block_on(async {
        PgStore::builder(&url).unwrap().migrate().await.unwrap();
        let mut proxies = Vec::new();
        let mut stores = Vec::new();
        for skew in [10 * MINUTE, 0, -10 * MINUTE] {
            let proxy = ChaosProxy::start(port, 0).await;
            let through = url.replace(&format!(":{port}/"), &format!(":{}/", proxy.port));
            let builder = PgStore::builder(&through)
                .unwrap()
                .clock(Skewed(skew))
                .pool_size(16)
                .pool_wait_timeout(Duration::from_secs(5));
            stores.push(Arc::new(builder.connect().await.unwrap()));
            proxies.push(proxy);
        }
        for proxy in &proxies {
            proxy.set_rate(CUT_RATE);
        }
        let ledger = Arc::new(Mutex::new(Ledger::default()));
        let next = Arc::new(AtomicUsize::new(0));
        let done = Arc::new(AtomicUsize::new(0));
        // Send j of intent i goes to instance (i + j) % 3; the three sends of an intent are
        // next to each other in the queue, so they race.
        let workers: Vec<_> = (0..WORKERS)
            .map(|_| {
                let (stores, ledger, next, done) = (
                    stores.clone(),
                    Arc::clone(&ledger),
                    Arc::clone(&next),
                    Arc::clone(&done),
                );
                tokio::spawn(async move {
                    loop {
                        let n = next.fetch_add(1, Ordering::SeqCst);
                        if n >= INTENTS * SENDS {
                            return;
                        }
                        let (i, j) = (n / SENDS, n % SENDS);
                        let answer = send(&stores[(i + j) % 3], i, &ledger).await;
                        ledger.lock().answers.entry(i).or_default().push(answer);
                        done.fetch_add(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        // Midway, the server is restarted, as by pg_ctl restart -m immediate.
        while done.load(Ordering::SeqCst) < INTENTS * SENDS / 3 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let restarting = Arc::clone(&server);
        tokio::task::spawn_blocking(move || restarting.restart_immediate())
            .await
            .unwrap()
            .unwrap();
        let restarted_at = done.load(Ordering::SeqCst);
        for w in workers {
            w.await.unwrap();
        }
        for proxy in &proxies {
            proxy.set_rate(0);
        }
        let cuts: u64 = proxies.iter().map(ChaosProxy::cuts).sum();
        assert!(cuts >= 20, "only {cuts} connections were cut");

        let ledger = std::mem::take(&mut *ledger.lock());
        // No token was issued twice.
        let distinct: HashSet<_> = ledger.tokens.iter().collect();
        assert_eq!(distinct.len(), ledger.tokens.len(), "a token issued twice");
        let mut taken_over = 0;
        for i in 0..INTENTS {
            let runs = &ledger.runs[&i];
            // Once; or every run but the last (of the highest token) was fenced.
            let (last, earlier) = runs.split_last().unwrap();
            assert_eq!(last.1, Run::Acked, "intent {i}: {runs:?}");
            for run in earlier {
                assert_eq!(run.1, Run::Fenced, "intent {i}: {runs:?}");
                assert!(run.0 < last.0, "intent {i}: {runs:?}");
            }
            taken_over += earlier.len();
            let acked = &ledger.acked[&i];
            assert_eq!(
                acked,
                &format!("receipt {i} by {}", last.0).into_bytes(),
                "intent {i}"
            );
            let answers = &ledger.answers[&i];
            assert_eq!(answers.len(), SENDS);
            assert!(
                answers.iter().all(|a| a == acked),
                "intent {i}: {answers:?}"
            );
        }
        // Stored byte for byte; every instance replays it.
        for i in 0..INTENTS {
            let acked = &ledger.acked[&i];
            for store in &stores {
                let rec = store.get(&scope(), &key(i)).await.unwrap().unwrap();
                assert_eq!(rec.state, RecordState::Completed);
                assert_eq!(&rec.response, acked, "intent {i}");
            }
            let store = &stores[i % 3];
            assert_eq!(
                store
                    .reserve(&scope(), &key(i), payload(i).as_slice(), LEASE)
                    .await
                    .unwrap(),
                ReserveOutcome::Completed(acked.clone()),
                "intent {i}"
            );
        }
        for (store, skew) in stores.iter().zip([10 * MINUTE, 0, -10 * MINUTE]) {
            let seen = store.stats().clock_skew_ms;
            assert!((seen - skew).abs() < 5_000, "skew {seen}, set {skew}");
        }
        println!(
            "{INTENTS} intents × {SENDS} sends on 3 instances: {cuts} connections cut, restart \
             after {restarted_at} sends, {taken_over} runs taken over and fenced, {:.1} s",
            began.elapsed().as_secs_f64()
        );
    });
}
