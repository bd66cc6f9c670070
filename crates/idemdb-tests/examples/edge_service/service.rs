//! The purchase service. `POST /purchases` reserves the key (scope `POST /purchases` + the
//! user), charges the provider with the same key and the fencing token, then completes with
//! the order row written in the record's commit. `GET /orders/count` counts the orders.
//!
//! One flow for both stores, generic over [`OrderStore`]: the embedded file (`--db PATH`, one
//! process) or PostgreSQL (`--postgres URL`, any number of processes on one database). Only
//! the order write and the count differ (orders.rs).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use idemdb::{ExecuteError, IdemDb, Key, Refusal, Reservation, ReserveOutcome, Scope, StoreError};
use serde::Deserialize;

use crate::orders::{ORDERS, Order, OrderStore, connect_postgres};
use crate::{Args, BoxError, header, serve};

/// After it a retry takes over the intent of an owner that died (the killed process).
pub const LEASE: Duration = Duration::from_secs(3);

struct Service<S> {
    db: Arc<S>,
    provider: String,
    http: reqwest::Client,
    counters: Arc<Counters>,
}

impl<S> Clone for Service<S> {
    fn clone(&self) -> Self {
        Service {
            db: Arc::clone(&self.db),
            provider: self.provider.clone(),
            http: self.http.clone(),
            counters: Arc::clone(&self.counters),
        }
    }
}

/// What this process's purchase flow saw since it started (`GET /stats`).
#[derive(Default)]
struct Counters {
    acquired: AtomicU64,
    takeovers: AtomicU64,
    replays: AtomicU64,
    in_progress: AtomicU64,
    mismatches: AtomicU64,
    fenced: AtomicU64,
    releases: AtomicU64,
    /// Owners waiting for the provider's answer now.
    charging: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

#[derive(Deserialize)]
struct Purchase {
    user: String,
    sku: String,
    cents: u64,
}

pub async fn run(args: &Args) -> Result<(), BoxError> {
    let port = args.number("--port", 0)?;
    let provider = args
        .required("--provider")?
        .trim_end_matches('/')
        .to_string();
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_millis(1500))
        .build()?;
    match args.optional("--postgres") {
        // Migrates (idempotent, safe from instances starting together) and connects.
        Some(url) => {
            let db = connect_postgres(url, args.number("--pool-size", 16)?).await?;
            serve_on(Arc::new(db), provider, http, port).await
        }
        None => {
            // Registered: an order row is logged with its record (one log append per batch).
            let db = IdemDb::builder()
                .table(ORDERS)
                .open(args.required("--db")?)?;
            serve_on(Arc::new(db), provider, http, port).await
        }
    }
}

async fn serve_on<S: OrderStore>(
    db: Arc<S>,
    provider: String,
    http: reqwest::Client,
    port: u16,
) -> Result<(), BoxError> {
    let state = Service {
        db,
        provider,
        http,
        counters: Arc::default(),
    };
    let app = Router::new()
        .route("/purchases", post(purchase::<S>))
        .route("/orders/count", get(orders_count::<S>))
        .route("/stats", get(stats::<S>))
        .with_state(state);
    serve(port, app).await
}

async fn purchase<S: OrderStore>(
    State(s): State<Service<S>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    // Runs to the end even if the client hangs up: a charge under way is finished and
    // recorded rather than abandoned between the provider's answer and the commit.
    match tokio::spawn(handle(s, headers, body)).await {
        Ok(response) => response,
        Err(_) => answer(StatusCode::INTERNAL_SERVER_ERROR, "the handler panicked"),
    }
}

async fn handle<S: OrderStore>(s: Service<S>, headers: HeaderMap, body: Bytes) -> Response {
    let Some(key) = header(&headers, "idempotency-key").map(|k| k.trim_matches('"')) else {
        return answer(StatusCode::BAD_REQUEST, "send an Idempotency-Key header");
    };
    let Ok(purchase) = serde_json::from_slice::<Purchase>(&body) else {
        return answer(StatusCode::BAD_REQUEST, "expected {user, sku, cents}");
    };
    let scope = Scope::new("POST /purchases", &purchase.user);
    let c = &s.counters;
    match s.db.reserve(&scope, &Key::new(key), &body[..], LEASE).await {
        Ok(ReserveOutcome::Acquired(r)) => {
            bump(&c.acquired);
            if r.is_takeover() {
                bump(&c.takeovers);
            }
            charge_and_complete(&s, &r, key, &purchase, body).await
        }
        Ok(ReserveOutcome::Completed(stored)) => {
            bump(&c.replays);
            replay(StatusCode::CREATED, stored)
        }
        Ok(ReserveOutcome::Failed(stored)) => {
            bump(&c.replays);
            replay(StatusCode::PAYMENT_REQUIRED, stored)
        }
        Ok(ReserveOutcome::InProgress { retry_after }) => {
            bump(&c.in_progress);
            in_progress(retry_after)
        }
        Ok(ReserveOutcome::Mismatch | ReserveOutcome::BeyondHorizon) => {
            bump(&c.mismatches);
            answer(
                StatusCode::UNPROCESSABLE_ENTITY,
                "this key was used for another purchase",
            )
        }
        Err(e) => answer(StatusCode::SERVICE_UNAVAILABLE, &e.to_string()),
    }
}

