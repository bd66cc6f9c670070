//! A typed convenience layer: responses as any `serde` type, stored as JSON bytes.

use std::marker::PhantomData;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::StoreError;
use crate::fingerprint::Payload;
use crate::outcome::ReserveOutcome;
use crate::scope::{Key, Scope};
use crate::store::{BlockingStore, Store};
use crate::token::Reservation;

/// [`ReserveOutcome`] with decoded responses: `T` for success, `F` for a stored failure.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum TypedOutcome<T, F> {
    /// The caller owns the intent; see [`ReserveOutcome::Acquired`].
    Acquired(Reservation),
    /// Same key, other payload; see [`ReserveOutcome::Mismatch`].
    Mismatch,
    /// The first success, decoded.
    Completed(T),
    /// The stored deterministic failure, decoded.
    Failed(F),
    /// Another caller holds a live lease; see [`ReserveOutcome::InProgress`].
    InProgress {
        /// Time left on the owner's lease.
        retry_after: Duration,
    },
    /// A recognised key beyond the retention, refused by policy; see
    /// [`ReserveOutcome::BeyondHorizon`].
    BeyondHorizon,
}

/// A view of a store whose responses are `T` (success) and `F` (failure), stored as JSON.
///
/// Over a [`BlockingStore`] (the embedded engine: `IdemDb::typed`) it has sync methods and
/// their `_async` twins; over any other [`Store`] (such as `PgStore`, from [`Typed::over`])
/// the `_async` ones.
///
/// An example over the embedded engine is at `idemdb::IdemDb::typed`.
pub struct Typed<'db, T, F, S> {
    db: &'db S,
    types: PhantomData<fn() -> (T, F)>,
}

impl<'db, T, F, S: Store> Typed<'db, T, F, S>
where
    T: Serialize + DeserializeOwned,
    F: Serialize + DeserializeOwned,
{
    /// A typed view of `store`.
    pub fn over(store: &'db S) -> Self {
        Typed {
            db: store,
            types: PhantomData,
        }
    }

    /// [`reserve`](Store::reserve), with the stored response decoded.
    pub async fn reserve_async<'p>(
        &self,
        scope: &Scope,
        key: &Key,
        payload: impl Into<Payload<'p>>,
        lease: Duration,
    ) -> Result<TypedOutcome<T, F>, S::Error> {
        typed(Store::reserve(self.db, scope, key, payload.into(), lease).await?)
    }

    /// [`complete`](Store::complete) with `value`, encoded.
    pub async fn complete_async(
        &self,
        reservation: &Reservation,
        value: &T,
    ) -> Result<(), S::Error> {
        Store::complete(self.db, reservation, encode::<_, S::Error>(value)?).await
    }

    /// [`fail`](Store::fail) with `value`, encoded.
    pub async fn fail_async(&self, reservation: &Reservation, value: &F) -> Result<(), S::Error> {
        Store::fail(self.db, reservation, encode::<_, S::Error>(value)?).await
    }
}

impl<T, F, S: BlockingStore> Typed<'_, T, F, S>
where
    T: Serialize + DeserializeOwned,
    F: Serialize + DeserializeOwned,
{
    /// [`BlockingStore::reserve_blocking`], with stored responses decoded.
    pub fn reserve<'p>(
        &self,
        scope: &Scope,
        key: &Key,
        payload: impl Into<Payload<'p>>,
        lease: Duration,
    ) -> Result<TypedOutcome<T, F>, S::Error> {
        typed(
            self.db
                .reserve_blocking(scope, key, payload.into(), lease)?,
        )
    }

    /// [`BlockingStore::complete_blocking`] with `value` encoded as JSON.
    pub fn complete(&self, reservation: &Reservation, value: &T) -> Result<(), S::Error> {
        self.db
            .complete_blocking(reservation, encode::<_, S::Error>(value)?)
    }

    /// [`BlockingStore::fail_blocking`] with `value` encoded as JSON.
    pub fn fail(&self, reservation: &Reservation, value: &F) -> Result<(), S::Error> {
        self.db
            .fail_blocking(reservation, encode::<_, S::Error>(value)?)
    }
}

/// A reservation's outcome with the stored response decoded.
fn typed<T: DeserializeOwned, F: DeserializeOwned, E: StoreError>(
    outcome: ReserveOutcome,
) -> Result<TypedOutcome<T, F>, E> {
    Ok(match outcome {
        ReserveOutcome::Acquired(r) => TypedOutcome::Acquired(r),
        ReserveOutcome::Mismatch => TypedOutcome::Mismatch,
        ReserveOutcome::Completed(b) => TypedOutcome::Completed(decode(&b)?),
        ReserveOutcome::Failed(b) => TypedOutcome::Failed(decode(&b)?),
        ReserveOutcome::InProgress { retry_after } => TypedOutcome::InProgress { retry_after },
        ReserveOutcome::BeyondHorizon => TypedOutcome::BeyondHorizon,
    })
}

fn encode<V: Serialize, E: StoreError>(value: &V) -> Result<Vec<u8>, E> {
    serde_json::to_vec(value).map_err(E::codec)
}

fn decode<V: DeserializeOwned, E: StoreError>(bytes: &[u8]) -> Result<V, E> {
    serde_json::from_slice(bytes).map_err(E::codec)
}
