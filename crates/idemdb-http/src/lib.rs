//! # idemdb-http
//!
//! An `Idempotency-Key` layer for tower and axum over any [`Store`](idemdb_core::Store) (the embedded
//! `idemdb::IdemDb` or `idemdb_postgres::PgStore`), after the IETF httpapi
//! draft "The Idempotency-Key HTTP Header Field" (draft-ietf-httpapi-idempotency-key-header-06).
//!
//! Put [`IdempotencyLayer`] on the routes that change state. For a request whose method is in
//! [`IdempotencyConfig::methods`] (POST and PATCH by default):
//!
//! | Request | Answer |
//! |---|---|
//! | no `Idempotency-Key` (and [`require_key`](IdempotencyConfig::require_key)) | 400, `application/problem+json` |
//! | an empty, too long or repeated key header; with [`strict_keys`](IdempotencyConfig::strict_keys), a key that is not one RFC 8941 sf-string | 400 |
//! | keys per caller, and the principal extractor names none | 403 |
//! | a route too long to scope a key | 414; a caller's name too long: 400 |
//! | body over [`max_body`](IdempotencyConfig::max_body) | 413 |
//! | first request with the key | the handler runs; a final response is stored |
//! | a retry after a final response | the stored status, allow-listed headers and body, byte for byte, plus `Idempotent-Replayed: true`; the handler does not run |
//! | a retry while the first is running | 409 with `Retry-After`, or, with [`wait`](IdempotencyConfig::wait), the first response once it is stored |
//! | the same key, method and route with another query or body | 422 |
//! | the same key with another method or route | another scope: a request of its own |
//! | a key beyond its retention, under [`BeyondHorizonPolicy::Refuse`](idemdb_core::BeyondHorizonPolicy::Refuse) | 422 |
//! | the handler's response body fails midway | 500 (`handler-failed`); the key is released |
//! | the store fails | 503; the handler did not run |
//!
//! **Keys are per caller.** There is no default config: [`IdempotencyConfig::new`] takes the
//! extractor of the caller (principal) a request acts for, and the key's scope is
//! `"<METHOD> <route>"` and that principal, so that one caller's key never reaches another's
//! response. A request it names no caller for is refused (403). Keys shared by all callers
//! take the explicit [`IdempotencyConfig::global_keys`]: with them, anyone who sends a key
//! gets the response stored under it, or learns that the key exists (the draft's §5, "Data
//! leaks"). The payload fingerprint covers method, path and query, and body
//! ([`IdempotencyConfig::fingerprint`] to change it).
//!
//! **Which responses are final** is [`IdempotencyConfig::finality`]; by default
//! ([`default_finality`]) 2xx and 3xx are stored as COMPLETED and 4xx as FAILED (both
//! replayed), except 401, 403, 408, 425 and 429, which a later or corrected retry may answer
//! otherwise: those, a 5xx, a handler panic or a dropped request (the client went away)
//! release the key so that the retry runs again. `Retry-After` is stored with the rest
//! ([`stored_headers`](IdempotencyConfig::stored_headers)).
//!
//! **A response too large to replay** (over
//! [`max_stored_response`](IdempotencyConfig::max_stored_response), counted as stored) is
//! sent in full, and a marker stored in its place: its status and a problem body
//! (`response-too-large`) saying that the request was processed but its response is not
//! kept. Retries get the marker; the handler does not run again. The same marker
//! (`response-not-stored`) stands in if storing the response fails: a key is never left in
//! progress until its lease ends. While the handler runs, its lease is renewed every third of
//! it ([`IdempotencyConfig::renew_lease`], on by default): a retry takes the key over only
//! from an instance that stopped, never from a handler that is merely slower than the lease.
//! [`IdempotencyLayer::new`] refuses a config whose limits the store's
//! [`Limits`](idemdb_core::Limits) could not hold.
//!
//! Every answer to a request with the layer's methods carries the retention in force
//! (`Idempotency-Retention: <seconds>`), the layer's refusals included. Problem answers are
//! `application/problem+json` (RFC 9457) whose `type` is
//! [`problem_type_prefix`](IdempotencyConfig::problem_type_prefix) and the problem's name.
//!
//! ```
//! use std::sync::Arc;
//! use axum::{Router, routing::post};
//! //! use idemdb_http::{IdempotencyConfig, IdempotencyLayer};
//!
//! # let dir = tempfile::tempdir()?;
//! let db = Arc::new(IdemDb::open(dir.path().join("shop.idemdb"))?);
//! let config = IdempotencyConfig::new(|parts| {
//!     // e.g. what an auth layer put there
//!     parts.headers.get("x-user").and_then(|v| v.to_str().ok()).map(String::from)
//! });
//! let app: Router = Router::new()
//!     .route("/purchases", post(|| async { (axum::http::StatusCode::CREATED, "order 1") }))
//!     .layer(IdempotencyLayer::new(db, config)?);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! There is no config without a choice of principal:
//!
//! ```compile_fail
//! let config = idemdb_http::IdempotencyConfig::default();
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod config;
mod finish;
mod key;
mod layer;
mod marker;
mod problem;
mod service;
mod stored;

pub use config::{Finality, IdempotencyConfig, default_finality, default_fingerprint};
pub use layer::IdempotencyLayer;
pub use service::{Idempotency, REPLAYED_HEADER};
