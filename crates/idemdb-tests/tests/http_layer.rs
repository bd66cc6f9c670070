//! The Idempotency-Key layer over a real socket: an axum server on 127.0.0.1 and a real HTTP
//! client. The scenarios that do not reopen a file run on the embedded engine and on
//! PostgreSQL.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use common::stores::Under;
use http_support::Server;
use idemdb::{IdemDb, Store};
use idemdb_http::{IdempotencyConfig, IdempotencyLayer};

mod common;
mod http_support;

#[derive(Clone, Default)]
struct Counts {
    purchase: Arc<AtomicUsize>,
    flaky: Arc<AtomicUsize>,
    declined: Arc<AtomicUsize>,
}

async fn purchase(State(c): State<Counts>, body: String) -> impl axum::response::IntoResponse {
    let n = c.purchase.fetch_add(1, Ordering::SeqCst) + 1;
    tokio::time::sleep(Duration::from_millis(150)).await;
    (
        StatusCode::CREATED,
        [
            ("content-type", "application/json"),
            ("location", "/orders/1"),
            ("x-request-scoped", "not stored"),
        ],
        format!("{{\"order\":{n},\"echo\":{body:?}}}"),
    )
}

/// 503 on the first call, 201 after.
async fn flaky(State(c): State<Counts>) -> (StatusCode, &'static str) {
    match c.flaky.fetch_add(1, Ordering::SeqCst) {
        0 => (StatusCode::SERVICE_UNAVAILABLE, "try again"),
        _ => (StatusCode::CREATED, "done"),
    }
}

async fn declined(State(c): State<Counts>) -> (StatusCode, &'static str) {
    c.declined.fetch_add(1, Ordering::SeqCst);
    (StatusCode::PAYMENT_REQUIRED, "card declined")
}

/// The test routes behind the layer with `config`.
async fn serve<S: Store>(db: Arc<S>, counts: Counts, config: IdempotencyConfig) -> Server {
    let app = Router::new()
        .route("/purchase", post(purchase))
        .route("/flaky", post(flaky))
        .route("/declined", post(declined))
        .layer(IdempotencyLayer::new(db, config).unwrap())
        .with_state(counts);
    Server::start(app).await
}

/// What a client saw: status, the headers that matter here, the body bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    status: u16,
    content_type: Option<String>,
    location: Option<String>,
    replayed: bool,
    body: Vec<u8>,
}

async fn send(
    client: &reqwest::Client,
    url: &str,
    key: Option<&str>,
    body: &str,
) -> (Seen, reqwest::header::HeaderMap) {
    let mut req = client.post(url).body(body.to_string());
    if let Some(key) = key {
        req = req.header("Idempotency-Key", format!("\"{key}\""));
    }
    let resp = req.send().await.unwrap();
    let headers = resp.headers().clone();
    let text = |name: &str| headers.get(name).map(|v| v.to_str().unwrap().to_string());
    let seen = Seen {
        status: resp.status().as_u16(),
        content_type: text("content-type"),
        location: text("location"),
        replayed: text("idempotent-replayed").as_deref() == Some("true"),
        body: resp.bytes().await.unwrap().to_vec(),
    };
    (seen, headers)
}

fn open(path: &std::path::Path) -> Arc<IdemDb> {
    Arc::new(IdemDb::open(path).unwrap())
}

/// Closes `db` once no one else holds it: a task the layer spawned for a request (its lease
/// heartbeat) may end a moment after the server stopped, and the file opens once only.
async fn close_once_released(db: Arc<IdemDb>) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while Arc::strong_count(&db) > 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "the handle is still held"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    drop(db);
}

/// A server on the store under test, with fresh handler counts.
async fn start<S: Store>(under: &Under<S>, config: IdempotencyConfig) -> (Counts, Server) {
    let counts = Counts::default();
    let server = serve(Arc::clone(&under.db), counts.clone(), config).await;
    (counts, server)
}

