//! What both services share: binding, the readiness line, JSON replies.

use std::io::Write;

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::BoxError;

/// Binds `listen`, announces the bound address on stdout, and serves `app` until the
/// process ends. The line `listening on http://<addr>` is printed (and flushed) only once
/// the socket accepts connections, so a supervisor or a test can wait for it instead of
/// sleeping; with port 0 it carries the port the system picked.
pub async fn serve(listen: &str, app: Router) -> Result<(), BoxError> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| format!("binding {listen}: {e}"))?;
    let addr = listener.local_addr()?;
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "listening on http://{addr}")?;
        out.flush()?;
    }
    axum::serve(listener, app).await?;
    Ok(())
}

/// A JSON reply.
pub fn json(status: StatusCode, body: &serde_json::Value) -> Response {
    bytes(status, body.to_string().into_bytes())
}

/// A reply of JSON bytes as they are (a stored response, replayed byte for byte).
pub fn bytes(status: StatusCode, body: Vec<u8>) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// An error reply: `{"error": why}`.
pub fn error(status: StatusCode, why: impl std::fmt::Display) -> Response {
    json(status, &serde_json::json!({ "error": why.to_string() }))
}
