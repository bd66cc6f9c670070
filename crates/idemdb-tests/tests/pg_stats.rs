//! `PgStore::stats`: what this instance's callers were told, and its pool.

mod common;

use std::time::Duration;

use common::stores::{postgres_with, runtime};
use common::{LEASE, acquired};
use idemdb::{Error, ExecuteOutcome, Key, Outcome, PgTx, ReserveOutcome, Retention, Scope, Store};

#[test]
fn every_answer_is_counted_once() {
    runtime().block_on(async {
        let under = postgres_with(Retention::default(), 4).await;
        let (db, clock) = (&under.db, &under.clock);
        let scope = Scope::new("POST /purchases", "u1");
        let k = |n: &str| Key::new(n);

        let r1 = acquired(db.reserve(&scope, &k("1"), b"req", LEASE).await.unwrap());
        assert!(matches!(
            db.reserve(&scope, &k("1"), b"req", LEASE).await.unwrap(),
            ReserveOutcome::InProgress { .. }
        ));
        assert_eq!(
            db.reserve(&scope, &k("1"), b"other", LEASE).await.unwrap(),
            ReserveOutcome::Mismatch
        );
        db.complete(&r1, b"ok".to_vec()).await.unwrap();
        assert!(matches!(
            db.reserve(&scope, &k("1"), b"req", LEASE).await.unwrap(),
            ReserveOutcome::Completed(_)
        ));
        let r2 = acquired(db.reserve(&scope, &k("2"), b"req", LEASE).await.unwrap());
        db.fail(&r2, b"declined".to_vec()).await.unwrap();
        assert!(matches!(
            db.reserve(&scope, &k("2"), b"req", LEASE).await.unwrap(),
            ReserveOutcome::Failed(_)
        ));
        let r3 = acquired(db.reserve(&scope, &k("3"), b"req", LEASE).await.unwrap());
        db.release(&r3).await.unwrap();
        // A takeover, and the stale owner fenced.
        let r4 = acquired(db.reserve(&scope, &k("4"), b"req", LEASE).await.unwrap());
        clock.advance(LEASE + Duration::from_millis(1));
        let r4b = acquired(db.reserve(&scope, &k("4"), b"req", LEASE).await.unwrap());
        assert!(r4b.is_takeover());
        assert!(matches!(
            db.complete(&r4, b"late".to_vec()).await,
            Err(Error::Fenced { .. })
        ));
        // One execution and its replay.
        for _ in 0..2 {
            let out = db
                .execute(&scope, &k("5"), b"req", |_tx: &mut PgTx<'_>| {
                    Box::pin(async move { Ok::<_, Error>(Outcome::Completed(b"5".to_vec())) })
                })
                .await
                .unwrap();
            assert!(matches!(
                out,
                ExecuteOutcome::Executed(_) | ExecuteOutcome::Completed(_)
            ));
        }

        let stats = db.stats();
        let counted = [
            ("acquired", stats.acquired, 6),
            ("takeovers", stats.takeovers, 1),
            ("replays_completed", stats.replays_completed, 2),
            ("replays_failed", stats.replays_failed, 1),
            ("mismatches", stats.mismatches, 1),
            ("in_progress", stats.in_progress, 1),
            ("fenced", stats.fenced, 1),
            ("finished", stats.finished, 3),
            ("releases", stats.releases, 1),
        ];
        for (what, got, want) in counted {
            assert_eq!(got, want, "{what}: {stats:?}");
        }
        assert_eq!(stats.beyond_horizon, 0);
        assert_eq!(stats.outcome_unknown, 0);
        assert_eq!(stats.pool_max, 4);
        assert!(stats.pool_connections >= 1 && stats.pool_connections <= 4);
        assert_eq!(stats.pool_waiting, 0);
    });
}
