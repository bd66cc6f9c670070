//! The stores under test and the hand-written baseline, driven the same way: every call is the async `Store` method,
//! driven to completion by the calling OS thread with `Handle::block_on` on the bench's one
//! multi-thread tokio runtime.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use idemdb::{Clock as _, IdemDb, Key, ManualClock, ReserveOutcome, Retention, Scope, Store};
use idemdb_postgres::PgStore;
use idemdb_testkit::postgres::{ServerClock, TestServer};
use tempfile::TempDir;
use tokio::runtime::Handle;

use crate::shared::keys::{PAYLOAD, RESPONSE, key_bytes};
use crate::table::Table;

/// Lease of every reservation.
pub const LEASE: Duration = Duration::from_secs(60);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Postgres,
    /// The hand-written table over the same server (`shared/pg_table.rs`).
    Table,
    Embedded,
}

impl Kind {
    /// The order in which every criterion cell runs them.
    pub const ALL: [Kind; 3] = [Kind::Postgres, Kind::Table, Kind::Embedded];
    /// The two stores: the drop stall runs these.
    pub const BOTH: [Kind; 2] = [Kind::Postgres, Kind::Embedded];

    /// The criterion benchmark id.
    pub fn id(self) -> &'static str {
        match self {
            Kind::Postgres => "postgres",
            Kind::Table => "pg_table",
            Kind::Embedded => "embedded",
        }
    }
}

/// One store, shared by the caller threads.
#[derive(Clone)]
pub enum Subject {
    Pg(Arc<PgStore>),
    Table(Arc<Table>),
    Embedded(Arc<IdemDb>),
}

/// A store and what keeps it alive (the embedded engine's directory).
pub struct Opened {
    pub subject: Subject,
    /// The database, for a PostgreSQL subject.
    url: Option<String>,
    /// The store's time moved by hand: the embedded engine's clock, or the server's.
    clock: Option<Clock>,
    _dir: Option<TempDir>,
}

enum Clock {
    Manual(ManualClock),
    Server(ServerClock),
}

impl Opened {
    /// Sets the store's time (a store opened with a clock).
    pub fn set_time(&self, ms: u64) {
        match &self.clock {
            Some(Clock::Manual(c)) => c.set(ms),
            Some(Clock::Server(c)) => c.set(ms).expect("set the server's time"),
            None => panic!("the store was opened without a clock"),
        }
    }
}

impl Opened {
    /// The server's WAL position now (`pg_current_wal_lsn()`, in bytes), for a PostgreSQL
    /// subject: the difference of two is the WAL the whole cluster wrote between them, to the
    /// byte and at once (`pg_stat_wal`'s counters reach the view up to a second late).
    /// PgStore's batches so far and the calls they answered (`PgStats::batches`,
    /// `batched_calls`); `None` for the other subjects.
    pub fn batches(&self) -> Option<(u64, u64)> {
        match &self.subject {
            Subject::Pg(store) => {
                let stats = store.stats();
                Some((stats.batches, stats.batched_calls))
            }
            _ => None,
        }
    }

    pub fn wal_position(&self, rt: &Handle) -> Option<f64> {
        let url = self.url.as_deref()?;
        rt.block_on(async {
            let (client, connection) = idemdb_postgres::tokio_postgres::connect(
                url,
                idemdb_postgres::tokio_postgres::NoTls,
            )
            .await
            .expect("connect for the WAL position");
            let connection = tokio::spawn(connection);
            let row = client
                .query_one("SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::float8", &[])
                .await
                .expect("pg_current_wal_lsn");
            drop(client);
            let _ = connection.await;
            Some(row.get(0))
        })
    }
}

/// What one compaction pass did.
pub struct Compacted {
    pub took: Duration,
    pub partitions_dropped: u64,
    /// PostgreSQL only: partitions made ahead of the writes.
    pub partitions_created: Option<u64>,
    /// PostgreSQL only: the longest detach + drop of one partition.
    pub longest_drop: Option<Duration>,
    /// Embedded only: records in the dropped partitions.
    pub records_expired: Option<u64>,
}

impl Opened {
    /// A fresh store of `kind`: the embedded engine on a new file under `root`, or
    /// PostgreSQL on a new, empty database of the test server with a pool of `pool`
    /// connections. The background compactor is off (`compact_interval(None)`) for both.
    pub fn open(
        kind: Kind,
        rt: &Handle,
        root: &Path,
        pool: usize,
        retention: Retention,
        clock: Option<ManualClock>,
    ) -> Opened {
        let retention = retention.compact_interval(None);
        match kind {
            Kind::Embedded => {
                let dir = tempfile::tempdir_in(root).expect("tempdir");
                let mut builder = IdemDb::builder().retention(retention);
                if let Some(clock) = &clock {
                    builder = builder.clock(clock.clone());
                }
                let db = builder
                    .open(dir.path().join("bench.idemdb"))
                    .expect("open idemdb");
                Opened {
                    subject: Subject::Embedded(Arc::new(db)),
                    url: None,
                    clock: clock.map(Clock::Manual),
                    _dir: Some(dir),
                }
            }
            Kind::Table => {
                assert!(clock.is_none(), "the baseline keeps no time of its own");
                let url = fresh_database();
                Opened {
                    subject: Subject::Table(Arc::new(Table::open(rt, &url, pool))),
                    url: Some(url),
                    clock: None,
                    _dir: None,
                }
            }
            Kind::Postgres => {
                let url = fresh_database();
                let builder = PgStore::builder(&url)
                    .expect("PgStore::builder")
                    .pool_size(pool)
                    .retention(retention);
                rt.block_on(builder.migrate()).expect("migrate");
                // The store's time is the server's: frozen and moved there.
                let clock = clock
                    .map(|c| Clock::Server(ServerClock::freeze(&url, c.now_ms()).expect("freeze")));
                let store = rt.block_on(builder.connect()).expect("connect");
                Opened {
                    subject: Subject::Pg(Arc::new(store)),
                    url: Some(url),
                    clock,
                    _dir: None,
                }
            }
        }
    }
}

