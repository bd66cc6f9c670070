//! The renewal loop of a lease (docs/semantics.md §4): `extend` every third of the lease,
//! sooner after a failure that may pass, until a renewal is refused. Below both forms that run
//! it: [`Store::renew_lease`](crate::Store::renew_lease) and [`Heartbeat`](crate::Heartbeat).

use std::future::Future;
use std::time::Duration;

use crate::store::StoreError;
use crate::token::Reservation;

/// How often a lease of `lease` is renewed: three times per lease, so that two renewals may
/// fail (a connection lost, a slow commit) before it runs out.
pub(crate) fn every(lease: Duration) -> Duration {
    (lease / 3).max(Duration::from_millis(1))
}

/// Renews `reservation`'s lease every third of `lease` until a renewal is refused; returns
/// that refusal (the lease is lost: taken over, released, finished or expired). `extend`
/// renews (the reservation passed in and out), `sleep` waits.
pub(crate) async fn renew<E, X, XF, S, SF>(
    mut reservation: Reservation,
    lease: Duration,
    mut extend: X,
    sleep: S,
) -> E
where
    E: StoreError,
    X: FnMut(Reservation, Duration) -> XF,
    XF: Future<Output = (Reservation, Result<(), E>)>,
    S: Fn(Duration) -> SF,
    SF: Future<Output = ()>,
{
    let beat = every(lease);
    let mut wait = beat;
    loop {
        sleep(wait).await;
        let (renewed, result) = extend(reservation, lease).await;
        reservation = renewed;
        wait = match result {
            Ok(()) => beat,
            // Sooner: the lease still covers the next tries.
            // A failed renewal that may pass (`StoreError::is_transient`).
            Err(e) if e.is_transient() => beat / 4,
            Err(lost) => return lost,
        };
    }
}
