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

/// The default finality: 2xx and 3xx are final successes; 4xx final failures (replayed, not
/// re-run), except those that a corrected or later retry of the same request can turn into
/// another answer: 401, 403 (credentials), 408 (timeout), 425 (too early), 429 (rate
/// limited). These and anything else (5xx) release the key.
pub fn default_finality(status: StatusCode) -> Finality {
    const TRANSIENT: [StatusCode; 5] = [
        StatusCode::UNAUTHORIZED,
        StatusCode::FORBIDDEN,
        StatusCode::REQUEST_TIMEOUT,
        StatusCode::TOO_EARLY,
        StatusCode::TOO_MANY_REQUESTS,
    ];
    if status.is_success() || status.is_redirection() {
        Finality::Completed
    } else if status.is_client_error() && !TRANSIENT.contains(&status) {
        Finality::Failed
    } else {
        Finality::Release
    }
}

type PartsFn<T> = Arc<dyn Fn(&Parts) -> T + Send + Sync>;
type FingerprintFn = Arc<dyn Fn(&Parts, &[u8]) -> Vec<u8> + Send + Sync>;

/// Whose keys a request's key is compared with.
#[derive(Clone)]
pub(crate) enum Principal {
    /// Per caller: `None` from the extractor refuses the request (403).
    PerCaller(PartsFn<Option<String>>),
    /// One key space per route, shared by every caller (the explicit opt-in).
    Global,
}

/// Settings of an [`IdempotencyLayer`](crate::IdempotencyLayer).
///
/// There is no default: start from [`IdempotencyConfig::new`] with the extractor of the
/// caller a request acts for, or opt in to keys shared by all callers with
/// [`IdempotencyConfig::global_keys`]. Keys scoped per caller are the safe choice: with
/// global keys, a caller who sends another's key gets the other's stored response (a data
/// leak, draft-ietf-httpapi-idempotency-key-header-06 §5), or learns that the key exists.
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
    /// Longest accepted key, in bytes (default 255; at most the store's
    /// [`Limits::max_key_len`](idemdb_core::Limits::max_key_len)).
    pub max_key_len: usize,
    /// Parse the key strictly as an RFC 8941 sf-string, as the draft specifies (default
    /// false): a quoted string of %x20-7E with `\"` and `\\` escapes, one key per field
    /// line, nothing else (a comma-joined pair is refused like two lines). When false, a
    /// quoted key is unquoted and any other value taken as it is.
    pub strict_keys: bool,
    /// Largest request body read, in bytes (default 1 MiB); above it: 413.
    pub max_body: usize,
    /// Largest response stored, in bytes, counted as stored: the body plus 5 bytes and, per
    /// kept header, its name and value and 6 bytes (default 1 MiB; at most the store's
    /// [`Limits::max_response_len`](idemdb_core::Limits::max_response_len), checked when the layer
    /// is built). A larger final response is sent, and a marker with its status and a
    /// problem body saying it was too large is stored in its place: retries get the marker,
    /// and the handler does not run again.
    pub max_stored_response: usize,
    /// The handler's lease: after it, a retry may take the key over (default 30 s).
    pub lease: Duration,
    /// Whether the lease is renewed every third of it while the handler runs (default true),
    /// so that a handler slower than its lease still runs once: a retry takes the key over
    /// only from an instance that stopped (crashed, or dropped the request, which releases
    /// the key). When false, a handler that outlives its lease may run again beside itself.
    pub renew_lease: bool,
    /// How long a duplicate that finds the first request in progress waits for it to finish
    /// and replays it (default `None`: answer 409 with `Retry-After` at once).
    pub wait: Option<Duration>,
    /// Response headers stored and replayed with the status and body (default:
    /// content-type, content-encoding, content-language, content-location,
    /// content-disposition, location, link, etag, last-modified, cache-control, vary,
    /// retry-after).
    pub stored_headers: Vec<HeaderName>,
    /// The header that advertises the retention (TTL) in force, in seconds (default
    /// `Idempotency-Retention`; `None`: not sent).
    pub retention_header: Option<HeaderName>,
    /// The prefix of the `type` URI of the layer's problem answers, followed by the
    /// problem's name, e.g. `key-missing` (default `urn:idemdb:problem:`). Point it at your
    /// own documentation, e.g. `https://api.example.com/problems/`.
    pub problem_type_prefix: String,
    pub(crate) principal: Principal,
    pub(crate) route: PartsFn<String>,
    pub(crate) fingerprint: FingerprintFn,
    pub(crate) finality: Arc<dyn Fn(StatusCode) -> Finality + Send + Sync>,
}

impl IdempotencyConfig {
    /// Keys scoped per caller: `principal` names who the request acts for, e.g. the user id
    /// an auth layer put in the request's extensions. A request for which it answers `None`
    /// (or an empty name, which would be the global scope) is refused with 403: keys are
    /// never shared between callers.
    pub fn new(principal: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static) -> Self {
        Self::with_principal(Principal::PerCaller(Arc::new(principal)))
    }

    /// Keys shared by all callers of a route: only for routes whose callers trust each other
    /// (or have one caller), since anyone who sends a key gets the response stored under it.
    pub fn global_keys() -> Self {
        Self::with_principal(Principal::Global)
    }

    fn with_principal(principal: Principal) -> Self {
        IdempotencyConfig {
            header: HeaderName::from_static("idempotency-key"),
            methods: vec![Method::POST, Method::PATCH],
            require_key: true,
            max_key_len: 255,
            strict_keys: false,
            max_body: 1 << 20,
            max_stored_response: 1 << 20,
            lease: Duration::from_secs(30),
            renew_lease: true,
            wait: None,
            stored_headers: [
                "content-type",
                "content-encoding",
                "content-language",
                "content-location",
                "content-disposition",
                "location",
                "link",
                "etag",
                "last-modified",
                "cache-control",
                "vary",
                "retry-after",
            ]
            .into_iter()
            .map(HeaderName::from_static)
            .collect(),
            retention_header: Some(HeaderName::from_static("idempotency-retention")),
            problem_type_prefix: "urn:idemdb:problem:".to_string(),
            principal,
            route: Arc::new(|parts| parts.uri.path().to_string()),
            fingerprint: Arc::new(default_fingerprint),
            finality: Arc::new(default_finality),
        }
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
        let principal = match self.principal {
            Principal::PerCaller(_) => "per caller",
            Principal::Global => "global keys",
        };
        f.debug_struct("IdempotencyConfig")
            .field("principal", &principal)
            .field("header", &self.header)
            .field("methods", &self.methods)
            .field("require_key", &self.require_key)
            .field("max_key_len", &self.max_key_len)
            .field("strict_keys", &self.strict_keys)
            .field("max_body", &self.max_body)
            .field("max_stored_response", &self.max_stored_response)
            .field("lease", &self.lease)
            .field("renew_lease", &self.renew_lease)
            .field("wait", &self.wait)
            .field("stored_headers", &self.stored_headers)
            .field("retention_header", &self.retention_header)
            .field("problem_type_prefix", &self.problem_type_prefix)
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

/// What every request of a layer's routes shares: the store and the config.
pub(crate) struct Shared<St> {
    pub(crate) db: std::sync::Arc<St>,
    pub(crate) config: IdempotencyConfig,
}
