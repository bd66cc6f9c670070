//! What the idempotency layer does, and how to change it.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;
use http::{HeaderName, Method, StatusCode};

/// What a handler's response means for its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finality {
    /// Stored as COMPLETED and replayed to every retry.
    Completed,
    /// Stored as FAILED (a deterministic failure) and replayed to every retry.
    Failed,
    /// Not stored: the key is released and the next retry runs the handler again.
    Release,
}

/// The default finality: 2xx and 3xx are final successes, 4xx final failures (replayed, not
/// re-run), anything else (5xx) releases the key.
pub fn default_finality(status: StatusCode) -> Finality {
    if status.is_success() || status.is_redirection() {
        Finality::Completed
    } else if status.is_client_error() {
        Finality::Failed
    } else {
        Finality::Release
    }
}

type PartsFn<T> = Arc<dyn Fn(&Parts) -> T + Send + Sync>;
type FingerprintFn = Arc<dyn Fn(&Parts, &[u8]) -> Vec<u8> + Send + Sync>;

/// Settings of an [`IdempotencyLayer`](super::IdempotencyLayer). Start from
/// [`IdempotencyConfig::default`] and change what you need.
#[derive(Clone)]
#[non_exhaustive]
pub struct IdempotencyConfig {
    /// The request header that carries the key (default `Idempotency-Key`).
    pub header: HeaderName,
    /// Methods the layer applies to (default POST and PATCH); others pass through untouched.
    pub methods: Vec<Method>,
    /// Whether a request without the header is refused with 400 (default true) or passes
    /// through without idempotency.
    pub require_key: bool,
    /// Longest accepted key, in bytes (default 255).
    pub max_key_len: usize,
    /// Largest request body read, in bytes (default 1 MiB); above it: 413.
    pub max_body: usize,
    /// Largest response stored, in bytes (default 1 MiB); a larger final response is sent but
    /// not stored, and its key is released.
    pub max_stored_response: usize,
    /// The handler's lease: after it, a retry may take the key over (default 30 s).
    pub lease: Duration,
    /// How long a duplicate that finds the first request in progress waits for it to finish
    /// and replays it (default `None`: answer 409 with `Retry-After` at once).
    pub wait: Option<Duration>,
    /// Response headers stored and replayed with the status and body (default:
    /// content-type, content-language, content-location, location, etag, last-modified,
    /// cache-control).
    pub stored_headers: Vec<HeaderName>,
    /// The header that advertises the retention (TTL) in force, in seconds (default
    /// `Idempotency-Retention`; `None`: not sent).
    pub retention_header: Option<HeaderName>,
    pub(crate) principal: PartsFn<Vec<u8>>,
    pub(crate) route: PartsFn<String>,
    pub(crate) fingerprint: FingerprintFn,
    pub(crate) finality: Arc<dyn Fn(StatusCode) -> Finality + Send + Sync>,
}

impl Default for IdempotencyConfig {
    fn default() -> Self {
        IdempotencyConfig {
            header: HeaderName::from_static("idempotency-key"),
            methods: vec![Method::POST, Method::PATCH],
            require_key: true,
            max_key_len: 255,
            max_body: 1 << 20,
            max_stored_response: 1 << 20,
            lease: Duration::from_secs(30),
            wait: None,
            stored_headers: [
                "content-type",
                "content-language",
                "content-location",
                "location",
                "etag",
                "last-modified",
                "cache-control",
            ]
            .into_iter()
            .map(HeaderName::from_static)
            .collect(),
            retention_header: Some(HeaderName::from_static("idempotency-retention")),
            principal: Arc::new(|_| Vec::new()),
            route: Arc::new(|parts| parts.uri.path().to_string()),
            fingerprint: Arc::new(default_fingerprint),
            finality: Arc::new(default_finality),
        }
    }
}

impl IdempotencyConfig {
    /// Who the request acts for, part of the key's scope: e.g. the authenticated user id
    /// an auth layer put in the request's extensions. Default: nobody (one scope per route).
    pub fn principal(
        mut self,
        f: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.principal = Arc::new(move |parts| f(parts).unwrap_or_default().into_bytes());
        self
    }

    /// The route part of the scope (default: the request path). With axum, the matched
    /// route template keeps one scope per endpoint whatever the path parameters.
    pub fn route(mut self, f: impl Fn(&Parts) -> String + Send + Sync + 'static) -> Self {
        self.route = Arc::new(f);
        self
    }

    /// The bytes fingerprinted to tell a retry from another request under the same key
    /// (default: method, path and query, body). E.g. a canonical subset of a JSON body.
    pub fn fingerprint(
        mut self,
        f: impl Fn(&Parts, &[u8]) -> Vec<u8> + Send + Sync + 'static,
    ) -> Self {
        self.fingerprint = Arc::new(f);
        self
    }

    /// Which responses are final (default [`default_finality`]).
    pub fn finality(mut self, f: impl Fn(StatusCode) -> Finality + Send + Sync + 'static) -> Self {
        self.finality = Arc::new(f);
        self
    }
}

impl fmt::Debug for IdempotencyConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyConfig")
            .field("header", &self.header)
            .field("methods", &self.methods)
            .field("require_key", &self.require_key)
            .field("max_body", &self.max_body)
            .field("max_stored_response", &self.max_stored_response)
            .field("lease", &self.lease)
            .field("wait", &self.wait)
            .field("stored_headers", &self.stored_headers)
            .finish_non_exhaustive()
    }
}

/// Method, path and query, and body, each length-prefixed so that no two requests share
/// the bytes.
pub fn default_fingerprint(parts: &Parts, body: &[u8]) -> Vec<u8> {
    let target = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    let mut out = Vec::with_capacity(24 + target.len() + body.len());
    for part in [parts.method.as_str().as_bytes(), target.as_bytes(), body] {
        out.extend_from_slice(&(part.len() as u64).to_be_bytes());
        out.extend_from_slice(part);
    }
    out
}
