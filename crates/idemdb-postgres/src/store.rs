//! `PgStore`: the state its calls share (`Inner`), its compactor task, and the [`Store`] impl
//! that the HTTP layer, the typed layer and generic callers use.

use idemdb_core::error::Refusal;
use std::future::Future;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::task::JoinHandle;

use crate::error::PgError;
use crate::errors::{self, database};
use crate::partitions::{Partitions, PgCompaction};
use crate::rows::Found;
use crate::server_time::ServerTime;
use crate::stats::{self, Owned, PgStats};
use crate::wait::Waits;
use idemdb_core::Limits;
use idemdb_core::Record;
use idemdb_core::Store;
use idemdb_core::clock::Clock;
use idemdb_core::fingerprint::{Fingerprint, Fingerprinter, Payload};
use idemdb_core::outcome::ReserveOutcome;
use idemdb_core::retention::Retention;
use idemdb_core::retention::Rules;
use idemdb_core::scope::{Key, Scope};
use idemdb_core::token::Reservation;

/// The idempotency store over PostgreSQL: many instances of a service share one database
/// and get the embedded engine's semantics (docs/semantics.md; the rows that differ say so).
///
/// Async: every call awaits its statements on the tokio runtime it was connected on. Every
/// outcome returned is committed. A connection lost where a commit may have happened answers
/// [`PgError::OutcomeUnknown`]; a serialization failure or deadlock is retried inside, up to 8
/// times. Dropping the store stops its listener and compactor.
pub struct PgStore {
    pub(super) inner: Arc<Inner>,
    pub(super) tasks: Vec<JoinHandle<()>>,
}

impl Drop for PgStore {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

pub(crate) struct Inner {
    /// The runtime connected on: background work (lease renewals) runs there.
    pub(super) runtime: tokio::runtime::Handle,
    pub(super) pool: deadpool_postgres::Pool,
    pub(super) database_id: u64,
    pub(super) fingerprinter: Fingerprinter,
    pub(super) limits: Limits,
    pub(super) retention: Retention,
    pub(super) rules: Rules,
    /// This instance's clock: compared with the server's, never used to judge.
    pub(super) clock: Arc<dyn Clock>,
    pub(super) server: ServerTime,
    pub(super) partitions: Partitions,
    pub(super) waits: Arc<Waits>,
    pub(super) wait_poll: Duration,
    pub(super) counters: stats::Counters,
    /// Concurrent reserves and finishes gathered into batches (batch.rs).
    pub(super) batcher: crate::batch::Batcher,
    /// The outbox's wake-up, commit times and counters (outbox_local.rs).
    pub(super) outbox: crate::outbox_local::OutboxLocal,
    /// Itself, for the drain tasks it starts.
    pub(super) this: Weak<Inner>,
}

impl PgStore {
    /// Drops every time partition whose records have all expired, and makes the partitions
    /// the next writes will need. The background compactor does this every
    /// `compact_interval`.
    pub async fn compact_now(&self) -> Result<PgCompaction, PgError> {
        self.inner.compact().await
    }

    /// What this instance's callers were told since connect, its pool now, and how far its
    /// clock is from the server's.
    pub fn stats(&self) -> PgStats {
        let mut stats = self.inner.counters.snapshot();
        stats.clock_skew_ms = self.inner.server.skew_ms();
        stats.outbox = self.inner.outbox.counted();
        stats
    }

    /// The connection pool, for the service's own statements outside idemdb's transactions.
    pub fn pool(&self) -> &deadpool_postgres::Pool {
        &self.inner.pool
    }
}

impl Inner {
    pub(super) async fn compact(&self) -> Result<PgCompaction, PgError> {
        let mut report = PgCompaction::default();
        let client = self.pool.get().await.map_err(errors::pool)?;
        let now = self.partitions.drop_expired(&client, &mut report).await?;
        self.server.saw(now, self.clock.now_ms());
        // The partitions the next writes go to: a finished record's, and an owner's lease
        // beyond it, for each TTL.
        let mut ttls: Vec<u64> = self.rules.ttls().collect();
        ttls.sort_unstable();
        ttls.dedup();
        for ttl in ttls {
            let from = now.saturating_add(ttl);
            let to = from.saturating_add(self.rules.width_ms.saturating_mul(2));
            report.partitions_created += self
                .partitions
                .ensure_range(&client, from, to)
                .await
                .map_err(database)?;
        }
        Ok(report)
    }

    /// A statement read the store's time: noted for estimates and the skew.
    pub(super) fn seen(&self, found: Found) -> Found {
        self.server.saw(found.now_ms, self.clock.now_ms());
        found
    }

    /// The server's time now, estimated (for partitions made ahead of a write only).
    pub(super) fn server_time(&self) -> u64 {
        self.server.estimate()
    }

