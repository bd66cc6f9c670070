//! The inbox over PostgreSQL: `consume_batch` (a poll in one transaction, a savepoint per
//! message, every key's stripe locked first) and `run` (writes with no dedupe record).

mod common;

use idemdb_postgres::Refusal;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use common::stores::{Under, accounts, accounts_table, postgres, postgres_with, runtime};

use idemdb_postgres::tokio_postgres;
use idemdb_postgres::{
    Consumed, ExecuteError, PgError, PgFuture, PgStore, PgTx, Retention, pg_handler,
};

type Answers = Vec<Result<Consumed, ExecuteError<String, PgError>>>;

/// A store on a fresh database with a table `ledger`, and a count of handler runs.
async fn ledger_store() -> (Under<PgStore>, Arc<AtomicU32>) {
    let under = postgres().await;
    // A row per handler run that committed. No unique constraint, so a message handled
    // twice shows as two rows.
    let client = under.db.pool().get().await.unwrap();
    client
        .batch_execute("CREATE TABLE ledger (message text NOT NULL)")
        .await
        .unwrap();
    drop(client);
    (under, Arc::new(AtomicU32::new(0)))
}

/// The ledger's rows: (message, how many), by message.
async fn ledger(db: &PgStore) -> Vec<(String, i64)> {
    let client = db.pool().get().await.unwrap();
    client
        .query(
            "SELECT message, count(*) FROM ledger GROUP BY message ORDER BY message",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

fn rows(expected: &[(&str, i64)]) -> Vec<(String, i64)> {
    expected.iter().map(|(m, n)| (m.to_string(), *n)).collect()
}

/// What a test handler does after it counted its run.
#[derive(Clone, Copy)]
enum Does {
    /// Writes its message to the ledger.
    Writes,
    /// Writes, then fails.
    Fails,
    /// Makes a statement fail, swallows the error and succeeds.
    Swallows,
}

/// A handler of message `id` that counts its runs in `runs`.
fn handler(
    id: &str,
    runs: &Arc<AtomicU32>,
    does: Does,
) -> impl for<'t, 'a> FnMut(&'t mut PgTx<'a>) -> PgFuture<'t, Result<(), String>> + Send + use<> {
    let (id, runs) = (id.to_string(), Arc::clone(runs));
    pg_handler(move |tx: &mut PgTx<'_>| {
        runs.fetch_add(1, Ordering::SeqCst);
        let id = id.clone();
        Box::pin(async move {
            if let Does::Swallows = does {
                let _ = tx
                    .execute("INSERT INTO ledger (message) VALUES (NULL)", &[])
                    .await;
                return Ok(());
            }
            tx.execute("INSERT INTO ledger (message) VALUES ($1)", &[&id])
                .await
                .map_err(|e| e.to_string())?;
            match does {
                Does::Fails => Err(format!("{id} was refused")),
                _ => Ok(()),
            }
        })
    })
}

async fn poll(db: &PgStore, ids: &[&str], runs: &Arc<AtomicU32>) -> Answers {
    let messages = ids.iter().map(|id| (*id, handler(id, runs, Does::Writes)));
    db.consume_batch("ledger", messages).await.unwrap()
}

fn consumed(answers: Answers) -> Vec<Consumed> {
    answers.into_iter().map(Result::unwrap).collect()
}

#[test]
fn a_repeated_id_in_one_poll_is_processed_then_duplicate_and_runs_once() {
    runtime().block_on(async {
        let (under, runs) = ledger_store().await;
        let db = &under.db;
        let answers = poll(db, &["m1", "m2", "m1"], &runs).await;
        assert_eq!(
            consumed(answers),
            [
                Consumed::Processed,
                Consumed::Processed,
                Consumed::Duplicate
            ]
        );
        assert_eq!(runs.load(Ordering::SeqCst), 2, "m1's handler ran once");
        assert_eq!(ledger(db).await, rows(&[("m1", 1), ("m2", 1)]));
        let stats = db.stats();
        assert_eq!((stats.acquired, stats.finished), (2, 2));
        assert_eq!(stats.replays_completed, 1);
    });
}

