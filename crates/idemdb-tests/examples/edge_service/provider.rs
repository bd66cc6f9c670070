//! The fake payment provider. `POST /charges` charges at most once per `Idempotency-Key`
//! (and user): idemdb's HTTP layer runs the handler once per key and replays its answer to
//! every retry. `GET /count` is the number of charges made, i.e. of handler runs that charged,
//! so a double charge would show.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use idemdb::IdemDb;
use idemdb_http::{IdempotencyConfig, IdempotencyLayer};

use crate::{Args, BoxError, header, serve};

#[derive(Clone)]
struct Provider {
    calls: Arc<AtomicU64>,
    charges: Arc<AtomicU64>,
    /// Every K-th call fails with 503 before charging (0: never).
    fail_every: u64,
    /// Added to every charge's card-network time.
    latency: Duration,
}

pub async fn run(args: &Args) -> Result<(), BoxError> {
    let db = Arc::new(IdemDb::open(args.required("--db")?)?);
    // Keys per user: one user's key never replays another's charge.
    let mut config =
        IdempotencyConfig::new(|parts| header(&parts.headers, "x-user").map(String::from));
    // A duplicate arriving while the first charge runs waits for it and gets its answer.
    config.wait = Some(Duration::from_secs(1));
    let state = Provider {
        calls: Arc::default(),
        charges: Arc::default(),
        fail_every: args.number("--fail-every", 0)?,
        latency: Duration::from_millis(args.number("--latency-ms", 0)?),
    };
    let app = Router::new()
        .route("/charges", post(charge))
        .route("/count", get(count))
        .layer(IdempotencyLayer::new(db, config)?)
        .with_state(state);
    serve(args.number("--port", 0)?, app).await
}

async fn charge(
    State(p): State<Provider>,
    headers: HeaderMap,
    body: String,
) -> (StatusCode, [(&'static str, &'static str); 1], String) {
    const JSON: [(&str, &str); 1] = [("content-type", "application/json")];
    let call = p.calls.fetch_add(1, Ordering::SeqCst) + 1;
    // The card network.
    tokio::time::sleep(Duration::from_millis(2 + call % 9) + p.latency).await;
    if p.fail_every > 0 && call.is_multiple_of(p.fail_every) {
        // Not charged; a 5xx releases the key, so the retry charges.
        let busy = r#"{"error":"provider busy"}"#.to_string();
        return (StatusCode::SERVICE_UNAVAILABLE, JSON, busy);
    }
    let Ok(request) = serde_json::from_str::<serde_json::Value>(&body) else {
        let bad = r#"{"error":"the body is not JSON"}"#.to_string();
        return (StatusCode::BAD_REQUEST, JSON, bad);
    };
    let token = header(&headers, "x-fencing-token").unwrap_or("none");
    // The charge. No await follows it, so a caller hanging up cannot cancel it half-done.
    let n = p.charges.fetch_add(1, Ordering::SeqCst) + 1;
    let receipt = serde_json::json!({
        "charge": format!("ch_{n}"),
        "cents": request["cents"],
        "fencing_token": token,
    });
    (StatusCode::CREATED, JSON, receipt.to_string())
}

async fn count(State(p): State<Provider>) -> String {
    p.charges.load(Ordering::SeqCst).to_string()
}
