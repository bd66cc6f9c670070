//! After the handler ran, its key is settled, never stranded in progress nor run twice, over
//! a real socket: a response at the limit is stored; one over it, or one that could not be
//! stored, leaves a marker that retries get instead of a second run.

use std::sync::Arc;

use axum::Router;
use axum::http::{Response, StatusCode};
use axum::routing::post;
use common::fresh_shared;
use http_support::{Calls, Server, per_user, problem, request, serve_on};
use idemdb::{IdemDb, InputError, Key, Limits, RecordState, Scope};
use idemdb_http::{IdempotencyConfig, IdempotencyLayer};

mod common;
mod http_support;

/// The stored encoding around a body of the `/sized` handler: version, status, header count,
/// and `content-type: application/octet-stream` with its two lengths.
const OVERHEAD: usize =
    1 + 2 + 2 + (2 + "content-type".len() + 4 + "application/octet-stream".len());

/// `/sized` answers 200 with as many bytes as the request body's number.
fn app(calls: &Calls) -> Router {
    let calls = calls.clone();
    let sized = move |body: String| async move {
        calls.next();
        let len: usize = body.parse().unwrap_or(0);
        Response::builder()
            .header("content-type", "application/octet-stream")
            .body(axum::body::Body::from(vec![b'x'; len]))
            .unwrap()
    };
    Router::new().route("/sized", post(sized))
}

async fn start(db: Arc<IdemDb>, config: IdempotencyConfig) -> (Calls, Server) {
    serve_on(db, app, config).await
}

fn state(db: &IdemDb, key: &str) -> Option<RecordState> {
    let scope = Scope::new("POST /sized", "alice");
    db.get(&scope, &Key::new(key)).unwrap().map(|r| r.state)
}

async fn sized(
    client: &reqwest::Client,
    server: &Server,
    key: &str,
    len: usize,
) -> reqwest::Response {
    let url = format!("{}/sized", server.url);
    request(client, &url, Some(key), Some("alice"), &len.to_string()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_at_the_documented_limit_never_strands_its_key() {
    let (_dir, db) = fresh_shared();
    let (calls, server) = start(Arc::clone(&db), per_user()).await;
    let client = reqwest::Client::new();
    let limit = 1 << 20;
    // Exactly the limit as stored: stored and replayed byte for byte.
    let at = limit - OVERHEAD;
    let first = sized(&client, &server, "\"at\"", at).await;
    assert_eq!(
        (first.status(), first.bytes().await.unwrap().len()),
        (StatusCode::OK, at)
    );
    let replay = sized(&client, &server, "\"at\"", at).await;
    assert!(replay.headers().contains_key("idempotent-replayed"));
    assert_eq!(replay.bytes().await.unwrap().len(), at);
    assert_eq!(calls.get(), 1);

    // A body of the documented 1 MiB: over the limit once stored, so a marker is.
    let first = sized(&client, &server, "\"mib\"", limit).await;
    assert_eq!(
        (first.status(), first.bytes().await.unwrap().len()),
        (StatusCode::OK, limit)
    );
    assert_eq!(
        state(&db, "mib"),
        Some(RecordState::Completed),
        "not left in progress"
    );
    let retry = sized(&client, &server, "\"mib\"", limit).await;
    assert_eq!(
        retry.status(),
        StatusCode::OK,
        "not 409 until the lease ends"
    );
    assert!(retry.headers().contains_key("idempotent-replayed"));
    assert_eq!(
        problem(retry).await["type"],
        "urn:idemdb:problem:response-too-large"
    );
    assert_eq!(calls.get(), 2, "each request ran once");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_response_is_sent_once_and_retries_get_a_marker() {
    let (_dir, db) = fresh_shared();
    let mut config = per_user();
    config.max_stored_response = 4096;
    let (calls, server) = start(Arc::clone(&db), config).await;
    let client = reqwest::Client::new();
    let first = sized(&client, &server, "\"big\"", 10_000).await;
    assert_eq!(first.bytes().await.unwrap().len(), 10_000, "sent in full");
    for _ in 0..3 {
        let retry = sized(&client, &server, "\"big\"", 10_000).await;
        assert_eq!(retry.status(), StatusCode::OK, "the first status");
        assert_eq!(retry.headers()["content-type"], "application/problem+json");
        let body = problem(retry).await;
        assert_eq!(body["type"], "urn:idemdb:problem:response-too-large");
        assert_eq!(body["status"], 200);
        assert!(body["detail"].as_str().unwrap().contains("processed"));
    }
    assert_eq!(calls.get(), 1, "the handler never ran again");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layer_the_store_cannot_hold_is_refused_when_built() {
    let dir = tempfile::tempdir().unwrap();
    let mut limits = Limits::default();
    limits.max_response_len = 64 * 1024;
    let db = Arc::new(
        IdemDb::builder()
            .limits(limits)
            .open(dir.path().join("db"))
            .unwrap(),
    );
    // The default 1 MiB would strand every response between 64 KiB and 1 MiB.
    let refused = IdempotencyLayer::new(Arc::clone(&db), per_user()).err();
    assert!(
        matches!(
            refused,
            Some(InputError::TooLong {
                what: "max_stored_response",
                ..
            })
        ),
        "{refused:?}"
    );
    let mut config = per_user();
    config.max_stored_response = 64 * 1024;
    let mut zero_lease = config.clone();
    zero_lease.lease = std::time::Duration::ZERO;
    let refused = IdempotencyLayer::new(Arc::clone(&db), zero_lease).err();
    assert!(matches!(refused, Some(InputError::ZeroLease)));

    let (calls, server) = start(Arc::clone(&db), config).await;
    let client = reqwest::Client::new();
    for _ in 0..2 {
        let resp = sized(&client, &server, "\"k\"", 100 * 1024).await;
        assert_eq!(resp.status(), StatusCode::OK);
    }
    assert_eq!(state(&db, "k"), Some(RecordState::Completed));
    assert_eq!(calls.get(), 1);
    server.stop().await;
}
