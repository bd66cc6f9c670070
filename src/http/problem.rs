//! `application/problem+json` (RFC 9457) answers of the idempotency layer.

use http::{HeaderValue, StatusCode, header};

/// Why the layer answered instead of the handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Problem {
    /// 400: the route requires an `Idempotency-Key` and the request has none.
    KeyMissing,
    /// 400: the header is not a usable key (empty, too long, not a string).
    KeyInvalid,
    /// 413: the request body is over the limit.
    BodyTooLarge,
    /// 422: the key was used with another request.
    KeyReused,
    /// 409: a request with this key is being processed.
    InProgress,
    /// 422: the key is older than the retention and refused by policy.
    BeyondHorizon,
    /// 503: the store failed; the request did not run (or its outcome is unknown).
    StoreUnavailable,
}

impl Problem {
    pub(crate) fn status(self) -> StatusCode {
        match self {
            Problem::KeyMissing | Problem::KeyInvalid => StatusCode::BAD_REQUEST,
            Problem::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Problem::KeyReused | Problem::BeyondHorizon => StatusCode::UNPROCESSABLE_ENTITY,
            Problem::InProgress => StatusCode::CONFLICT,
            Problem::StoreUnavailable => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    fn slug_and_title(self) -> (&'static str, &'static str) {
        match self {
            Problem::KeyMissing => ("key-missing", "An Idempotency-Key header is required"),
            Problem::KeyInvalid => ("key-invalid", "The Idempotency-Key header is not valid"),
            Problem::BodyTooLarge => ("body-too-large", "The request body is too large"),
            Problem::KeyReused => (
                "key-reused",
                "The Idempotency-Key was already used with another request",
            ),
            Problem::InProgress => (
                "in-progress",
                "A request with this Idempotency-Key is being processed",
            ),
            Problem::BeyondHorizon => (
                "beyond-retention",
                "The Idempotency-Key is older than its retention",
            ),
            Problem::StoreUnavailable => (
                "store-unavailable",
                "The idempotency store could not take the request",
            ),
        }
    }

    /// The response: status, `Content-Type: application/problem+json`, the JSON body.
    pub(crate) fn response(self, detail: &str) -> http::Response<axum_core::body::Body> {
        let (slug, title) = self.slug_and_title();
        let body = serde_json::json!({
            "type": format!("urn:idemdb:problem:{slug}"),
            "title": title,
            "status": self.status().as_u16(),
            "detail": detail,
        });
        let mut response = http::Response::new(axum_core::body::Body::from(body.to_string()));
        *response.status_mut() = self.status();
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        response
    }
}
