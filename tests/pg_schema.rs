//! The PostgreSQL schema: created by `migrate`, versioned, idempotent, safe from several
//! instances at once; a store refuses a database that is not migrated or is newer.

mod common;

use common::stores::{fresh_database_url, runtime};
use idemdb::{Error, PgStore};

/// The schema version this build writes.
const SCHEMA: u32 = 2;

use common::stores::admin as client;

#[test]
fn connect_refuses_a_database_without_the_schema() {
    runtime().block_on(async {
        let url = fresh_database_url();
        let refused = PgStore::builder(&url).unwrap().connect().await;
        assert!(
            matches!(refused, Err(Error::NotIdemdb(_))),
            "{:?}",
            refused.err()
        );
    });
}

#[test]
fn migrate_is_idempotent_and_safe_from_many_instances_at_once() {
    runtime().block_on(async {
        let url = fresh_database_url();
        let tasks: Vec<_> = (0..6)
            .map(|_| {
                let url = url.clone();
                tokio::spawn(async move { PgStore::builder(&url).unwrap().migrate().await })
            })
            .collect();
        for t in tasks {
            assert_eq!(t.await.unwrap().unwrap(), SCHEMA);
        }
        assert_eq!(
            PgStore::builder(&url).unwrap().migrate().await.unwrap(),
            SCHEMA
        );
        let c = client(&url).await;
        let meta: i64 = c
            .query_one("SELECT count(*) FROM idemdb_meta", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(
            meta, 1,
            "one identity and one secret, whoever migrated first"
        );
        let stripes: i64 = c
            .query_one("SELECT count(*) FROM idemdb_stripes", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(stripes, 1024);
        // The secret survives reconnects: fingerprints are stable.
        let a = PgStore::builder(&url).unwrap().connect().await.unwrap();
        let b = PgStore::builder(&url).unwrap().connect().await.unwrap();
        use idemdb::Store;
        assert_eq!(a.fingerprint(b"x"), b.fingerprint(b"x"));
    });
}

#[test]
fn a_schema_of_a_newer_build_is_refused_by_connect_and_by_migrate() {
    runtime().block_on(async {
        let url = fresh_database_url();
        let builder = PgStore::builder(&url).unwrap();
        builder.migrate().await.unwrap();
        client(&url)
            .await
            .batch_execute("UPDATE idemdb_meta SET schema_version = 99")
            .await
            .unwrap();
        let refused = PgStore::builder(&url).unwrap().connect().await;
        assert!(
            matches!(
                refused,
                Err(Error::UnsupportedFormat {
                    found: 99,
                    supported: SCHEMA
                })
            ),
            "{:?}",
            refused.err()
        );
        // migrate refuses it too, as its doc says, and leaves it alone.
        let migrated = builder.migrate().await;
        assert!(
            matches!(
                migrated,
                Err(Error::UnsupportedFormat {
                    found: 99,
                    supported: SCHEMA
                })
            ),
            "{migrated:?}"
        );
        let version: i32 = client(&url)
            .await
            .query_one("SELECT schema_version FROM idemdb_meta", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(version, 99);
    });
}
