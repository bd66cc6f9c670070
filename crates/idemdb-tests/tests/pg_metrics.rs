//! Feature `metrics` over PostgreSQL: `PgStore` exports what it counts under the embedded
//! engine's names, so that one dashboard reads either store; its commits feed the same
//! commit metrics, and its pool four gauges.
//!
//! The recorder is the process's global one (the embedded engine commits on its writer's
//! thread, the PostgreSQL store on the runtime's), so the tests of this file run one at a
//! time, each reading the deltas since its first snapshot.

mod common;

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, OnceLock};

use common::stores::{SCRIPT_WRITES, embedded, postgres, postgres_with, runtime, script};
use common::{LEASE, acquired};
use idemdb_postgres::{ExecuteOutcome, Key, Outcome, PgError, PgTx, Retention, Scope, Store};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

/// The global recorder's snapshotter, and the right to read it alone.
fn recorder() -> (MutexGuard<'static, ()>, &'static Snapshotter) {
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    static SNAPSHOTTER: OnceLock<Snapshotter> = OnceLock::new();
    let guard = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let snapshotter = SNAPSHOTTER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        metrics::set_global_recorder(recorder).unwrap();
        snapshotter
    });
    // Counters and histograms are drained by each snapshot: what follows is a delta.
    snapshotter.snapshot();
    (guard, snapshotter)
}

/// What a snapshot holds, by name: counters, gauges, and the samples of each histogram.
#[derive(Debug, Default)]
struct Seen {
    counters: BTreeMap<String, u64>,
    gauges: BTreeMap<String, f64>,
    histograms: BTreeMap<String, Vec<f64>>,
}

impl Seen {
    fn of(snapshotter: &Snapshotter) -> Seen {
        let mut seen = Seen::default();
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            let name = key.key().name().to_string();
            match value {
                // A counter registered but not incremented since the last snapshot.
                DebugValue::Counter(0) => {}
                DebugValue::Counter(n) => {
                    seen.counters.insert(name, n);
                }
                DebugValue::Gauge(v) => {
                    seen.gauges.insert(name, v.0);
                }
                DebugValue::Histogram(samples) if samples.is_empty() => {}
                DebugValue::Histogram(samples) => {
                    let samples = samples.into_iter().map(|s| s.0).collect();
                    seen.histograms.insert(name, samples);
                }
            }
        }
        seen
    }

    /// The pool's gauges (a gauge keeps its last value across snapshots: other tests' outbox
    /// gauges stay in the recorder).
    fn pool_gauges(&self) -> BTreeMap<String, f64> {
        let mut gauges = self.gauges.clone();
        gauges.retain(|name, _| name.starts_with("idemdb_pool_"));
        gauges
    }

    fn samples(&self, name: &str) -> usize {
        self.histograms.get(name).map_or(0, Vec::len)
    }
}

#[test]
fn a_dashboard_reads_both_stores_alike() {
    let (_one, snapshotter) = recorder();
    let rt = runtime();
    let on_postgres = rt.block_on(async {
        let under = postgres().await;
        script(&under).await;
        let seen = Seen::of(snapshotter);
        let stats = under.db.stats();
        assert_eq!(stats.commits, SCRIPT_WRITES, "{stats:?}");
        assert_eq!(stats.commit_latency_us.count, SCRIPT_WRITES, "{stats:?}");
        seen
    });
    let mut on_embedded = {
        let under = embedded();
        rt.block_on(script(&under));
        Seen::of(snapshotter)
    };
    // The embedded file's own housekeeping, which has no PostgreSQL counterpart: its
    // checkpoints, taken by age or size whenever they fall due.
    on_embedded.counters.remove("idemdb_checkpoints_total");
    on_embedded
        .histograms
        .remove("idemdb_checkpoint_latency_seconds");

    let want: BTreeMap<String, u64> = [
        ("idemdb_acquired_total", 5),
        ("idemdb_takeovers_total", 1),
        ("idemdb_replays_completed_total", 1),
        ("idemdb_replays_failed_total", 1),
        ("idemdb_mismatches_total", 1),
        ("idemdb_in_progress_total", 1),
        ("idemdb_fenced_total", 1),
        ("idemdb_finished_total", 3),
        ("idemdb_releases_total", 1),
        ("idemdb_commits_total", SCRIPT_WRITES),
    ]
    .into_iter()
    .map(|(name, n)| (name.to_string(), n))
    .collect();
    // The same names and deltas from both: what a dashboard of either store plots.
    assert_eq!(on_embedded.counters, want, "embedded");
    assert_eq!(on_postgres.counters, want, "PostgreSQL");
    // The same histograms, one sample per commit in each.
    let names = |seen: &Seen| seen.histograms.keys().cloned().collect::<Vec<_>>();
    assert_eq!(names(&on_postgres), names(&on_embedded));
    for seen in [&on_embedded, &on_postgres] {
        for histogram in ["idemdb_commit_latency_seconds", "idemdb_commit_batch_size"] {
            assert_eq!(seen.samples(histogram), SCRIPT_WRITES as usize, "{seen:?}");
        }
    }
}

