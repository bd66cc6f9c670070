//! The renewal loop of a lease (docs/semantics.md §4): `extend` every third of the lease,
//! sooner after a failure that may pass, until a renewal is refused. Below both forms that run
//! it: [`Store::renew_lease`](crate::Store::renew_lease) and [`Heartbeat`](crate::Heartbeat).

use std::future::Future;
use std::time::Duration;

use crate::error::StoreError;
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

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::future::{Future, ready};
    use std::pin::pin;
    use std::sync::Arc;
    use std::task::{Context, Poll, Waker};
    use std::time::Duration;

    use super::*;
    use crate::error::Error;
    use crate::fencing::FencingToken;
    use crate::scope::{Key, RecordKey, Scope};

    fn run<F: Future>(future: F) -> F::Output {
        let mut cx = Context::from_waker(Waker::noop());
        let mut future = pin!(future);
        loop {
            if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
                return out;
            }
        }
    }

    fn reservation() -> Reservation {
        let key = RecordKey::encode(
            &Scope::new("op", "p"),
            &Key::new("k"),
            &crate::config::Limits::default(),
        )
        .unwrap();
        Reservation {
            database_id: 7,
            record_key: key,
            token: FencingToken::new(3).unwrap(),
            lease_expires_at: 0,
            attempt: 1,
            takeover: false,
            beyond_horizon: false,
        }
    }

    /// A renewal the store could not confirm (an unknown outcome, or for PostgreSQL a lost
    /// connection) is tried again a quarter-beat later; the first refusal ends the loop.
    #[test]
    fn a_transient_failure_is_retried_sooner_and_a_refusal_ends_renewal() {
        let lease = Duration::from_secs(3);
        let fenced = Error::Fenced {
            presented: FencingToken::new(3).unwrap(),
            current: FencingToken::new(4).unwrap(),
        };
        let answers = RefCell::new(vec![
            Ok(()),
            Err(Error::OutcomeUnknown(Arc::new(std::io::Error::other(
                "cut",
            )))),
            Ok(()),
            Err(fenced),
        ]);
        let slept = RefCell::new(Vec::new());
        let lost: Error = run(renew(
            reservation(),
            lease,
            |r, _| ready((r, answers.borrow_mut().remove(0))),
            |d| {
                slept.borrow_mut().push(d);
                ready(())
            },
        ));
        assert!(matches!(lost, Error::Fenced { .. }), "{lost:?}");
        let beat = every(lease);
        assert_eq!(*slept.borrow(), vec![beat, beat, beat / 4, beat]);
    }
}
