//! The sending service: `POST /purchases` places an order under the request's
//! `Idempotency-Key` with `IdemDb::execute`, whose closure writes the purchase row and stages
//! the `order.created` message in the same commit; a dispatcher delivers the message once that
//! commit is durable. `GET /purchases` lists the committed purchases and the outbox backlog.
//!
//! Invariants: a message exists iff its purchase committed (one transaction), so none is
//! sent for a purchase that rolled back and none is lost for one acknowledged; the 201 is the
//! stored response, so a retried key replays the same bytes and stages nothing more.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use axum::routing::post;
use idemdb::redb::{ReadableTable, TableDefinition, TableError};
use idemdb::{
    DispatchOptions, Dispatcher, ExecuteError, ExecuteOutcome, IdemDb, Key, Message, Outcome,
    Scope, Tx,
};
use serde::Deserialize;
use serde_json::json;

use crate::BoxError;
use crate::crash::Crash;
use crate::http::{bytes, error, json, serve};
use crate::publisher::{DESTINATION, HttpPublisher};

/// The purchases: order id to the row as JSON (customer, qty, the message staged with it).
const PURCHASES: TableDefinition<&str, &str> = TableDefinition::new("purchases");

/// A purchase request's body.
#[derive(Debug, Deserialize)]
struct Purchase {
    order_id: String,
    customer: String,
    qty: u32,
}

/// Why a purchase's closure committed nothing.
#[derive(Debug)]
enum Refused {
    /// The request is invalid: 422, not stored (a corrected retry under the same key runs).
    Invalid(String),
    /// The database failed inside the closure.
    Db(idemdb::Error),
}

impl<E: Into<idemdb::Error>> From<E> for Refused {
    fn from(e: E) -> Self {
        Refused::Db(e.into())
    }
}

/// Serves the sender, its dispatcher publishing to `receiver`, until the process ends.
pub async fn run(db: PathBuf, listen: &str, receiver: &str, crash: Crash) -> Result<(), BoxError> {
    // Registered, the purchases table's writes ride in the record's log append.
    let db = IdemDb::builder()
        .table(PURCHASES)
        .open(&db)
        .map_err(|e| format!("opening {}: {e}", db.display()))?;
    let db = Arc::new(db);
    // (Opening and this listing block a runtime worker: at startup, nothing else runs yet.)
    let crash = if crash.is_armed() {
        let mut staged = db.outbox_pending(usize::MAX)?;
        staged.extend(db.outbox_parked(usize::MAX)?);
        crash.backlog_up_to(staged.iter().map(|m| m.seq).max().unwrap_or(0))
    } else {
        crash
    };
    let publisher = HttpPublisher::new(tokio::runtime::Handle::current(), receiver, crash)?;
    // Retries start fast and stay under 5 s apart; 100 attempts ride out a receiver down for
    // minutes before a message is parked.
    let options = DispatchOptions::default()
        .backoff(Duration::from_millis(50), Duration::from_secs(5))
        .max_attempts(100);
    // Started before serving: a backlog left by the last run goes out at once.
    let dispatcher = Dispatcher::start(Arc::clone(&db), publisher, options)?;
    let app = Router::new()
        .route("/purchases", post(purchase).get(purchases))
        .with_state(Arc::clone(&db));
    let served = serve(listen, app).await;
    // Only on a serving error: stopping marks what was published (it joins the dispatcher's
    // thread, which may wait on this runtime, hence off its workers).
    let stopped = tokio::task::spawn_blocking(move || dispatcher.stop()).await?;
    served.and(stopped.map_err(Into::into))
}

