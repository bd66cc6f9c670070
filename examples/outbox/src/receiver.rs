//! The receiving service: `POST /events` consumes each message through idemdb's inbox, by the
//! message id the sender's dispatcher puts in the `Message-Id` header, and applies its effect
//! in the inbox record's own commit. `GET /effects` lists the effects.
//!
//! Invariant: an order's effect row exists iff the inbox recorded the message that carried
//! it, because both are in one commit; a re-sent message finds its inbox record and does not
//! run the handler, so `applied` stays 1. The 2xx goes out only after that commit is durable:
//! a sender that saw it may forget it, never the other way round.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::{get, post};
use idemdb::redb::{ReadableTable, TableDefinition, TableError};
use idemdb::{Consumed, IdemDb, MessageId, Tx};
use serde::Deserialize;
use serde_json::json;

use crate::BoxError;
use crate::http::{error, json, serve};
use crate::publisher::MESSAGE_ID;

/// The effect: per order id, how many times it was applied and the message that first
/// applied it. Written only inside inbox handlers.
const EFFECTS: TableDefinition<&str, (u64, &str)> = TableDefinition::new("effects");

/// The inbox's consumer name (its dedupe scope): another consumer of the same messages would
/// have an inbox of its own.
const CONSUMER: &str = "orders-projection";

/// The message's payload, as far as the receiver reads it.
#[derive(Debug, Deserialize)]
struct OrderCreated {
    order_id: String,
}

struct Receiver {
    db: Arc<IdemDb>,
    /// Since this process started (not durable): messages whose handler ran.
    processed: AtomicU64,
    /// Since this process started (not durable): re-sent messages the inbox dropped.
    duplicates: AtomicU64,
}

/// Serves the receiver until the process ends.
pub async fn run(db: PathBuf, listen: &str) -> Result<(), BoxError> {
    // Registered, the effects table's writes ride in the inbox record's log append.
    let db = IdemDb::builder()
        .table(EFFECTS)
        .open(&db)
        .map_err(|e| format!("opening {}: {e}", db.display()))?;
    let state = Arc::new(Receiver {
        db: Arc::new(db),
        processed: AtomicU64::new(0),
        duplicates: AtomicU64::new(0),
    });
    let app = Router::new()
        .route("/events", post(event))
        .route("/effects", get(effects))
        .with_state(state);
    serve(listen, app).await
}

/// `POST /events`: 200 once the effect is durable (or was already), 400 for a message that
/// can never be applied (the sender parks it), 5xx for what a retry may fix.
async fn event(State(r): State<Arc<Receiver>>, headers: HeaderMap, body: Bytes) -> Response {
    let Some(id) = headers
        .get(MESSAGE_ID)
        .and_then(|v| v.to_str().ok())
        .and_then(MessageId::parse)
    else {
        return error(StatusCode::BAD_REQUEST, "missing or malformed Message-Id");
    };
    let event: OrderCreated = match serde_json::from_slice(&body) {
        Ok(event) => event,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("bad payload: {e}")),
    };
    let message_id = id.to_string();
    let written = message_id.clone();
    let consumed =
        r.db.consume_async(CONSUMER, message_id.as_bytes(), move |tx| {
            apply(tx, &event.order_id, &written)
        })
        .await;
    match consumed {
        Ok(Consumed::Processed) => {
            r.processed.fetch_add(1, Ordering::Relaxed);
            json(StatusCode::OK, &json!({ "status": "applied" }))
        }
        Ok(Consumed::Duplicate) => {
            r.duplicates.fetch_add(1, Ordering::Relaxed);
            json(StatusCode::OK, &json!({ "status": "duplicate" }))
        }
        // Not an inbox's doing (a two-step owner of this id): worth a retry.
        Ok(Consumed::InProgress { retry_after }) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("message {message_id} in progress, retry after {retry_after:?}"),
        ),
        // Older than the inbox's retention, refused by policy: a retry cannot change that.
        Ok(Consumed::BeyondHorizon) => error(
            StatusCode::CONFLICT,
            format!("message {message_id} is beyond the inbox's horizon"),
        ),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e),
    }
}

/// The effect, run by the inbox once per message id, in the inbox record's commit.
fn apply(tx: &mut Tx<'_>, order_id: &str, message_id: &str) -> Result<(), idemdb::Error> {
    let mut effects = tx.open_table(EFFECTS)?;
    let (applied, first) = match effects.get(order_id)? {
        Some(row) => {
            let (applied, first) = row.value();
            (applied, first.to_string())
        }
        None => (0, message_id.to_string()),
    };
    // Counted, not set: were a message ever applied twice, the count would show it.
    effects.insert(order_id, (applied + 1, first.as_str()))?;
    Ok(())
}

/// `GET /effects`: `{"effects": [{"order_id", "applied", "message_id"}], "processed",
/// "duplicates"}`, the effects as durable.
async fn effects(State(r): State<Arc<Receiver>>) -> Response {
    let db = Arc::clone(&r.db);
    // begin_read may wait for a commit in flight to be durable: off the async workers.
    let listed = tokio::task::spawn_blocking(move || list(&db)).await;
    match listed {
        Ok(Ok(effects)) => json(
            StatusCode::OK,
            &json!({
                "effects": effects,
                "processed": r.processed.load(Ordering::Relaxed),
                "duplicates": r.duplicates.load(Ordering::Relaxed),
            }),
        ),
        Ok(Err(e)) => error(StatusCode::INTERNAL_SERVER_ERROR, e),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e),
    }
}

fn list(db: &IdemDb) -> Result<Vec<serde_json::Value>, BoxError> {
    let read = db.begin_read()?;
    let table = match read.open_table(EFFECTS) {
        Ok(table) => table,
        Err(TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
        Err(e) => return Err(e.into()),
    };
    let mut effects = Vec::new();
    for row in table.iter()? {
        let (order, value) = row?;
        let (applied, message_id) = value.value();
        effects.push(json!({
            "order_id": order.value(),
            "applied": applied,
            "message_id": message_id,
        }));
    }
    Ok(effects)
}
