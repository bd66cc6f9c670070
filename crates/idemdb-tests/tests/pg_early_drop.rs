//! The compactor drops a partition of `idemdb_records` (a range of `expires_at`) only once its
//! window has **ended** by the server's clock, when every row in it has expired; never once it
//! has merely started, while records in it still answer their duplicates. Each test shows a
//! live answer that a drop at the window's start would lose: the duplicate would be acquired
//! again and the intent run twice.

mod common;

use std::time::Duration;

use common::stores::{Under, postgres_with, runtime};
use common::{LEASE, T0, acquired};
use idemdb_postgres::{Key, PgStore, ReserveOutcome, Retention, Scope, Store};

const SECOND: u64 = 1_000;
const MINUTE: u64 = 60 * SECOND;
const HOUR: u64 = 60 * MINUTE;

/// An answer no text encoding could alter: it must come back byte for byte.
const ANSWER: &[u8] = b"\x00\xffreceipt 17\r\n";

fn scope() -> Scope {
    Scope::new("POST /purchases", "user-42")
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap()
}

/// The rows in idemdb's partition for `expires_at` in `start..end`; `None` once it is gone.
async fn partition_rows(under: &Under<PgStore>, start: u64, end: u64) -> Option<i64> {
    let name = format!("idemdb_records_{start}_{end}");
    let client = under.db.pool().get().await.unwrap();
    let attached = client
        .query_opt(
            "SELECT 1 FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
             WHERE i.inhparent = 'idemdb_records'::regclass AND c.relname = $1",
            &[&name],
        )
        .await
        .unwrap();
    attached?;
    let count = format!("SELECT count(*) FROM {name}");
    Some(client.query_one(&count, &[]).await.unwrap().get(0))
}

/// Completes `key` with [`ANSWER`] at the store's time now.
async fn complete(db: &PgStore, key: &Key) {
    let r = acquired(db.reserve(&scope(), key, b"req", LEASE).await.unwrap());
    db.complete(&r, ANSWER.to_vec()).await.unwrap();
}

/// A duplicate of `key` replays [`ANSWER`], and `get` finds it: the record is live and stored.
async fn assert_replays(db: &PgStore, key: &Key, when: &str) {
    assert_eq!(
        db.reserve(&scope(), key, b"req", LEASE).await.unwrap(),
        ReserveOutcome::Completed(ANSWER.to_vec()),
        "{when}: the duplicate of a live record must get its stored answer back, not run again"
    );
    let stored = db.get(&scope(), key).await.unwrap().map(|r| r.response);
    assert_eq!(
        stored.as_deref(),
        Some(ANSWER),
        "{when}: get must find the live record"
    );
}

