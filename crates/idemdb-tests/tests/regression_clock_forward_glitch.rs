//! Regression (issue 11, defect 3b): one record finished while the clock was far ahead put
//! every later record into that future partition, and compaction dropped nothing until the
//! glitch's date, so the file grew without bound. A record now goes to its own window's
//! partition; only what was written during the glitch waits for the glitch's date.

mod common;

use common::{T0, acquired, minutes, setup_retained};

use std::time::Duration;

use idemdb::{Key, Scope};

const MINUTE: u64 = 60_000;
const LEASE: Duration = Duration::from_secs(5);

#[test]
fn a_forward_clock_glitch_holds_back_only_its_own_partition() {
    // 1-minute partitions, TTL 1 min.
    let (_dir, clock, db) = setup_retained(minutes(1));
    let scope = Scope::new("POST /events", "tenant-1");
    let finish = |name: String| {
        let res = acquired(db.reserve(&scope, &Key::new(name), b"e", LEASE).unwrap());
        db.complete(&res, b"ok".to_vec()).unwrap();
    };

    finish("before".into());
    // The clock jumps ten days ahead for one write, then comes back.
    clock.set(T0 + 10 * 24 * 60 * MINUTE);
    finish("during".into());
    clock.set(T0 + 1_000);

    // Ordinary traffic over the next hour, a record every minute.
    for minute in 1..=60 {
        clock.set(T0 + minute * MINUTE);
        finish(format!("after-{minute}"));
    }
    assert!(db.stats().clock_behind >= 1, "the anomaly is counted");

    // Everything but the glitch's record has expired: its partitions are dropped.
    clock.set(T0 + 63 * MINUTE);
    let report = db.compact_now().unwrap();
    assert_eq!(report.records_expired, 61, "{report:?}");
    let stats = db.stats();
    assert_eq!(stats.partitions, 1, "only the glitch's partition is left");
    assert_eq!(stats.stored_records, 1);
    assert!(db.get(&scope, &Key::new("during")).unwrap().is_some());
}
