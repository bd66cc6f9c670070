//! An `Idempotency-Key` layer for tower and axum (feature `http`), after the IETF httpapi
//! draft "The Idempotency-Key HTTP Header Field".
//!
//! Put [`IdempotencyLayer`] on the routes that change state. For a request whose method is in
//! [`IdempotencyConfig::methods`] (POST and PATCH by default):
//!
//! | Request | Answer |
//! |---|---|
//! | no `Idempotency-Key` (and [`require_key`](IdempotencyConfig::require_key)) | 400, `application/problem+json` |
//! | an empty, too long or repeated key header | 400 |
//! | body over [`max_body`](IdempotencyConfig::max_body) | 413 |
//! | first request with the key | the handler runs; a final response is stored |
//! | a retry after a final response | the stored status, allow-listed headers and body, byte for byte, plus `Idempotent-Replayed: true`; the handler does not run |
//! | a retry while the first is running | 409 with `Retry-After`, or, with [`wait`](IdempotencyConfig::wait), the first response once it is stored |
//! | the same key with another method, path or body | 422 |
//! | a key beyond its retention, under [`BeyondHorizonPolicy::Refuse`](crate::BeyondHorizonPolicy::Refuse) | 422 |
//! | the store fails | 503; the handler did not run |
//!
//! Which responses are final is [`IdempotencyConfig::finality`]: by default 2xx and 3xx
//! are stored as COMPLETED and 4xx as FAILED (both replayed), while a 5xx, a handler panic or
//! a dropped request (the client went away) releases the key so that the retry runs again. A
//! final response larger than [`max_stored_response`](IdempotencyConfig::max_stored_response)
//! is sent but not stored, and its key released. Every answer carries the retention in force
//! (`Idempotency-Retention: <seconds>`).
//!
//! The key's scope is `"<METHOD> <route>"` and the principal from
//! [`IdempotencyConfig::principal`]; the payload fingerprint covers method, path and query, and
//! body ([`IdempotencyConfig::fingerprint`] to change it).
//!
//! ```
//! use std::sync::Arc;
//! use axum::{Router, routing::post};
//! use idemdb::IdemDb;
//! use idemdb::http::{IdempotencyConfig, IdempotencyLayer};
//!
//! # let dir = tempfile::tempdir()?;
//! let db = Arc::new(IdemDb::open(dir.path().join("shop.idemdb"))?);
//! let config = IdempotencyConfig::default().principal(|parts| {
//!     // e.g. what an auth layer put there
//!     parts.headers.get("x-user").and_then(|v| v.to_str().ok()).map(String::from)
//! });
//! let app: Router = Router::new()
//!     .route("/purchases", post(|| async { (axum::http::StatusCode::CREATED, "order 1") }))
//!     .layer(IdempotencyLayer::with_config(db, config));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod config;
mod problem;
mod service;
mod stored;

pub use config::{Finality, IdempotencyConfig, default_finality, default_fingerprint};
pub use service::{Idempotency, IdempotencyLayer, REPLAYED_HEADER};
