//! Time is the database's: instances whose clocks are off by ±10 min or ±1 day (through the
//! builder's `clock`, which is what the system clock goes through too) run each intent once,
//! replay every answer and drop no live partition, because every lease and expiry is judged
//! and written by the server's clock. Each defect of issue 21 found from outside has its row.
//!
//! | failure | test |
//! |---|---|
//! | an instance ahead judges a live lease over (takeover, double execution) | `a_skewed_instance_does_not_take_over_a_live_lease` |
//! | an instance behind writes an expiry in the past (lost replay) | `a_skewed_writer_s_answer_replays_on_every_instance` |
//! | an instance ahead drops a live partition; the others' writes break | `a_skewed_compactor_drops_no_live_partition_and_the_others_keep_writing` |
//! | leases and expiry still end, by the server's clock, for a skewed instance | `leases_and_partitions_end_by_the_server_s_clock_whatever_the_instances_say` |
//! | the server's clock steps back after a partition was dropped | `a_write_into_a_partition_dropped_elsewhere_makes_it_again` |
//! | another instance dropped a partition this one knew | `a_write_into_a_partition_dropped_elsewhere_makes_it_again` |

mod common;

use idemdb_postgres::Refusal;
use std::sync::Arc;
use std::time::Duration;

use common::stores::{Skewed, admin, fresh_database_url, runtime};
use common::{T0, acquired};
use idemdb_postgres::{
    Clock, Key, PgStore, RecordState, ReserveOutcome, Retention, Scope, Store, SystemClock,
};
use idemdb_testkit::postgres::ServerClock;

const MINUTE: i64 = 60_000;
const DAY: i64 = 24 * 60 * MINUTE;
/// The instances' clocks, as far off as the issue asks.
const SKEWS: [i64; 4] = [10 * MINUTE, -10 * MINUTE, DAY, -DAY];
const LEASE: Duration = Duration::from_secs(30);
const TTL: Duration = Duration::from_secs(300);
const WIDTH: Duration = Duration::from_secs(60);

/// An instance on `url` whose clock is off by `skew_ms`: TTL 5 min, partitions 1 min wide,
/// no background compactor.
async fn instance(url: &str, skew_ms: i64) -> Arc<PgStore> {
    let retention = Retention::default()
        .ttl(TTL)
        .partition_width(WIDTH)
        .compact_interval(None);
    let builder = PgStore::builder(url)
        .unwrap()
        .clock(Skewed(skew_ms))
        .retention(retention);
    builder.migrate().await.unwrap();
    Arc::new(builder.connect().await.unwrap())
}

fn scope() -> Scope {
    Scope::new("POST /payments", "user-7")
}

/// The instance really runs on its skewed clock: it sees it against the server's.
fn assert_skew(store: &PgStore, skew_ms: i64) {
    let seen = store.stats().clock_skew_ms;
    assert!(
        (seen - skew_ms).abs() < 5_000,
        "instance skew {seen} ms, expected about {skew_ms}"
    );
}

#[test]
fn a_skewed_instance_does_not_take_over_a_live_lease() {
    runtime().block_on(async {
        let url = fresh_database_url();
        let a = instance(&url, 0).await;
        for skew in SKEWS {
            let b = instance(&url, skew).await;
            let key = Key::new(format!("lease-{skew}"));
            let on_a = acquired(a.reserve(&scope(), &key, b"req", LEASE).await.unwrap());
            // A's lease is live by the server's clock: B waits, whatever its own clock says.
            match b.reserve(&scope(), &key, b"req", LEASE).await.unwrap() {
                ReserveOutcome::InProgress { retry_after } => assert!(
                    retry_after <= LEASE && retry_after > LEASE - Duration::from_secs(10),
                    "skew {skew}: retry after {retry_after:?}"
                ),
                other => panic!("skew {skew}: B got {other:?} while A's lease is live"),
            }
            assert_skew(&b, skew);
            // A is not fenced: its answer is the one stored, and B replays it.
            a.complete(&on_a, b"A's answer".to_vec()).await.unwrap();
            assert_eq!(
                b.reserve(&scope(), &key, b"req", LEASE).await.unwrap(),
                ReserveOutcome::Completed(b"A's answer".to_vec()),
                "skew {skew}"
            );
            // And the lease B is given is the server's: about LEASE from now.
            let fresh = Key::new(format!("lease-b-{skew}"));
            let on_b = acquired(b.reserve(&scope(), &fresh, b"req", LEASE).await.unwrap());
            let now = i64::try_from(SystemClock.now_ms()).unwrap();
            let lease_end = i64::try_from(on_b.lease_expires_at()).unwrap();
            assert!(
                (lease_end - now - 30_000).abs() < 5_000,
                "skew {skew}: lease ends {} ms from now",
                lease_end - now
            );
        }
    });
}