/// A poll of messages a, b and c in which b's handler `does` so: a and c are processed
/// whatever b does, b's answer is returned.
async fn around(
    db: &PgStore,
    runs: &Arc<AtomicU32>,
    does: Does,
) -> Result<Consumed, ExecuteError<String, PgError>> {
    let messages = [("a", Does::Writes), ("b", does), ("c", Does::Writes)]
        .map(|(id, does)| (id, handler(id, runs, does)));
    let mut answers = db.consume_batch("ledger", messages).await.unwrap();
    assert!(
        matches!(
            answers[..],
            [Ok(Consumed::Processed), _, Ok(Consumed::Processed)]
        ),
        "{answers:?}"
    );
    // b's write was rolled back to its savepoint; a's and c's committed.
    assert_eq!(ledger(db).await, rows(&[("a", 1), ("c", 1)]));
    answers.swap_remove(1)
}

#[test]
fn a_failing_handler_undoes_its_message_only_and_its_redelivery_runs() {
    runtime().block_on(async {
        let (under, runs) = ledger_store().await;
        let db = &under.db;
        let b = around(db, &runs, Does::Fails).await;
        assert!(
            matches!(&b, Err(ExecuteError::Closure(e)) if e == "b was refused"),
            "{b:?}"
        );
        // No record for b: its redelivery runs it.
        let again = poll(db, &["b", "a"], &runs).await;
        assert_eq!(consumed(again), [Consumed::Processed, Consumed::Duplicate]);
        assert_eq!(ledger(db).await, rows(&[("a", 1), ("b", 1), ("c", 1)]));
        assert_eq!(runs.load(Ordering::SeqCst), 4);
        let stats = db.stats();
        assert_eq!((stats.acquired, stats.finished), (3, 3));
        assert_eq!(stats.replays_completed, 1);
    });
}

#[test]
fn a_handler_that_swallows_a_failed_statement_gets_a_database_error_alone() {
    runtime().block_on(async {
        let (under, runs) = ledger_store().await;
        let db = &under.db;
        // The failed insert aborts the transaction; rolled back to b's savepoint, c still
        // runs and commits.
        let b = around(db, &runs, Does::Swallows).await;
        assert!(
            matches!(b, Err(ExecuteError::Db(PgError::Database(_)))),
            "{b:?}"
        );
        assert_eq!(
            consumed(poll(db, &["b"], &runs).await),
            [Consumed::Processed]
        );
    });
}

#[test]
fn a_redelivered_poll_is_all_duplicates_and_runs_no_handler() {
    runtime().block_on(async {
        let (under, runs) = ledger_store().await;
        let db = &under.db;
        let ids = ["x", "y", "z"];
        assert_eq!(
            consumed(poll(db, &ids, &runs).await),
            vec![Consumed::Processed; 3]
        );
        assert_eq!(
            consumed(poll(db, &ids, &runs).await),
            vec![Consumed::Duplicate; 3]
        );
        assert_eq!(runs.load(Ordering::SeqCst), 3);
        assert_eq!(ledger(db).await, rows(&[("x", 1), ("y", 1), ("z", 1)]));
        assert_eq!(db.stats().replays_completed, 3);
    });
}

#[test]
fn concurrent_overlapping_polls_process_every_id_exactly_once() {
    const POLLS: usize = 8;
    const IDS: usize = 50;
    runtime().block_on(async {
        let (under, runs) = ledger_store().await;
        let db = Arc::clone(&under.db);
        let start = Arc::new(tokio::sync::Barrier::new(POLLS));
        let tasks: Vec<_> = (0..POLLS)
            .map(|p| {
                // Every poll has every id, each in an order of its own.
                let mut order: Vec<String> = (0..IDS).map(|i| format!("id-{i:02}")).collect();
                shuffle(&mut order, p as u64 + 1);
                let (db, runs, start) = (Arc::clone(&db), Arc::clone(&runs), Arc::clone(&start));
                tokio::spawn(async move {
                    let messages: Vec<_> = order
                        .iter()
                        .map(|id| (id.clone(), handler(id, &runs, Does::Writes)))
                        .collect();
                    start.wait().await;
                    db.consume_batch("ledger", messages).await
                })
            })
            .collect();
        let mut processed = 0;
        for task in tasks {
            let answers = task
                .await
                .unwrap()
                .expect("no poll failed (no deadlock surfaced)");
            for answer in answers {
                match answer {
                    Ok(Consumed::Processed) => processed += 1,
                    Ok(Consumed::Duplicate) => {}
                    other => panic!("unexpected answer {other:?}"),
                }
            }
        }
        assert_eq!(processed, IDS, "each id processed by exactly one poll");
        let ledger = ledger(&db).await;
        assert_eq!(ledger.len(), IDS);
        assert!(
            ledger.iter().all(|(_, n)| *n == 1),
            "a handler's write committed twice: {ledger:?}"
        );
        let stats = db.stats();
        assert_eq!(stats.acquired, IDS as u64);
        assert_eq!(stats.replays_completed, (POLLS * IDS - IDS) as u64);
    });
}