async fn sixty_four_concurrent_duplicates_run_the_handler_once<S: Store>(under: Under<S>) {
    let (counts, server) = start(&under, IdempotencyConfig::global_keys()).await;
    let client = reqwest::Client::new();
    let url = format!("{}/purchase", server.url);
    let replies: Vec<_> = (0..64)
        .map(|_| {
            let (client, url) = (client.clone(), url.clone());
            tokio::spawn(async move { send(&client, &url, Some("intent-1"), "{\"sku\":1}").await })
        })
        .collect();
    let mut firsts = Vec::new();
    let mut conflicts = 0;
    for r in replies {
        let (seen, headers) = r.await.unwrap();
        match seen.status {
            201 => firsts.push(seen),
            409 => {
                conflicts += 1;
                let retry: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
                assert!((1..=30).contains(&retry));
                assert_eq!(headers["content-type"], "application/problem+json");
            }
            other => panic!("unexpected status {other}: {seen:?}"),
        }
    }
    assert_eq!(
        counts.purchase.load(Ordering::SeqCst),
        1,
        "the handler ran once"
    );
    assert!(!firsts.is_empty());
    let first = &firsts[0];
    for seen in &firsts {
        assert_eq!(
            (seen.status, &seen.body, &seen.location),
            (first.status, &first.body, &first.location)
        );
    }
    assert_eq!(firsts.len() + conflicts, 64);
    // A retry after it finished: the same bytes, marked as a replay; the handler did not run.
    let (again, headers) = send(&client, &url, Some("intent-1"), "{\"sku\":1}").await;
    assert!(again.replayed);
    assert_eq!((again.status, &again.body), (201, &first.body));
    assert_eq!(again.content_type.as_deref(), Some("application/json"));
    assert_eq!(again.location.as_deref(), Some("/orders/1"));
    assert!(
        headers.get("x-request-scoped").is_none(),
        "not on the allow-list"
    );
    assert_eq!(headers["idempotency-retention"], "86400");
    assert_eq!(counts.purchase.load(Ordering::SeqCst), 1);
    server.stop().await;
}

async fn refusals_are_problem_json_with_the_right_status<S: Store>(under: Under<S>) {
    let mut config = IdempotencyConfig::global_keys();
    config.max_body = 64;
    let (counts, server) = start(&under, config).await;
    let client = reqwest::Client::new();
    let url = format!("{}/purchase", server.url);
    let (missing, _) = send(&client, &url, None, "{}").await;
    assert_eq!(missing.status, 400);
    assert_eq!(
        missing.content_type.as_deref(),
        Some("application/problem+json")
    );
    let problem: serde_json::Value = serde_json::from_slice(&missing.body).unwrap();
    assert_eq!(problem["type"], "urn:idemdb:problem:key-missing");
    assert_eq!(problem["status"], 400);
    assert_eq!(send(&client, &url, Some(""), "{}").await.0.status, 400);
    let (big, _) = send(&client, &url, Some("k-big"), &"x".repeat(65)).await;
    assert_eq!(big.status, 413);
    assert_eq!(
        counts.purchase.load(Ordering::SeqCst),
        0,
        "no refusal ran the handler"
    );

    assert_eq!(
        send(&client, &url, Some("k"), "{\"sku\":1}").await.0.status,
        201
    );
    let (mismatch, _) = send(&client, &url, Some("k"), "{\"sku\":2}").await;
    assert_eq!(mismatch.status, 422);
    let problem: serde_json::Value = serde_json::from_slice(&mismatch.body).unwrap();
    assert_eq!(problem["type"], "urn:idemdb:problem:key-reused");
    // The same key on another route is another record.
    let other = format!("{}/declined", server.url);
    assert_eq!(
        send(&client, &other, Some("k"), "{\"sku\":1}")
            .await
            .0
            .status,
        402
    );
    assert_eq!(counts.purchase.load(Ordering::SeqCst), 1);
    server.stop().await;
}

