//! What is stored and replayed, over a real socket: answers a retry may change are not
//! stored; what is stored replays with the headers that make its bytes readable.

use axum::Router;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::post;
use http_support::{Calls, Server, per_user, request, serve};

mod common;
mod http_support;

/// `echo hello | gzip -n`
const GZIP_HELLO: [u8; 26] = [
    0x1f, 0x8b, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03, 0xcb, 0x48, 0xcd, 0xc9, 0xc9, 0xe7,
    0x02, 0x00, 0x20, 0x30, 0x3a, 0x36, 0x06, 0x00, 0x00, 0x00,
];

/// `/limited`: 429, 401, 403, 408, 425, then 201. `/accepted`: 202 with `Retry-After`.
/// `/report`: a gzip answer with the headers it needs to be read.
fn app(calls: &Calls) -> Router {
    let limited = {
        let calls = calls.clone();
        move || async move {
            let statuses = [429, 401, 403, 408, 425];
            let status = statuses.get(calls.next() - 1).copied().unwrap_or(201);
            let status = StatusCode::from_u16(status).unwrap();
            (status, [("retry-after", "7")], status.as_str().to_string())
        }
    };
    let accepted = {
        let calls = calls.clone();
        move || async move {
            calls.next();
            let headers = [("retry-after", "5"), ("location", "/jobs/1")];
            (StatusCode::ACCEPTED, headers, "queued")
        }
    };
    let report = {
        let calls = calls.clone();
        move || async move {
            calls.next();
            let headers = [
                ("content-type", "application/json"),
                ("content-encoding", "gzip"),
                ("vary", "accept-encoding"),
                ("content-disposition", "attachment; filename=\"r.json\""),
                ("link", "</reports/1>; rel=\"self\""),
                ("set-cookie", "session=secret"),
            ];
            (headers, GZIP_HELLO.to_vec()).into_response()
        }
    };
    Router::new()
        .route("/limited", post(limited))
        .route("/accepted", post(accepted))
        .route("/report", post(report))
}

async fn start() -> (tempfile::TempDir, Calls, Server) {
    serve(app, per_user()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_401_403_408_or_425_releases_the_key_so_the_retry_runs() {
    let (_dir, calls, server) = start().await;
    let client = reqwest::Client::new();
    let url = format!("{}/limited", server.url);
    for expected in [429, 401, 403, 408, 425, 201] {
        let resp = request(&client, &url, Some("\"k\""), Some("a"), "x").await;
        assert_eq!(resp.status().as_u16(), expected);
        assert!(
            !resp.headers().contains_key("idempotent-replayed"),
            "{expected} ran"
        );
        assert_eq!(resp.headers()["retry-after"], "7");
    }
    let replay = request(&client, &url, Some("\"k\""), Some("a"), "x").await;
    assert_eq!(replay.status().as_u16(), 201);
    assert!(replay.headers().contains_key("idempotent-replayed"));
    assert_eq!(calls.get(), 6);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_is_stored_with_the_response() {
    let (_dir, calls, server) = start().await;
    let client = reqwest::Client::new();
    let url = format!("{}/accepted", server.url);
    for _ in 0..2 {
        let resp = request(&client, &url, Some("\"job\""), Some("a"), "x").await;
        assert_eq!(resp.status().as_u16(), 202);
        assert_eq!(resp.headers()["retry-after"], "5");
        assert_eq!(resp.headers()["location"], "/jobs/1");
    }
    assert_eq!(calls.get(), 1);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gzip_answer_replays_with_its_encoding_and_without_its_cookie() {
    let (_dir, calls, server) = start().await;
    let client = reqwest::Client::new();
    let url = format!("{}/report", server.url);
    let first = request(&client, &url, Some("\"r\""), Some("a"), "x").await;
    let replay = request(&client, &url, Some("\"r\""), Some("a"), "x").await;
    assert!(replay.headers().contains_key("idempotent-replayed"));
    for name in [
        "content-type",
        "content-encoding",
        "vary",
        "content-disposition",
        "link",
    ] {
        assert_eq!(
            replay.headers().get(name),
            first.headers().get(name),
            "{name}"
        );
        assert!(first.headers().contains_key(name), "{name}");
    }
    assert!(
        replay.headers().get("set-cookie").is_none(),
        "per-response, not replayed"
    );
    assert_eq!(first.bytes().await.unwrap(), &GZIP_HELLO[..]);
    assert_eq!(replay.bytes().await.unwrap(), &GZIP_HELLO[..]);
    assert_eq!(calls.get(), 1);
    server.stop().await;
}
