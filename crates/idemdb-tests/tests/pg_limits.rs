//! Every limit the PostgreSQL store accepts works: records are found through a fixed-size
//! hash of their key (a btree entry holds at most ~2.7 KB), the full key compared, so keys,
//! principals and operations of any accepted length are stored; limits a record could not
//! hold are refused at `connect`.

mod common;

use idemdb_postgres::Refusal;
use std::sync::Arc;
use std::time::Duration;

use common::acquired;
use common::stores::{fresh_database_url, runtime};
use idemdb_postgres::{
    InputError, Key, Limits, Outcome, PgError, PgStore, PgTx, ReserveOutcome, Scope, Store,
};

const LEASE: Duration = Duration::from_secs(30);

/// `len` bytes no compressor shrinks: xxh3 of a counter.
fn incompressible(len: usize, seed: u64) -> Vec<u8> {
    (0..len.div_ceil(8) as u64)
        .flat_map(|i| xxhash_rust::xxh3::xxh3_64_with_seed(&i.to_le_bytes(), seed).to_le_bytes())
        .take(len)
        .collect()
}

fn wide_limits() -> Limits {
    let mut limits = Limits::default();
    limits.max_key_len = 16 * 1024;
    limits.max_operation_len = Limits::MAX_PART_LEN;
    limits.max_principal_len = Limits::MAX_PART_LEN;
    limits.max_response_len = 4 << 20;
    limits
}

async fn instance(url: &str, limits: Limits) -> Result<Arc<PgStore>, PgError> {
    let builder = PgStore::builder(url).unwrap().limits(limits);
    builder.migrate().await?;
    Ok(Arc::new(builder.connect().await?))
}

#[test]
fn a_3_kb_incompressible_key_and_the_longest_parts_are_stored_and_replayed() {
    runtime().block_on(async {
        let url = fresh_database_url();
        let a = instance(&url, wide_limits()).await.unwrap();
        let b = instance(&url, wide_limits()).await.unwrap();
        let scope = Scope::new("POST /big", "u");
        let key = Key::new(incompressible(3 * 1024, 1));
        let response = incompressible(4 << 20, 2);
        let r = acquired(a.reserve(&scope, &key, b"req", LEASE).await.unwrap());
        assert!(matches!(
            b.reserve(&scope, &key, b"req", LEASE).await.unwrap(),
            ReserveOutcome::InProgress { .. }
        ));
        b.complete(&r, response.clone()).await.unwrap();
        for store in [&a, &b] {
            assert_eq!(
                store.reserve(&scope, &key, b"req", LEASE).await.unwrap(),
                ReserveOutcome::Completed(response.clone())
            );
        }
        // A key that differs from it in its last byte only is another record.
        let mut near = incompressible(3 * 1024, 1);
        *near.last_mut().unwrap() ^= 1;
        acquired(
            a.reserve(&scope, &Key::new(near), b"req", LEASE)
                .await
                .unwrap(),
        );

        // The longest operation and principal, with the longest key, through execute too.
        let scope = Scope::new(
            incompressible(Limits::MAX_PART_LEN, 3),
            incompressible(Limits::MAX_PART_LEN, 4),
        );
        let key = Key::new(incompressible(16 * 1024, 5));
        let ran = a
            .execute(&scope, &key, b"req", |_tx: &mut PgTx<'_>| {
                Box::pin(async { Ok::<_, PgError>(Outcome::Completed(b"done".to_vec())) })
            })
            .await
            .unwrap();
        assert!(
            matches!(ran, idemdb::ExecuteOutcome::Executed(_)),
            "{ran:?}"
        );
        assert_eq!(
            b.reserve(&scope, &key, b"req", LEASE).await.unwrap(),
            ReserveOutcome::Completed(b"done".to_vec())
        );
    });
}

#[test]
fn limits_a_record_could_not_hold_are_refused_at_connect() {
    runtime().block_on(async {
        let url = fresh_database_url();
        let mut limits = Limits::default();
        limits.max_response_len = Limits::MAX_RESPONSE_LEN;
        let refused = instance(&url, limits).await;
        assert!(
            matches!(
                refused,
                Err(PgError::Refused(Refusal::InvalidInput(
                    InputError::TooLong { .. }
                )))
            ),
            "{:?}",
            refused.err()
        );
    });
}
