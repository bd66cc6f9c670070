//! The PostgreSQL schema: created by `migrate`, versioned, idempotent, safe from several
//! instances at once; a store refuses a database that is not migrated or is newer.

mod common;

use common::stores::{fresh_database_url, runtime};
use idemdb_postgres::{PgError, PgStore};

/// The schema version this build writes.
const SCHEMA: u32 = 4;

use common::stores::admin as client;

#[test]
fn connect_refuses_a_database_without_the_schema() {
    runtime().block_on(async {
        let url = fresh_database_url();
        let refused = PgStore::builder(&url).unwrap().connect().await;
        assert!(
            matches!(refused, Err(PgError::NotMigrated(_))),
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

/// A fresh database migrated by this build, then altered by `sql`.
async fn migrated_then(sql: &str) -> (String, idemdb_postgres::PgStoreBuilder) {
    let url = fresh_database_url();
    let builder = PgStore::builder(&url).unwrap();
    builder.migrate().await.unwrap();
    client(&url).await.batch_execute(sql).await.unwrap();
    (url, builder)
}

#[test]
fn a_schema_of_a_newer_build_is_refused_by_connect_and_by_migrate() {
    runtime().block_on(async {
        let (url, builder) = migrated_then("UPDATE idemdb_meta SET schema_version = 99").await;
        let refused = PgStore::builder(&url).unwrap().connect().await;
        assert!(
            matches!(
                refused,
                Err(PgError::UnsupportedFormat {
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
                Err(PgError::UnsupportedFormat {
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

/// The schema of version 1, as its build made it, with one record in a partition.
const V1_WITH_A_RECORD: &str = "
CREATE TABLE idemdb_meta (id int PRIMARY KEY CHECK (id = 1), schema_version int NOT NULL,
    fingerprint_secret bytea NOT NULL);
INSERT INTO idemdb_meta VALUES (1, 1, decode(repeat('ab', 192), 'hex'));
CREATE SEQUENCE idemdb_tokens AS bigint MINVALUE 1 START WITH 1;
CREATE TABLE idemdb_stripes (stripe int PRIMARY KEY);
INSERT INTO idemdb_stripes SELECT generate_series(0, 1023);
CREATE TABLE idemdb_records (operation bytea NOT NULL, principal bytea NOT NULL,
    key bytea NOT NULL, state smallint NOT NULL, fingerprint bytea NOT NULL,
    token bigint NOT NULL, lease_expires_at bigint NOT NULL, created_at bigint NOT NULL,
    updated_at bigint NOT NULL, expires_at bigint NOT NULL, attempts int NOT NULL,
    response bytea NOT NULL, waiters int NOT NULL DEFAULT 0) PARTITION BY RANGE (expires_at);
CREATE INDEX idemdb_records_key ON idemdb_records (operation, principal, key, expires_at DESC);
CREATE TABLE idemdb_records_0_max PARTITION OF idemdb_records FOR VALUES FROM (0) TO (MAXVALUE);
INSERT INTO idemdb_records VALUES ('POST /v1', 'u', 'old-key', 2, decode(repeat('00', 16), 'hex'),
    nextval('idemdb_tokens'), 1, 1, 1, 4000000000000000000, 1, 'stored by v1', 0);
";

#[test]
fn a_version_1_schema_is_upgraded_and_its_records_are_found() {
    runtime().block_on(async {
        let url = fresh_database_url();
        client(&url)
            .await
            .batch_execute(V1_WITH_A_RECORD)
            .await
            .unwrap();
        let builder = PgStore::builder(&url).unwrap();
        assert_eq!(builder.migrate().await.unwrap(), SCHEMA);
        let store = builder.connect().await.unwrap();
        use idemdb::Store;
        let (scope, key) = (
            idemdb::Scope::new("POST /v1", "u"),
            idemdb::Key::new("old-key"),
        );
        let rec = store
            .get(&scope, &key)
            .await
            .unwrap()
            .expect("the v1 record");
        assert_eq!(rec.response, b"stored by v1");
        // Found through the new index, the old one gone.
        let indexes: Vec<String> = client(&url)
            .await
            .query(
                "SELECT indexname::text FROM pg_indexes WHERE tablename = 'idemdb_records'",
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert_eq!(indexes, vec!["idemdb_records_hash".to_string()]);
    });
}

#[test]
fn a_version_3_schema_gains_the_outbox_and_keeps_its_records() {
    runtime().block_on(async {
        // A version 3 database, as its build left it: no outbox.
        let (url, builder) = migrated_then(
            "DROP TABLE idemdb_outbox; DROP SEQUENCE idemdb_outbox_seq, idemdb_outbox_claims; \
             UPDATE idemdb_meta SET schema_version = 3",
        )
        .await;
        let refused = PgStore::builder(&url).unwrap().connect().await;
        assert!(
            matches!(&refused, Err(PgError::NotMigrated(m)) if m.contains("older")),
            "{:?}",
            refused.err()
        );
        assert_eq!(builder.migrate().await.unwrap(), SCHEMA);
        let store = builder.connect().await.unwrap();
        use idemdb::Store;
        // The outbox is there: a message staged and listed.
        use idemdb_postgres::{Message, Outcome, PgTx};
        let _ = store
            .execute(
                &idemdb::Scope::new("POST /v4", "u"),
                &idemdb::Key::new("k"),
                b"req",
                |tx: &mut PgTx<'_>| {
                    Box::pin(async move {
                        tx.stage(Message::new("orders", b"m".to_vec())).await?;
                        Ok::<_, PgError>(Outcome::Completed(b"201".to_vec()))
                    })
                },
            )
            .await
            .unwrap();
        assert_eq!(store.outbox_pending(10).await.unwrap().len(), 1);
        // An instance of the version 3 build, still running, inserts a record as it does.
        client(&url)
            .await
            .batch_execute(OLDER_BUILD_INSERT)
            .await
            .unwrap();
        let rec = store
            .get(&idemdb::Scope::new("POST /v2", "u"), &idemdb::Key::new("k"))
            .await
            .unwrap()
            .expect("the version 3 build's record");
        assert_eq!(rec.state, idemdb::RecordState::InProgress);
    });
}

/// A record as an instance of an older build inserts it under the stripe lock: IN_PROGRESS,
/// its lease live by the server's clock.
const OLDER_BUILD_INSERT: &str = "
INSERT INTO idemdb_records (operation, principal, key, state, fingerprint, token,
    lease_expires_at, created_at, updated_at, expires_at, attempts, response)
SELECT 'POST /v2', 'u', 'k', 1, decode(repeat('00', 16), 'hex'), nextval('idemdb_tokens'),
    now_ms + 600000, now_ms, now_ms, now_ms + 600000 + 86400000, 1, ''
FROM (SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms) t";

#[test]
fn a_version_2_schema_is_upgraded_and_its_stripe_locks_still_exclude_the_new_reservation() {
    runtime().block_on(async {
        // Made a version 2 database: version 3 only adds the function.
        let (url, builder) = migrated_then(
            "DROP FUNCTION idemdb_reserve; UPDATE idemdb_meta SET schema_version = 2",
        )
        .await;
        let refused = PgStore::builder(&url).unwrap().connect().await;
        assert!(
            matches!(&refused, Err(PgError::NotMigrated(m)) if m.contains("older")),
            "{:?}",
            refused.err()
        );
        assert_eq!(builder.migrate().await.unwrap(), SCHEMA);
        let store = builder.connect().await.unwrap();

        // An instance of the older build, still running, holds every stripe while it reads
        // and inserts a key, as its reservation does.
        let mut older = client(&url).await;
        let txn = older.transaction().await.unwrap();
        txn.batch_execute("SELECT stripe FROM idemdb_stripes ORDER BY stripe FOR UPDATE")
            .await
            .unwrap();
        use idemdb::Store;
        let reserve = tokio::spawn(async move {
            store
                .reserve(
                    &idemdb::Scope::new("POST /v2", "u"),
                    &idemdb::Key::new("k"),
                    b"req",
                    std::time::Duration::from_secs(30),
                )
                .await
        });
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        assert!(
            !reserve.is_finished(),
            "the reservation did not wait for the stripe"
        );
        txn.batch_execute(OLDER_BUILD_INSERT).await.unwrap();
        txn.commit().await.unwrap();
        // It read again after the lock: the older instance's insert is there, and the key is
        // not acquired twice. (That record was made for another payload: `Mismatch`, which
        // only a read of it can answer.)
        let outcome = reserve.await.unwrap().unwrap();
        assert!(
            matches!(outcome, idemdb::ReserveOutcome::Mismatch),
            "{outcome:?}"
        );
    });
}

/// `url` with its connections' `search_path` set to `path`.
fn with_search_path(url: &str, path: &str) -> String {
    let path = path.replace(',', "%2C");
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}options=-c%20search_path%3D{path}")
}

#[test]
fn a_store_keeps_to_the_first_schema_of_its_search_path() {
    // Another tenant's tables later in the path are not this store's: connect refuses to
    // adopt them, migrate creates this store's own in the first schema, and each store
    // answers with its own records.
    runtime().block_on(async {
        use idemdb::{Key, ReserveOutcome, Scope, Store};
        let url = fresh_database_url();
        let scope = Scope::new("POST /orders", "user-1");
        let key = Key::new("order-1");
        let lease = std::time::Duration::from_secs(30);
        let public = PgStore::builder(&url).unwrap();
        public.migrate().await.unwrap();
        let public = public.connect().await.unwrap();
        let ReserveOutcome::Acquired(r) = public.reserve(&scope, &key, b"a", lease).await.unwrap()
        else {
            panic!("a fresh key was not acquired");
        };
        public.complete(&r, b"public's answer").await.unwrap();

        client(&url)
            .await
            .batch_execute("CREATE SCHEMA tenant_c")
            .await
            .unwrap();
        let tenant_url = with_search_path(&url, "tenant_c,public");
        let refused = PgStore::builder(&tenant_url).unwrap().connect().await;
        assert!(
            matches!(&refused, Err(PgError::NotMigrated(m)) if m.contains("\"tenant_c\"")),
            "{:?}",
            refused.err()
        );
        let tenant = PgStore::builder(&tenant_url).unwrap();
        assert_eq!(tenant.migrate().await.unwrap(), SCHEMA);
        let tenant = tenant.connect().await.unwrap();
        let made: bool = client(&url)
            .await
            .query_one(
                "SELECT to_regclass('tenant_c.idemdb_meta') IS NOT NULL \
                 AND to_regclass('tenant_c.idemdb_records') IS NOT NULL \
                 AND to_regprocedure('tenant_c.idemdb_reserve(bytea, bytea, bytea, bytea, \
                 bigint, bigint, boolean, int)') IS NOT NULL",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert!(made, "migrate did not create the tables in tenant_c");
        assert!(
            matches!(
                tenant.reserve(&scope, &key, b"a", lease).await.unwrap(),
                ReserveOutcome::Acquired(_)
            ),
            "the tenant got the other schema's record"
        );
        assert_eq!(
            public.reserve(&scope, &key, b"a", lease).await.unwrap(),
            ReserveOutcome::Completed(b"public's answer".to_vec())
        );

        // A path naming no schema that exists: nothing is created anywhere.
        let nowhere_url = with_search_path(&url, "tenant_x");
        let nowhere = PgStore::builder(&nowhere_url).unwrap();
        let failed = nowhere.migrate().await;
        assert!(failed.is_err(), "migrated with no schema to create in");
        let refused = nowhere.connect().await;
        assert!(
            matches!(&refused, Err(PgError::NotMigrated(m)) if m.contains("names none")),
            "{:?}",
            refused.err()
        );
    });
}
