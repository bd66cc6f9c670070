//! Both stores behind one test: the embedded engine and PostgreSQL (a fresh database on the
//! test server, `idemdb_testkit::postgres`), each on a manual clock at [`T0`], so that a
//! scenario written once against [`Store`](idemdb::Store) runs with the same assertions on
//! each.

use std::sync::Arc;
use std::time::Duration;

use idemdb::{
    Clock, IdemDb, Key, ManualClock, Refusal, ReserveOutcome, Retention, Scope, Store, StoreError,
};
use idemdb_postgres::PgStore;
use idemdb_testkit::postgres::{ServerClock, TestServer};
use tempfile::TempDir;

use super::{LEASE, T0, acquired};

/// The time a scenario moves by hand: the embedded engine's [`ManualClock`], or the
/// PostgreSQL store's, which is the server's (frozen through [`ServerClock`]).
#[derive(Debug, Clone)]
pub enum TestClock {
    Local(ManualClock),
    Server(ServerClock),
}

impl TestClock {
    pub fn advance(&self, by: Duration) {
        match self {
            TestClock::Local(c) => c.advance(by),
            TestClock::Server(c) => c.advance(by).unwrap(),
        }
    }

    pub fn set(&self, ms: u64) {
        match self {
            TestClock::Local(c) => c.set(ms),
            TestClock::Server(c) => c.set(ms).unwrap(),
        }
    }

    pub fn now_ms(&self) -> u64 {
        match self {
            TestClock::Local(c) => c.now_ms(),
            TestClock::Server(c) => c.now_ms(),
        }
    }
}

/// The system clock, off by `.0` ms: an instance whose clock is wrong.
#[derive(Debug, Clone, Copy)]
pub struct Skewed(pub i64);

impl Clock for Skewed {
    fn now_ms(&self) -> u64 {
        let now = i64::try_from(idemdb::SystemClock.now_ms()).unwrap();
        u64::try_from(now + self.0).unwrap()
    }
}

/// A store under test, its clock, and what keeps it alive.
pub struct Under<S> {
    pub clock: TestClock,
    pub db: Arc<S>,
    _dir: Option<TempDir>,
}

/// The embedded engine on a manual clock at [`T0`].
pub fn embedded() -> Under<IdemDb> {
    embedded_with(Retention::default())
}

pub fn embedded_with(retention: Retention) -> Under<IdemDb> {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let db = IdemDb::builder()
        .clock(clock.clone())
        .retention(retention.compact_interval(None))
        .open(dir.path().join("test.idemdb"))
        .unwrap();
    Under {
        clock: TestClock::Local(clock),
        db: Arc::new(db),
        _dir: Some(dir),
    }
}

/// The PostgreSQL store on a fresh database, its (server's) time frozen at [`T0`]; to be
/// called on a tokio runtime (its listener runs there).
pub async fn postgres() -> Under<PgStore> {
    postgres_with(Retention::default(), 16).await
}

pub async fn postgres_with(retention: Retention, pool_size: usize) -> Under<PgStore> {
    let url = fresh_database_url();
    let builder = PgStore::builder(&url)
        .unwrap()
        .pool_size(pool_size)
        .wait_poll_interval(Duration::from_secs(1))
        .retention(retention.compact_interval(None));
    builder.migrate().await.unwrap();
    let clock = ServerClock::freeze(&url, T0).unwrap();
    let db = builder.connect().await.unwrap();
    Under {
        clock: TestClock::Server(clock),
        db: Arc::new(db),
        _dir: None,
    }
}

/// A fresh, empty database on the test server.
pub fn fresh_database_url() -> String {
    let server =
        TestServer::shared().unwrap_or_else(|e| panic!("no PostgreSQL for the tests: {e}"));
    server.fresh_database().unwrap()
}

/// A connection of the test's own to `url` (an operator's or another program's), its
/// driver on the current runtime.
pub async fn admin(url: &str) -> idemdb_postgres::tokio_postgres::Client {
    let (client, connection) =
        idemdb_postgres::tokio_postgres::connect(url, idemdb_postgres::tokio_postgres::NoTls)
            .await
            .unwrap();
    tokio::spawn(connection);
    client
}

