//! The sender's publisher: POSTs each outbox message to the receiver's `/events`, its
//! [`MessageId`](idemdb::MessageId) in the `Message-Id` header (the receiver's inbox key).
//!
//! **An async client in the embedded engine.** The [`Dispatcher`](idemdb::Dispatcher) calls a
//! sync publisher on a std thread of its own, outside the tokio runtime. The publisher keeps
//! a [`Handle`] to the service's runtime and drives the async client with
//! [`Handle::block_on`]: the request's I/O runs on the runtime's workers while the dispatcher
//! thread waits for the answer. That is sound only off the runtime (`block_on` panics on a
//! runtime thread), which the dispatcher's thread always is; and it blocks nothing but that
//! thread, which has nothing else to do: messages are published one at a time anyway, in
//! order per ordering key.
//!
//! The answer decides: 2xx is `Ok` (the receiver has it durably); 4xx is `Permanent` (the
//! message is refused for what it is; the dispatcher parks it); a 5xx, a connection error or a
//! timeout is `Transient` (retried with backoff). A timeout may hide a delivery: the retry
//! then re-sends, and the receiver's inbox drops it.

use std::time::Duration;

use axum::body::Bytes;
use axum::http::header::{HeaderName, HeaderValue};
use axum::http::{Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use idemdb::{OutboxMessage, Publish, PublishError};
use tokio::runtime::Handle;

use crate::BoxError;
use crate::crash::{Crash, Point};

/// The header carrying the message id.
pub const MESSAGE_ID: &str = "message-id";

/// The one destination the sender stages to, routed to the receiver.
pub const DESTINATION: &str = "orders";

/// The longest one POST may take, answer included: a hung receiver must not hold its
/// ordering key (and every message behind it) forever.
const TIMEOUT: Duration = Duration::from_secs(5);

/// Publishes to the receiver over HTTP.
pub struct HttpPublisher {
    runtime: Handle,
    client: Client<HttpConnector, Full<Bytes>>,
    events: Uri,
    crash: Crash,
}

impl HttpPublisher {
    /// A publisher POSTing to `receiver`'s `/events` (an `http://` URL) on `runtime`.
    pub fn new(runtime: Handle, receiver: &str, crash: Crash) -> Result<HttpPublisher, BoxError> {
        let events: Uri = format!("{}/events", receiver.trim_end_matches('/'))
            .parse()
            .map_err(|e| format!("--receiver {receiver:?}: {e}"))?;
        if events.scheme_str() != Some("http") {
            return Err(format!("--receiver {receiver:?}: only http:// is supported").into());
        }
        Ok(HttpPublisher {
            runtime,
            client: Client::builder(TokioExecutor::new()).build_http(),
            events,
            crash,
        })
    }

    /// The request for `m`; an error is permanent (what cannot be sent now never can).
    fn request(&self, m: &OutboxMessage) -> Result<Request<Full<Bytes>>, PublishError> {
        let permanent = |e: &dyn std::fmt::Display| PublishError::Permanent(e.to_string());
        let mut request = Request::post(self.events.clone())
            .header(MESSAGE_ID, m.id.to_string())
            .body(Full::new(Bytes::from(m.payload.clone())))
            .map_err(|e| permanent(&e))?;
        for (name, value) in &m.headers {
            let name = HeaderName::from_bytes(name.as_bytes()).map_err(|e| permanent(&e))?;
            let value = HeaderValue::from_bytes(value).map_err(|e| permanent(&e))?;
            request.headers_mut().append(name, value);
        }
        Ok(request)
    }
}

impl Publish for HttpPublisher {
    fn publish(&mut self, m: &OutboxMessage) -> Result<(), PublishError> {
        if m.destination != DESTINATION {
            return Err(PublishError::Permanent(format!(
                "no route to destination {:?}",
                m.destination
            )));
        }
        let attempt = self.crash.attempt(m.seq);
        // The commit that staged `m` is durable; nothing is sent yet.
        self.crash
            .at(Point::BeforePublish, attempt, &m.id.to_string());
        let request = self.request(m)?;
        let client = &self.client;
        let answer = self.runtime.block_on(async {
            tokio::time::timeout(TIMEOUT, async {
                let response = client.request(request).await?;
                let status = response.status();
                // Read to the end, so that the connection goes back to the pool.
                let body = response.into_body().collect().await?.to_bytes();
                Ok::<_, BoxError>((status, body))
            })
            .await
        });
        let (status, body) = match answer {
            Err(_) => return Err(PublishError::Transient(format!("no answer in {TIMEOUT:?}"))),
            Ok(Err(e)) => return Err(PublishError::Transient(e.to_string())),
            Ok(Ok(answer)) => answer,
        };
        classify(status, &body)?;
        // The receiver has it durably; the dispatcher does not know yet.
        self.crash
            .at(Point::AfterPublish, attempt, &m.id.to_string());
        Ok(())
    }
}

/// 2xx delivered, 4xx refused for good, anything else worth a retry.
fn classify(status: StatusCode, body: &[u8]) -> Result<(), PublishError> {
    let why = || format!("{status}: {}", String::from_utf8_lossy(body));
    if status.is_success() {
        Ok(())
    } else if status.is_client_error() {
        Err(PublishError::Permanent(why()))
    } else {
        Err(PublishError::Transient(why()))
    }
}
