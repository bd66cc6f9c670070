//! The tower layer and service: the request flow documented in the module (http/mod.rs).

use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum_core::body::Body;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use tower_layer::Layer;
use tower_service::Service;

use super::config::{Finality, IdempotencyConfig};
use super::problem::Problem;
use super::stored::StoredResponse;
use crate::db::IdemDb;
use crate::outcome::ReserveOutcome;
use crate::scope::{Key, Scope};
use crate::token::Reservation;

/// Response header on every replay.
pub const REPLAYED_HEADER: &str = "idempotent-replayed";

/// A tower [`Layer`] that makes a route idempotent under the `Idempotency-Key` header: the
/// handler runs once per key and every retry gets its first response back.
///
/// See the module documentation for the full behaviour.
#[derive(Clone)]
pub struct IdempotencyLayer {
    shared: Arc<Shared>,
}

struct Shared {
    db: Arc<IdemDb>,
    config: IdempotencyConfig,
}

impl IdempotencyLayer {
    /// The layer with default settings.
    pub fn new(db: Arc<IdemDb>) -> Self {
        Self::with_config(db, IdempotencyConfig::default())
    }

    /// The layer with `config`.
    pub fn with_config(db: Arc<IdemDb>, config: IdempotencyConfig) -> Self {
        IdempotencyLayer {
            shared: Arc::new(Shared { db, config }),
        }
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = Idempotency<S>;

    fn layer(&self, inner: S) -> Idempotency<S> {
        Idempotency {
            inner,
            shared: Arc::clone(&self.shared),
        }
    }
}

/// The service [`IdempotencyLayer`] wraps a handler in.
#[derive(Clone)]
pub struct Idempotency<S> {
    inner: S,
    shared: Arc<Shared>,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S> Service<Request<Body>> for Idempotency<S>
where
    S: Service<Request<Body>, Response = Response<Body>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Response<Body>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        // The clone is not ready; the ready one goes with this request (tower's rule).
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let shared = Arc::clone(&self.shared);
        Box::pin(handle(shared, inner, req))
    }
}

async fn handle<S>(
    shared: Arc<Shared>,
    mut inner: S,
    req: Request<Body>,
) -> Result<Response<Body>, S::Error>
where
    S: Service<Request<Body>, Response = Response<Body>> + Send + 'static,
    S::Future: Send + 'static,
{
    let config = &shared.config;
    let (parts, body) = req.into_parts();
    if !config.methods.contains(&parts.method) {
        return inner.call(Request::from_parts(parts, body)).await;
    }
    let key = match parse_key(&parts.headers, &config.header, config.max_key_len) {
        Ok(Some(key)) => key,
        Ok(None) if !config.require_key => {
            return inner.call(Request::from_parts(parts, body)).await;
        }
        Ok(None) => return Ok(Problem::KeyMissing.response("send an Idempotency-Key header")),
        Err(why) => return Ok(Problem::KeyInvalid.response(why)),
    };
    let bytes = match Limited::new(body, config.max_body).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.is::<LengthLimitError>() => {
            let limit = format!("the limit is {} bytes", config.max_body);
            return Ok(Problem::BodyTooLarge.response(&limit));
        }
        Err(e) => return Ok(Problem::KeyInvalid.response(&format!("unreadable body: {e}"))),
    };
    let route = (config.route)(&parts);
    let scope = Scope::new(
        format!("{} {}", parts.method, route),
        (config.principal)(&parts),
    );
    let payload = (config.fingerprint)(&parts, &bytes);
    let db = &shared.db;
    let outcome = match config.wait {
        Some(wait) => {
            db.reserve_or_wait_async(&scope, &key, payload.as_slice(), config.lease, wait)
                .await
        }
        None => {
            db.reserve_async(&scope, &key, payload.as_slice(), config.lease)
                .await
        }
    };
    let retention = retention_seconds(db, &scope);
    let mut response = match outcome {
        Ok(ReserveOutcome::Acquired(reservation)) => {
            let req = Request::from_parts(parts, Body::from(bytes));
            run_handler(&shared, inner, req, reservation).await?
        }
        Ok(ReserveOutcome::Completed(stored) | ReserveOutcome::Failed(stored)) => replay(&stored),
        Ok(ReserveOutcome::Mismatch) => Problem::KeyReused
            .response("this key was first used with another method, path or body; use a new key"),
        Ok(ReserveOutcome::InProgress { retry_after }) => {
            let mut r = Problem::InProgress.response("retry after the time given");
            let seconds = retry_after.as_millis().div_ceil(1000).max(1);
            if let Ok(v) = HeaderValue::from_str(&seconds.to_string()) {
                r.headers_mut().insert(http::header::RETRY_AFTER, v);
            }
            r
        }
        Ok(ReserveOutcome::BeyondHorizon) => Problem::BeyondHorizon
            .response("the first request with this key is older than the retention; use a new key"),
        Err(e) => Problem::StoreUnavailable.response(&e.to_string()),
    };
    if let (Some(name), Some(seconds)) = (&config.retention_header, retention) {
        response.headers_mut().insert(name.clone(), seconds);
    }
    Ok(response)
}

