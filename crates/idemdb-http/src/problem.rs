//! `application/problem+json` (RFC 9457) answers of the idempotency layer.

use http::{HeaderValue, StatusCode, header};

/// The media type of every problem answer.
pub(crate) const PROBLEM_JSON: &str = "application/problem+json";

/// Why the layer answered instead of the handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Problem {
    /// 400: the route requires an `Idempotency-Key` and the request has none.
    KeyMissing,
    /// 400: the header is not a usable key (empty, too long, not a string).
    KeyInvalid,
    /// 403: keys are scoped per caller and the request names none.
    PrincipalMissing,
    /// 400: the caller's name is too long to scope a key.
    PrincipalTooLong,
    /// 414: the request's route is too long to scope a key.
    PathTooLong,
    /// 413: the request body is over the limit.
    BodyTooLarge,
    /// 422: the key was used with another request.
    KeyReused,
    /// 409: a request with this key is being processed.
    InProgress,
    /// 422: the key is older than the retention and refused by policy.
    BeyondHorizon,
    /// 500: the handler's response failed before it was complete.
    HandlerFailed,
    /// 503: the store failed; the request did not run (or its outcome is unknown).
    StoreUnavailable,
}

impl Problem {
    pub(crate) fn status(self) -> StatusCode {
        match self {
            Problem::KeyMissing | Problem::KeyInvalid | Problem::PrincipalTooLong => {
                StatusCode::BAD_REQUEST
            }
            Problem::PrincipalMissing => StatusCode::FORBIDDEN,
            Problem::PathTooLong => StatusCode::URI_TOO_LONG,
            Problem::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Problem::KeyReused | Problem::BeyondHorizon => StatusCode::UNPROCESSABLE_ENTITY,
            Problem::InProgress => StatusCode::CONFLICT,
            Problem::HandlerFailed => StatusCode::INTERNAL_SERVER_ERROR,
            Problem::StoreUnavailable => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    fn slug_and_title(self) -> (&'static str, &'static str) {
        match self {
            Problem::KeyMissing => ("key-missing", "An Idempotency-Key header is required"),
            Problem::KeyInvalid => ("key-invalid", "The Idempotency-Key header is not valid"),
            Problem::PrincipalMissing => (
                "principal-missing",
                "Idempotency keys are per caller and the request names no caller",
            ),
            Problem::PrincipalTooLong => (
                "principal-too-long",
                "The caller's name is too long to scope an Idempotency-Key",
            ),
            Problem::PathTooLong => (
                "path-too-long",
                "The request path is too long to scope an Idempotency-Key",
            ),
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
            Problem::HandlerFailed => (
                "handler-failed",
                "The handler's response failed before it was complete",
            ),
            Problem::StoreUnavailable => (
                "store-unavailable",
                "The idempotency store could not take the request",
            ),
        }
    }

    /// The response: status, `Content-Type: application/problem+json`, the JSON body with
    /// `type` = `type_prefix` + the problem's name.
    pub(crate) fn response(
        self,
        type_prefix: &str,
        detail: &str,
    ) -> http::Response<axum_core::body::Body> {
        let (slug, title) = self.slug_and_title();
        let body = problem_json(type_prefix, slug, title, self.status(), detail);
        let mut response = http::Response::new(axum_core::body::Body::from(body));
        *response.status_mut() = self.status();
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        response
    }
}

/// An RFC 9457 problem document.
pub(crate) fn problem_json(
    type_prefix: &str,
    slug: &str,
    title: &str,
    status: StatusCode,
    detail: &str,
) -> Vec<u8> {
    serde_json::json!({
        "type": format!("{type_prefix}{slug}"),
        "title": title,
        "status": status.as_u16(),
        "detail": detail,
    })
    .to_string()
    .into_bytes()
}
