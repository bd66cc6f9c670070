//! Retention over PostgreSQL: expiry on every read, partitions by `expires_at` dropped whole by
//! the compactor (never a `DELETE` sweep), and what a key that comes back is told.

mod common;

use idemdb_postgres::Refusal;
use std::time::Duration;

use common::stores::{Under, postgres_with, runtime};
use common::{LEASE, acquired};
use idemdb_postgres::{BeyondHorizonPolicy, Key, PgStore, ReserveOutcome, Retention, Scope, Store};

const TTL: Duration = Duration::from_secs(600);
const WIDTH: Duration = Duration::from_secs(60);

fn retention() -> Retention {
    Retention::default().ttl(TTL).partition_width(WIDTH)
}

fn scope() -> Scope {
    Scope::new("POST /purchases", "user-42")
}

/// idemdb's partitions, and the rows in each.
async fn partitions(under: &Under<PgStore>) -> Vec<(String, i64)> {
    let client = under.db.pool().get().await.unwrap();
    let names: Vec<String> = client
        .query(
            "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
             WHERE i.inhparent = 'idemdb_records'::regclass ORDER BY 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut out = Vec::new();
    for name in names {
        let n: i64 = client
            .query_one(&format!("SELECT count(*) FROM {name}"), &[])
            .await
            .unwrap()
            .get(0);
        out.push((name, n));
    }
    out
}

#[test]
fn records_expire_on_read_and_their_partitions_are_dropped_whole() {
    runtime().block_on(async {
        let under = postgres_with(retention(), 4).await;
        let (db, clock) = (&under.db, &under.clock);
        for i in 0..50 {
            let key = Key::new(format!("old-{i}"));
            let r = acquired(db.reserve(&scope(), &key, b"req", LEASE).await.unwrap());
            db.complete(&r, b"ok".to_vec()).await.unwrap();
        }
        let old = partitions(&under).await;
        let old_rows: i64 = old.iter().map(|p| p.1).sum();
        assert_eq!(old_rows, 50);

        // Two windows later, a second generation.
        clock.advance(WIDTH * 2);
        for i in 0..20 {
            let key = Key::new(format!("new-{i}"));
            let r = acquired(db.reserve(&scope(), &key, b"req", LEASE).await.unwrap());
            db.complete(&r, b"ok".to_vec()).await.unwrap();
        }
        // The old records expire exactly TTL after their completion: absent on every read
        // from then on, before any compaction.
        clock.advance(TTL - WIDTH * 2);
        let old_key = Key::new("old-0");
        assert_eq!(db.get(&scope(), &old_key).await.unwrap(), None);
        // A partition goes once its window's end has passed: every row in it expired.
        let nothing = db.compact_now().await.unwrap();
        assert_eq!(
            partitions(&under).await.iter().map(|p| p.1).sum::<i64>(),
            70,
            "{nothing:?}"
        );
        clock.advance(WIDTH);
        let before = partitions(&under).await;

        let report = db.compact_now().await.unwrap();
        assert!(report.partitions_dropped >= 1, "{report:?}");
        let after = partitions(&under).await;
        // Every row of the dropped partitions had expired; none of the live ones were touched.
        let rows_after: i64 = after.iter().map(|p| p.1).sum();
        assert_eq!(rows_after, 20, "before {before:?}, after {after:?}");
        for i in 0..20 {
            assert_eq!(
                db.reserve(&scope(), &Key::new(format!("new-{i}")), b"req", LEASE)
                    .await
                    .unwrap(),
                ReserveOutcome::Completed(b"ok".to_vec())
            );
        }
        // Partitions for the coming writes were made ahead of them.
        assert!(report.partitions_created >= 1, "{report:?}");
        // The key of a dropped record starts afresh.
        let again = acquired(db.reserve(&scope(), &old_key, b"req", LEASE).await.unwrap());
        assert_eq!(again.attempt(), 1);
    });
}

#[test]
fn an_expired_record_still_stored_is_flagged_or_refused_beyond_the_horizon() {
    runtime().block_on(async {
        for policy in [BeyondHorizonPolicy::Flag, BeyondHorizonPolicy::Refuse] {
            let under = postgres_with(retention().beyond_horizon(policy), 4).await;
            let (db, clock) = (&under.db, &under.clock);
            let key = Key::new("redrive");
            let r = acquired(db.reserve(&scope(), &key, b"req", LEASE).await.unwrap());
            db.complete(&r, b"first".to_vec()).await.unwrap();
            clock.advance(TTL);
            let outcome = db.reserve(&scope(), &key, b"req", LEASE).await.unwrap();
            match policy {
                BeyondHorizonPolicy::Flag => {
                    let again = acquired(outcome);
                    assert!(again.is_beyond_horizon());
                    assert!(again.token() > r.token());
                    assert_eq!(again.attempt(), 1);
                }
                _ => {
                    assert_eq!(outcome, ReserveOutcome::BeyondHorizon);
                    assert_eq!(
                        db.get(&scope(), &key).await.unwrap(),
                        None,
                        "nothing written"
                    );
                }
            }
        }
    });
}

#[test]
fn an_owner_whose_record_expired_is_told_it_is_unknown() {
    runtime().block_on(async {
        let under = postgres_with(retention(), 4).await;
        let (db, clock) = (&under.db, &under.clock);
        let r = acquired(
            db.reserve(&scope(), &Key::new("k"), b"req", LEASE)
                .await
                .unwrap(),
        );
        // An IN_PROGRESS record lives a TTL past its lease.
        clock.advance(LEASE + TTL);
        assert!(matches!(
            db.complete(&r, b"late".to_vec()).await,
            Err(idemdb_postgres::PgError::Refused(Refusal::UnknownRecord))
        ));
    });
}