#[test]
fn a_skewed_writer_s_answer_replays_on_every_instance() {
    runtime().block_on(async {
        let url = fresh_database_url();
        let a = instance(&url, 0).await;
        for skew in SKEWS {
            let b = instance(&url, skew).await;
            let key = Key::new(format!("expiry-{skew}"));
            let on_b = acquired(b.reserve(&scope(), &key, b"req", LEASE).await.unwrap());
            b.complete(&on_b, b"B's answer".to_vec()).await.unwrap();
            // The expiry is the server's time + TTL, not B's.
            let rec = a.get(&scope(), &key).await.unwrap().expect("stored");
            assert_eq!(rec.state, RecordState::Completed);
            assert_eq!(rec.expires_at - rec.updated_at, 300_000, "skew {skew}");
            let now = SystemClock.now_ms();
            assert!(
                rec.updated_at.abs_diff(now) < 5_000,
                "skew {skew}: updated at {} ms from the server's now",
                i128::from(rec.updated_at) - i128::from(now)
            );
            for store in [&a, &b] {
                assert_eq!(
                    store.reserve(&scope(), &key, b"req", LEASE).await.unwrap(),
                    ReserveOutcome::Completed(b"B's answer".to_vec()),
                    "skew {skew}: the duplicate must replay B's answer"
                );
            }
        }
    });
}

#[test]
fn a_skewed_compactor_drops_no_live_partition_and_the_others_keep_writing() {
    runtime().block_on(async {
        let url = fresh_database_url();
        let a = instance(&url, 0).await;
        for (i, skew) in SKEWS.into_iter().enumerate() {
            let b = instance(&url, skew).await;
            let key = Key::new(format!("answer-{i}"));
            let on_a = acquired(a.reserve(&scope(), &key, b"req", LEASE).await.unwrap());
            a.complete(&on_a, b"A's answer".to_vec()).await.unwrap();
            let report = b.compact_now().await.unwrap();
            assert_eq!(report.partitions_dropped, 0, "skew {skew}: {report:?}");
            let rec = a.get(&scope(), &key).await.unwrap();
            assert_eq!(
                rec.map(|r| r.response),
                Some(b"A's answer".to_vec()),
                "skew {skew}"
            );
            // A's later writes, fresh keys included, still find their partitions.
            let fresh = Key::new(format!("after-{i}"));
            let r = acquired(a.reserve(&scope(), &fresh, b"req", LEASE).await.unwrap());
            a.complete(&r, b"later".to_vec()).await.unwrap();
            assert_eq!(
                a.reserve(&scope(), &key, b"req", LEASE).await.unwrap(),
                ReserveOutcome::Completed(b"A's answer".to_vec())
            );
        }
    });
}

