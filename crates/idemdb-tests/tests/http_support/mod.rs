//! Set-up shared by the HTTP layer's socket tests: an axum server on 127.0.0.1, requests
//! from a real HTTP client. It builds on `tests/common`: a test file that declares
//! `mod http_support;` declares `mod common;` too.

#![allow(dead_code)] // each test file uses its own subset

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::http::StatusCode;
use axum::routing::{MethodFilter, MethodRouter, on};
use idemdb::IdemDb;
use idemdb_http::{IdempotencyConfig, IdempotencyLayer};
use tokio::sync::oneshot;

/// A server on an ephemeral port.
pub struct Server {
    pub url: String,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    pub async fn start(app: Router) -> Server {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
        });
        Server {
            url,
            stop: Some(stop),
            task,
        }
    }

    /// Stops the server and waits until it dropped its router (and so the database handle).
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.task.await.unwrap();
    }
}

/// `app`'s routes, given a fresh call count, behind the layer with `config` on `db`.
pub async fn serve_on(
    db: Arc<IdemDb>,
    app: impl FnOnce(&Calls) -> Router,
    config: IdempotencyConfig,
) -> (Calls, Server) {
    let calls = Calls::default();
    let layer = IdempotencyLayer::new(db, config).unwrap();
    let server = Server::start(app(&calls).layer(layer)).await;
    (calls, server)
}

/// [`serve_on`] a fresh database.
pub async fn serve(
    app: impl FnOnce(&Calls) -> Router,
    config: IdempotencyConfig,
) -> (tempfile::TempDir, Calls, Server) {
    let (dir, db) = crate::common::fresh_shared();
    let (calls, server) = serve_on(db, app, config).await;
    (dir, calls, server)
}

/// A handler for `methods` that answers 201 "order <n>", n counting its runs.
pub fn order(calls: &Calls, methods: MethodFilter) -> MethodRouter {
    let calls = calls.clone();
    on(methods, move || async move {
        (StatusCode::CREATED, format!("order {}", calls.next()))
    })
}

/// Keys per caller, the caller named by the `x-user` header.
pub fn per_user() -> IdempotencyConfig {
    IdempotencyConfig::new(|parts| {
        let user = parts.headers.get("x-user")?;
        user.to_str().ok().map(String::from)
    })
}

/// A POST with an optional `Idempotency-Key` (sent as given) and `x-user`.
pub async fn request(
    client: &reqwest::Client,
    url: &str,
    key: Option<&str>,
    user: Option<&str>,
    body: &str,
) -> reqwest::Response {
    let mut req = client.post(url).body(body.to_string());
    if let Some(key) = key {
        req = req.header("idempotency-key", key);
    }
    if let Some(user) = user {
        req = req.header("x-user", user);
    }
    req.send().await.unwrap()
}

/// The response's problem document (panics if the body is not JSON).
pub async fn problem(resp: reqwest::Response) -> serde_json::Value {
    serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap()
}

/// Counts calls: `next()` returns 1, 2, ...
#[derive(Clone, Default)]
pub struct Calls(Arc<AtomicUsize>);

impl Calls {
    pub fn next(&self) -> usize {
        self.0.fetch_add(1, Ordering::SeqCst) + 1
    }

    pub fn get(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}