/// Runs the handler as the key's owner; stores its response if final, else releases the key.
async fn run_handler<S>(
    shared: &Shared,
    mut inner: S,
    req: Request<Body>,
    reservation: Reservation,
) -> Result<Response<Body>, S::Error>
where
    S: Service<Request<Body>, Response = Response<Body>>,
    S::Future: Send + 'static,
{
    let config = &shared.config;
    let db = &shared.db;
    // Released if the request future is dropped (the client went away) or the handler panics.
    let mut guard = ReleaseOnDrop {
        db: Arc::clone(db),
        reservation: Some(reservation),
    };
    let response = match CatchUnwind(Box::pin(inner.call(req))).await {
        Ok(Ok(response)) => response,
        Ok(Err(e)) => {
            if let Some(r) = guard.reservation.take() {
                release_now(db, &r, "the handler failed").await;
            }
            return Err(e);
        }
        Err(panic) => {
            drop(guard);
            resume_unwind(panic);
        }
    };
    let finality = (config.finality)(response.status());
    if finality == Finality::Release {
        if let Some(r) = guard.reservation.take() {
            release_now(db, &r, "the response is not final").await;
        }
        return Ok(response);
    }
    let (parts, body) = response.into_parts();
    let body = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        // The handler's body failed midway: nothing complete to store or send.
        Err(e) => {
            let detail = format!("the handler's response body failed: {e}");
            return Ok(Problem::StoreUnavailable.response(&detail));
        }
    };
    let Some(reservation) = guard.reservation.take() else {
        return Ok(Response::from_parts(parts, Body::from(body)));
    };
    if body.len() > config.max_stored_response {
        release_now(db, &reservation, "response over max_stored_response").await;
        return Ok(Response::from_parts(parts, Body::from(body)));
    }
    let stored = StoredResponse::new(
        parts.status,
        &parts.headers,
        &config.stored_headers,
        body.to_vec(),
    );
    let saved = match finality {
        Finality::Failed => db.fail_async(&reservation, stored.encode()).await,
        _ => db.complete_async(&reservation, stored.encode()).await,
    };
    if let Err(e) = saved {
        // The handler ran; its answer goes to this caller even if a retry cannot replay it.
        warn(&format!("response not stored: {e}"));
    }
    Ok(Response::from_parts(parts, Body::from(body)))
}

/// The stored response, as sent the first time, with `Idempotent-Replayed: true`.
fn replay(stored: &[u8]) -> Response<Body> {
    let Some(stored) = StoredResponse::decode(stored) else {
        return Problem::StoreUnavailable.response("the stored response does not decode");
    };
    let mut response = Response::new(Body::from(stored.body));
    *response.status_mut() = stored.status;
    for (name, value) in stored.headers {
        response.headers_mut().append(name, value);
    }
    response
        .headers_mut()
        .insert(REPLAYED_HEADER, HeaderValue::from_static("true"));
    response
}

/// The key from the header: an RFC 8941 string (`"…"`, as the draft specifies) or, leniently,
/// the bare value.
fn parse_key(
    headers: &HeaderMap,
    name: &HeaderName,
    max_len: usize,
) -> Result<Option<Key>, &'static str> {
    let mut values = headers.get_all(name).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err("more than one Idempotency-Key header");
    }
    let raw = value.as_bytes();
    let key = match raw {
        [b'"', inner @ .., b'"'] if !inner.contains(&b'"') => inner,
        _ => raw,
    };
    if key.is_empty() {
        return Err("the key is empty");
    }
    if key.len() > max_len {
        return Err("the key is too long");
    }
    Ok(Some(Key::new(key)))
}

fn retention_seconds(db: &IdemDb, scope: &Scope) -> Option<HeaderValue> {
    let ttl = db.retention().ttl_for(scope.operation());
    HeaderValue::from_str(&ttl.as_secs().to_string()).ok()
}

async fn release_now(db: &IdemDb, reservation: &Reservation, why: &str) {
    if let Err(e) = db.release_async(reservation).await {
        warn(&format!("key not released ({why}): {e}"));
    }
}

fn warn(message: &str) {
    #[cfg(feature = "tracing")]
    tracing::warn!(target: "idemdb::http", "{message}");
    #[cfg(not(feature = "tracing"))]
    let _ = message;
}

/// Releases the key unless the response was stored (or released) first.
struct ReleaseOnDrop {
    db: Arc<IdemDb>,
    reservation: Option<Reservation>,
}

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        if let Some(reservation) = self.reservation.take() {
            // Blocking, but only on this rare path (a dropped request or a panic): the next
            // retry must not wait for the lease to run out.
            if let Err(e) = self.db.release(&reservation) {
                warn(&format!("key not released after a dropped request: {e}"));
            }
        }
    }
}

/// Polls a future, turning a panic into `Err(payload)`.
struct CatchUnwind<F>(Pin<Box<F>>);

impl<F: Future> Future for CatchUnwind<F> {
    type Output = Result<F::Output, Box<dyn std::any::Any + Send>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let inner = self.0.as_mut();
        match catch_unwind(AssertUnwindSafe(|| inner.poll(cx))) {
            Ok(Poll::Ready(v)) => Poll::Ready(Ok(v)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(panic) => Poll::Ready(Err(panic)),
        }
    }
}
