//! The async API on tokio: many concurrent tasks on a current-thread runtime, the same
//! guarantees as the sync API, and sync and async callers sharing commits.

mod common;

use common::{LEASE, db_path, fresh, fresh_shared, open_on};
use idemdb::Refusal;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idemdb::redb::TableDefinition;
use idemdb::{Error, ExecuteOutcome, IdemDb, Key, Outcome, ReserveOutcome, Scope};

const ROWS: TableDefinition<&str, u64> = TableDefinition::new("rows");

#[tokio::test(flavor = "current_thread")]
async fn many_tasks_one_key_on_a_current_thread_runtime() {
    let (_dir, db) = fresh_shared();
    let scope = Scope::new("charge", "u1");
    let acquired = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..200 {
        let (db, scope, acquired) = (Arc::clone(&db), scope.clone(), Arc::clone(&acquired));
        tasks.push(tokio::spawn(async move {
            match db
                .reserve_async(&scope, &Key::new("k"), b"p", LEASE)
                .await
                .unwrap()
            {
                ReserveOutcome::Acquired(r) => {
                    acquired.fetch_add(1, Ordering::SeqCst);
                    db.complete_async(&r, b"receipt".to_vec()).await.unwrap();
                }
                ReserveOutcome::InProgress { .. } => {}
                ReserveOutcome::Completed(b) => assert_eq!(b, b"receipt"),
                other => panic!("unexpected {other:?}"),
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(acquired.load(Ordering::SeqCst), 1);
    assert_eq!(
        db.reserve_async(&scope, &Key::new("k"), b"p", LEASE)
            .await
            .unwrap(),
        ReserveOutcome::Completed(b"receipt".to_vec())
    );
}

#[tokio::test(flavor = "current_thread")]
async fn many_tasks_distinct_keys_all_commit() {
    let (_dir, db) = fresh_shared();
    let scope = Scope::new("op", "p");
    let mut tasks = Vec::new();
    for i in 0..500u64 {
        let (db, scope) = (Arc::clone(&db), scope.clone());
        tasks.push(tokio::spawn(async move {
            let key = Key::new(format!("k{i}"));
            let out = db
                .execute_async(&scope, &key, b"p", move |tx| {
                    tx.open_table(ROWS)?.insert(format!("k{i}").as_str(), i)?;
                    Ok::<_, Error>(Outcome::Completed(i.to_le_bytes().to_vec()))
                })
                .await
                .unwrap();
            assert_eq!(
                out,
                ExecuteOutcome::Executed(Outcome::Completed(i.to_le_bytes().to_vec()))
            );
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let read = db.begin_read().unwrap();
    let rows = read.open_table(ROWS).unwrap();
    assert_eq!(
        idemdb::redb::ReadableTableMetadata::len(&rows).unwrap(),
        500
    );
}

#[tokio::test(flavor = "current_thread")]
async fn owner_operations_and_fencing_async() {
    let clock = idemdb::ManualClock::new(1_000);
    let dir = tempfile::tempdir().unwrap();
    let db = open_on(&dir.path().join("db"), &clock);
    let (scope, key) = (Scope::new("op", "p"), Key::new("k"));
    let ReserveOutcome::Acquired(mut old) =
        db.reserve_async(&scope, &key, b"p", LEASE).await.unwrap()
    else {
        panic!("fresh key")
    };
    db.extend_async(&mut old, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(old.lease_expires_at(), 61_000);
    clock.advance(Duration::from_secs(61));
    let ReserveOutcome::Acquired(new) = db.reserve_async(&scope, &key, b"p", LEASE).await.unwrap()
    else {
        panic!("takeover")
    };
    assert!(new.is_takeover());
    assert!(matches!(
        db.complete_async(&old, b"late".to_vec()).await,
        Err(Error::Refused(Refusal::Fenced { .. }))
    ));
    let err = db
        .complete_with_async(&new, b"x".to_vec(), |_tx| Err::<(), _>("boom"))
        .await
        .unwrap_err();
    assert!(matches!(err, idemdb::ExecuteError::Closure("boom")));
    db.release_async(&new).await.unwrap();
    assert!(db.get(&scope, &key).unwrap().is_none());
    let ReserveOutcome::Acquired(third) =
        db.reserve_async(&scope, &key, b"p", LEASE).await.unwrap()
    else {
        panic!("after release")
    };
    db.fail_async(&third, b"declined".to_vec()).await.unwrap();
    assert_eq!(
        db.reserve_async(&scope, &key, b"p", LEASE).await.unwrap(),
        ReserveOutcome::Failed(b"declined".to_vec())
    );
}

/// Sync threads and async tasks write at once; every op is answered and committed.
#[test]
fn sync_and_async_callers_share_the_writer() {
    let (_dir, db) = fresh_shared();
    let scope = Scope::new("mixed", "p");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    let async_part = {
        let (db, scope) = (Arc::clone(&db), scope.clone());
        rt.spawn(async move {
            let mut tasks = Vec::new();
            for i in 0..300 {
                let (db, scope) = (Arc::clone(&db), scope.clone());
                tasks.push(tokio::spawn(async move {
                    let key = Key::new(format!("a{i}"));
                    let ReserveOutcome::Acquired(r) =
                        db.reserve_async(&scope, &key, b"p", LEASE).await.unwrap()
                    else {
                        panic!("fresh key")
                    };
                    db.complete_async(&r, b"ok".to_vec()).await.unwrap();
                }));
            }
            for t in tasks {
                t.await.unwrap();
            }
        })
    };
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let (db, scope) = (Arc::clone(&db), scope.clone());
            std::thread::spawn(move || {
                for i in 0..40 {
                    let key = Key::new(format!("s{t}-{i}"));
                    let ReserveOutcome::Acquired(r) =
                        db.reserve(&scope, &key, b"p", LEASE).unwrap()
                    else {
                        panic!("fresh key")
                    };
                    db.complete(&r, b"ok".to_vec()).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    rt.block_on(async_part).unwrap();
    for i in 0..300 {
        let rec = db.get(&scope, &Key::new(format!("a{i}"))).unwrap().unwrap();
        assert_eq!(rec.response, b"ok");
    }
}

/// Dropping the database answers queued async ops before the file closes.
#[test]
fn drop_drains_the_queue() {
    let (dir, db) = fresh();
    let path = db_path(&dir);
    let scope = Scope::new("op", "p");
    // Queue ops whose futures are polled once and then dropped: the ops still commit. (A
    // dropped reservation would be released again: see tests/async_cancellation.rs.)
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        for i in 0..50 {
            let key = Key::new(format!("k{i}"));
            let fut = db.execute_async(&scope, &key, b"p", |_| {
                Ok::<_, idemdb::Error>(idemdb::Outcome::Completed(b"done".to_vec()))
            });
            let _ = tokio::time::timeout(Duration::ZERO, fut).await;
        }
    });
    drop(db);
    let db = IdemDb::open(&path).unwrap();
    let mut present = 0;
    for i in 0..50 {
        if db
            .get(&scope, &Key::new(format!("k{i}")))
            .unwrap()
            .is_some()
        {
            present += 1;
        }
    }
    // Each future was polled once (which queues its op) and then dropped unanswered: every
    // queued op still committed before the file closed.
    assert_eq!(present, 50);
    assert_eq!(
        db.reserve(&scope, &Key::new("k0"), b"p", LEASE).unwrap(),
        ReserveOutcome::Completed(b"done".to_vec())
    );
}

#[tokio::test(flavor = "current_thread")]
async fn async_waiters_are_woken_by_the_owner_commit() {
    let (_dir, db) = fresh_shared();
    let scope = Scope::new("op", "p");
    let ReserveOutcome::Acquired(r) = db
        .reserve_async(&scope, &Key::new("k"), b"p", LEASE)
        .await
        .unwrap()
    else {
        panic!("fresh key")
    };
    let waiters: Vec<_> = (0..8)
        .map(|_| {
            let (db, scope) = (Arc::clone(&db), scope.clone());
            tokio::spawn(async move {
                let started = std::time::Instant::now();
                let out = db
                    .reserve_or_wait_async(
                        &scope,
                        &Key::new("k"),
                        b"p",
                        LEASE,
                        Duration::from_secs(30),
                    )
                    .await
                    .unwrap();
                (out, started.elapsed())
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(50)).await;
    db.complete_async(&r, b"done".to_vec()).await.unwrap();
    for w in waiters {
        let (out, waited) = w.await.unwrap();
        assert_eq!(out, ReserveOutcome::Completed(b"done".to_vec()));
        assert!(waited < Duration::from_secs(5), "woken late: {waited:?}");
    }
}

#[tokio::test(flavor = "current_thread")]
async fn an_async_wait_times_out_with_in_progress() {
    let (_dir, db) = fresh_shared();
    let scope = Scope::new("op", "p");
    let _owner = db
        .reserve_async(&scope, &Key::new("k"), b"p", LEASE)
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let out = db
        .reserve_or_wait_async(
            &scope,
            &Key::new("k"),
            b"p",
            LEASE,
            Duration::from_millis(150),
        )
        .await
        .unwrap();
    let waited = started.elapsed();
    assert!(matches!(out, ReserveOutcome::InProgress { .. }), "{out:?}");
    assert!(waited >= Duration::from_millis(150), "{waited:?}");
    assert!(waited < Duration::from_secs(5), "{waited:?}");
}

#[tokio::test(flavor = "current_thread")]
async fn an_async_waiter_takes_over_when_the_lease_runs_out() {
    let (_dir, db) = fresh_shared();
    let scope = Scope::new("op", "p");
    let short = Duration::from_millis(200);
    let ReserveOutcome::Acquired(stale) = db
        .reserve_async(&scope, &Key::new("k"), b"p", short)
        .await
        .unwrap()
    else {
        panic!("fresh key")
    };
    let out = db
        .reserve_or_wait_async(&scope, &Key::new("k"), b"p", LEASE, Duration::from_secs(30))
        .await
        .unwrap();
    let ReserveOutcome::Acquired(fresh) = out else {
        panic!("expected a takeover, got {out:?}")
    };
    assert!(fresh.is_takeover());
    assert!(fresh.token() > stale.token());
}

/// Test hooks' `lazy_committer` (the fuzz target's): sync callers need no committer thread;
/// the first async caller starts it, and so does a log past `checkpoint_bytes`; queued ops
/// are still drained at close.
#[test]
fn a_lazy_committer_starts_when_first_needed() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    let scope = Scope::new("op", "p");
    let lazy = || {
        IdemDb::builder()
            .lazy_committer(true)
            .checkpoint_bytes(64 << 10)
            .checkpoint_interval(Duration::from_secs(3600))
    };
    // Sync callers only, past the checkpoint's size (not twice past it, where a leader would
    // take one itself): the thread starts and takes it.
    let db = lazy().open(&path).unwrap();
    let body = vec![7u8; 4096];
    for i in 0..20 {
        let r = common::acquired(
            db.reserve(&scope, &Key::new(format!("s{i}")), b"p", LEASE)
                .unwrap(),
        );
        db.complete(&r, body.clone()).unwrap();
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while db.stats().checkpoints == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no checkpoint by size"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(db);
    // An async caller on a database whose thread has not started: it leads for it, and ops
    // queued by futures dropped unanswered still commit before the file closes.
    let db = lazy().open(&path).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        let r = common::acquired(
            db.reserve_async(&scope, &Key::new("a"), b"p", LEASE)
                .await
                .unwrap(),
        );
        db.complete_async(&r, b"done".to_vec()).await.unwrap();
        for i in 0..20 {
            let key = Key::new(format!("q{i}"));
            let fut = db.execute_async(&scope, &key, b"p", |_| {
                Ok::<_, Error>(Outcome::Completed(b"done".to_vec()))
            });
            let _ = tokio::time::timeout(Duration::ZERO, fut).await;
        }
    });
    drop(db);
    let db = IdemDb::open(&path).unwrap();
    for key in std::iter::once("a".to_string()).chain((0..20).map(|i| format!("q{i}"))) {
        assert_eq!(
            db.reserve(&scope, &Key::new(&key), b"p", LEASE).unwrap(),
            ReserveOutcome::Completed(b"done".to_vec()),
            "{key}"
        );
    }
    assert_eq!(
        db.reserve(&scope, &Key::new("s19"), b"p", LEASE).unwrap(),
        ReserveOutcome::Completed(body)
    );
}