#[test]
fn each_durable_write_is_one_commit_sample() {
    let (_one, snapshotter) = recorder();
    runtime().block_on(async {
        let under = postgres().await;
        let db = &*under.db;
        let scope = Scope::new("POST /orders", "u1");
        let before = Seen::of(snapshotter);
        assert_eq!(before.samples("idemdb_commit_latency_seconds"), 0);

        script(&under).await;
        let mut writes = SCRIPT_WRITES;
        // An execution commits once; its replay, nothing.
        for _ in 0..2 {
            let out = db
                .execute(&scope, &Key::new("e"), b"req", |_tx: &mut PgTx<'_>| {
                    Box::pin(async { Ok::<_, PgError>(Outcome::Completed(b"e".to_vec())) })
                })
                .await
                .unwrap();
            assert!(matches!(
                out,
                ExecuteOutcome::Executed(_) | ExecuteOutcome::Completed(_)
            ));
        }
        writes += 1;
        // A complete_with commits once; a stale owner's is fenced before any commit.
        let r = acquired(
            db.reserve(&scope, &Key::new("w"), b"req", LEASE)
                .await
                .unwrap(),
        );
        db.complete_with(&r, b"201".to_vec(), |_tx: &mut PgTx<'_>| {
            Box::pin(async { Ok::<_, PgError>(()) })
        })
        .await
        .unwrap();
        writes += 2;
        assert!(
            db.complete_with(&r, b"again".to_vec(), |_tx: &mut PgTx<'_>| {
                Box::pin(async { Ok::<_, PgError>(()) })
            })
            .await
            .is_err()
        );

        let seen = Seen::of(snapshotter);
        let stats = db.stats();
        let latencies = &seen.histograms["idemdb_commit_latency_seconds"];
        assert_eq!(latencies.len() as u64, writes, "{seen:?}");
        assert!(
            latencies.iter().all(|s| *s > 0.0 && *s < 60.0),
            "{latencies:?}"
        );
        assert_eq!(seen.counters["idemdb_commits_total"], writes);
        assert!(
            seen.histograms["idemdb_commit_batch_size"]
                .iter()
                .all(|n| *n == 1.0)
        );
        assert_eq!(stats.commits, writes, "{stats:?}");
        assert_eq!(stats.commit_latency_us.count, writes, "{stats:?}");
        // The histogram of PgStats holds the same commits as the metric, in µs.
        let metric_us: f64 = latencies.iter().sum::<f64>() * 1e6;
        let stats_us = stats.commit_latency_us.sum as f64;
        assert!(
            (metric_us - stats_us).abs() <= writes as f64 + 1.0,
            "{metric_us} µs against {stats_us} µs"
        );
    });
}

#[test]
fn the_pool_gauges_follow_the_pool() {
    let (_one, snapshotter) = recorder();
    runtime().block_on(async {
        let under = postgres_with(Retention::default(), 3).await;
        let db = &*under.db;
        let scope = Scope::new("POST /orders", "u1");
        // Two connections held by the service's own statements while a reservation runs: the
        // gauges set when the reservation answered show them in use, without a stats() call.
        let held = [
            db.pool().get().await.unwrap(),
            db.pool().get().await.unwrap(),
        ];
        Seen::of(snapshotter);
        acquired(
            db.reserve(&scope, &Key::new("g"), b"req", LEASE)
                .await
                .unwrap(),
        );
        let gauges = Seen::of(snapshotter).pool_gauges();
        let want = |connections: f64, idle: f64| -> BTreeMap<String, f64> {
            [
                ("idemdb_pool_connections", connections),
                ("idemdb_pool_max", 3.0),
                ("idemdb_pool_idle", idle),
                ("idemdb_pool_waiting", 0.0),
            ]
            .into_iter()
            .map(|(name, v)| (name.to_string(), v))
            .collect()
        };
        assert_eq!(gauges, want(3.0, 1.0));

        // Given back: stats() sets the gauges as it reports the pool.
        drop(held);
        let stats = db.stats();
        assert_eq!(
            (stats.pool_connections, stats.pool_max, stats.pool_idle),
            (3, 3, 3)
        );
        assert_eq!(Seen::of(snapshotter).pool_gauges(), want(3.0, 3.0));
    });
}

