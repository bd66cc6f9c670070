//! `PgStore::stats`: what this instance's callers were told, and its pool.

mod common;

use common::stores::{postgres_with, runtime, script};
use idemdb_postgres::{ExecuteOutcome, Key, Outcome, PgError, PgTx, Retention, Scope};

#[test]
fn every_answer_is_counted_once() {
    runtime().block_on(async {
        let under = postgres_with(Retention::default(), 4).await;
        script(&under).await;
        let (db, scope) = (&under.db, Scope::new("POST /purchases", "u1"));
        // One execution and its replay.
        for _ in 0..2 {
            let out = db
                .execute(&scope, &Key::new("5"), b"req", |_tx: &mut PgTx<'_>| {
                    Box::pin(async move { Ok::<_, PgError>(Outcome::Completed(b"5".to_vec())) })
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
            ("finished", stats.finished, 4),
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
