//! Over PostgreSQL, `execute`, `complete_with` and `consume` give the closure the transaction
//! that also writes the record: both commit, or neither.

mod common;

use common::stores::{accounts, accounts_table, postgres, runtime};
use idemdb_postgres::Refusal;

use idemdb::{Consumed, ExecuteError, ExecuteOutcome, Key, Outcome, ReserveOutcome, Scope, Store};
use idemdb_postgres::tokio_postgres;

use common::{LEASE, acquired};

async fn orders_table(db: &idemdb_postgres::PgStore) {
    let client = db.pool().get().await.unwrap();
    client
        .batch_execute("CREATE TABLE orders (id text PRIMARY KEY, cents bigint NOT NULL)")
        .await
        .unwrap();
}

async fn orders(db: &idemdb_postgres::PgStore) -> Vec<(String, i64)> {
    let client = db.pool().get().await.unwrap();
    client
        .query("SELECT id, cents FROM orders ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

#[test]
fn execute_commits_the_closure_writes_with_the_record_once() {
    runtime().block_on(async {
        let under = postgres().await;
        let db = &under.db;
        orders_table(db).await;
        let scope = Scope::new("POST /orders", "u1");
        let key = Key::new("k1");
        fn place<'t>(
            tx: &'t mut idemdb_postgres::PgTx<'_>,
        ) -> idemdb_postgres::PgFuture<'t, Result<Outcome, tokio_postgres::Error>> {
            Box::pin(async move {
                tx.execute("INSERT INTO orders VALUES ('o-1', 1999)", &[])
                    .await?;
                Ok(Outcome::Completed(b"201 o-1".to_vec()))
            })
        }
        let first = db.execute(&scope, &key, b"req", place).await.unwrap();
        assert_eq!(
            first,
            ExecuteOutcome::Executed(Outcome::Completed(b"201 o-1".to_vec()))
        );
        // A duplicate replays; its closure would fail on the primary key if it ran.
        let again = db.execute(&scope, &key, b"req", place).await.unwrap();
        assert_eq!(again, ExecuteOutcome::Completed(b"201 o-1".to_vec()));
        assert_eq!(orders(db).await, [("o-1".to_string(), 1999)]);
        assert_eq!(
            db.execute(&scope, &key, b"other", place).await.unwrap(),
            ExecuteOutcome::Mismatch
        );
    });
}

#[test]
fn a_failing_closure_commits_neither_its_writes_nor_the_record() {
    runtime().block_on(async {
        let under = postgres().await;
        let db = &under.db;
        orders_table(db).await;
        let scope = Scope::new("POST /orders", "u1");
        let key = Key::new("k1");
        let result = db
            .execute(
                &scope,
                &key,
                b"req",
                |tx: &mut idemdb_postgres::PgTx<'_>| {
                    Box::pin(async move {
                        tx.execute("INSERT INTO orders VALUES ('o-1', 5)", &[])
                            .await
                            .map_err(|e| e.to_string())?;
                        Err::<Outcome, _>("the stock ran out".to_string())
                    })
                },
            )
            .await;
        assert!(matches!(result, Err(ExecuteError::Closure(ref e)) if e == "the stock ran out"));
        assert!(orders(db).await.is_empty());
        assert_eq!(db.get(&scope, &key).await.unwrap(), None);
        // The retry runs.
        let ok = db
            .execute(
                &scope,
                &key,
                b"req",
                |tx: &mut idemdb_postgres::PgTx<'_>| {
                    Box::pin(async move {
                        tx.execute("INSERT INTO orders VALUES ('o-1', 5)", &[])
                            .await?;
                        Ok::<_, tokio_postgres::Error>(Outcome::Failed(b"declined".to_vec()))
                    })
                },
            )
            .await
            .unwrap();
        assert_eq!(
            ok,
            ExecuteOutcome::Executed(Outcome::Failed(b"declined".to_vec()))
        );
        assert_eq!(orders(db).await.len(), 1);
    });
}

#[test]
fn complete_with_commits_with_the_record_and_a_stale_owner_runs_nothing() {
    runtime().block_on(async {
        let under = postgres().await;
        let db = std::sync::Arc::clone(&under.db);
        orders_table(&db).await;
        let scope = Scope::new("POST /orders", "u1");
        let key = Key::new("k1");
        let r = acquired(db.reserve(&scope, &key, b"req", LEASE).await.unwrap());
        // From a spawned task: the future is Send.
        let task = {
            let db = std::sync::Arc::clone(&db);
            let r = r.clone();
            tokio::spawn(async move {
                db.complete_with(&r, b"201".to_vec(), |tx: &mut idemdb_postgres::PgTx<'_>| {
                    Box::pin(async move {
                        tx.execute("INSERT INTO orders VALUES ('o-1', 7)", &[])
                            .await?;
                        Ok::<_, tokio_postgres::Error>(())
                    })
                })
                .await
            })
        };
        task.await.unwrap().unwrap();
        assert_eq!(
            db.reserve(&scope, &key, b"req", LEASE).await.unwrap(),
            ReserveOutcome::Completed(b"201".to_vec())
        );
        // Finished: a second complete_with is refused before its closure runs.
        let again = db
            .complete_with(&r, b"201".to_vec(), |tx: &mut idemdb_postgres::PgTx<'_>| {
                Box::pin(async move {
                    tx.execute("INSERT INTO orders VALUES ('o-2', 7)", &[])
                        .await?;
                    Ok::<_, tokio_postgres::Error>(())
                })
            })
            .await;
        assert!(matches!(
            again,
            Err(ExecuteError::Db(idemdb_postgres::PgError::Refused(
                Refusal::NotInProgress { .. }
            )))
        ));
        assert_eq!(orders(&db).await, [("o-1".to_string(), 7)]);
    });
}