#[test]
fn a_poll_is_one_commit_whose_batch_is_the_messages_it_executed() {
    let (_one, snapshotter) = recorder();
    runtime().block_on(async {
        let under = postgres().await;
        let db = &*under.db;
        let poll = |ids: &'static [&'static str]| {
            ids.iter().map(|id| {
                let handler = idemdb_postgres::pg_handler(|_tx: &mut PgTx<'_>| {
                    Box::pin(async { Ok::<_, PgError>(()) })
                });
                (*id, handler)
            })
        };
        let answers = db.consume_batch("q", poll(&["m1", "m2"])).await.unwrap();
        assert!(answers.iter().all(Result::is_ok), "{answers:?}");
        Seen::of(snapshotter);
        let commits_before = db.stats().commits;

        // Three new messages and one seen: one commit holding three writes.
        let answers = db
            .consume_batch("q", poll(&["m2", "m3", "m4", "m5"]))
            .await
            .unwrap();
        assert!(answers.iter().all(Result::is_ok), "{answers:?}");
        let seen = Seen::of(snapshotter);
        assert_eq!(seen.counters["idemdb_commits_total"], 1, "{seen:?}");
        assert_eq!(seen.histograms["idemdb_commit_batch_size"], [3.0]);
        assert_eq!(seen.samples("idemdb_commit_latency_seconds"), 1);
        assert_eq!(db.stats().commits, commits_before + 1);

        // A poll of duplicates only writes nothing: no commit counted.
        let answers = db.consume_batch("q", poll(&["m1", "m3"])).await.unwrap();
        assert!(answers.iter().all(Result::is_ok), "{answers:?}");
        let seen = Seen::of(snapshotter);
        assert!(
            !seen.counters.contains_key("idemdb_commits_total"),
            "{seen:?}"
        );
        assert_eq!(db.stats().commits, commits_before + 1);
    });
}

#[test]
fn the_outbox_exports_its_counts_gauges_and_latency_under_the_embedded_engines_names() {
    use idemdb_postgres::{DispatchOptions, Message, OutboxMessage, PgDispatcher, PublishError};
    let (_one, snapshotter) = recorder();
    runtime().block_on(async {
        let under = postgres().await;
        let db = &*under.db;
        for (i, payload) in ["ok-1", "poison", "ok-2"].iter().enumerate() {
            let m = Message::new("orders", payload.as_bytes().to_vec());
            let _ = db
                .execute(
                    &Scope::new("o", "p"),
                    &Key::new(format!("k{i}")),
                    b"r",
                    |tx: &mut PgTx<'_>| {
                        let m = m.clone();
                        Box::pin(async move {
                            tx.stage(m).await?;
                            Ok::<_, PgError>(Outcome::Completed(b"ok".to_vec()))
                        })
                    },
                )
                .await
                .unwrap();
        }
        let publisher = |m: OutboxMessage| {
            std::future::ready(match m.payload.as_slice() {
                b"poison" => Err(PublishError::Permanent("refused".into())),
                _ => Ok(()),
            })
        };
        let options = DispatchOptions::default().idle_check(std::time::Duration::from_millis(5));
        let dispatcher = PgDispatcher::start(db, publisher, options);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            let s = db.stats().outbox;
            if s.delivered == 2 && s.parked_since_open == 1 {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "{s:?}");
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
        dispatcher.stop().await;
        // The gauges are set by a count of the table.
        let stats = db.outbox_stats().await.unwrap();
        assert_eq!((stats.backlog, stats.parked), (0, 1));
        let seen = Seen::of(snapshotter);
        assert_eq!(seen.counters.get("idemdb_outbox_delivered_total"), Some(&2));
        assert_eq!(seen.counters.get("idemdb_outbox_parked_total"), Some(&1));
        assert_eq!(seen.gauges.get("idemdb_outbox_backlog"), Some(&0.0));
        assert_eq!(seen.gauges.get("idemdb_outbox_parked"), Some(&1.0));
        assert_eq!(
            seen.gauges
                .get("idemdb_outbox_oldest_undelivered_age_seconds"),
            Some(&0.0)
        );
        assert_eq!(seen.samples("idemdb_outbox_publish_latency_seconds"), 2);
    });
}
