//! The lease outlives a slow handler while its owner lives: renewed in the background
//! ([`Heartbeat`], [`Store::renew_lease`], and by default in the HTTP layer), so a handler three
//! times slower than its lease runs once; an owner that stopped (its heartbeat gone) is still
//! taken over after about one lease. On both stores, in real time (the embedded engine on the
//! system clock, PostgreSQL on the server's).

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::routing::post;
use common::acquired;
use common::stores::{fresh_database_url, runtime};
use idemdb::{Heartbeat, IdemDb, Key, Refusal, ReserveOutcome, Scope, Store, StoreError};
use idemdb_http::{IdempotencyConfig, IdempotencyLayer};
use idemdb_postgres::PgStore;
use tower::ServiceExt;

const LEASE: Duration = Duration::from_secs(1);

fn scope() -> Scope {
    Scope::new("POST /reports", "u1")
}

/// A PostgreSQL store on a fresh database, on the server's own clock.
async fn postgres() -> Arc<PgStore> {
    let builder = PgStore::builder(&fresh_database_url()).unwrap();
    builder.migrate().await.unwrap();
    Arc::new(builder.connect().await.unwrap())
}

fn embedded() -> (tempfile::TempDir, Arc<IdemDb>) {
    common::fresh_shared()
}

/// Duplicates look every 50 ms for three leases while the owner works: none acquires.
async fn a_slow_owner_runs_once<S: Store>(db: Arc<S>) {
    let key = Key::new("slow");
    let r = acquired(db.reserve(&scope(), &key, b"req", LEASE).await.unwrap());
    let beat = Heartbeat::start(Arc::clone(&db), &r, LEASE).unwrap();
    let until = Instant::now() + LEASE * 3;
    let mut looks = 0;
    while Instant::now() < until {
        match db.reserve(&scope(), &key, b"req", LEASE).await.unwrap() {
            ReserveOutcome::InProgress { .. } => looks += 1,
            other => panic!("a duplicate got {other:?} while the owner was working"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(looks >= 10, "{looks} looks");
    assert!(!beat.is_lost());
    beat.stop().unwrap();
    db.complete(&r, b"once".to_vec()).await.unwrap();
    assert_eq!(
        db.reserve(&scope(), &key, b"req", LEASE).await.unwrap(),
        ReserveOutcome::Completed(b"once".to_vec())
    );
}

/// The owner's heartbeat stops (as when its process dies): a duplicate takes over after
/// about one lease, and the stopped owner is fenced.
async fn a_stopped_owner_is_taken_over_after_about_one_lease<S: Store>(db: Arc<S>) {
    let key = Key::new("dead");
    let r = acquired(db.reserve(&scope(), &key, b"req", LEASE).await.unwrap());
    let beat = Heartbeat::start(Arc::clone(&db), &r, LEASE).unwrap();
    tokio::time::sleep(LEASE * 2).await;
    assert!(matches!(
        db.reserve(&scope(), &key, b"req", LEASE).await.unwrap(),
        ReserveOutcome::InProgress { .. }
    ));
    drop(beat);
    let stopped = Instant::now();
    let taken = loop {
        match db.reserve(&scope(), &key, b"req", LEASE).await.unwrap() {
            ReserveOutcome::Acquired(taken) => break taken,
            ReserveOutcome::InProgress { .. } => {}
            other => panic!("{other:?}"),
        }
        assert!(
            stopped.elapsed() < LEASE * 4,
            "never taken over after the heartbeat stopped"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let after = stopped.elapsed();
    // The last renewal was at most a third of a lease before the stop.
    assert!(
        after >= LEASE / 2 && after <= LEASE + Duration::from_millis(500),
        "taken over {after:?} after the heartbeat stopped"
    );
    assert!(taken.is_takeover() && taken.token() > r.token());
    assert!(matches!(
        db.complete(&r, b"late".to_vec())
            .await
            .map_err(|e| e.refusal().cloned()),
        Err(Some(Refusal::Fenced { .. }))
    ));
    // A heartbeat of a reservation taken over ends, and says so.
    let beat = Heartbeat::start(Arc::clone(&db), &r, LEASE).unwrap();
    tokio::time::sleep(LEASE).await;
    assert!(beat.is_lost());
    assert!(matches!(
        beat.stop().map_err(|e| e.refusal().cloned()),
        Err(Some(Refusal::Fenced { .. }))
    ));
}

/// The layer's handler takes three leases; the same request is sent again every quarter
/// lease meanwhile, for two and a half leases. How many times the handler ran.
async fn handler_runs<S: Store>(db: Arc<S>, renew_lease: bool) -> usize {
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&runs);
    let mut config = IdempotencyConfig::global_keys();
    config.lease = LEASE;
    config.renew_lease = renew_lease;
    let app = Router::new()
        .route(
            "/reports",
            post(move || {
                let counted = Arc::clone(&counted);
                async move {
                    let n = counted.fetch_add(1, Ordering::SeqCst) + 1;
                    tokio::time::sleep(LEASE * 3).await;
                    (StatusCode::CREATED, format!("report {n}"))
                }
            }),
        )
        .layer(IdempotencyLayer::new(db, config).unwrap());
    let send = |app: Router| async move {
        let req = Request::post("/reports")
            .header("idempotency-key", "k-slow")
            .body(Body::empty())
            .unwrap();
        app.oneshot(req).await.unwrap().status()
    };
    let mut sent = vec![tokio::spawn(send(app.clone()))];
    for _ in 0..10 {
        tokio::time::sleep(LEASE / 4).await;
        sent.push(tokio::spawn(send(app.clone())));
    }
    for s in sent {
        let status = s.await.unwrap();
        assert!(
            status == StatusCode::CREATED || status == StatusCode::CONFLICT,
            "{status}"
        );
    }
    runs.load(Ordering::SeqCst)
}

#[test]
fn a_handler_three_times_slower_than_its_lease_runs_once_embedded() {
    let (_dir, db) = embedded();
    runtime().block_on(a_slow_owner_runs_once(db));
}

#[test]
fn a_handler_three_times_slower_than_its_lease_runs_once_postgres() {
    runtime().block_on(async { a_slow_owner_runs_once(postgres().await).await });
}

#[test]
fn a_stopped_owner_is_taken_over_after_about_one_lease_embedded() {
    let (_dir, db) = embedded();
    runtime().block_on(a_stopped_owner_is_taken_over_after_about_one_lease(db));
}

#[test]
fn a_stopped_owner_is_taken_over_after_about_one_lease_postgres() {
    runtime().block_on(async {
        a_stopped_owner_is_taken_over_after_about_one_lease(postgres().await).await
    });
}

#[test]
fn the_http_layer_renews_a_slow_handler_s_lease_by_default() {
    let (_dir, db) = embedded();
    assert!(IdempotencyConfig::global_keys().renew_lease);
    runtime().block_on(async {
        assert_eq!(handler_runs(db, true).await, 1, "embedded");
        assert_eq!(handler_runs(postgres().await, true).await, 1, "postgres");
    });
}

#[test]
fn without_renewal_the_same_slow_handler_runs_again() {
    // What the renewal prevents: the test above would see it.
    let (_dir, db) = embedded();
    runtime().block_on(async {
        assert!(handler_runs(db, false).await >= 2);
    });
}
