//! The stores under test: `PgStore`s on fresh databases of the test server, each with the
//! business table `orders`; one `execute` (the business insert, and one staged message or
//! not); the immediate publisher; the outbox's counts.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idemdb_postgres::{
    ExecuteOutcome, Key, Message, OutboxMessage, OutboxStats, Outcome, PgStore, PgTx, PublishError,
    Retention, Scope,
};
use idemdb_testkit::postgres::TestServer;
use tokio::runtime::Handle;

use crate::shared::keys::{OPERATION, PAYLOAD, PRINCIPAL, RESPONSE, key_bytes};

/// The business table, made in every fresh database.
const ORDERS: &str = "CREATE TABLE orders (id bytea PRIMARY KEY, cents int NOT NULL)";
/// The business insert every closure makes (a plain statement, as a user writes one).
const INSERT_ORDER: &str = "INSERT INTO orders (id, cents) VALUES ($1, $2)";

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A new, empty database on the test server (`$IDEMDB_TEST_PG`, or the process's own
/// throwaway cluster).
fn fresh_database() -> String {
    let server = TestServer::shared().unwrap_or_else(|e| panic!("no PostgreSQL server: {e}"));
    server.fresh_database().expect("fresh database")
}

/// A store on `url` with `pool` connections; the background compactor off.
pub fn connect(rt: &Handle, url: &str, pool: usize) -> Arc<PgStore> {
    let builder = PgStore::builder(url)
        .expect("PgStore::builder")
        .pool_size(pool)
        .retention(Retention::default().compact_interval(None));
    Arc::new(rt.block_on(builder.connect()).expect("connect"))
}

/// A fresh database, migrated, with the `orders` table; its URL and a store of `pool`
/// connections on it.
pub fn fresh(rt: &Handle, pool: usize) -> (String, Arc<PgStore>) {
    let url = fresh_database();
    let builder = PgStore::builder(&url).expect("PgStore::builder");
    rt.block_on(builder.migrate()).expect("migrate");
    let store = connect(rt, &url, pool);
    rt.block_on(async {
        let client = store.pool().get().await.expect("pool");
        client.batch_execute(ORDERS).await.expect("create orders");
    });
    (url, store)
}

/// Where a store's executes spent their time, as their callers saw it: ns summed over the
/// executes (the closure's statements counted once per run of the closure).
#[derive(Default)]
pub struct Probe {
    executes: AtomicU64,
    execute_ns: AtomicU64,
    insert_ns: AtomicU64,
    stage_ns: AtomicU64,
}

/// A [`Probe`]'s means, µs per execute.
#[derive(Clone, Copy, Default)]
pub struct Spent {
    pub execute_us: f64,
    pub insert_us: f64,
    pub stage_us: f64,
}

impl Probe {
    fn add(counter: &AtomicU64, since: Instant) {
        let ns = u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX);
        counter.fetch_add(ns, Ordering::Relaxed);
    }

    /// Starts over.
    pub fn reset(&self) {
        for c in [
            &self.executes,
            &self.execute_ns,
            &self.insert_ns,
            &self.stage_ns,
        ] {
            c.store(0, Ordering::Relaxed);
        }
    }

    pub fn spent(&self) -> Spent {
        let n = self.executes.load(Ordering::Relaxed);
        let mean = |c: &AtomicU64| c.load(Ordering::Relaxed) as f64 / 1e3 / n.max(1) as f64;
        Spent {
            execute_us: mean(&self.execute_ns),
            insert_us: mean(&self.insert_ns),
            stage_us: mean(&self.stage_ns),
        }
    }
}

/// `execute` of the fresh key `id`: the closure inserts the order and, if `stage`, stages one
/// message keyed by the key's first 4 hex digits (65,536 ordering keys); timed into `probe`.
pub async fn execute(store: &PgStore, id: u64, stage: bool, probe: &Arc<Probe>) {
    let key = key_bytes(id);
    let started = Instant::now();
    let done = store
        .execute(
            &Scope::new(OPERATION, PRINCIPAL),
            &Key::new(key),
            PAYLOAD,
            |tx: &mut PgTx<'_>| {
                let probe = Arc::clone(probe);
                Box::pin(async move {
                    let at = Instant::now();
                    tx.execute(INSERT_ORDER, &[&&key[..], &1999i32]).await?;
                    Probe::add(&probe.insert_ns, at);
                    if stage {
                        let message =
                            Message::new("orders", key.to_vec()).ordering_key(key[..4].to_vec());
                        let at = Instant::now();
                        tx.stage(message).await?;
                        Probe::add(&probe.stage_ns, at);
                    }
                    Ok::<_, BoxError>(Outcome::Completed(RESPONSE.to_vec()))
                })
            },
        )
        .await
        .expect("execute");
    Probe::add(&probe.execute_ns, started);
    probe.executes.fetch_add(1, Ordering::Relaxed);
    assert!(matches!(done, ExecuteOutcome::Executed(_)), "{done:?}");
}

/// `execute` of the fresh key `id` staging one message of ordering key `okey` with `payload`
/// (no business insert).
pub async fn stage_one(store: &PgStore, id: u64, okey: Vec<u8>, payload: &'static [u8]) {
    let key = key_bytes(id);
    let done = store
        .execute(
            &Scope::new(OPERATION, PRINCIPAL),
            &Key::new(key),
            PAYLOAD,
            |tx: &mut PgTx<'_>| {
                let message = Message::new("orders", payload.to_vec()).ordering_key(okey.clone());
                Box::pin(async move {
                    tx.stage(message).await?;
                    Ok::<_, BoxError>(Outcome::Completed(RESPONSE.to_vec()))
                })
            },
        )
        .await
        .expect("execute");
    assert!(matches!(done, ExecuteOutcome::Executed(_)), "{done:?}");
}

/// A publisher that counts each message and answers `Ok` at once.
pub fn immediate(
    sent: Arc<AtomicU64>,
) -> impl FnMut(OutboxMessage) -> std::future::Ready<Result<(), PublishError>> + Send + 'static {
    move |_| {
        sent.fetch_add(1, Ordering::Relaxed);
        std::future::ready(Ok(()))
    }
}

pub fn stats(rt: &Handle, store: &PgStore) -> OutboxStats {
    rt.block_on(store.outbox_stats()).expect("outbox_stats")
}

/// Waits (polling every `every`) until the outbox is empty; false if it was not within 60 s.
pub fn drain(rt: &Handle, store: &PgStore, every: Duration) -> bool {
    let deadline = Instant::now() + Duration::from_secs(60);
    while stats(rt, store).backlog > 0 {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(every);
    }
    true
}

/// The outbox table's bytes on disk, indexes and TOAST included.
pub fn outbox_bytes(rt: &Handle, store: &PgStore) -> i64 {
    rt.block_on(async {
        let client = store.pool().get().await.expect("pool");
        client
            .query_one("SELECT pg_total_relation_size('idemdb_outbox')", &[])
            .await
            .expect("pg_total_relation_size")
            .get(0)
    })
}

/// The server's version and the settings that decide commit cost, as `(name, value)`.
pub fn pg_settings(rt: &Handle, store: &PgStore) -> Vec<(String, String)> {
    crate::shared::pg_table::pg_settings(
        rt,
        store,
        &[
            "server_version",
            "fsync",
            "synchronous_commit",
            "wal_sync_method",
            "shared_buffers",
        ],
    )
}
