//! What is stored in place of a final response that cannot be kept for replay: its status
//! and a problem body saying why. A retry gets the marker; the handler, which already ran,
//! never runs again for the key.

use http::{HeaderName, HeaderValue, StatusCode, header};

use crate::problem::{PROBLEM_JSON, problem_json};
use crate::stored::StoredResponse;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Marker {
    /// The response was over `max_stored_response`.
    TooLarge,
    /// Storing the response failed.
    NotStored,
}

impl Marker {
    /// The marker for a response of `status` (its status is kept, so that a 2xx stays one).
    pub(crate) fn stored(self, type_prefix: &str, status: StatusCode) -> StoredResponse {
        let (slug, title, detail) = match self {
            Marker::TooLarge => (
                "response-too-large",
                "The response was too large to replay",
                "the request with this key was processed; its response was too large to keep \
                 for replays",
            ),
            Marker::NotStored => (
                "response-not-stored",
                "The response could not be stored for replay",
                "the request with this key was processed; its response could not be kept for \
                 replays",
            ),
        };
        let content_type: (HeaderName, HeaderValue) =
            (header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        StoredResponse {
            status,
            headers: vec![content_type],
            body: problem_json(type_prefix, slug, title, status, detail),
        }
    }

    /// The longest encoded marker (every status has three digits).
    pub(crate) fn max_encoded_len(type_prefix: &str) -> usize {
        [Marker::TooLarge, Marker::NotStored]
            .into_iter()
            .map(|m| m.stored(type_prefix, StatusCode::OK).encode().len())
            .max()
            .unwrap_or(0)
    }
}