/// A new, empty database on the test server (`$IDEMDB_TEST_PG`, or the process's own
/// throwaway cluster).
fn fresh_database() -> String {
    let server = TestServer::shared().unwrap_or_else(|e| panic!("no PostgreSQL server: {e}"));
    server.fresh_database().expect("fresh database")
}

/// reserve + complete of the fresh key `id`; returns when the reserve started and how long it
/// took.
async fn lifecycle<S: Store>(store: &S, scope: &Scope, id: u64) -> (Instant, Duration) {
    let key = Key::new(key_bytes(id));
    let start = Instant::now();
    let outcome = store
        .reserve(scope, &key, PAYLOAD, LEASE)
        .await
        .expect("reserve");
    let took = start.elapsed();
    match outcome {
        ReserveOutcome::Acquired(r) => store.complete(&r, RESPONSE).await.expect("complete"),
        other => panic!("fresh key {id} not acquired: {other:?}"),
    }
    (start, took)
}

/// reserve of the completed key `id`: a replay.
async fn replay<S: Store>(store: &S, scope: &Scope, id: u64) {
    let key = Key::new(key_bytes(id));
    match store
        .reserve(scope, &key, PAYLOAD, LEASE)
        .await
        .expect("reserve")
    {
        ReserveOutcome::Completed(bytes) => {
            assert_eq!(bytes.len(), RESPONSE.len(), "the stored response");
            std::hint::black_box(bytes);
        }
        other => panic!("completed key {id} not replayed: {other:?}"),
    }
}

impl Subject {
    /// reserve + complete of the fresh key `id`, driven by this thread.
    pub fn lifecycle(&self, rt: &Handle, scope: &Scope, id: u64) -> (Instant, Duration) {
        match self {
            Subject::Pg(s) => rt.block_on(lifecycle(&**s, scope, id)),
            Subject::Table(t) => rt.block_on(t.lifecycle(id)),
            Subject::Embedded(s) => rt.block_on(lifecycle(&**s, scope, id)),
        }
    }

    /// reserve of the completed key `id`, driven by this thread.
    pub fn replay(&self, rt: &Handle, scope: &Scope, id: u64) {
        match self {
            Subject::Pg(s) => rt.block_on(replay(&**s, scope, id)),
            Subject::Table(t) => rt.block_on(t.replay(id)),
            Subject::Embedded(s) => rt.block_on(replay(&**s, scope, id)),
        }
    }

    /// One compaction pass: `PgStore::compact_now` or `IdemDb::compact_now`.
    pub fn compact(&self, rt: &Handle) -> Compacted {
        let start = Instant::now();
        match self {
            Subject::Pg(s) => {
                let r = rt.block_on(s.compact_now()).expect("compact_now");
                Compacted {
                    took: start.elapsed(),
                    partitions_dropped: r.partitions_dropped,
                    partitions_created: Some(r.partitions_created),
                    longest_drop: Some(r.longest_drop),
                    records_expired: None,
                }
            }
            Subject::Embedded(db) => {
                let r = db.compact_now().expect("compact_now");
                Compacted {
                    took: start.elapsed(),
                    partitions_dropped: r.partitions_dropped,
                    partitions_created: None,
                    longest_drop: None,
                    records_expired: Some(r.records_expired),
                }
            }
            Subject::Table(_) => panic!("the baseline has no compaction"),
        }
    }
}

/// Runs `op` on every id of `ids` from `threads` threads (each id once).
pub fn parallel(threads: usize, ids: std::ops::Range<u64>, op: &(dyn Fn(u64) + Sync)) {
    let next = std::sync::atomic::AtomicU64::new(ids.start);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                loop {
                    let id = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if id >= ids.end {
                        break;
                    }
                    op(id);
                }
            });
        }
    });
}

/// The server's version and the settings that decide commit cost, as `(name, value)`.
pub fn pg_settings(rt: &Handle, root: &Path) -> Vec<(String, String)> {
    let opened = Opened::open(Kind::Postgres, rt, root, 1, Retention::default(), None);
    let Subject::Pg(store) = &opened.subject else {
        unreachable!("opened PostgreSQL");
    };
    crate::shared::pg_table::pg_settings(
        rt,
        store,
        &[
            "server_version",
            "fsync",
            "synchronous_commit",
            "wal_sync_method",
            "full_page_writes",
            "shared_buffers",
            "max_connections",
        ],
    )
}
