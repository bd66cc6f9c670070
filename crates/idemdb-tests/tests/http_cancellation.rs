//! A request whose future is dropped (the client went away) or whose handler panics releases
//! its key, so that the retry runs the handler again instead of waiting out the lease.

mod common;

use common::fresh_shared;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, Response, StatusCode};
use idemdb::{IdemDb, Key, Scope};
use idemdb_http::{IdempotencyConfig, IdempotencyLayer};
use tower::{Layer, ServiceExt, service_fn};

fn request(key: &str) -> Request<Body> {
    Request::post("/op")
        .header("idempotency-key", key)
        .body(Body::from("payload"))
        .unwrap()
}

/// The record the layer keeps for `key` on POST /op.
fn record(db: &IdemDb, key: &str) -> Option<idemdb::Record> {
    db.get(&Scope::new("POST /op", ""), &Key::new(key)).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_request_releases_its_key() {
    let (_dir, db) = fresh_shared();
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = IdempotencyLayer::new(Arc::clone(&db), IdempotencyConfig::global_keys()).unwrap();
    let handler = {
        let calls = Arc::clone(&calls);
        service_fn(move |_req: Request<Body>| {
            let n = calls.fetch_add(1, Ordering::SeqCst);
            async move {
                if n == 0 {
                    // The first call hangs until its caller gives up.
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                }
                Ok::<_, std::convert::Infallible>(Response::new(Body::from("ok")))
            }
        })
    };
    let service = layer.layer(handler);
    let first = tokio::spawn(service.clone().oneshot(request("k")));
    while calls.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        record(&db, "k").unwrap().state,
        idemdb::RecordState::InProgress
    );
    first.abort();
    assert!(first.await.unwrap_err().is_cancelled());
    assert_eq!(
        record(&db, "k"),
        None,
        "released when the request was dropped"
    );
    let retry = service.oneshot(request("k")).await.unwrap();
    assert_eq!(retry.status(), StatusCode::OK);
    assert_eq!(calls.load(Ordering::SeqCst), 2, "the retry ran the handler");
    assert_eq!(
        record(&db, "k").unwrap().state,
        idemdb::RecordState::Completed
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_handler_releases_its_key_and_the_panic_goes_on() {
    let (_dir, db) = fresh_shared();
    let calls = Arc::new(AtomicUsize::new(0));
    let handler = {
        let calls = Arc::clone(&calls);
        service_fn(move |_req: Request<Body>| {
            let n = calls.fetch_add(1, Ordering::SeqCst);
            async move {
                if n == 0 {
                    panic!("handler bug");
                }
                Ok::<_, std::convert::Infallible>(Response::new(Body::from("ok")))
            }
        })
    };
    let service = IdempotencyLayer::new(Arc::clone(&db), IdempotencyConfig::global_keys())
        .unwrap()
        .layer(handler);
    let crashed = tokio::spawn(service.clone().oneshot(request("p"))).await;
    assert!(
        crashed.unwrap_err().is_panic(),
        "the panic is not swallowed"
    );
    assert_eq!(record(&db, "p"), None, "released");
    let retry = service.oneshot(request("p")).await.unwrap();
    assert_eq!(retry.status(), StatusCode::OK);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_too_large_to_store_is_sent_and_a_marker_stored_in_its_place() {
    let (_dir, db) = fresh_shared();
    let calls = Arc::new(AtomicUsize::new(0));
    let handler = {
        let calls = Arc::clone(&calls);
        service_fn(move |_req: Request<Body>| {
            calls.fetch_add(1, Ordering::SeqCst);
            async move { Ok::<_, std::convert::Infallible>(Response::new(Body::from(vec![7u8; 2048]))) }
        })
    };
    let mut config = IdempotencyConfig::global_keys();
    config.max_stored_response = 1024;
    let service = IdempotencyLayer::new(Arc::clone(&db), config)
        .unwrap()
        .layer(handler);
    let response = service.clone().oneshot(request("big")).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    assert_eq!(body.len(), 2048, "sent in full");
    assert_eq!(
        record(&db, "big").unwrap().state,
        idemdb::RecordState::Completed,
        "settled with a marker, not released"
    );
    let retry = service.oneshot(request("big")).await.unwrap();
    assert_eq!(retry.status(), StatusCode::OK);
    assert_eq!(retry.headers()["content-type"], "application/problem+json");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "the retry did not run it again"
    );
}