#[test]
fn leases_and_partitions_end_by_the_server_s_clock_whatever_the_instances_say() {
    runtime().block_on(async {
        let url = fresh_database_url();
        let a = instance(&url, DAY).await;
        let b = instance(&url, -DAY).await;
        let server = ServerClock::freeze(&url, T0).unwrap();
        let key = Key::new("dead-owner");
        let on_a = acquired(a.reserve(&scope(), &key, b"req", LEASE).await.unwrap());
        assert_eq!(on_a.lease_expires_at(), T0 + 30_000);
        assert!(matches!(
            b.reserve(&scope(), &key, b"req", LEASE).await.unwrap(),
            ReserveOutcome::InProgress { .. }
        ));
        // The server's clock passes the lease: B, a day behind, takes over; A is fenced.
        server.set(T0 + 30_000).unwrap();
        let on_b = acquired(b.reserve(&scope(), &key, b"req", LEASE).await.unwrap());
        assert!(on_b.is_takeover() && on_b.token() > on_a.token());
        assert_eq!(on_b.lease_expires_at(), T0 + 60_000);
        assert!(matches!(
            a.complete(&on_a, b"late".to_vec()).await,
            Err(idemdb_postgres::PgError::Refused(Refusal::Fenced { .. }))
        ));
        b.complete(&on_b, b"B".to_vec()).await.unwrap();
        // Past the TTL by the server's clock, B (a day behind) drops the partition, and the
        // record is gone for A (a day ahead) too.
        server.advance(TTL + WIDTH * 2).unwrap();
        assert_eq!(a.get(&scope(), &key).await.unwrap(), None);
        let report = b.compact_now().await.unwrap();
        assert!(report.partitions_dropped >= 1, "{report:?}");
        acquired(a.reserve(&scope(), &key, b"req", LEASE).await.unwrap());
    });
}

#[test]
fn a_write_into_a_partition_dropped_elsewhere_makes_it_again() {
    runtime().block_on(async {
        let url = fresh_database_url();
        let a = instance(&url, 0).await;
        let b = instance(&url, 0).await;
        let server = ServerClock::freeze(&url, T0).unwrap();
        // A writes: it has made (and knows) the partitions around T0 + TTL.
        let first = acquired(
            a.reserve(&scope(), &Key::new("first"), b"req", LEASE)
                .await
                .unwrap(),
        );
        a.complete(&first, b"1".to_vec()).await.unwrap();
        // The server's clock runs a day ahead; B's compactor drops them.
        server.advance(Duration::from_secs(24 * 3600)).unwrap();
        assert!(b.compact_now().await.unwrap().partitions_dropped >= 1);
        // The clock steps back: A's next writes land in the partitions it thinks exist.
        server.set(T0).unwrap();
        let second = acquired(
            a.reserve(&scope(), &Key::new("second"), b"req", LEASE)
                .await
                .unwrap(),
        );
        a.complete(&second, b"2".to_vec()).await.unwrap();
        let mut third = acquired(
            a.reserve(&scope(), &Key::new("third"), b"req", LEASE)
                .await
                .unwrap(),
        );
        // Extends move the record through partitions A makes and then knows; the one it
        // left is dropped by someone else (an operator, another build).
        let ten_minutes = Duration::from_secs(600);
        a.extend(&mut third, ten_minutes).await.unwrap();
        a.extend(&mut third, Duration::from_secs(3600))
            .await
            .unwrap();
        let left = T0 + 600_000 + 300_000;
        let start = left - left % 60_000;
        let name = format!("idemdb_records_{start}_{}", start + 60_000);
        admin(&url)
            .await
            .batch_execute(&format!(
                "ALTER TABLE idemdb_records DETACH PARTITION {name}; DROP TABLE {name}"
            ))
            .await
            .unwrap();
        // A's extend back into it makes it again.
        a.extend(&mut third, ten_minutes).await.unwrap();
        assert_eq!(third.lease_expires_at(), T0 + 600_000);
        a.complete(&third, b"3".to_vec()).await.unwrap();
        for (key, answer) in [("second", b"2"), ("third", b"3")] {
            assert_eq!(
                b.reserve(&scope(), &Key::new(key), b"req", LEASE)
                    .await
                    .unwrap(),
                ReserveOutcome::Completed(answer.to_vec())
            );
        }
    });
}