/// A deterministic shuffle (xorshift), so that a failure reproduces.
fn shuffle(v: &mut [String], seed: u64) {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for i in (1..v.len()).rev() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        v.swap(i, (s % (i as u64 + 1)) as usize);
    }
}

#[test]
fn a_deadlock_between_two_polls_handlers_reruns_one_poll_whole() {
    runtime().block_on(async {
        let (under, barrier, runs) = accounts_store().await;
        let db = Arc::clone(&under.db);
        // Each poll bumps one account in its first message, meets the other poll in its
        // second (first attempt only), then bumps the other account: a deadlock.
        let poll = |ids: [&'static str; 2], first: &'static str, second: &'static str| {
            let (db, barrier, runs) = (Arc::clone(&db), Arc::clone(&barrier), Arc::clone(&runs));
            tokio::spawn(async move {
                let messages = [
                    (ids[0], bumper(first, None, &runs)),
                    (ids[1], bumper(second, Some(barrier), &runs)),
                ];
                db.consume_batch("transfers", messages).await
            })
        };
        let a = poll(["a1", "a2"], "x", "y");
        let b = poll(["b1", "b2"], "y", "x");
        for answers in [a.await.unwrap(), b.await.unwrap()] {
            assert_eq!(consumed(answers.unwrap()), vec![Consumed::Processed; 2]);
        }
        assert_eq!(
            runs.load(Ordering::SeqCst),
            6,
            "the poll that lost the deadlock ran both its handlers again"
        );
        // The loser's first attempt was rolled back whole: each message counted once.
        assert_eq!(accounts(&db).await, [2, 2]);
        assert!(db.stats().retried >= 1);
    });
}

/// A store with the two accounts, a barrier for two transactions to meet at, and a count
/// of runs.
async fn accounts_store() -> (Under<PgStore>, Arc<tokio::sync::Barrier>, Arc<AtomicU32>) {
    let under = postgres().await;
    accounts_table(&under.db).await;
    let barrier = Arc::new(tokio::sync::Barrier::new(2));
    (under, barrier, Arc::new(AtomicU32::new(0)))
}

/// A handler that bumps `account`, meeting the other side at `meet` first on its first run.
fn bumper(
    account: &'static str,
    meet: Option<Arc<tokio::sync::Barrier>>,
    runs: &Arc<AtomicU32>,
) -> impl for<'t, 'a> FnMut(&'t mut PgTx<'a>) -> PgFuture<'t, Result<(), String>> + Send + use<> {
    let runs = Arc::clone(runs);
    let mut meet = meet;
    pg_handler(move |tx: &mut PgTx<'_>| {
        runs.fetch_add(1, Ordering::SeqCst);
        let meet = meet.take();
        Box::pin(async move {
            if let Some(barrier) = meet {
                barrier.wait().await;
            }
            bump(tx, account).await
        })
    })
}

async fn bump(tx: &PgTx<'_>, account: &str) -> Result<(), String> {
    tx.execute("UPDATE accounts SET n = n + 1 WHERE id = $1", &[&account])
        .await
        .map_err(|e| e.to_string())?;
    Ok(())
}