async fn a_5xx_releases_the_key_and_a_4xx_is_replayed<S: Store>(under: Under<S>) {
    let (counts, server) = start(&under, IdempotencyConfig::global_keys()).await;
    let client = reqwest::Client::new();
    let flaky = format!("{}/flaky", server.url);
    let (first, _) = send(&client, &flaky, Some("f"), "x").await;
    assert_eq!((first.status, first.replayed), (503, false));
    let (retry, _) = send(&client, &flaky, Some("f"), "x").await;
    assert_eq!(
        (retry.status, retry.replayed),
        (201, false),
        "the retry ran the handler"
    );
    let (replay, _) = send(&client, &flaky, Some("f"), "x").await;
    assert_eq!(
        (replay.status, replay.replayed, replay.body.as_slice()),
        (201, true, &b"done"[..])
    );
    assert_eq!(counts.flaky.load(Ordering::SeqCst), 2);

    let declined = format!("{}/declined", server.url);
    let (no, _) = send(&client, &declined, Some("d"), "x").await;
    let (again, _) = send(&client, &declined, Some("d"), "x").await;
    assert_eq!((no.status, again.status, again.replayed), (402, 402, true));
    assert_eq!(again.body, b"card declined");
    assert_eq!(
        counts.declined.load(Ordering::SeqCst),
        1,
        "a declined card is not charged again"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_after_a_restart_is_byte_identical() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let counts = Counts::default();
    let db = open(&path);
    let server = serve(
        Arc::clone(&db),
        counts.clone(),
        IdempotencyConfig::global_keys(),
    )
    .await;
    let client = reqwest::Client::new();
    let (first, _) = send(
        &client,
        &format!("{}/purchase", server.url),
        Some("r"),
        "{\"sku\":3}",
    )
    .await;
    drop(client);
    server.stop().await;
    close_once_released(db).await;

    let server = serve(
        open(&path),
        counts.clone(),
        IdempotencyConfig::global_keys(),
    )
    .await;
    let client = reqwest::Client::new();
    let (replay, _) = send(
        &client,
        &format!("{}/purchase", server.url),
        Some("r"),
        "{\"sku\":3}",
    )
    .await;
    assert!(replay.replayed && !first.replayed);
    assert_eq!(
        (
            replay.status,
            &replay.content_type,
            &replay.location,
            &replay.body
        ),
        (
            first.status,
            &first.content_type,
            &first.location,
            &first.body
        )
    );
    assert_eq!(counts.purchase.load(Ordering::SeqCst), 1);
    server.stop().await;
}

async fn with_wait_a_duplicate_gets_the_first_response_instead_of_409<S: Store>(under: Under<S>) {
    let mut config = IdempotencyConfig::global_keys();
    config.wait = Some(Duration::from_secs(5));
    let (counts, server) = start(&under, config).await;
    let client = reqwest::Client::new();
    let url = format!("{}/purchase", server.url);
    let replies: Vec<_> = (0..16)
        .map(|_| {
            let (client, url) = (client.clone(), url.clone());
            tokio::spawn(async move { send(&client, &url, Some("w"), "{}").await.0 })
        })
        .collect();
    let mut bodies = Vec::new();
    for r in replies {
        let seen = r.await.unwrap();
        assert_eq!(seen.status, 201, "{seen:?}");
        bodies.push(seen.body);
    }
    assert!(bodies.windows(2).all(|w| w[0] == w[1]));
    assert_eq!(counts.purchase.load(Ordering::SeqCst), 1);
    server.stop().await;
}

on_both_stores!(
    sixty_four_concurrent_duplicates_run_the_handler_once,
    refusals_are_problem_json_with_the_right_status,
    a_5xx_releases_the_key_and_a_4xx_is_replayed,
    with_wait_a_duplicate_gets_the_first_response_instead_of_409,
);
