//! What the HTTP layer, the typed layer and generic callers need of a store, so that they run
//! unchanged over the embedded engine ([`IdemDb`]) or PostgreSQL (`PgStore`, feature
//! `postgres`). Both stores decide with the same code (decide.rs); they differ in how they
//! read and write atomically.

use std::future::Future;
use std::time::{Duration, Instant};

use crate::config::Limits;
use crate::db::IdemDb;
use crate::error::{Error, StoreError};
use crate::fingerprint::{Fingerprint, Payload};
use crate::outcome::ReserveOutcome;
use crate::record::Record;
use crate::retention::Retention;
use crate::scope::{Key, Scope};
use crate::timer::Sleep;
use crate::token::Reservation;

/// An idempotency store: the two-step operations, async, with the semantics of
/// docs/semantics.md.
///
/// On [`IdemDb`] each method is the inherent `_async` method of the same name (the inherent
/// sync methods keep their names: call these through the trait, e.g. in code generic over
/// `S: Store`).
pub trait Store: Send + Sync + 'static {
    /// What this store's calls fail with: [`Error`](crate::Error) for the embedded engine,
    /// `PgError` for PostgreSQL. Generic code reads it through [`StoreError`].
    type Error: StoreError;

    /// The input limits: keys, scopes and responses longer than these are refused.
    fn limits(&self) -> &Limits;

    /// The retention settings (TTL per operation).
    fn retention(&self) -> &Retention;

    /// The fingerprint this store keeps for `payload`, keyed by its own secret.
    fn fingerprint(&self, payload: &[u8]) -> Fingerprint;

    /// Reserves the intent atomically; see [`IdemDb::reserve`].
    fn reserve<'p>(
        &self,
        scope: &Scope,
        key: &Key,
        payload: impl Into<Payload<'p>>,
        lease: Duration,
    ) -> impl Future<Output = Result<ReserveOutcome, Self::Error>> + Send;

    /// Reserves, waiting out an IN_PROGRESS owner for up to `timeout`; see
    /// [`IdemDb::reserve_or_wait`].
    fn reserve_or_wait<'p>(
        &self,
        scope: &Scope,
        key: &Key,
        payload: impl Into<Payload<'p>>,
        lease: Duration,
        timeout: Duration,
    ) -> impl Future<Output = Result<ReserveOutcome, Self::Error>> + Send;

    /// Finishes the reservation with success; see [`IdemDb::complete`].
    fn complete(
        &self,
        reservation: &Reservation,
        response: impl Into<Vec<u8>>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Finishes the reservation with a deterministic failure; see [`IdemDb::fail`].
    fn fail(
        &self,
        reservation: &Reservation,
        response: impl Into<Vec<u8>>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Gives the key up so that a retry runs; see [`IdemDb::release`].
    fn release(
        &self,
        reservation: &Reservation,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Renews the lease for `lease` from now; see [`IdemDb::extend`].
    fn extend(
        &self,
        reservation: &mut Reservation,
        lease: Duration,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// The live record of the key, if any; see [`IdemDb::get`].
    fn get(
        &self,
        scope: &Scope,
        key: &Key,
    ) -> impl Future<Output = Result<Option<Record>, Self::Error>> + Send;

    /// Releases the reservation from a place that cannot await (a `Drop`): now, or on a
    /// task of its own. Failures are the caller's to log; the lease bounds what is lost.
    fn release_detached(&self, reservation: Reservation) -> Result<(), Self::Error>;

    /// Renews `reservation`'s lease of `lease` every third of it ([`extend`](Self::extend))
    /// for as long as the returned future is polled: run it beside work that may outlast the
    /// lease (e.g. in `tokio::select!`), so that a duplicate takes over only from an owner
    /// that stopped, not from a slow one. It ends only when the lease is lost, with the
    /// refusal that says why ([`Error::Fenced`], [`Error::UnknownRecord`],
    /// [`Error::NotInProgress`], ...); a renewal that fails for the store being unreachable is
    /// tried again sooner. [`Heartbeat`](crate::Heartbeat) runs it on a thread of its own.
    fn renew_lease(
        &self,
        reservation: &Reservation,
        lease: Duration,
    ) -> impl Future<Output = Self::Error> + Send;
}

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
            crate::renewal::renew(reservation, lease, extend, sleep).await
        }
    }
}
