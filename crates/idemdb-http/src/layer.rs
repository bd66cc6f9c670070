//! The tower layer: built once per set of routes, after checking the config against the
//! store's limits.

use std::sync::Arc;

use tower_layer::Layer;

use crate::config::{IdempotencyConfig, Shared};
use crate::marker::Marker;
use crate::service::Idempotency;
use idemdb_core::InputError;
use idemdb_core::Store;

/// A tower [`Layer`] that makes a route idempotent under the `Idempotency-Key` header: the
/// handler runs once per key and every retry gets its first response back.
///
/// See the module documentation for the full behaviour. The store is the embedded
/// `idemdb::IdemDb`, or any other [`Store`] (e.g. `idemdb_postgres::PgStore`, for
/// instances that share one database).
pub struct IdempotencyLayer<St> {
    shared: Arc<Shared<St>>,
}

impl<St> Clone for IdempotencyLayer<St> {
    fn clone(&self) -> Self {
        IdempotencyLayer {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<St: Store> IdempotencyLayer<St> {
    /// The layer with `config` (from [`IdempotencyConfig::new`] or
    /// [`IdempotencyConfig::global_keys`]) over `db`.
    ///
    /// Refused with the [`InputError`] when a response or key the layer accepts could
    /// not be stored, so that no handler's answer is ever left unstored for a limit:
    /// `max_stored_response` above the store's
    /// [`Limits::max_response_len`](idemdb_core::Limits::max_response_len), `max_key_len` above its
    /// [`Limits::max_key_len`](idemdb_core::Limits::max_key_len), a store limit too small for the
    /// layer's own marker of a too-large response, or a zero `lease`.
    pub fn new(db: Arc<St>, config: IdempotencyConfig) -> Result<Self, InputError> {
        check_fits(&*db, &config)?;
        Ok(IdempotencyLayer {
            shared: Arc::new(Shared { db, config }),
        })
    }
}

fn check_fits<St: Store>(db: &St, config: &IdempotencyConfig) -> Result<(), InputError> {
    let limits = db.limits();
    let marker = Marker::max_encoded_len(&config.problem_type_prefix);
    let checks = [
        (
            "max_stored_response",
            config.max_stored_response,
            limits.max_response_len,
        ),
        ("max_key_len", config.max_key_len, limits.max_key_len),
        ("too-large response marker", marker, limits.max_response_len),
    ];
    for (what, len, max) in checks {
        if len > max {
            return Err(InputError::TooLong { what, len, max });
        }
    }
    if config.lease.is_zero() {
        return Err(InputError::ZeroLease);
    }
    Ok(())
}

impl<S, St> Layer<S> for IdempotencyLayer<St> {
    type Service = Idempotency<S, St>;

    fn layer(&self, inner: S) -> Idempotency<S, St> {
        Idempotency::new(inner, Arc::clone(&self.shared))
    }
}
