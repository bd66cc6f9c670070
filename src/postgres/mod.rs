//! The store over PostgreSQL (feature `postgres`): the same semantics as the embedded engine
//! (the same `decide` and `check_owner`, docs/semantics.md), for services whose instances
//! share one database.
//!
//! - reserve.rs: `reserve`, `reserve_or_wait`, `get`;
//! - owner.rs: `complete`, `fail`, `release`, `extend`;
//! - execute.rs: `execute`, `complete_with`, `fail_with`: the caller's writes in the
//!   transaction that writes the record; inbox.rs: `consume`, `consume_batch` (a poll in one
//!   transaction, a savepoint per message) and `run` (no record);
//! - schema.rs, rows.rs: the tables, versioned, and records as rows;
//! - sql.rs: the store's clock (the server's, read by each statement) and how a key is found;
//!   server_time.rs: what this instance last learnt of it;
//! - partitions.rs: time partitions and the compactor; wait.rs: LISTEN/NOTIFY;
//! - tls.rs: `sslmode` on rustls;
//! - errors.rs: refused, retried or outcome unknown, in the server's words.

mod errors;
mod execute;
mod inbox;
mod owner;
mod partitions;
mod reserve;
mod rows;
mod schema;
mod server_time;
mod sql;
mod stats;
mod tls;
mod wait;

use std::future::Future;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::task::JoinHandle;

pub use execute::{PgFuture, PgTx};
pub use inbox::pg_handler;
pub use partitions::PgCompaction;
pub use stats::PgStats;

use crate::clock::{Clock, SystemClock};
use crate::config::Limits;
use crate::error::Error;
use crate::fingerprint::{Fingerprint, Fingerprinter, Payload};
use crate::outcome::ReserveOutcome;
use crate::record::Record;
use crate::retention::Retention;
use crate::retention::settings::Rules;
use crate::scope::{Key, Scope};
use crate::store::Store;
use crate::token::Reservation;
use errors::database;
use partitions::Partitions;
use rows::Found;
use server_time::ServerTime;
use stats::Owned;
use wait::Waits;

/// Builds a [`PgStore`]: where the database is, and the settings shared with the embedded
/// engine (retention, limits).
///
/// ```no_run
/// # async fn run() -> Result<(), idemdb::Error> {
/// use idemdb::PgStore;
/// let builder = PgStore::builder("postgres://app@db.internal/shop")?.pool_size(32);
/// builder.migrate().await?; // once per deploy, or at every start: it is idempotent
/// let store = builder.connect().await?;
/// # Ok(()) }
/// ```
pub struct PgStoreBuilder {
    config: tokio_postgres::Config,
    tls: tls::Mode,
    tls_roots: Option<Vec<u8>>,
    pool_size: usize,
    retention: Retention,
    limits: Limits,
    clock: Arc<dyn Clock>,
    wait_poll: Duration,
    pool_wait: Duration,
}

impl PgStore {
    /// A builder for the database at `url` (a libpq connection string or URL). TLS is as
    /// its `sslmode` says, with libpq's meanings: `disable`, `prefer` (the default: TLS when
    /// the server offers it, unverified), `require` (TLS, unverified), `verify-ca` (the
    /// server's certificate chains to a trusted root) or `verify-full` (and names the host):
    /// use `verify-full` across any network you do not control. Trusted roots are the
    /// operating system's, or the PEM file of `sslrootcert=<path>`, or those given to
    /// [`tls_root_certificates`](PgStoreBuilder::tls_root_certificates).
    ///
    /// ```no_run
    /// # fn run() -> Result<(), idemdb::Error> {
    /// let ca = std::fs::read("/etc/ssl/db-ca.pem").unwrap();
    /// let builder = idemdb::PgStore::builder("postgres://app@db.internal/shop?sslmode=verify-full")?
    ///     .tls_root_certificates(ca);
    /// # Ok(()) }
    /// ```
    pub fn builder(url: &str) -> Result<PgStoreBuilder, Error> {
        let split = tls::split(url)?;
        let mut config: tokio_postgres::Config = split.rest.parse().map_err(database)?;
        config.ssl_mode(split.mode.driver());
        let tls_roots = match split.root_file.as_deref() {
            None | Some("system") => None,
            Some(path) => Some(std::fs::read(path).map_err(|e| {
                Error::Database(Arc::new(std::io::Error::new(
                    e.kind(),
                    format!("sslrootcert {path}: {e}"),
                )))
            })?),
        };
        Ok(PgStoreBuilder {
            config,
            tls: split.mode,
            tls_roots,
            pool_size: 16,
            // Every read of a key probes each partition's index (the partition key is not
            // the record key), so fewer, wider partitions than the embedded default.
            retention: Retention::default()
                .partition_width(PgStoreBuilder::DEFAULT_PARTITION_WIDTH),
            limits: Limits::default(),
            clock: Arc::new(SystemClock),
            wait_poll: Duration::from_secs(1),
            pool_wait: Duration::from_secs(30),
        })
    }
}

