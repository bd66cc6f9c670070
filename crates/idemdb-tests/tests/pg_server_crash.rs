//! A PostgreSQL crash under load: one server process is SIGKILLed, so the postmaster kills the
//! others and recovers from its WAL. Every outcome the store acknowledged survives; calls in
//! flight get `OutcomeUnknown` or `Database`, and a retry never acquires a key twice. The
//! same across a restart of a server that three instances share, whose callers contend for
//! the same keys and whose calls are batched (design.md §14.4).

mod common;

use idemdb_postgres::Refusal;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::stores::runtime;
use idemdb_postgres::{Key, PgError, PgStore, RecordState, ReserveOutcome, Scope, Store};
use idemdb_testkit::postgres::TestServer;
use parking_lot::Mutex;

const TASKS: usize = 16;
const LEASE: Duration = Duration::from_secs(600);

#[derive(Default)]
struct Seen {
    /// Key → how many times a reservation of it was answered `Acquired`.
    acquired: HashMap<String, u32>,
    /// Key → the response whose `complete` was acknowledged.
    completed: HashMap<String, Vec<u8>>,
}

/// One worker: lifecycles of its own keys, retrying every failed call.
async fn worker(
    db: Arc<PgStore>,
    task: usize,
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Seen>>,
    errors: Arc<AtomicU64>,
) {
    let scope = Scope::new("POST /purchases", "crash");
    let mut i = 0;
    while !stop.load(Ordering::SeqCst) {
        i += 1;
        let name = format!("t{task}-{i}");
        let key = Key::new(name.as_str());
        let response = format!("receipt {name}").into_bytes();
        let reservation = loop {
            match db.reserve(&scope, &key, b"req", LEASE).await {
                Ok(ReserveOutcome::Acquired(r)) => {
                    *seen.lock().acquired.entry(name.clone()).or_default() += 1;
                    break Some(r);
                }
                // An earlier attempt committed without an answer: its token is lost to us,
                // and the key is held until its lease ends. Never acquired twice.
                Ok(ReserveOutcome::InProgress { .. }) => break None,
                // Another instance's worker of the same index ran this key first.
                Ok(ReserveOutcome::Completed(_)) => break None,
                Ok(other) => panic!("{name}: {other:?}"),
                Err(PgError::OutcomeUnknown(_) | PgError::Database(_)) => {
                    errors.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("{name}: {e}"),
            }
        };
        let Some(r) = reservation else { continue };
        loop {
            match db.complete(&r, response.clone()).await {
                Ok(()) => {
                    seen.lock().completed.insert(name.clone(), response.clone());
                    break;
                }
                // An earlier attempt committed without an answer.
                Err(PgError::Refused(Refusal::NotInProgress {
                    state: RecordState::Completed,
                })) => break,
                Err(PgError::OutcomeUnknown(_) | PgError::Database(_)) => {
                    errors.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("{name}: {e}"),
            }
        }
    }
}

/// Checks that no key was acquired twice and every acknowledged completion is stored byte
/// for byte; returns how many were acknowledged.
async fn survived(seen: &Mutex<Seen>, db: &PgStore) -> usize {
    let scope = Scope::new("POST /purchases", "crash");
    let completed: Vec<(String, Vec<u8>)> = {
        let seen = seen.lock();
        for (name, times) in &seen.acquired {
            assert_eq!(*times, 1, "{name} was acquired {times} times");
        }
        seen.completed
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    for (name, response) in &completed {
        let rec = db
            .get(&scope, &Key::new(name.as_str()))
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{name}: acknowledged, then lost"));
        assert_eq!(rec.state, RecordState::Completed, "{name}");
        assert_eq!(&rec.response, response, "{name}");
    }
    completed.len()
}

/// Waits until 200 more lifecycles were acknowledged after the server came back, stops the
/// workers, and requires that the fault struck some call.
async fn resumed_then_stopped(
    seen: &Mutex<Seen>,
    stop: &AtomicBool,
    workers: Vec<tokio::task::JoinHandle<()>>,
    errors: &AtomicU64,
) {
    let at = acked(seen);
    let deadline = Instant::now() + Duration::from_secs(60);
    while acked(seen) < at + 200 {
        assert!(
            Instant::now() < deadline,
            "the load never resumed after the fault"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, Ordering::SeqCst);
    for w in workers {
        w.await.unwrap();
    }
    assert!(
        errors.load(Ordering::Relaxed) > 0,
        "the fault struck no call: the test proved nothing"
    );
}

fn acked(seen: &Mutex<Seen>) -> usize {
    seen.lock().completed.len()
}

#[test]
fn acknowledged_outcomes_survive_a_server_crash_and_no_key_is_acquired_twice() {
    let server = TestServer::start().unwrap();
    let url = server.fresh_database().unwrap();
    runtime().block_on(async {
        let builder = PgStore::builder(&url).unwrap().pool_size(TASKS);
        builder.migrate().await.unwrap();
        let db = Arc::new(builder.connect().await.unwrap());
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Seen::default()));
        let errors = Arc::new(AtomicU64::new(0));
        let workers: Vec<_> = (0..TASKS)
            .map(|t| {
                tokio::spawn(worker(
                    Arc::clone(&db),
                    t,
                    Arc::clone(&stop),
                    Arc::clone(&seen),
                    Arc::clone(&errors),
                ))
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let before = acked(&seen);
        assert!(before > 0, "no load before the crash");

        // SIGKILL one backend of this database: the postmaster treats it as a crash.
        let (admin, connection) =
            idemdb_postgres::tokio_postgres::connect(&url, idemdb_postgres::tokio_postgres::NoTls)
                .await
                .unwrap();
        let driver = tokio::spawn(connection);
        let pid: i32 = admin
            .query_one(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() \
                 AND backend_type = 'client backend' AND pid <> pg_backend_pid() LIMIT 1",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        drop(admin);
        driver.abort();
        let killed = std::process::Command::new("sh")
            .args(["-c", &format!("kill -9 {pid}")])
            .status()
            .unwrap();
        assert!(killed.success(), "kill -9 {pid}");

        // The load resumes once the server has recovered.
        resumed_then_stopped(&seen, &stop, workers, &errors).await;

        // What was acknowledged is there, byte for byte; no key was acquired twice.
        let completed = survived(&seen, &db).await;
        println!(
            "{} lifecycles acknowledged ({before} before the crash), {} calls failed and were retried",
            completed,
            errors.load(Ordering::Relaxed)
        );
    });
}

/// Three instances (stores) on one database, 16 workers each; worker `t` of every instance
/// runs the same keys, so the instances contend for each. The server is restarted (immediate
/// shutdown: no checkpoint, recovery from the WAL) under the load.
#[test]
fn three_instances_contending_for_keys_survive_a_server_restart() {
    let server = TestServer::start().unwrap();
    let url = server.fresh_database().unwrap();
    runtime().block_on(async {
        let builder = PgStore::builder(&url).unwrap().pool_size(TASKS);
        builder.migrate().await.unwrap();
        let mut stores = Vec::new();
        for _ in 0..3 {
            let builder = PgStore::builder(&url).unwrap().pool_size(TASKS);
            stores.push(Arc::new(builder.connect().await.unwrap()));
        }
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Seen::default()));
        let errors = Arc::new(AtomicU64::new(0));
        let mut workers = Vec::new();
        for db in &stores {
            for t in 0..TASKS {
                workers.push(tokio::spawn(worker(
                    Arc::clone(db),
                    t,
                    Arc::clone(&stop),
                    Arc::clone(&seen),
                    Arc::clone(&errors),
                )));
            }
        }
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(acked(&seen) > 0, "no load before the restart");
        tokio::task::block_in_place(|| server.restart_immediate()).unwrap();
        resumed_then_stopped(&seen, &stop, workers, &errors).await;
        for db in &stores {
            assert!(db.stats().batches > 0, "an instance never batched");
        }
        survived(&seen, &stores[0]).await;
    });
}
