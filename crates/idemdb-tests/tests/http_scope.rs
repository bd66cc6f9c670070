//! Whose keys a key is compared with, over a real socket: per caller unless the service opts
//! in to global keys; a scope too long for the store is the client's 4xx, not a 503.

use axum::Router;
use axum::routing::MethodFilter;
use http_support::{Calls, Server, order, per_user, problem, request, serve};
use idemdb_http::IdempotencyConfig;

mod common;
mod http_support;

/// `/order` (POST and PATCH), `/other` and `/items/{*rest}` answer 201 "order <n>", n
/// counting the handler's runs.
fn app(calls: &Calls) -> Router {
    Router::new()
        .route(
            "/order",
            order(calls, MethodFilter::POST.or(MethodFilter::PATCH)),
        )
        .route("/other", order(calls, MethodFilter::POST))
        .route("/items/{*rest}", order(calls, MethodFilter::POST))
}

async fn start(config: IdempotencyConfig) -> (tempfile::TempDir, Calls, Server) {
    serve(app, config).await
}

async fn text(resp: reqwest::Response) -> (u16, bool, String) {
    let replayed = resp.headers().contains_key("idempotent-replayed");
    (resp.status().as_u16(), replayed, resp.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_caller_with_the_same_key_never_gets_the_first_callers_response() {
    let (_dir, calls, server) = start(per_user()).await;
    let client = reqwest::Client::new();
    let url = format!("{}/order", server.url);
    let send = |user: Option<&'static str>, body: &'static str| {
        let (client, url) = (client.clone(), url.clone());
        async move { text(request(&client, &url, Some("\"k\""), user, body).await).await }
    };
    assert_eq!(
        send(Some("alice"), "x").await,
        (201, false, "order 1".into())
    );
    assert_eq!(
        send(Some("alice"), "x").await,
        (201, true, "order 1".into())
    );
    // Bob's request with Alice's key is his own: it runs, whatever its body.
    assert_eq!(send(Some("bob"), "x").await, (201, false, "order 2".into()));
    assert_eq!(
        send(Some("carol"), "y").await,
        (201, false, "order 3".into())
    );
    // No caller (or an empty name, the global scope's): refused, never shared.
    for user in [None, Some("")] {
        let resp = request(&client, &url, Some("\"k\""), user, "x").await;
        assert_eq!(resp.status(), 403);
        assert_eq!(
            problem(resp).await["type"],
            "urn:idemdb:problem:principal-missing"
        );
    }
    assert_eq!(calls.get(), 3);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn global_keys_are_shared_by_every_caller_and_only_on_request() {
    let (_dir, calls, server) = start(IdempotencyConfig::global_keys()).await;
    let client = reqwest::Client::new();
    let url = format!("{}/order", server.url);
    let first = text(request(&client, &url, Some("\"g\""), Some("alice"), "x").await).await;
    let other = text(request(&client, &url, Some("\"g\""), Some("bob"), "x").await).await;
    assert_eq!(first, (201, false, "order 1".into()));
    assert_eq!(
        other,
        (201, true, "order 1".into()),
        "the opt-in shares keys"
    );
    assert_eq!(calls.get(), 1);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_method_or_route_is_another_scope_and_a_query_is_part_of_the_request() {
    let (_dir, calls, server) = start(per_user()).await;
    let client = reqwest::Client::new();
    let key = Some("\"same\"");
    let order = format!("{}/order", server.url);
    assert_eq!(
        text(request(&client, &order, key, Some("a"), "x").await)
            .await
            .0,
        201
    );
    let other = format!("{}/other", server.url);
    assert_eq!(
        text(request(&client, &other, key, Some("a"), "x").await)
            .await
            .0,
        201
    );
    let patch = client
        .patch(&order)
        .header("idempotency-key", "\"same\"")
        .header("x-user", "a")
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(text(patch).await, (201, false, "order 3".into()));
    // Same method and route, another query: the key was used with another request.
    let query = format!("{order}?coupon=1");
    let resp = request(&client, &query, key, Some("a"), "x").await;
    assert_eq!(resp.status(), 422);
    assert_eq!(calls.get(), 3);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scope_too_long_for_the_store_is_a_4xx_that_names_no_limit() {
    let (_dir, calls, server) = start(per_user()).await;
    let client = reqwest::Client::new();
    let long_path = format!("{}/items/{}", server.url, "p".repeat(300));
    let resp = request(&client, &long_path, Some("\"k\""), Some("a"), "x").await;
    assert_eq!(resp.status(), 414);
    assert!(resp.headers().contains_key("idempotency-retention"));
    let body = problem(resp).await;
    assert_eq!(body["type"], "urn:idemdb:problem:path-too-long");
    assert!(!body.to_string().contains("256"), "{body}");

    let url = format!("{}/order", server.url);
    let long_user = "u".repeat(300);
    let resp = request(&client, &url, Some("\"k\""), Some(&long_user), "x").await;
    assert_eq!(resp.status(), 400);
    let body = problem(resp).await;
    assert_eq!(body["type"], "urn:idemdb:problem:principal-too-long");
    assert!(!body.to_string().contains("256"), "{body}");
    assert_eq!(calls.get(), 0);
    server.stop().await;
}
