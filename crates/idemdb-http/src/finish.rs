//! The owner's side: run the handler, then settle its key. A key is never left IN_PROGRESS
//! for its lease to end: it is stored (the response, or a marker in its place) or released.

use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum_core::body::Body;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use tower_service::Service;

use crate::config::Finality;
use crate::config::Shared;
use crate::marker::Marker;
use crate::problem::Problem;
use crate::stored::StoredResponse;
use idemdb_core::Reservation;
use idemdb_core::Store;
use idemdb_core::{Refusal, StoreError};

/// Runs the handler as the key's owner; stores its response if final, else releases the key.
pub(crate) async fn run_handler<S, St: Store>(
    shared: &Shared<St>,
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
    // The lease is renewed while the handler runs: only a stopped instance is taken over.
    let renewed = reservation.clone();
    let renewal = config
        .renew_lease
        .then(|| Box::pin(db.renew_lease(&renewed, config.lease)));
    // Released if the request future is dropped (the client went away) or the handler panics.
    let mut guard = ReleaseOnDrop {
        db: Arc::clone(db),
        reservation: Some(reservation),
    };
    let handler = Beside {
        main: CatchUnwind(Box::pin(inner.call(req))),
        renewal,
    };
    let response = match handler.await {
        Ok(Ok(response)) => response,
        Ok(Err(e)) => {
            if let Some(r) = guard.reservation.take() {
                release_now(&**db, &r, "the handler failed").await;
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
            release_now(&**db, &r, "the response is not final").await;
        }
        return Ok(response);
    }
    let (parts, body) = response.into_parts();
    let body = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        // The handler's body failed midway: nothing complete to store or send, like a 5xx.
        Err(e) => {
            if let Some(r) = guard.reservation.take() {
                release_now(&**db, &r, "the handler's response body failed").await;
            }
            warn(&format!("the handler's response body failed: {e}"));
            let detail = "the response failed before it was complete; retry";
            return Ok(Problem::HandlerFailed.response(&config.problem_type_prefix, detail));
        }
    };
    // The guard stays armed while settling: a request dropped between a failed store and
    // the marker still releases its key.
    if let Some(reservation) = &guard.reservation {
        let stored = StoredResponse::new(
            parts.status,
            &parts.headers,
            &config.stored_headers,
            body.to_vec(),
        );
        let encoded = stored.encode();
        settle(shared, reservation, finality, parts.status, encoded).await;
    }
    guard.reservation = None;
    Ok(Response::from_parts(parts, Body::from(body)))
}

/// Stores the final response, or a marker in its place when it is too large or could not be
/// stored; releases the key only if neither was stored. The handler ran: the response goes
/// to this caller whatever happens here.
async fn settle<St: Store>(
    shared: &Shared<St>,
    reservation: &Reservation,
    finality: Finality,
    status: StatusCode,
    encoded: Vec<u8>,
) {
    let db = &shared.db;
    let marker = if encoded.len() > shared.config.max_stored_response {
        Marker::TooLarge
    } else {
        match save(&**db, reservation, finality, encoded).await {
            Ok(()) => return,
            Err(e) => {
                warn(&format!("response not stored: {e}"));
                Marker::NotStored
            }
        }
    };
    let marker = marker.stored(&shared.config.problem_type_prefix, status);
    if let Err(e) = save(&**db, reservation, finality, marker.encode()).await {
        warn(&format!("marker not stored: {e}"));
        release_now(&**db, reservation, "nothing could be stored").await;
    }
}

async fn save<St: Store>(
    db: &St,
    reservation: &Reservation,
    finality: Finality,
    encoded: Vec<u8>,
) -> Result<(), St::Error> {
    match finality {
        Finality::Failed => db.fail(reservation, encoded).await,
        _ => db.complete(reservation, encoded).await,
    }
}

async fn release_now<St: Store>(db: &St, reservation: &Reservation, why: &str) {
    if let Err(e) = db.release(reservation).await {
        warn(&format!("key not released ({why}): {e}"));
    }
}

pub(crate) fn warn(message: &str) {
    #[cfg(feature = "tracing")]
    tracing::warn!(target: "idemdb::http", "{message}");
    #[cfg(not(feature = "tracing"))]
    let _ = message;
}

/// Releases the key unless the response was stored (or released) first.
struct ReleaseOnDrop<St: Store> {
    db: Arc<St>,
    reservation: Option<Reservation>,
}

impl<St: Store> Drop for ReleaseOnDrop<St> {
    fn drop(&mut self) {
        if let Some(reservation) = self.reservation.take() {
            // The next retry must not wait for the lease to run out.
            match self.db.release_detached(reservation) {
                // Dropped after its answer was stored: nothing to release.
                Ok(()) => {}
                Err(e) if matches!(e.refusal(), Some(Refusal::NotInProgress { .. })) => {}
                Err(e) => warn(&format!("key not released after a dropped request: {e}")),
            }
        }
    }
}

/// Polls `main` to its end, and `renewal` beside it until that ends (the lease was lost).
struct Beside<M, R> {
    main: M,
    renewal: Option<Pin<Box<R>>>,
}

impl<M: Future + Unpin, R: Future<Output: std::fmt::Display>> Future for Beside<M, R> {
    type Output = M::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<M::Output> {
        if let Some(renewal) = self.renewal.as_mut()
            && let Poll::Ready(lost) = renewal.as_mut().poll(cx)
        {
            warn(&format!(
                "the handler's lease was lost while it ran: {lost}"
            ));
            self.renewal = None;
        }
        Pin::new(&mut self.main).poll(cx)
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