    /// Makes the partition a write found missing (`at`: the partition key the server named;
    /// without it, every partition is looked at again by the next writes).
    pub(super) async fn remake_partition(&self, at: Option<u64>) -> Result<(), PgError> {
        let Some(at) = at else {
            self.partitions.forget_all();
            return Ok(());
        };
        let client = self.pool.get().await.map_err(errors::pool)?;
        self.partitions
            .remake(&client, at)
            .await
            .map_err(database)?;
        Ok(())
    }
}

/// The most a record's key parts and response may add up to: a statement's parameters travel
/// in one protocol message, and the server refuses messages of 1 GB and more.
const MAX_RECORD_BYTES: usize = 512 << 20;

/// Refuses limits a record could exceed: every record the limits accept must be storable.
pub(super) fn record_fits(limits: &Limits) -> Result<(), PgError> {
    let len = [
        limits.max_operation_len,
        limits.max_principal_len,
        limits.max_key_len,
        limits.max_response_len,
    ]
    .iter()
    .fold(0usize, |sum, l| sum.saturating_add(*l));
    if len > MAX_RECORD_BYTES {
        return Err(PgError::Refused(Refusal::InvalidInput(
            idemdb_core::error::InputError::TooLong {
                what: "the limits of a record over PostgreSQL (operation, principal, key and response together)",
                len,
                max: MAX_RECORD_BYTES,
            },
        )));
    }
    Ok(())
}

/// A task aborted when its handle is dropped.
struct AbortOnDrop<T>(JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

pub(super) async fn compactor(inner: Weak<Inner>, every: Duration) {
    loop {
        match inner.upgrade() {
            // A failure is retried at the next interval; reads ignore expired rows anyway.
            // The pool gauges are set each tick too, so that an idle store's gauges catch up.
            Some(inner) => {
                drop(inner.compact().await);
                inner.counters.pool_seen();
            }
            None => return,
        }
        tokio::time::sleep(every).await;
    }
}

impl PgStore {
    /// `call`, counted as an owner's call that does `done`.
    pub(super) async fn counted(
        &self,
        call: impl Future<Output = Result<(), PgError>> + Send,
        done: Owned,
    ) -> Result<(), PgError> {
        let result = call.await;
        self.inner.counters.owned(result.as_ref().map(|_| ()), done);
        result
    }
}

impl Store for PgStore {
    type Error = PgError;

    fn limits(&self) -> &Limits {
        &self.inner.limits
    }

    fn retention(&self) -> &Retention {
        &self.inner.retention
    }

    fn fingerprint(&self, payload: &[u8]) -> Fingerprint {
        self.inner.fingerprinter.fingerprint(payload)
    }

    fn reserve<'p>(
        &self,
        scope: &Scope,
        key: &Key,
        payload: impl Into<Payload<'p>>,
        lease: Duration,
    ) -> impl Future<Output = Result<ReserveOutcome, PgError>> + Send {
        let reserved = self.inner.reserve(scope, key, payload.into(), lease);
        async move {
            let result = reserved.await;
            self.inner.counters.reserved(&result);
            result
        }
    }

    fn reserve_or_wait<'p>(
        &self,
        scope: &Scope,
        key: &Key,
        payload: impl Into<Payload<'p>>,
        lease: Duration,
        timeout: Duration,
    ) -> impl Future<Output = Result<ReserveOutcome, PgError>> + Send {
        let reserved = self
            .inner
            .reserve_or_wait(scope, key, payload.into(), lease, timeout);
        async move {
            let result = reserved.await;
            self.inner.counters.reserved(&result);
            result
        }
    }

    fn complete(
        &self,
        reservation: &Reservation,
        response: impl Into<Vec<u8>>,
    ) -> impl Future<Output = Result<(), PgError>> + Send {
        let state = idemdb_core::RecordState::Completed;
        self.counted(
            self.inner.finish(reservation, state, response.into()),
            Owned::Finished,
        )
    }

    fn fail(
        &self,
        reservation: &Reservation,
        response: impl Into<Vec<u8>>,
    ) -> impl Future<Output = Result<(), PgError>> + Send {
        let state = idemdb_core::RecordState::Failed;
        self.counted(
            self.inner.finish(reservation, state, response.into()),
            Owned::Finished,
        )
    }

    fn release(
        &self,
        reservation: &Reservation,
    ) -> impl Future<Output = Result<(), PgError>> + Send {
        self.counted(self.inner.release(reservation), Owned::Released)
    }

    fn extend(
        &self,
        reservation: &mut Reservation,
        lease: Duration,
    ) -> impl Future<Output = Result<(), PgError>> + Send {
        self.counted(self.inner.extend(reservation, lease), Owned::Extended)
    }

    fn get(
        &self,
        scope: &Scope,
        key: &Key,
    ) -> impl Future<Output = Result<Option<Record>, PgError>> + Send {
        self.inner.get(scope, key)
    }

    fn renew_lease(
        &self,
        reservation: &Reservation,
        lease: Duration,
    ) -> impl Future<Output = PgError> + Send {
        let inner = Arc::clone(&self.inner);
        let reservation = reservation.clone();
        // On the store's runtime, so that the future may be polled by any executor (a
        // Heartbeat's thread); stopped when the future is dropped.
        let task = AbortOnDrop(self.inner.runtime.spawn(async move {
            let extend = |mut r: Reservation, lease| {
                let inner = Arc::clone(&inner);
                async move {
                    let result = inner.extend(&mut r, lease).await;
                    (r, result)
                }
            };
            idemdb_core::renewal::renew(reservation, lease, extend, tokio::time::sleep).await
        }));
        async move {
            let mut task = task;
            match (&mut task.0).await {
                Ok(lost) => lost,
                Err(e) => PgError::Internal(format!("the lease renewal task ended: {e}")),
            }
        }
    }

    fn release_detached(&self, reservation: Reservation) -> Result<(), PgError> {
        let handle = tokio::runtime::Handle::try_current()
            .map_err(|_| PgError::Internal("release_detached outside a tokio runtime".into()))?;
        let inner = Arc::clone(&self.inner);
        handle.spawn(async move {
            if let Err(e) = inner.release(&reservation).await {
                crate::store::warn_detached_release(&e);
            }
        });
        Ok(())
    }
}

/// A release from a `Drop` (a dropped request) failed: the key waits for its lease.
pub(crate) fn warn_detached_release(error: &dyn std::fmt::Display) {
    #[cfg(feature = "tracing")]
    tracing::warn!(target: "idemdb::postgres", %error, "key not released after a dropped request");
    #[cfg(not(feature = "tracing"))]
    let _ = error;
}
