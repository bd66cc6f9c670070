//! A key that comes back after its record was dropped is still recognised for the extended
//! horizon (4 TTLs by default), across restarts: flagged, or refused by policy.

mod common;

use common::{LEASE, T0, acquired, minutes, open_retained};
use idemdb::{
    BeyondHorizonPolicy, Error, ExecuteOutcome, Key, ManualClock, Outcome, ReserveOutcome, Scope,
};

const MIN: u64 = 60_000;

fn finish(db: &idemdb::IdemDb, scope: &Scope, key: &Key) {
    let r = acquired(db.reserve(scope, key, b"x", LEASE).unwrap());
    db.complete(&r, b"done".to_vec()).unwrap();
}

#[test]
fn a_dropped_key_is_flagged_for_four_ttls_even_after_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let start = T0 - T0 % MIN;
    let clock = ManualClock::new(start);
    let scope = Scope::new("op", "p");
    let keys: Vec<Key> = (0..50).map(|i| Key::new(format!("k{i}"))).collect();
    {
        let db = open_retained(&path, &clock, minutes(5));
        keys.iter().for_each(|k| finish(&db, &scope, k));
        clock.set(start + 6 * MIN);
        let report = db.compact_now().unwrap();
        assert_eq!(report.records_expired, 50);
        assert_eq!(db.stats().horizon_keys, 50);
        // A key never seen is not flagged.
        assert!(
            !acquired(db.reserve(&scope, &Key::new("new"), b"x", LEASE).unwrap())
                .is_beyond_horizon()
        );
    }
    // The horizon set is on disk: recognised after a restart.
    let db = open_retained(&path, &clock, minutes(5));
    assert_eq!(db.stats().horizon_keys, 50);
    let r = acquired(
        db.reserve(&scope, &keys[0], b"other payload", LEASE)
            .unwrap(),
    );
    assert!(r.is_beyond_horizon());
    db.complete(&r, b"again".to_vec()).unwrap();
    // Another principal's same key is another record: never seen.
    let other = acquired(
        db.reserve(&Scope::new("op", "q"), &keys[1], b"x", LEASE)
            .unwrap(),
    );
    assert!(!other.is_beyond_horizon());
    // Recognised until the window's end + 4 TTLs = 21 min, then retired.
    clock.set(start + 21 * MIN - 1);
    assert!(acquired(db.reserve(&scope, &keys[2], b"x", LEASE).unwrap()).is_beyond_horizon());
    clock.set(start + 21 * MIN);
    assert!(!acquired(db.reserve(&scope, &keys[3], b"x", LEASE).unwrap()).is_beyond_horizon());
    let report = db.compact_now().unwrap();
    assert_eq!(report.horizon_sets_retired, 1);
    // This pass also dropped k0's second record and swept the two abandoned reservations
    // ("new" and the other principal's): their keys start a horizon of their own.
    assert_eq!(
        (report.partitions_dropped, report.in_flight_expired),
        (1, 2)
    );
    assert_eq!(db.stats().horizon_keys, 3);
    assert_eq!(db.stats().beyond_horizon, 2);
    drop(db);
    let db = open_retained(&path, &clock, minutes(5));
    assert_eq!(
        db.stats().horizon_keys,
        3,
        "the retired set is gone from disk"
    );
    assert!(!acquired(db.reserve(&scope, &keys[4], b"x", LEASE).unwrap()).is_beyond_horizon());
    assert!(acquired(db.reserve(&scope, &keys[0], b"x", LEASE).unwrap()).is_beyond_horizon());
}

#[test]
fn the_refuse_policy_answers_beyond_horizon_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let start = T0 - T0 % MIN;
    let clock = ManualClock::new(start);
    let retention = minutes(5).beyond_horizon(BeyondHorizonPolicy::Refuse);
    let db = open_retained(&dir.path().join("db"), &clock, retention);
    let scope = Scope::new("op", "p");
    let (dropped, expired) = (Key::new("dropped"), Key::new("expired"));
    finish(&db, &scope, &dropped);
    clock.set(start + 6 * MIN);
    assert_eq!(db.compact_now().unwrap().records_expired, 1);
    finish(&db, &scope, &expired);
    clock.set(start + 12 * MIN);
    // Dropped (recognised from its tag) and expired-but-stored: both refused.
    for key in [&dropped, &expired] {
        assert_eq!(
            db.reserve(&scope, key, b"x", LEASE).unwrap(),
            ReserveOutcome::BeyondHorizon
        );
        let ran = db
            .execute(&scope, key, b"x", |_| -> Result<Outcome, Error> {
                panic!("a refused execute must not run")
            })
            .unwrap();
        assert_eq!(ran, ExecuteOutcome::BeyondHorizon);
        assert_eq!(db.get(&scope, key).unwrap(), None);
    }
    assert_eq!(
        db.stats().stored_records,
        1,
        "nothing written for the refusals"
    );
    assert_eq!(db.stats().beyond_horizon, 4);
    assert!(matches!(
        db.reserve(&scope, &Key::new("fresh"), b"x", LEASE).unwrap(),
        ReserveOutcome::Acquired(_)
    ));
}

#[test]
fn a_horizon_factor_of_zero_turns_recognition_off() {
    let dir = tempfile::tempdir().unwrap();
    let start = T0 - T0 % MIN;
    let clock = ManualClock::new(start);
    let db = open_retained(&dir.path().join("db"), &clock, minutes(5).horizon_factor(0));
    let (scope, key) = (Scope::new("op", "p"), Key::new("k"));
    finish(&db, &scope, &key);
    clock.set(start + 6 * MIN);
    db.compact_now().unwrap();
    assert_eq!(db.stats().horizon_keys, 0);
    assert!(!acquired(db.reserve(&scope, &key, b"x", LEASE).unwrap()).is_beyond_horizon());
}