impl PgStoreBuilder {
    /// The partition width of a store built without [`retention`](Self::retention): a
    /// quarter of the default 24 h TTL, so that about six partitions hold the live records.
    pub const DEFAULT_PARTITION_WIDTH: Duration = Duration::from_secs(6 * 3600);

    /// The CA certificates (PEM) that `verify-ca` and `verify-full` trust, instead of the
    /// operating system's roots or the URL's `sslrootcert`.
    pub fn tls_root_certificates(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls_roots = Some(pem.into());
        self
    }

    fn tls(&self) -> Result<tokio_postgres_rustls::MakeRustlsConnect, Error> {
        tls::connector(self.tls, self.tls_roots.as_deref())
    }

    /// Connections in the pool (default 16). Each operation holds one for its statements;
    /// `execute` and `complete_with` hold one while their closure runs.
    pub fn pool_size(mut self, size: usize) -> Self {
        self.pool_size = size.max(1);
        self
    }

    /// How long a call waits for a pooled connection before it fails with
    /// [`Error::Database`] (default 30 s), so that an exhausted pool (or an unreachable
    /// server) answers instead of hanging.
    pub fn pool_wait_timeout(mut self, timeout: Duration) -> Self {
        self.pool_wait = timeout;
        self
    }

    /// Retention: TTL per operation, partition width, beyond-horizon policy and the
    /// compactor's interval (see docs/semantics.md for what differs from the embedded
    /// engine). Keep the partition width the same for a database. Every read of a key
    /// probes each live partition, so choose a width near a quarter of the longest TTL
    /// (the default without this call is
    /// [`DEFAULT_PARTITION_WIDTH`](Self::DEFAULT_PARTITION_WIDTH), 6 h).
    pub fn retention(mut self, retention: Retention) -> Self {
        self.retention = retention;
        self
    }

    /// Input limits (lengths of keys, scopes and responses).
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// This instance's clock (default: the system clock). The store judges no lease and no
    /// expiry by it, and writes no time from it: every time is the server's, read by the
    /// statement that acts on it, so instances whose clocks disagree (by minutes or days)
    /// still run each intent once. It is only compared with the server's, for
    /// [`PgStats::clock_skew_ms`].
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// How often a waiting duplicate looks again even without a notification (default 1 s):
    /// the fallback when a notification is lost (a listener reconnecting).
    pub fn wait_poll_interval(mut self, interval: Duration) -> Self {
        self.wait_poll = interval.max(Duration::from_millis(1));
        self
    }

    /// Creates idemdb's tables, or upgrades them, and returns the schema version now in
    /// place. Idempotent, and safe to run from several instances at once. Refuses a schema
    /// of a newer build with [`Error::UnsupportedFormat`].
    pub async fn migrate(&self) -> Result<u32, Error> {
        let (mut client, connection) = self.config.connect(self.tls()?).await.map_err(database)?;
        let driver = tokio::spawn(connection);
        let version = schema::migrate(&mut client).await;
        drop(client);
        let _ = driver.await;
        version.map(i32::unsigned_abs)
    }