/// `POST /purchases`: 201 with the stored response (first time or replay), 409 for an order
/// another key placed or a key in progress, 422 for an invalid purchase or a key reused with
/// another body, 400 for a malformed request.
async fn purchase(State(db): State<Arc<IdemDb>>, headers: HeaderMap, body: Bytes) -> Response {
    let Some(key) = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .filter(|k| !k.is_empty())
    else {
        return error(
            StatusCode::BAD_REQUEST,
            "an Idempotency-Key header is required",
        );
    };
    let purchase: Purchase = match serde_json::from_slice(&body) {
        Ok(p) => p,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("bad purchase: {e}")),
    };
    if purchase.order_id.is_empty() || purchase.customer.is_empty() {
        return error(
            StatusCode::BAD_REQUEST,
            "order_id and customer are required",
        );
    }
    // The customer is the key's principal: keys are the client's, one namespace per customer.
    let scope = Scope::new("POST /purchases", purchase.customer.as_str());
    let executed = db
        .execute_async(&scope, &Key::new(key), &body[..], move |tx| {
            place(tx, &purchase)
        })
        .await;
    match executed {
        Ok(
            ExecuteOutcome::Executed(Outcome::Completed(stored))
            | ExecuteOutcome::Completed(stored),
        ) => bytes(StatusCode::CREATED, stored),
        Ok(ExecuteOutcome::Executed(Outcome::Failed(stored)) | ExecuteOutcome::Failed(stored)) => {
            bytes(StatusCode::CONFLICT, stored)
        }
        Ok(ExecuteOutcome::Mismatch) => error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "this Idempotency-Key was used with another request",
        ),
        Ok(ExecuteOutcome::InProgress { retry_after }) => {
            let seconds = retry_after.as_secs().max(1).to_string();
            let mut reply = error(StatusCode::CONFLICT, "this Idempotency-Key is in progress");
            if let Ok(value) = seconds.parse() {
                reply.headers_mut().insert(header::RETRY_AFTER, value);
            }
            reply
        }
        Ok(ExecuteOutcome::BeyondHorizon) => error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "this Idempotency-Key is older than the retention",
        ),
        Err(ExecuteError::Closure(Refused::Invalid(why))) => {
            error(StatusCode::UNPROCESSABLE_ENTITY, why)
        }
        Err(ExecuteError::Closure(Refused::Db(e)) | ExecuteError::Db(e)) => {
            error(StatusCode::INTERNAL_SERVER_ERROR, e)
        }
    }
}

/// The purchase's commit: the row and its message together, or nothing.
fn place(tx: &mut Tx<'_>, p: &Purchase) -> Result<Outcome, Refused> {
    let mut purchases = tx.open_table(PURCHASES)?;
    if purchases.get(p.order_id.as_str())?.is_some() {
        // Another key placed this order: a deterministic failure, stored and replayed to this
        // key, with nothing staged.
        let answer = json!({ "order_id": p.order_id, "error": "order already placed" });
        return Ok(Outcome::Failed(answer.to_string().into_bytes()));
    }
    let event = json!({
        "type": "order.created",
        "order_id": p.order_id,
        "customer": p.customer,
        "qty": p.qty,
    });
    // Ordered per customer: a customer's orders reach the receiver in commit order.
    let id = tx.stage(
        Message::new(DESTINATION, event.to_string())
            .ordering_key(p.customer.as_bytes())
            .header("content-type", "application/json"),
    )?;
    let row = json!({ "customer": p.customer, "qty": p.qty, "message_id": id.to_string() });
    purchases.insert(p.order_id.as_str(), row.to_string().as_str())?;
    // Checked after staging on purpose, to show it: the closure's error rolls back the row and
    // the staged message alike, and the message is never sent. (An `Outcome::Failed` would
    // commit, and so would anything staged before it.)
    if p.qty == 0 {
        return Err(Refused::Invalid("qty must be at least 1".into()));
    }
    let answer =
        json!({ "order_id": p.order_id, "message_id": id.to_string(), "status": "created" });
    Ok(Outcome::Completed(answer.to_string().into_bytes()))
}

/// `GET /purchases`: `{"purchases": [order ids], "backlog", "parked"}`, as durable.
async fn purchases(State(db): State<Arc<IdemDb>>) -> Response {
    // Reads wait for commits in flight to be durable: off the async workers.
    match tokio::task::spawn_blocking(move || list(&db)).await {
        Ok(Ok(listed)) => json(StatusCode::OK, &listed),
        Ok(Err(e)) => error(StatusCode::INTERNAL_SERVER_ERROR, e),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e),
    }
}

/// The purchases are read before the stats: a backlog of 0 then covers every listed purchase.
fn list(db: &IdemDb) -> Result<serde_json::Value, BoxError> {
    let read = db.begin_read()?;
    let mut orders = Vec::new();
    match read.open_table(PURCHASES) {
        Ok(table) => {
            for row in table.iter()? {
                orders.push(row?.0.value().to_string());
            }
        }
        Err(TableError::TableDoesNotExist(_)) => {}
        Err(e) => return Err(e.into()),
    }
    let stats = db.outbox_stats()?;
    Ok(json!({ "purchases": orders, "backlog": stats.backlog, "parked": stats.parked }))
}
