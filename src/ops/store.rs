//! The embedded engine as a [`Store`] (the `_async` methods) and a [`BlockingStore`] (the
//! sync ones), for the HTTP layer, [`Typed`](crate::Typed) and code generic over stores.

use std::future::Future;
use std::time::{Duration, Instant};

use idemdb_core::{BlockingStore, Store};

use crate::config::Limits;
use crate::db::IdemDb;
use crate::error::Error;
use crate::record::Record;
use crate::timer::Sleep;
use idemdb_core::fingerprint::{Fingerprint, Payload};
use idemdb_core::outcome::ReserveOutcome;
use idemdb_core::retention::Retention;
use idemdb_core::scope::{Key, Scope};
use idemdb_core::token::Reservation;

impl Store for IdemDb {
    type Error = Error;

    fn limits(&self) -> &Limits {
        IdemDb::limits(self)
    }

    fn retention(&self) -> &Retention {
        IdemDb::retention(self)
    }

    fn fingerprint(&self, payload: &[u8]) -> Fingerprint {
        IdemDb::fingerprint(self, payload)
    }

    fn reserve<'p>(
        &self,
        scope: &Scope,
        key: &Key,
        payload: impl Into<Payload<'p>>,
        lease: Duration,
    ) -> impl Future<Output = Result<ReserveOutcome, Error>> + Send {
        self.reserve_async(scope, key, payload.into(), lease)
    }

    fn reserve_or_wait<'p>(
        &self,
        scope: &Scope,
        key: &Key,
        payload: impl Into<Payload<'p>>,
        lease: Duration,
        timeout: Duration,
    ) -> impl Future<Output = Result<ReserveOutcome, Error>> + Send {
        self.reserve_or_wait_async(scope, key, payload.into(), lease, timeout)
    }

    fn complete(
        &self,
        reservation: &Reservation,
        response: impl Into<Vec<u8>>,
    ) -> impl Future<Output = Result<(), Error>> + Send {
        self.complete_async(reservation, response.into())
    }

    fn fail(
        &self,
        reservation: &Reservation,
        response: impl Into<Vec<u8>>,
    ) -> impl Future<Output = Result<(), Error>> + Send {
        self.fail_async(reservation, response.into())
    }

    fn release(&self, reservation: &Reservation) -> impl Future<Output = Result<(), Error>> + Send {
        self.release_async(reservation)
    }

    fn extend(
        &self,
        reservation: &mut Reservation,
        lease: Duration,
    ) -> impl Future<Output = Result<(), Error>> + Send {
        self.extend_async(reservation, lease)
    }

    fn get(
        &self,
        scope: &Scope,
        key: &Key,
    ) -> impl Future<Output = Result<Option<Record>, Error>> + Send {
        // Reads a snapshot: it waits only for a commit of this key already in flight.
        std::future::ready(IdemDb::get(self, scope, key))
    }

    fn release_detached(&self, reservation: Reservation) -> Result<(), Error> {
        // Blocking, but only on this rare path (a dropped request or a panic).
        IdemDb::release(self, &reservation)
    }

    fn renew_lease(
        &self,
        reservation: &Reservation,
        lease: Duration,
    ) -> impl Future<Output = Error> + Send {
        let reservation = reservation.clone();
        async move {
            // Woken by the engine's timer thread: no runtime needed.
            let timer = match self.timer() {
                Ok(timer) => timer,
                Err(e) => return e,
            };
            let extend = |mut r: Reservation, lease| async move {
                let result = self.extend_async(&mut r, lease).await;
                (r, result)
            };
            let sleep = |d| Sleep::until(timer, Instant::now() + d);
            idemdb_core::renewal::renew(reservation, lease, extend, sleep).await
        }
    }
}

impl BlockingStore for IdemDb {
    fn reserve_blocking(
        &self,
        scope: &Scope,
        key: &Key,
        payload: Payload<'_>,
        lease: Duration,
    ) -> Result<ReserveOutcome, Error> {
        IdemDb::reserve(self, scope, key, payload, lease)
    }

    fn complete_blocking(&self, reservation: &Reservation, response: Vec<u8>) -> Result<(), Error> {
        IdemDb::complete(self, reservation, response)
    }

    fn fail_blocking(&self, reservation: &Reservation, response: Vec<u8>) -> Result<(), Error> {
        IdemDb::fail(self, reservation, response)
    }
}
