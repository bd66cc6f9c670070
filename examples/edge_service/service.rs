//! The purchase service. `POST /purchases` reserves the key (scope `POST /purchases` + the
//! user), charges the provider with the same key and the fencing token, then completes with
//! the order row written in the record's commit. `GET /orders/count` counts the orders.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use idemdb::redb::{ReadableTableMetadata, TableDefinition, TableError};
use idemdb::{Error, ExecuteError, IdemDb, Key, Reservation, ReserveOutcome, Scope};
use serde::Deserialize;

use crate::{Args, BoxError, header, serve};

/// Orders, keyed by `user/key`, written in the same commit as the completed record.
const ORDERS: TableDefinition<&str, &[u8]> = TableDefinition::new("orders");
/// After it a retry takes over the intent of an owner that died (the killed process).
const LEASE: Duration = Duration::from_secs(3);

#[derive(Clone)]
struct Service {
    db: Arc<IdemDb>,
    provider: String,
    http: reqwest::Client,
}

#[derive(Deserialize)]
struct Purchase {
    user: String,
    sku: String,
    cents: u64,
}

pub async fn run(args: &Args) -> Result<(), BoxError> {
    let state = Service {
        // Registered: an order row is logged with its record (one log append per batch).
        db: Arc::new(
            IdemDb::builder()
                .table(ORDERS)
                .open(args.required("--db")?)?,
        ),
        provider: args
            .required("--provider")?
            .trim_end_matches('/')
            .to_string(),
        http: reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_millis(1500))
            .build()?,
    };
    let app = Router::new()
        .route("/purchases", post(purchase))
        .route("/orders/count", get(orders_count))
        .route("/stats", get(stats))
        .with_state(state);
    serve(args.number("--port", 0)?, app).await
}

async fn purchase(State(s): State<Service>, headers: HeaderMap, body: Bytes) -> Response {
    // Runs to the end even if the client hangs up: a charge under way is finished and
    // recorded rather than abandoned between the provider's answer and the commit.
    match tokio::spawn(handle(s, headers, body)).await {
        Ok(response) => response,
        Err(_) => answer(StatusCode::INTERNAL_SERVER_ERROR, "the handler panicked"),
    }
}

async fn handle(s: Service, headers: HeaderMap, body: Bytes) -> Response {
    let Some(key) = header(&headers, "idempotency-key").map(|k| k.trim_matches('"')) else {
        return answer(StatusCode::BAD_REQUEST, "send an Idempotency-Key header");
    };
    let Ok(purchase) = serde_json::from_slice::<Purchase>(&body) else {
        return answer(StatusCode::BAD_REQUEST, "expected {user, sku, cents}");
    };
    let scope = Scope::new("POST /purchases", &purchase.user);
    match s
        .db
        .reserve_async(&scope, &Key::new(key), &body[..], LEASE)
        .await
    {
        Ok(ReserveOutcome::Acquired(r)) => charge_and_complete(&s, &r, key, &purchase, body).await,
        Ok(ReserveOutcome::Completed(stored)) => replay(StatusCode::CREATED, stored),
        Ok(ReserveOutcome::Failed(stored)) => replay(StatusCode::PAYMENT_REQUIRED, stored),
        Ok(ReserveOutcome::InProgress { retry_after }) => in_progress(retry_after),
        Ok(ReserveOutcome::Mismatch | ReserveOutcome::BeyondHorizon) => answer(
            StatusCode::UNPROCESSABLE_ENTITY,
            "this key was used for another purchase",
        ),
        Err(e) => answer(StatusCode::SERVICE_UNAVAILABLE, &e.to_string()),
    }
}

/// The owner's path: charge downstream with the same key, then the order and the record in
/// one commit.
async fn charge_and_complete(
    s: &Service,
    r: &Reservation,
    key: &str,
    p: &Purchase,
    body: Bytes,
) -> Response {
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
            return match s.db.fail_async(r, why.clone()).await {
                Ok(()) => json(StatusCode::PAYMENT_REQUIRED, why),
                Err(e) => owner_error(s, r, e).await,
            };
        }
        Ok(resp) => return release(s, r, &format!("provider answered {}", resp.status())).await,
        Err(e) => return release(s, r, &format!("provider unreachable: {e}")).await,
    };
    let order = serde_json::json!({
        "order": format!("o-{}", r.token()),
        "user": p.user,
        "sku": p.sku,
        "cents": p.cents,
        "payment": receipt,
    })
    .to_string();
    let (row, stored) = (format!("{}/{key}", p.user), order.clone().into_bytes());
    let done =
        s.db.complete_with_async(r, order.clone(), move |tx| -> Result<(), Error> {
            tx.open_table(ORDERS)?
                .insert(row.as_str(), stored.as_slice())?;
            Ok(())
        })
        .await;
    match done {
        Ok(()) => json(StatusCode::CREATED, order),
        Err(ExecuteError::Db(e) | ExecuteError::Closure(e)) => owner_error(s, r, e).await,
    }
}

/// The owner could not finish: fenced (a retry took over; it answers), or a store error.
async fn owner_error(s: &Service, r: &Reservation, e: Error) -> Response {
    match e {
        Error::Fenced { .. } => in_progress(Duration::from_secs(1)),
        e if e.is_outcome_unknown() => answer(StatusCode::SERVICE_UNAVAILABLE, &e.to_string()),
        e => release(s, r, &e.to_string()).await,
    }
}

/// A transient failure: the key is released so that the client's retry runs the purchase.
async fn release(s: &Service, r: &Reservation, why: &str) -> Response {
    let _ = s.db.release_async(r).await; // if this fails, the lease runs out instead
    answer(StatusCode::SERVICE_UNAVAILABLE, why)
}

async fn orders_count(State(s): State<Service>) -> Response {
    let count = tokio::task::spawn_blocking(move || -> Result<u64, BoxError> {
        let read = s.db.begin_read()?;
        match read.open_table(ORDERS) {
            Ok(orders) => Ok(orders.len()?),
            Err(TableError::TableDoesNotExist(_)) => Ok(0),
            Err(e) => Err(e.into()),
        }
    })
    .await;
    match count {
        Ok(Ok(n)) => n.to_string().into_response(),
        Ok(Err(e)) => answer(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
        Err(e) => answer(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

/// This process's idemdb counters (since it started).
async fn stats(State(s): State<Service>) -> Response {
    let st = s.db.stats();
    let body = serde_json::json!({
        "acquired": st.acquired,
        "takeovers": st.takeovers,
        "replays": st.replays_completed,
        "in_progress": st.in_progress,
        "mismatches": st.mismatches,
        "fenced": st.fenced,
        "releases": st.releases,
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
