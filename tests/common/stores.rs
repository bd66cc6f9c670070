//! Both stores behind one test: the embedded engine and PostgreSQL (a fresh database on the
//! test server, `idemdb::testing::postgres`), each on a manual clock at [`T0`], so that a
//! scenario written once against [`Store`](idemdb::Store) runs with the same assertions on
//! each.

use std::sync::Arc;
use std::time::Duration;

use idemdb::testing::postgres::TestServer;
use idemdb::{IdemDb, ManualClock, PgStore, Retention};
use tempfile::TempDir;

use super::T0;

/// A store under test, its clock, and what keeps it alive.
pub struct Under<S> {
    pub clock: ManualClock,
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
        clock,
        db: Arc::new(db),
        _dir: Some(dir),
    }
}

/// The PostgreSQL store on a fresh database, on a manual clock at [`T0`]; to be called on a
/// tokio runtime (its listener runs there).
pub async fn postgres() -> Under<PgStore> {
    postgres_with(Retention::default(), 16).await
}

pub async fn postgres_with(retention: Retention, pool_size: usize) -> Under<PgStore> {
    let url = fresh_database_url();
    let clock = ManualClock::new(T0);
    let builder = PgStore::builder(&url)
        .unwrap()
        .clock(clock.clone())
        .pool_size(pool_size)
        .wait_poll_interval(Duration::from_secs(1))
        .retention(retention.compact_interval(None));
    builder.migrate().await.unwrap();
    let db = builder.connect().await.unwrap();
    Under {
        clock,
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
