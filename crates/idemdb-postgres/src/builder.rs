//! Building a [`PgStore`]: the connection settings, the schema's migration, and `connect`.

use std::sync::Arc;
use std::time::Duration;

use crate::error::PgError;
use crate::errors::{self, database};
use crate::partitions::Partitions;
use crate::schema;
use crate::server_time::ServerTime;
use crate::stats;
use crate::store::{Inner, PgStore, compactor, record_fits};
use crate::tls;

/// Operations of concurrent calls in one batch, by default.
const DEFAULT_MAX_BATCH: usize = 64;
use crate::wait::{self, Waits};
use idemdb_core::Limits;
use idemdb_core::clock::{Clock, SystemClock};
use idemdb_core::retention::Retention;

/// Builds a [`PgStore`]: where the database is, and the settings shared with the embedded
/// engine (retention, limits).
///
/// ```no_run
/// # async fn run() -> Result<(), idemdb_postgres::PgError> {
/// use idemdb_postgres::PgStore;
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
    max_batch: usize,
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
    /// # fn run() -> Result<(), idemdb_postgres::PgError> {
    /// let ca = std::fs::read("/etc/ssl/db-ca.pem").unwrap();
    /// let builder = idemdb_postgres::PgStore::builder("postgres://app@db.internal/shop?sslmode=verify-full")?
    ///     .tls_root_certificates(ca);
    /// # Ok(()) }
    /// ```
    pub fn builder(url: &str) -> Result<PgStoreBuilder, PgError> {
        let split = tls::split(url)?;
        let mut config: tokio_postgres::Config = split.rest.parse().map_err(database)?;
        config.ssl_mode(split.mode.driver());
        let tls_roots = match split.root_file.as_deref() {
            None | Some("system") => None,
            Some(path) => Some(std::fs::read(path).map_err(|e| {
                PgError::Database(Arc::new(std::io::Error::new(
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
            retention: Retention::default(),
            limits: Limits::default(),
            clock: Arc::new(SystemClock),
            wait_poll: Duration::from_secs(1),
            pool_wait: Duration::from_secs(30),
            max_batch: DEFAULT_MAX_BATCH,
        })
    }
}

impl PgStoreBuilder {
    /// The partition width of a store built without [`retention`](Self::retention): a
    /// quarter of the default 24 h TTL, so that about six partitions hold the live records.
    /// Every read of a key probes each partition's index (the partition key is not the record
    /// key), so fewer, wider partitions than the embedded default
    /// (`idemdb::Builder::DEFAULT_PARTITION_WIDTH`).
    pub const DEFAULT_PARTITION_WIDTH: Duration = Duration::from_secs(6 * 3600);

    /// The partition width of a [`Retention`] given to [`retention`](Self::retention) without
    /// one: 1 h, what `Retention::default()` said before the width became each store's own
    /// choice. Kept so that a database's width does not change under it with this version:
    /// a partition of a new width that overlaps the old ones cannot be made, and the writes
    /// that need it would fail.
    pub const RETENTION_PARTITION_WIDTH: Duration = Duration::from_secs(3600);

    /// The CA certificates (PEM) that `verify-ca` and `verify-full` trust, instead of the
    /// operating system's roots or the URL's `sslrootcert`.
    pub fn tls_root_certificates(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls_roots = Some(pem.into());
        self
    }

    fn tls(&self) -> Result<tokio_postgres_rustls::MakeRustlsConnect, PgError> {
        tls::connector(self.tls, self.tls_roots.as_deref())
    }

    /// Connections in the pool (default 16). Each operation holds one for its statements;
    /// `execute` and `complete_with` hold one while their closure runs.
    pub fn pool_size(mut self, size: usize) -> Self {
        self.pool_size = size.max(1);
        self
    }

    /// How long a call waits for a pooled connection before it fails with
    /// [`PgError::Database`] (default 30 s), so that an exhausted pool (or an unreachable
    /// server) answers instead of hanging.
    pub fn pool_wait_timeout(mut self, timeout: Duration) -> Self {
        self.pool_wait = timeout;
        self
    }

    /// Retention: TTL per operation, partition width, beyond-horizon policy and the
    /// compactor's interval (see docs/semantics.md for what differs from the embedded
    /// engine). Keep the partition width the same for a database. Every read of a key
    /// probes each live partition, so choose a width near a quarter of the longest TTL
    /// (without this call, [`DEFAULT_PARTITION_WIDTH`](Self::DEFAULT_PARTITION_WIDTH), 6 h;
    /// with it but no width set, [`RETENTION_PARTITION_WIDTH`](Self::RETENTION_PARTITION_WIDTH),
    /// 1 h, as before).
    pub fn retention(mut self, mut retention: Retention) -> Self {
        retention
            .partition_width
            .get_or_insert(Self::RETENTION_PARTITION_WIDTH);
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
    /// [`PgStats::clock_skew_ms`](crate::PgStats::clock_skew_ms).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// The most reserves and finishes of concurrent calls that share one transaction, one
    /// round trip and one commit (default 64; 0 or 1: every call runs on its own). Up to four
    /// calls run alone at once, each its own statement; calls that arrive while four run, or
    /// while a batch runs, are gathered (design.md §14).
    pub fn max_batch(mut self, ops: usize) -> Self {
        self.max_batch = ops;
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
    /// of a newer build with [`PgError::UnsupportedFormat`].
    pub async fn migrate(&self) -> Result<u32, PgError> {
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
    pub async fn connect(self) -> Result<PgStore, PgError> {
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
            .map_err(|e| PgError::Database(Arc::new(e)))?;
        let (meta, server_ms) = {
            let client = pool.get().await.map_err(errors::pool)?;
            let meta = schema::Meta::read(&client).await?;
            (meta, schema::server_now(&client).await?)
        };
        let rules = self.retention.rules(Self::DEFAULT_PARTITION_WIDTH);
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| PgError::Internal("PgStore connected outside a tokio runtime".into()))?;
        let counters = stats::Counters::new(pool.clone());
        let max_batch = self.max_batch;
        let inner = Arc::new_cyclic(|this| Inner {
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
            batcher: crate::batch::Batcher::new(max_batch),
            outbox: crate::outbox_local::OutboxLocal::default(),
            this: this.clone(),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn width_ms(builder: &PgStoreBuilder) -> u64 {
        builder
            .retention
            .rules(PgStoreBuilder::DEFAULT_PARTITION_WIDTH)
            .width_ms
    }

    /// A database's width must not change under it with a new version: the partitions of a
    /// new width that overlap the old ones could not be made.
    #[test]
    fn the_widths_of_earlier_versions_are_kept() {
        let url = "postgres://u@127.0.0.1/db";
        let hour = 3_600_000;
        assert_eq!(width_ms(&PgStore::builder(url).unwrap()), 6 * hour);
        let unset = PgStore::builder(url)
            .unwrap()
            .retention(Retention::default().ttl(Duration::from_secs(60)));
        assert_eq!(width_ms(&unset), hour);
        let set = PgStore::builder(url)
            .unwrap()
            .retention(Retention::default().partition_width(Duration::from_secs(600)));
        assert_eq!(width_ms(&set), 600_000);
    }
}