/// The owner's path: charge downstream with the same key, then the order and the record in
/// one commit.
async fn charge_and_complete<S: OrderStore>(
    s: &Service<S>,
    r: &Reservation,
    key: &str,
    p: &Purchase,
    body: Bytes,
) -> Response {
    bump(&s.counters.charging);
    let sent = s
        .http
        .post(format!("{}/charges", s.provider))
        .header("idempotency-key", format!("\"{key}\""))
        .header("x-user", &p.user)
        .header("x-fencing-token", r.token().to_string())
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await;
    s.counters.charging.fetch_sub(1, Ordering::Relaxed);
    let receipt = match sent {
        Ok(resp) if resp.status().is_success() => match resp.bytes().await {
            Ok(bytes) => serde_json::from_slice::<serde_json::Value>(&bytes).unwrap_or_default(),
            Err(e) => return release(s, r, &format!("provider: {e}")).await,
        },
        // A 4xx other than 409/429 is the provider's final word (a declined card): stored.
        Ok(resp)
            if resp.status().is_client_error() && !matches!(resp.status().as_u16(), 409 | 429) =>
        {
            let why = serde_json::json!({"error": "payment refused", "provider_status": resp.status().as_u16()});
            let why = why.to_string();
            return match s.db.fail(r, why.clone()).await {
                Ok(()) => json(StatusCode::PAYMENT_REQUIRED, why),
                Err(e) => owner_error(s, r, e).await,
            };
        }
        Ok(resp) => return release(s, r, &format!("provider answered {}", resp.status())).await,
        Err(e) => return release(s, r, &format!("provider unreachable: {e}")).await,
    };
    let json_body = serde_json::json!({
        "order": format!("o-{}", r.token()),
        "user": p.user,
        "sku": p.sku,
        "cents": p.cents,
        "payment": receipt,
    })
    .to_string();
    let order = Order {
        id: format!("{}/{key}", p.user),
        key: key.to_string(),
        user: p.user.clone(),
        sku: p.sku.clone(),
        cents: p.cents,
        charge: receipt["charge"].as_str().unwrap_or_default().to_string(),
        token: r.token().get(),
        json: json_body,
    };
    match s.db.complete_with_order(r, &order).await {
        Ok(()) => json(StatusCode::CREATED, order.json),
        Err(ExecuteError::Db(e)) => owner_error(s, r, e).await,
        // Nothing committed: the retry runs the purchase (the provider replays its charge).
        Err(ExecuteError::Closure(e)) => release(s, r, &format!("order not written: {e}")).await,
    }
}

/// The owner could not finish: fenced (a retry took over; it answers), or a store error.
async fn owner_error<S: OrderStore>(s: &Service<S>, r: &Reservation, e: S::Error) -> Response {
    match e.refusal() {
        Some(Refusal::Fenced { .. }) => {
            bump(&s.counters.fenced);
            in_progress(Duration::from_secs(1))
        }
        _ if e.is_outcome_unknown() => answer(StatusCode::SERVICE_UNAVAILABLE, &e.to_string()),
        _ => release(s, r, &e.to_string()).await,
    }
}

/// A transient failure: the key is released so that the client's retry runs the purchase.
async fn release<S: OrderStore>(s: &Service<S>, r: &Reservation, why: &str) -> Response {
    if s.db.release(r).await.is_ok() {
        bump(&s.counters.releases);
    } // if this fails, the lease runs out instead
    answer(StatusCode::SERVICE_UNAVAILABLE, why)
}

async fn orders_count<S: OrderStore>(State(s): State<Service<S>>) -> Response {
    match s.db.count_orders().await {
        Ok(n) => n.to_string().into_response(),
        Err(e) => answer(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

/// This process's purchase-flow counters (since it started).
async fn stats<S: OrderStore>(State(s): State<Service<S>>) -> Response {
    let c = &s.counters;
    let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let body = serde_json::json!({
        "acquired": n(&c.acquired),
        "takeovers": n(&c.takeovers),
        "replays": n(&c.replays),
        "in_progress": n(&c.in_progress),
        "mismatches": n(&c.mismatches),
        "fenced": n(&c.fenced),
        "releases": n(&c.releases),
        "charging": n(&c.charging),
    });
    json(StatusCode::OK, body.to_string())
}

fn json(status: StatusCode, body: String) -> Response {
    (status, [("content-type", "application/json")], body).into_response()
}

fn answer(status: StatusCode, detail: &str) -> Response {
    json(status, serde_json::json!({ "error": detail }).to_string())
}

fn replay(status: StatusCode, stored: Vec<u8>) -> Response {
    let headers = [
        ("content-type", "application/json"),
        ("idempotent-replayed", "true"),
    ];
    (status, headers, stored).into_response()
}

fn in_progress(retry_after: Duration) -> Response {
    let seconds = retry_after.as_millis().div_ceil(1000).max(1).to_string();
    let mut r = answer(StatusCode::CONFLICT, "this purchase is in progress; retry");
    if let Ok(v) = seconds.parse() {
        r.headers_mut().insert("retry-after", v);
    }
    r
}