#[test]
fn an_empty_poll_and_a_poll_of_refused_ids_take_no_connection() {
    runtime().block_on(async {
        let under = postgres_with(Retention::default(), 1).await;
        let db = &under.db;
        // The pool's only connection is taken: a poll that needed one would wait.
        let _held = db.pool().get().await.unwrap();
        let runs = Arc::new(AtomicU32::new(0));
        let within = Duration::from_secs(5);
        let empty = tokio::time::timeout(within, poll(db, &[], &runs)).await;
        assert!(empty.expect("answered without a connection").is_empty());
        let refused = tokio::time::timeout(
            within,
            db.consume_batch("ledger", [("", handler("", &runs, Does::Writes))]),
        )
        .await
        .expect("answered without a connection")
        .unwrap();
        assert!(
            matches!(
                refused[..],
                [Err(ExecuteError::Db(PgError::Refused(
                    Refusal::InvalidInput(_)
                )))]
            ),
            "{refused:?}"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 0);
    });
}

#[test]
fn run_commits_on_ok_and_commits_nothing_on_err() {
    runtime().block_on(async {
        let (under, _) = ledger_store().await;
        let db = &under.db;
        let value = db
            .run(|tx: &mut PgTx<'_>| {
                Box::pin(async move {
                    tx.execute("INSERT INTO ledger (message) VALUES ('ran')", &[])
                        .await?;
                    Ok::<_, tokio_postgres::Error>(42)
                })
            })
            .await
            .unwrap();
        assert_eq!(value, 42);
        assert_eq!(ledger(db).await, rows(&[("ran", 1)]));
        let refused = db
            .run(|tx: &mut PgTx<'_>| {
                Box::pin(async move {
                    tx.execute("INSERT INTO ledger (message) VALUES ('refused')", &[])
                        .await
                        .map_err(|e| e.to_string())?;
                    Err::<(), _>("no".to_string())
                })
            })
            .await;
        assert!(matches!(refused, Err(ExecuteError::Closure(ref e)) if e == "no"));
        // A swallowed failed statement left the transaction aborted: a bare COMMIT would
        // roll back and report success.
        let swallowed = db
            .run(|tx: &mut PgTx<'_>| {
                Box::pin(async move {
                    tx.execute("INSERT INTO ledger (message) VALUES ('swallowed')", &[])
                        .await?;
                    let _ = tx
                        .execute("INSERT INTO ledger (message) VALUES (NULL)", &[])
                        .await;
                    Ok::<_, tokio_postgres::Error>(())
                })
            })
            .await;
        assert!(
            matches!(swallowed, Err(ExecuteError::Db(PgError::Database(_)))),
            "{swallowed:?}"
        );
        assert_eq!(ledger(db).await, rows(&[("ran", 1)]));
    });
}

#[test]
fn run_is_retried_after_a_deadlock_and_each_body_commits_once() {
    runtime().block_on(async {
        let (under, barrier, attempts) = accounts_store().await;
        let db = Arc::clone(&under.db);
        let transfer = |first: &'static str, second: &'static str| {
            let (db, barrier, attempts) =
                (Arc::clone(&db), Arc::clone(&barrier), Arc::clone(&attempts));
            tokio::spawn(async move {
                let mut mine = 0;
                db.run(|tx: &mut PgTx<'_>| {
                    mine += 1;
                    attempts.fetch_add(1, Ordering::SeqCst);
                    let meet = (mine == 1).then(|| Arc::clone(&barrier));
                    Box::pin(async move {
                        bump(tx, first).await?;
                        if let Some(barrier) = meet {
                            barrier.wait().await;
                        }
                        bump(tx, second).await?;
                        Ok::<_, String>(mine)
                    })
                })
                .await
            })
        };
        let (a, b) = (transfer("x", "y"), transfer("y", "x"));
        let (a, b) = (a.await.unwrap().unwrap(), b.await.unwrap().unwrap());
        assert_eq!(a + b, 3, "one side lost the deadlock and ran again");
        assert_eq!(attempts.load(Ordering::SeqCst), 3);
        assert_eq!(accounts(&db).await, [2, 2]);
        assert_eq!(db.stats().retried, 1);
    });
}
