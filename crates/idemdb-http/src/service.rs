//! The tower service: the request flow documented in the module (http/mod.rs).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum_core::body::Body;
use http::request::Parts;
use http::{HeaderValue, Request, Response};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use tower_service::Service;

use crate::config::Shared;
use crate::config::{IdempotencyConfig, Principal};
use crate::finish::{run_handler, warn};
use crate::key::parse_key;
use crate::problem::Problem;
use crate::stored::StoredResponse;
use idemdb_core::Limits;
use idemdb_core::ReserveOutcome;
use idemdb_core::Store;
use idemdb_core::{Key, Scope};

/// Response header on every replay.
pub const REPLAYED_HEADER: &str = "idempotent-replayed";

/// The service [`IdempotencyLayer`](crate::IdempotencyLayer) wraps a handler in.
pub struct Idempotency<S, St> {
    inner: S,
    shared: Arc<Shared<St>>,
}

impl<S: Clone, St> Clone for Idempotency<S, St> {
    fn clone(&self) -> Self {
        Idempotency {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S, St> Idempotency<S, St> {
    pub(crate) fn new(inner: S, shared: Arc<Shared<St>>) -> Self {
        Idempotency { inner, shared }
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, St: Store> Service<Request<Body>> for Idempotency<S, St>
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

async fn handle<S, St: Store>(
    shared: Arc<Shared<St>>,
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
    let key = match parse_key(
        &parts.headers,
        &config.header,
        config.max_key_len,
        config.strict_keys,
    ) {
        Ok(None) if !config.require_key => {
            return inner.call(Request::from_parts(parts, body)).await;
        }
        parsed => parsed,
    };
    let operation = format!("{} {}", parts.method, (config.route)(&parts));
    let retention = retention_seconds(&shared, &operation);
    let mut response = match key {
        Ok(Some(key)) => idempotent(&shared, inner, parts, body, &key, operation).await?,
        Ok(None) => problem(
            config,
            Problem::KeyMissing,
            "send an Idempotency-Key header",
        ),
        Err(why) => problem(config, Problem::KeyInvalid, why),
    };
    // Every answer under a key, the layer's refusals included, states the retention.
    if let (Some(name), Some(seconds)) = (&config.retention_header, retention) {
        response.headers_mut().insert(name.clone(), seconds);
    }
    Ok(response)
}

/// A request with a well-formed key: scoped, read, reserved, then run or answered.
async fn idempotent<S, St: Store>(
    shared: &Shared<St>,
    inner: S,
    parts: Parts,
    body: Body,
    key: &Key,
    operation: String,
) -> Result<Response<Body>, S::Error>
where
    S: Service<Request<Body>, Response = Response<Body>> + Send + 'static,
    S::Future: Send + 'static,
{
    let (config, db) = (&shared.config, &shared.db);
    let scope = match scope(config, db.limits(), &parts, operation) {
        Ok(scope) => scope,
        Err((p, detail)) => return Ok(problem(config, p, detail)),
    };
    let bytes = match Limited::new(body, config.max_body).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.is::<LengthLimitError>() => {
            let limit = format!("the limit is {} bytes", config.max_body);
            return Ok(problem(config, Problem::BodyTooLarge, &limit));
        }
        Err(e) => {
            let detail = format!("unreadable body: {e}");
            return Ok(problem(config, Problem::KeyInvalid, &detail));
        }
    };
    let payload = (config.fingerprint)(&parts, &bytes);
    let outcome = match config.wait {
        Some(wait) => {
            db.reserve_or_wait(&scope, key, payload.as_slice(), config.lease, wait)
                .await
        }
        None => {
            db.reserve(&scope, key, payload.as_slice(), config.lease)
                .await
        }
    };
    Ok(match outcome {
        Ok(ReserveOutcome::Acquired(reservation)) => {
            let req = Request::from_parts(parts, Body::from(bytes));
            run_handler(shared, inner, req, reservation).await?
        }
        Ok(ReserveOutcome::Completed(stored) | ReserveOutcome::Failed(stored)) => {
            replay(config, &stored)
        }
        // Another method or route is another scope: only the payload can differ here.
        Ok(ReserveOutcome::Mismatch) => problem(
            config,
            Problem::KeyReused,
            "this key was first used with another request (query or body); use a new key",
        ),
        Ok(ReserveOutcome::InProgress { retry_after }) => {
            let mut r = problem(config, Problem::InProgress, "retry after the time given");
            let seconds = retry_after.as_millis().div_ceil(1000).max(1);
            if let Ok(v) = HeaderValue::from_str(&seconds.to_string()) {
                r.headers_mut().insert(http::header::RETRY_AFTER, v);
            }
            r
        }
        Ok(ReserveOutcome::BeyondHorizon) => problem(
            config,
            Problem::BeyondHorizon,
            "the first request with this key is older than the retention; use a new key",
        ),
        Err(e) => {
            // The cause stays in the log: it may name files or limits.
            warn(&format!("reserve failed: {e}"));
            let detail = "the request did not run; retry later";
            problem(config, Problem::StoreUnavailable, detail)
        }
    })
}

/// The key's scope: the operation and the caller, checked against the store's limits so
/// that a request the store would refuse is answered 4xx (the client's to fix), not 503.
fn scope(
    config: &IdempotencyConfig,
    limits: &Limits,
    parts: &Parts,
    operation: String,
) -> Result<Scope, (Problem, &'static str)> {
    let principal = match &config.principal {
        Principal::Global => String::new(),
        // An empty name would be the global scope: refused like no name.
        Principal::PerCaller(f) => match f(parts) {
            Some(p) if !p.is_empty() => p,
            _ => {
                let detail = "this route's keys are per caller; authenticate";
                return Err((Problem::PrincipalMissing, detail));
            }
        },
    };
    if operation.len() > limits.max_operation_len {
        return Err((Problem::PathTooLong, "use a shorter path with this key"));
    }
    if principal.len() > limits.max_principal_len {
        let detail = "the caller's name is too long for this service's keys";
        return Err((Problem::PrincipalTooLong, detail));
    }
    Ok(Scope::new(operation, principal))
}

fn problem(config: &IdempotencyConfig, p: Problem, detail: &str) -> Response<Body> {
    p.response(&config.problem_type_prefix, detail)
}

/// The stored response, as sent the first time, with `Idempotent-Replayed: true`.
fn replay(config: &IdempotencyConfig, stored: &[u8]) -> Response<Body> {
    let Some(stored) = StoredResponse::decode(stored) else {
        let detail = "the stored response does not decode";
        return problem(config, Problem::StoreUnavailable, detail);
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

fn retention_seconds<St: Store>(shared: &Shared<St>, operation: &str) -> Option<HeaderValue> {
    let ttl = shared.db.retention().ttl_for(operation.as_bytes());
    HeaderValue::from_str(&ttl.as_secs().to_string()).ok()
}
