//! The renewal loop of a lease (docs/semantics.md §4): `extend` every third of the lease,
//! sooner after a failure that may pass, until a renewal is refused. Below both forms that run
//! it: [`Store::renew_lease`](crate::Store::renew_lease) and [`Heartbeat`](crate::Heartbeat).
//! Each store's `renew_lease` runs [`renew`] with its own `extend` and timer.

use std::future::Future;
use std::time::Duration;

use crate::error::StoreError;
use crate::token::Reservation;

/// How often a lease of `lease` is renewed: three times per lease, so that two renewals may
/// fail (a connection lost, a slow commit) before it runs out.
pub fn every(lease: Duration) -> Duration {
    (lease / 3).max(Duration::from_millis(1))
}

/// Renews `reservation`'s lease every third of `lease` until a renewal is refused; returns
/// that refusal (the lease is lost: taken over, released, finished or expired). `extend`
/// renews (the reservation passed in and out), `sleep` waits.
pub async fn renew<E, X, XF, S, SF>(
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
    use std::task::{Context, Poll, Waker};
    use std::time::Duration;

    use super::*;
    use crate::error::Refusal;
    use crate::fencing::FencingToken;
    use crate::limits::Limits;
    use crate::scope::{Key, RecordKey, Scope};
    use crate::token::Grant;

    /// A store's error as the loop sees it: one that may pass, or a refusal.
    #[derive(Debug, Clone)]
    enum Failure {
        Unconfirmed,
        Refused(Refusal),
    }

    impl std::fmt::Display for Failure {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "{self:?}")
        }
    }

    impl std::error::Error for Failure {}

    impl StoreError for Failure {
        fn refusal(&self) -> Option<&Refusal> {
            match self {
                Failure::Refused(r) => Some(r),
                Failure::Unconfirmed => None,
            }
        }
        fn is_outcome_unknown(&self) -> bool {
            matches!(self, Failure::Unconfirmed)
        }
        fn is_transient(&self) -> bool {
            matches!(self, Failure::Unconfirmed)
        }
        fn codec(_: serde_json::Error) -> Self {
            Failure::Unconfirmed
        }
        fn internal(_: String) -> Self {
            Failure::Unconfirmed
        }
    }

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
        let key =
            RecordKey::encode(&Scope::new("op", "p"), &Key::new("k"), &Limits::default()).unwrap();
        Reservation::issue(Grant {
            database_id: 7,
            record_key: key,
            token: FencingToken::new(3).unwrap(),
            lease_expires_at: 0,
            attempt: 1,
            takeover: false,
            beyond_horizon: false,
        })
    }

    /// A renewal the store could not confirm (an unknown outcome, or for PostgreSQL a lost
    /// connection) is tried again a quarter-beat later; the first refusal ends the loop.
    #[test]
    fn a_transient_failure_is_retried_sooner_and_a_refusal_ends_renewal() {
        let lease = Duration::from_secs(3);
        let fenced = Failure::Refused(Refusal::Fenced {
            presented: FencingToken::new(3).unwrap(),
            current: FencingToken::new(4).unwrap(),
        });
        let answers = RefCell::new(vec![Ok(()), Err(Failure::Unconfirmed), Ok(()), Err(fenced)]);
        let slept = RefCell::new(Vec::new());
        let lost: Failure = run(renew(
            reservation(),
            lease,
            |r, _| ready((r, answers.borrow_mut().remove(0))),
            |d| {
                slept.borrow_mut().push(d);
                ready(())
            },
        ));
        assert!(
            matches!(lost, Failure::Refused(Refusal::Fenced { .. })),
            "{lost:?}"
        );
        let beat = every(lease);
        assert_eq!(*slept.borrow(), vec![beat, beat, beat / 4, beat]);
    }
}