#[test]
fn consume_runs_each_message_once() {
    runtime().block_on(async {
        let under = postgres().await;
        let db = &under.db;
        orders_table(db).await;
        let deliver = async || {
            db.consume("ledger", "msg-1", |tx: &mut idemdb_postgres::PgTx<'_>| {
                Box::pin(async move {
                    tx.execute("INSERT INTO orders VALUES ('m-1', 50)", &[])
                        .await?;
                    Ok::<_, tokio_postgres::Error>(())
                })
            })
            .await
            .unwrap()
        };
        assert_eq!(deliver().await, Consumed::Processed);
        assert_eq!(deliver().await, Consumed::Duplicate);
        assert_eq!(orders(db).await.len(), 1);
    });
}

#[test]
fn a_deadlock_between_two_closures_is_retried_inside_and_each_commits_once() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};
    runtime().block_on(async {
        let under = postgres().await;
        let db = Arc::clone(&under.db);
        accounts_table(&db).await;
        let barrier = Arc::new(tokio::sync::Barrier::new(2));
        let attempts = Arc::new(AtomicU32::new(0));
        // Each locks its first row, meets the other, then wants the other's row.
        let transfer = |key: &'static str, first: &'static str, second: &'static str| {
            let (db, barrier, attempts) =
                (Arc::clone(&db), Arc::clone(&barrier), Arc::clone(&attempts));
            tokio::spawn(async move {
                let mut mine = 0;
                let bump = "UPDATE accounts SET n = n + 1 WHERE id = $1";
                db.execute(
                    &Scope::new("transfer", "u"),
                    &Key::new(key),
                    b"req",
                    |tx: &mut idemdb_postgres::PgTx<'_>| {
                        mine += 1;
                        attempts.fetch_add(1, Ordering::SeqCst);
                        let meet = (mine == 1).then(|| Arc::clone(&barrier));
                        Box::pin(async move {
                            tx.execute(bump, &[&first]).await?;
                            if let Some(barrier) = meet {
                                barrier.wait().await;
                            }
                            tx.execute(bump, &[&second]).await?;
                            Ok::<_, tokio_postgres::Error>(Outcome::Completed(
                                key.as_bytes().to_vec(),
                            ))
                        })
                    },
                )
                .await
            })
        };
        let a = transfer("t1", "x", "y");
        let b = transfer("t2", "y", "x");
        let (a, b) = (a.await.unwrap(), b.await.unwrap());
        assert_eq!(
            a.unwrap(),
            ExecuteOutcome::Executed(Outcome::Completed(b"t1".to_vec()))
        );
        assert_eq!(
            b.unwrap(),
            ExecuteOutcome::Executed(Outcome::Completed(b"t2".to_vec()))
        );
        assert_eq!(
            attempts.load(Ordering::SeqCst),
            3,
            "one side lost the deadlock and ran again"
        );
        // The loser's first attempt was rolled back: each transfer counted once.
        assert_eq!(accounts(&db).await, [2, 2]);
    });
}

#[test]
fn a_closure_that_swallows_a_failed_statement_commits_nothing() {
    runtime().block_on(async {
        let under = postgres().await;
        let db = &under.db;
        orders_table(db).await;
        let (scope, key) = (Scope::new("POST /orders", "u1"), Key::new("k1"));
        let r = acquired(db.reserve(&scope, &key, b"req", LEASE).await.unwrap());
        // The failed insert aborts the transaction; a bare COMMIT would roll it back and
        // report success. The store's own write after the closure fails instead.
        let result = db
            .complete_with(&r, b"201".to_vec(), |tx: &mut idemdb_postgres::PgTx<'_>| {
                Box::pin(async move {
                    let _ = tx
                        .execute("INSERT INTO orders VALUES ('o-1', 'NaN-ish')", &[])
                        .await;
                    Ok::<_, tokio_postgres::Error>(())
                })
            })
            .await;
        assert!(
            matches!(
                result,
                Err(ExecuteError::Db(idemdb_postgres::PgError::Database(_)))
            ),
            "{result:?}"
        );
        let rec = db.get(&scope, &key).await.unwrap().unwrap();
        assert_eq!(
            rec.state,
            idemdb::RecordState::InProgress,
            "still the owner's to finish"
        );
        assert!(orders(db).await.is_empty());
        // The same for execute: neither the row nor the record.
        let k2 = Key::new("k2");
        let result = db
            .execute(&scope, &k2, b"req", |tx: &mut idemdb_postgres::PgTx<'_>| {
                Box::pin(async move {
                    let _ = tx
                        .execute("INSERT INTO orders VALUES ('o-2', 'NaN-ish')", &[])
                        .await;
                    Ok::<_, tokio_postgres::Error>(Outcome::Completed(b"201".to_vec()))
                })
            })
            .await;
        assert!(
            matches!(
                result,
                Err(ExecuteError::Db(idemdb_postgres::PgError::Database(_)))
            ),
            "{result:?}"
        );
        assert_eq!(db.get(&scope, &k2).await.unwrap(), None);
    });
}
