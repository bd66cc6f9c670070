//! Regression (issue 11, defect 3): when one compaction pass swept several abandoned
//! IN_PROGRESS records, every swept key was recognised until the latest horizon of the whole
//! sweep. Each is recognised until its own: lease end + factor × TTL (docs/semantics.md).

mod common;

use common::{T0, acquired, minutes, reopenable};

use std::time::Duration;

use idemdb::{IdemDb, Key, ManualClock, Scope};

const MINUTE: u64 = 60_000;

#[test]
fn each_swept_reservation_is_recognised_until_its_own_horizon() {
    let (_dir, path, clock) = reopenable();
    // TTL 1 min, horizon factor 4: recognised until lease end + 4 min.
    let db = common::open_retained(&path, &clock, minutes(1));
    let scope = Scope::new("POST /jobs", "tenant-1");
    let early = Key::new("early");
    let late = Key::new("late");

    // Two owners that vanish: leases end at T0 + 10 s and T0 + 70 s.
    acquired(
        db.reserve(&scope, &early, b"e", Duration::from_secs(10))
            .unwrap(),
    );
    acquired(
        db.reserve(&scope, &late, b"l", Duration::from_secs(70))
            .unwrap(),
    );
    let early_end = T0 + 10_000;
    let late_end = T0 + 70_000;

    // One pass sweeps both (each expired a TTL after its lease).
    clock.set(late_end + MINUTE);
    assert_eq!(db.compact_now().unwrap().in_flight_expired, 2);

    let flagged = |db: &IdemDb, key: &Key, clock: &ManualClock, at: u64| {
        clock.set(at);
        let res = acquired(
            db.reserve(&scope, key, b"again", Duration::from_secs(1))
                .unwrap(),
        );
        db.release(&res).unwrap();
        res.is_beyond_horizon()
    };
    assert!(flagged(&db, &early, &clock, early_end + 4 * MINUTE - 1));
    assert!(
        !flagged(&db, &early, &clock, early_end + 4 * MINUTE),
        "the early key is recognised past its own horizon"
    );
    assert!(flagged(&db, &late, &clock, late_end + 4 * MINUTE - 1));
    assert!(!flagged(&db, &late, &clock, late_end + 4 * MINUTE));

    // The same holds after a reopen, from the horizon rows on disk.
    db.close();
    clock.set(T0);
    let db = common::open_retained(&path, &clock, minutes(1));
    assert!(flagged(&db, &early, &clock, early_end + 4 * MINUTE - 1));
    assert!(!flagged(&db, &early, &clock, early_end + 4 * MINUTE));
    assert!(flagged(&db, &late, &clock, late_end + 4 * MINUTE - 1));
}