/// Waits (up to 5 s) until `n` backends of `client`'s database other than its own wait for a
/// lock: a call has reached the lock a test's transaction holds. `client` must not be inside a
/// transaction: there `pg_stat_activity` keeps the snapshot of its first read.
pub async fn wait_for_lock_waiters(client: &idemdb_postgres::tokio_postgres::Client, n: i64) {
    for _ in 0..500 {
        let waiting: i64 = client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
                 AND datname = current_database()",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if waiting >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let seen: Vec<String> = client
        .query(
            "SELECT coalesce(wait_event_type, '-') || ' ' || coalesce(wait_event, '-') || ' ' \
             || coalesce(state, '-') || ' ' || left(query, 60) FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
            &[],
        )
        .await
        .map(|rows| rows.iter().map(|r| r.get(0)).collect())
        .unwrap_or_default();
    panic!("{n} calls never waited for a lock; the database's other sessions: {seen:#?}");
}

/// A multi-threaded runtime for one test.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Runs the async scenario `$name(under: Under<S>)` twice, as `$name::embedded` and
/// `$name::postgres`.
#[macro_export]
macro_rules! on_both_stores {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[test]
            fn embedded() {
                let under = $crate::common::stores::embedded();
                $crate::common::stores::runtime().block_on(super::$name(under));
            }

            #[test]
            fn postgres() {
                $crate::common::stores::runtime().block_on(async {
                    let under = $crate::common::stores::postgres().await;
                    super::$name(under).await
                });
            }
        }
    )*};
}

/// Two accounts, `x` and `y`, at 0: rows for transactions to update in opposite orders.
pub async fn accounts_table(db: &PgStore) {
    let client = db.pool().get().await.unwrap();
    client
        .batch_execute(
            "CREATE TABLE accounts (id text PRIMARY KEY, n int NOT NULL); \
             INSERT INTO accounts VALUES ('x', 0), ('y', 0)",
        )
        .await
        .unwrap();
}

/// The accounts' counts: `x`'s, then `y`'s.
pub async fn accounts(db: &PgStore) -> Vec<i32> {
    let client = db.pool().get().await.unwrap();
    let rows = client.query("SELECT n FROM accounts ORDER BY id", &[]);
    rows.await.unwrap().iter().map(|r| r.get(0)).collect()
}

/// The same calls on either store (the stats and metrics tests count them): a lifecycle (and a duplicate told to wait), a replay, a
/// mismatch, an extended lease then a failure and its replay, a release, a takeover and the
/// stale owner's complete fenced. Ten writes: five reservations (one a takeover), an
/// extension, two completes, a fail and a release.
pub async fn script<S: Store>(under: &Under<S>) {
    let (db, clock) = (&*under.db, &under.clock);
    let scope = Scope::new("POST /purchases", "u1");
    let k = |n: &str| Key::new(n);

    let r1 = acquired(db.reserve(&scope, &k("1"), b"req", LEASE).await.unwrap());
    assert!(matches!(
        db.reserve(&scope, &k("1"), b"req", LEASE).await.unwrap(),
        ReserveOutcome::InProgress { .. }
    ));
    db.complete(&r1, b"ok".to_vec()).await.unwrap();
    assert_eq!(
        db.reserve(&scope, &k("1"), b"req", LEASE).await.unwrap(),
        ReserveOutcome::Completed(b"ok".to_vec())
    );
    assert_eq!(
        db.reserve(&scope, &k("1"), b"other", LEASE).await.unwrap(),
        ReserveOutcome::Mismatch
    );

    let mut r2 = acquired(db.reserve(&scope, &k("2"), b"req", LEASE).await.unwrap());
    db.extend(&mut r2, LEASE).await.unwrap();
    db.fail(&r2, b"declined".to_vec()).await.unwrap();
    assert_eq!(
        db.reserve(&scope, &k("2"), b"req", LEASE).await.unwrap(),
        ReserveOutcome::Failed(b"declined".to_vec())
    );

    let r3 = acquired(db.reserve(&scope, &k("3"), b"req", LEASE).await.unwrap());
    db.release(&r3).await.unwrap();

    let r4 = acquired(db.reserve(&scope, &k("4"), b"req", LEASE).await.unwrap());
    clock.advance(LEASE + Duration::from_millis(1));
    let r4b = acquired(db.reserve(&scope, &k("4"), b"req", LEASE).await.unwrap());
    assert!(r4b.is_takeover());
    let late = db.complete(&r4, b"late".to_vec()).await;
    assert!(matches!(
        late.map_err(|e| e.refusal().cloned()),
        Err(Some(Refusal::Fenced { .. }))
    ));
    db.complete(&r4b, b"ok".to_vec()).await.unwrap();
}

/// The writes of [`script`].
pub const SCRIPT_WRITES: u64 = 10;
