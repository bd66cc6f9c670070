//! The layer's own answers over a real socket: labelled for what happened, with the
//! retention, a `type` the service chooses, and strict sf-string keys on request.

use std::pin::Pin;
use std::task::{Context, Poll};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{MethodFilter, post};
use http_body::Frame;
use http_support::{Calls, Server, order, per_user, problem, request, serve};
use idemdb_http::IdempotencyConfig;

mod common;
mod http_support;

/// A body that sends one chunk, then fails.
struct FailingBody {
    sent: bool,
}

impl http_body::Body for FailingBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        if self.sent {
            return Poll::Ready(Some(Err(std::io::Error::other("upstream went away"))));
        }
        self.sent = true;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"partial")))))
    }
}

/// `/order` answers 201 "order <n>"; `/broken`'s first body fails midway, later ones don't.
fn app(calls: &Calls) -> Router {
    let broken = {
        let calls = calls.clone();
        move || async move {
            if calls.next() == 1 {
                let body = Body::new(FailingBody { sent: false });
                return (StatusCode::CREATED, body).into_response();
            }
            (StatusCode::CREATED, "ok").into_response()
        }
    };
    Router::new()
        .route("/order", order(calls, MethodFilter::POST))
        .route("/broken", post(broken))
}

async fn start(config: IdempotencyConfig) -> (tempfile::TempDir, Calls, Server) {
    serve(app, config).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_400_and_a_413_state_the_retention_too() {
    let mut config = per_user();
    config.max_body = 8;
    let (_dir, calls, server) = start(config).await;
    let client = reqwest::Client::new();
    let url = format!("{}/order", server.url);
    let missing = request(&client, &url, None, Some("a"), "x").await;
    let big = request(&client, &url, Some("\"k\""), Some("a"), "too large a body").await;
    for (resp, status) in [(missing, 400), (big, 413)] {
        assert_eq!(resp.status().as_u16(), status);
        assert_eq!(resp.headers()["idempotency-retention"], "86400", "{status}");
    }
    assert_eq!(calls.get(), 0);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_body_failing_midway_is_a_handler_failure_and_releases_the_key() {
    let (_dir, calls, server) = start(per_user()).await;
    let client = reqwest::Client::new();
    let url = format!("{}/broken", server.url);
    let failed = request(&client, &url, Some("\"b\""), Some("a"), "x").await;
    assert_eq!(failed.status().as_u16(), 500);
    assert_eq!(
        problem(failed).await["type"],
        "urn:idemdb:problem:handler-failed"
    );
    let retry = request(&client, &url, Some("\"b\""), Some("a"), "x").await;
    assert_eq!(
        (retry.status().as_u16(), retry.text().await.unwrap()),
        (201, "ok".into())
    );
    assert_eq!(calls.get(), 2, "the retry ran");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_problem_type_is_the_services_choice() {
    let mut config = per_user();
    config.problem_type_prefix = "https://api.example.com/problems/".into();
    let (_dir, _calls, server) = start(config).await;
    let client = reqwest::Client::new();
    let resp = request(
        &client,
        &format!("{}/order", server.url),
        None,
        Some("a"),
        "x",
    )
    .await;
    assert_eq!(
        problem(resp).await["type"],
        "https://api.example.com/problems/key-missing"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_keys_take_one_rfc_8941_string_per_request() {
    let mut config = per_user();
    config.strict_keys = true;
    let (_dir, calls, server) = start(config).await;
    let client = reqwest::Client::new();
    let url = format!("{}/order", server.url);
    let status = |key: &'static [u8]| {
        let (client, url) = (client.clone(), url.clone());
        async move {
            let value = reqwest::header::HeaderValue::from_bytes(key).unwrap();
            let resp = client
                .post(&url)
                .header("idempotency-key", value)
                .header("x-user", "a")
                .body("x")
                .send()
                .await
                .unwrap();
            resp.status().as_u16()
        }
    };
    assert_eq!(status(b"\"a\\\"b\"").await, 201);
    assert_eq!(status(b" \"a\\\"b\" ").await, 201, "the same key, replayed");
    for refused in [
        &b"bare"[..],
        b"\"a\", \"b\"",
        b"\"a\";p=1",
        b"\"caf\xc3\xa9\"",
        b"\"a\\b\"",
        b"\"unterminated",
    ] {
        assert_eq!(
            status(refused).await,
            400,
            "{}",
            String::from_utf8_lossy(refused)
        );
    }
    let two_lines = client
        .post(&url)
        .header("idempotency-key", "\"a\"")
        .header("idempotency-key", "\"b\"")
        .header("x-user", "a")
        .send()
        .await
        .unwrap();
    assert_eq!(two_lines.status().as_u16(), 400);
    assert_eq!(calls.get(), 1);
    server.stop().await;
}