/// A TTL shorter than the partition width (here the 1 h that `PgStore` takes for a
/// `Retention` without one) puts a record completed just now into the partition whose window
/// has already started: a compaction pass must keep it until the window ends, and the answer
/// replays throughout its TTL. At the window's end, the pass drops the partition of the
/// records that all expired and keeps the next one, which starts at that very moment and
/// holds the answer completed in the last millisecond of the window before.
///
/// Catches the mutant that drops a partition once its window has started (`start <= now`
/// instead of `end <= now` in `Partitions::drop_expired`): the answer completed a minute
/// before the pass, four minutes short of its expiry, is dropped and its duplicate acquired.
#[test]
fn a_partition_whose_window_has_not_ended_keeps_its_live_answers() {
    runtime().block_on(async {
        const TTL: Duration = Duration::from_secs(300);
        let retention = Retention::default()
            .ttl(TTL)
            .partition_width(Duration::from_millis(HOUR));
        let under = postgres_with(retention, 4).await;
        let (db, clock) = (&*under.db, &under.clock);
        // The first hour window after T0: [h, h + 1 h), by expires_at.
        let h = T0 - T0 % HOUR + HOUR;

        clock.set(h + SECOND);
        let early = Key::new("early");
        complete(db, &early).await;
        let stored = db.get(&scope(), &early).await.unwrap().unwrap();
        assert_eq!(stored.expires_at, h + SECOND + ms(TTL));
        assert_eq!(partition_rows(&under, h, h + HOUR).await, Some(1));

        // A minute in: the window [h, h + 1 h) has started and will not end for 59 min.
        clock.set(h + MINUTE);
        db.compact_now().await.unwrap();
        assert_replays(
            db,
            &early,
            "a pass a minute after the answer, 4 min before expiry",
        )
        .await;
        assert_eq!(partition_rows(&under, h, h + HOUR).await, Some(1));

        // The last millisecond of the window: this answer expires in the next one.
        clock.set(h + HOUR - 1);
        let late = Key::new("late");
        complete(db, &late).await;
        assert_eq!(
            partition_rows(&under, h + HOUR, h + 2 * HOUR).await,
            Some(1)
        );

        // Right at the window's end: its partition (every row expired) goes; the next one,
        // started this very millisecond, stays with the answer completed 1 ms ago.
        clock.set(h + HOUR);
        let report = db.compact_now().await.unwrap();
        assert_eq!(
            partition_rows(&under, h, h + HOUR).await,
            None,
            "the ended window's partition is dropped: {report:?}"
        );
        assert!(report.partitions_dropped >= 1, "{report:?}");
        assert_replays(
            db,
            &late,
            "a pass right after the window in which it was completed",
        )
        .await;
        assert_eq!(db.get(&scope(), &early).await.unwrap(), None);
    });
}

/// With the usual partitions narrower than the TTL, a partition is kept by its last live
/// record until the window's end: passes at the window's start and at the last millisecond
/// its last record is live both keep the answer; the first pass once the window has ended
/// (every row in it expired) drops the partition, and the key starts afresh.
///
/// Catches the mutant that drops a partition once its window has started (`start <= now`),
/// at the first pass; and, at the second, a drop while its last record is still live (e.g.
/// `end - 2 <= now`). A drop from `end - 1` on loses nothing and is not caught.
#[test]
fn the_last_live_record_of_a_window_keeps_its_partition_until_the_window_ends() {
    runtime().block_on(async {
        const TTL: Duration = Duration::from_secs(600);
        const WIDTH: u64 = MINUTE;
        let retention = Retention::default()
            .ttl(TTL)
            .partition_width(Duration::from_millis(WIDTH));
        let under = postgres_with(retention, 4).await;
        let (db, clock) = (&*under.db, &under.clock);
        // A window [start, end) of expires_at, and a record expiring in its last millisecond.
        let start = T0 + ms(TTL) - (T0 + ms(TTL)) % WIDTH + WIDTH;
        let end = start + WIDTH;

        clock.set(end - 1 - ms(TTL));
        let key = Key::new("last");
        complete(db, &key).await;
        let stored = db.get(&scope(), &key).await.unwrap().unwrap();
        assert_eq!(stored.expires_at, end - 1);
        assert_eq!(partition_rows(&under, start, end).await, Some(1));

        // The window has started; the record has a width less 1 ms to live.
        clock.set(start);
        db.compact_now().await.unwrap();
        assert_replays(db, &key, "a pass at the start of the record's window").await;

        // Its last live millisecond (expired from end - 1 on).
        clock.set(end - 2);
        db.compact_now().await.unwrap();
        assert_replays(db, &key, "a pass at the record's last live millisecond").await;
        assert_eq!(partition_rows(&under, start, end).await, Some(1));

        // The window has ended: every row in it expired, and the pass drops it.
        clock.set(end);
        let report = db.compact_now().await.unwrap();
        assert_eq!(partition_rows(&under, start, end).await, None, "{report:?}");
        let again = acquired(db.reserve(&scope(), &key, b"req", LEASE).await.unwrap());
        assert_eq!(again.attempt(), 1);
    });
}