    /// Connects: opens the pool, reads the database's identity and fingerprint secret, starts
    /// the listener for waiting duplicates and (unless the retention's `compact_interval` is
    /// `None`) the compactor, as tasks on the current tokio runtime. The schema must be
    /// migrated ([`migrate`](Self::migrate)).
    pub async fn connect(self) -> Result<PgStore, Error> {
        self.retention.validate()?;
        self.limits.validate()?;
        record_fits(&self.limits)?;
        let tls = self.tls()?;
        let manager = deadpool_postgres::Manager::from_config(
            self.config.clone(),
            tls.clone(),
            deadpool_postgres::ManagerConfig {
                recycling_method: deadpool_postgres::RecyclingMethod::Fast,
            },
        );
        let pool = deadpool_postgres::Pool::builder(manager)
            .max_size(self.pool_size)
            .wait_timeout(Some(self.pool_wait))
            .create_timeout(Some(self.pool_wait))
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .build()
            .map_err(|e| Error::Database(Arc::new(e)))?;
        let (meta, server_ms) = {
            let client = pool.get().await.map_err(errors::pool)?;
            let meta = schema::Meta::read(&client).await?;
            (meta, schema::server_now(&client).await?)
        };
        let rules = self.retention.rules();
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| Error::Internal("PgStore connected outside a tokio runtime".into()))?;
        let counters = stats::Counters::new(pool.clone());
        let inner = Arc::new(Inner {
            runtime,
            partitions: Partitions::new(rules.width_ms),
            pool,
            database_id: meta.database_id,
            fingerprinter: meta.fingerprinter,
            limits: self.limits,
            retention: self.retention,
            rules,
            server: ServerTime::new(server_ms, self.clock.now_ms()),
            clock: self.clock,
            waits: Arc::new(Waits::default()),
            wait_poll: self.wait_poll,
            counters,
        });
        let mut tasks = vec![tokio::spawn(wait::listen(
            self.config,
            tls,
            Arc::downgrade(&inner.waits),
        ))];
        if let Some(every) = inner.retention.compact_interval {
            tasks.push(tokio::spawn(compactor(Arc::downgrade(&inner), every)));
        }
        Ok(PgStore { inner, tasks })
    }
}

/// The idempotency store over PostgreSQL: many instances of a service share one database
/// and get the embedded engine's semantics (docs/semantics.md; the rows that differ say so).
///
/// Async: every call awaits its statements on the tokio runtime it was connected on. Every
/// outcome returned is committed. A connection lost where a commit may have happened answers
/// [`Error::OutcomeUnknown`]; a serialization failure or deadlock is retried inside, up to 8
/// times. Dropping the store stops its listener and compactor.
pub struct PgStore {
    inner: Arc<Inner>,
    tasks: Vec<JoinHandle<()>>,
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
    runtime: tokio::runtime::Handle,
    pool: deadpool_postgres::Pool,
    database_id: u64,
    fingerprinter: Fingerprinter,
    limits: Limits,
    retention: Retention,
    rules: Rules,
    /// This instance's clock: compared with the server's, never used to judge.
    clock: Arc<dyn Clock>,
    server: ServerTime,
    partitions: Partitions,
    waits: Arc<Waits>,
    wait_poll: Duration,
    counters: stats::Counters,
}

impl PgStore {
    /// Drops every time partition whose records have all expired, and makes the partitions
    /// the next writes will need. The background compactor does this every
    /// `compact_interval`.
    pub async fn compact_now(&self) -> Result<PgCompaction, Error> {
        self.inner.compact().await
    }

    /// What this instance's callers were told since connect, its pool now, and how far its
    /// clock is from the server's.
    pub fn stats(&self) -> PgStats {
        let mut stats = self.inner.counters.snapshot();
        stats.clock_skew_ms = self.inner.server.skew_ms();
        stats
    }

