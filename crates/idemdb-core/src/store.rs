//! What the HTTP layer, the typed layer and generic callers need of a store, so that they run
//! unchanged over the embedded engine (`idemdb::IdemDb`) or PostgreSQL
//! (`idemdb_postgres::PgStore`). Both stores decide with the same code ([`decide`]); they
//! differ in how they read and write atomically.
//!
//! [`decide`]: crate::decide::decide

use std::future::Future;
use std::time::Duration;

use crate::error::StoreError;
use crate::fingerprint::{Fingerprint, Payload};
use crate::limits::Limits;
use crate::outcome::ReserveOutcome;
use crate::record::Record;
use crate::retention::Retention;
use crate::scope::{Key, Scope};
use crate::token::Reservation;

/// An idempotency store: the two-step operations, async, with the semantics of
/// docs/semantics.md.
///
/// On `idemdb::IdemDb` each method is the inherent `_async` method of the same name (the
/// inherent sync methods keep their names: call these through the trait, e.g. in code generic
/// over `S: Store`). docs/semantics.md gives every state × operation → result.
pub trait Store: Send + Sync + 'static {
    /// What this store's calls fail with: `idemdb::Error` for the embedded engine, `PgError`
    /// for PostgreSQL. Generic code reads it through [`StoreError`].
    type Error: StoreError;

    /// The input limits: keys, scopes and responses longer than these are refused.
    fn limits(&self) -> &Limits;

    /// The retention settings (TTL per operation).
    fn retention(&self) -> &Retention;

    /// The fingerprint this store keeps for `payload`, keyed by its own secret.
    fn fingerprint(&self, payload: &[u8]) -> Fingerprint;

    /// Reserves the intent atomically: of concurrent duplicates exactly one acquires.
    fn reserve<'p>(
        &self,
        scope: &Scope,
        key: &Key,
        payload: impl Into<Payload<'p>>,
        lease: Duration,
    ) -> impl Future<Output = Result<ReserveOutcome, Self::Error>> + Send;

    /// Reserves, waiting out an IN_PROGRESS owner for up to `timeout`.
    fn reserve_or_wait<'p>(
        &self,
        scope: &Scope,
        key: &Key,
        payload: impl Into<Payload<'p>>,
        lease: Duration,
        timeout: Duration,
    ) -> impl Future<Output = Result<ReserveOutcome, Self::Error>> + Send;

    /// Finishes the reservation with success: the response is stored and replayed.
    fn complete(
        &self,
        reservation: &Reservation,
        response: impl Into<Vec<u8>>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Finishes the reservation with a deterministic failure: it is stored and replayed.
    fn fail(
        &self,
        reservation: &Reservation,
        response: impl Into<Vec<u8>>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Gives the key up so that a retry runs.
    fn release(
        &self,
        reservation: &Reservation,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Renews the lease for `lease` from now.
    fn extend(
        &self,
        reservation: &mut Reservation,
        lease: Duration,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// The live record of the key, if any.
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
    /// refusal that says why (`Refusal::Fenced`, `UnknownRecord`, `NotInProgress`, ... read
    /// through [`StoreError::refusal`]); a renewal that fails for the store being unreachable is
    /// tried again sooner. [`Heartbeat`](crate::Heartbeat) runs it on a thread of its own.
    fn renew_lease(
        &self,
        reservation: &Reservation,
        lease: Duration,
    ) -> impl Future<Output = Self::Error> + Send;
}

/// A store whose calls can also block the calling thread (the embedded engine, whose writer
/// needs no runtime): what [`Typed`](crate::Typed)'s sync methods run on.
pub trait BlockingStore: Store {
    /// [`Store::reserve`], blocking.
    fn reserve_blocking(
        &self,
        scope: &Scope,
        key: &Key,
        payload: Payload<'_>,
        lease: Duration,
    ) -> Result<ReserveOutcome, Self::Error>;

    /// [`Store::complete`], blocking.
    fn complete_blocking(
        &self,
        reservation: &Reservation,
        response: Vec<u8>,
    ) -> Result<(), Self::Error>;

    /// [`Store::fail`], blocking.
    fn fail_blocking(
        &self,
        reservation: &Reservation,
        response: Vec<u8>,
    ) -> Result<(), Self::Error>;
}