    /// The connection pool, for the service's own statements outside idemdb's transactions.
    pub fn pool(&self) -> &deadpool_postgres::Pool {
        &self.inner.pool
    }
}

impl Inner {
    async fn compact(&self) -> Result<PgCompaction, Error> {
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
    fn seen(&self, found: Found) -> Found {
        self.server.saw(found.now_ms, self.clock.now_ms());
        found
    }

    /// The server's time now, estimated (for partitions made ahead of a write only).
    fn server_time(&self) -> u64 {
        self.server.estimate()
    }

    /// Makes the partition a write found missing (`at`: the partition key the server named;
    /// without it, every partition is looked at again by the next writes).
    async fn remake_partition(&self, at: Option<u64>) -> Result<(), Error> {
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
fn record_fits(limits: &Limits) -> Result<(), Error> {
    let len = [
        limits.max_operation_len,
        limits.max_principal_len,
        limits.max_key_len,
        limits.max_response_len,
    ]
    .iter()
    .fold(0usize, |sum, l| sum.saturating_add(*l));
    if len > MAX_RECORD_BYTES {
        return Err(Error::InvalidInput(crate::error::InputError::TooLong {
            what: "the limits of a record over PostgreSQL (operation, principal, key and response together)",
            len,
            max: MAX_RECORD_BYTES,
        }));
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

async fn compactor(inner: Weak<Inner>, every: Duration) {
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
    async fn counted(
        &self,
        call: impl Future<Output = Result<(), Error>> + Send,
        done: Owned,
    ) -> Result<(), Error> {
        let result = call.await;
        self.inner.counters.owned(result.as_ref().map(|_| ()), done);
        result
    }
}

impl Store for PgStore {
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
    ) -> impl Future<Output = Result<ReserveOutcome, Error>> + Send {
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
    ) -> impl Future<Output = Result<ReserveOutcome, Error>> + Send {
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
    ) -> impl Future<Output = Result<(), Error>> + Send {
        let state = crate::record::RecordState::Completed;
        self.counted(
            self.inner.finish(reservation, state, response.into()),
            Owned::Finished,
        )
    }

    fn fail(
        &self,
        reservation: &Reservation,
        response: impl Into<Vec<u8>>,
    ) -> impl Future<Output = Result<(), Error>> + Send {
        let state = crate::record::RecordState::Failed;
        self.counted(
            self.inner.finish(reservation, state, response.into()),
            Owned::Finished,
        )
    }

    fn release(&self, reservation: &Reservation) -> impl Future<Output = Result<(), Error>> + Send {
        self.counted(self.inner.release(reservation), Owned::Released)
    }

    fn extend(
        &self,
        reservation: &mut Reservation,
        lease: Duration,
    ) -> impl Future<Output = Result<(), Error>> + Send {
        self.counted(self.inner.extend(reservation, lease), Owned::Extended)
    }

    fn get(
        &self,
        scope: &Scope,
        key: &Key,
    ) -> impl Future<Output = Result<Option<Record>, Error>> + Send {
        self.inner.get(scope, key)
    }

    fn renew_lease(
        &self,
        reservation: &Reservation,
        lease: Duration,
    ) -> impl Future<Output = Error> + Send {
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
            crate::renewal::renew(reservation, lease, extend, tokio::time::sleep).await
        }));
        async move {
            let mut task = task;
            match (&mut task.0).await {
                Ok(lost) => lost,
                Err(e) => Error::Internal(format!("the lease renewal task ended: {e}")),
            }
        }
    }

    fn release_detached(&self, reservation: Reservation) -> Result<(), Error> {
        let handle = tokio::runtime::Handle::try_current()
            .map_err(|_| Error::Internal("release_detached outside a tokio runtime".into()))?;
        let inner = Arc::clone(&self.inner);
        handle.spawn(async move {
            if let Err(e) = inner.release(&reservation).await {
                crate::observe::warn_detached_release(&e);
            }
        });
        Ok(())
    }
}
