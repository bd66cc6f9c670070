//! An expired record is never served as live, even before its partition is dropped; the TTL
//! counts from the record's last change and can differ per operation.

mod common;

use idemdb::Refusal;
use std::time::Duration;

use common::{LEASE, T0, acquired, minutes, setup_retained};
use idemdb::{Error, ExecuteOutcome, Key, Outcome, ReserveOutcome, Scope};

fn min(n: u64) -> Duration {
    Duration::from_secs(60 * n)
}

#[test]
fn a_finished_record_counts_until_its_ttl_then_is_absent() {
    let (_dir, clock, db) = setup_retained(minutes(10));
    let (scope, key) = (Scope::new("op", "p"), Key::new("k"));
    let r = acquired(db.reserve(&scope, &key, b"a", LEASE).unwrap());
    clock.advance(min(3));
    db.complete(&r, b"first".to_vec()).unwrap();
    let rec = db.get(&scope, &key).unwrap().unwrap();
    assert_eq!(
        rec.expires_at,
        T0 + 3 * 60_000 + 10 * 60_000,
        "counted from the last change"
    );

    clock.set(rec.expires_at - 1);
    assert_eq!(
        db.reserve(&scope, &key, b"a", LEASE).unwrap(),
        ReserveOutcome::Completed(b"first".to_vec())
    );
    assert_eq!(
        db.reserve(&scope, &key, b"other", LEASE).unwrap(),
        ReserveOutcome::Mismatch
    );

    // Expired: not served, although no compaction ran and the record is still on disk.
    clock.set(rec.expires_at);
    assert_eq!(db.get(&scope, &key).unwrap(), None);
    assert_eq!(db.stats().stored_records, 1);
    // Another payload is not a mismatch any more: the old record does not count.
    let again = acquired(db.reserve(&scope, &key, b"other", LEASE).unwrap());
    assert!(again.is_beyond_horizon(), "an expired copy was there");
    assert!(again.token() > r.token());
    db.complete(&again, b"second".to_vec()).unwrap();
    assert_eq!(
        db.reserve(&scope, &key, b"other", LEASE).unwrap(),
        ReserveOutcome::Completed(b"second".to_vec())
    );
    assert_eq!(db.stats().beyond_horizon, 1);
}

#[test]
fn each_operation_expires_after_its_own_ttl() {
    let retention = minutes(10).operation_ttl("redrive", min(120));
    let (_dir, clock, db) = setup_retained(retention);
    let short = (Scope::new("client", "p"), Key::new("k"));
    let long = (Scope::new("redrive", "p"), Key::new("k"));
    for (scope, key) in [&short, &long] {
        let r = acquired(db.reserve(scope, key, b"x", LEASE).unwrap());
        db.complete(&r, b"done".to_vec()).unwrap();
    }
    clock.advance(min(11));
    assert_eq!(db.get(&short.0, &short.1).unwrap(), None);
    assert_eq!(
        db.reserve(&long.0, &long.1, b"x", LEASE).unwrap(),
        ReserveOutcome::Completed(b"done".to_vec())
    );
    clock.advance(min(110));
    assert_eq!(db.get(&long.0, &long.1).unwrap(), None);
    assert_eq!(db.retention().ttl_for(b"redrive"), min(120));
}

#[test]
fn an_abandoned_reservation_expires_a_ttl_after_its_lease() {
    let (_dir, clock, db) = setup_retained(minutes(10));
    let (scope, key) = (Scope::new("op", "p"), Key::new("k"));
    let stale = acquired(db.reserve(&scope, &key, b"a", LEASE).unwrap());
    // Past the lease but within lease + TTL: a takeover, with the record's history.
    clock.advance(LEASE + min(1));
    let taken = acquired(db.reserve(&scope, &key, b"a", LEASE).unwrap());
    assert!(taken.is_takeover() && !taken.is_beyond_horizon());
    assert_eq!(taken.attempt(), 2);
    // Abandoned again, past lease + TTL: the record no longer counts at all.
    clock.advance(LEASE + min(10));
    assert_eq!(db.get(&scope, &key).unwrap(), None);
    assert!(matches!(
        db.complete(&taken, b"late".to_vec()),
        Err(Error::Refused(Refusal::UnknownRecord))
    ));
    let fresh = acquired(db.reserve(&scope, &key, b"a", LEASE).unwrap());
    assert!(!fresh.is_takeover() && fresh.is_beyond_horizon());
    assert_eq!(fresh.attempt(), 1);
    // Both earlier owners are refused.
    assert!(matches!(
        db.complete(&stale, b"x".to_vec()),
        Err(Error::Refused(Refusal::Fenced { .. }))
    ));
    assert!(matches!(
        db.complete(&taken, b"x".to_vec()),
        Err(Error::Refused(Refusal::Fenced { .. }))
    ));
    db.complete(&fresh, b"ok".to_vec()).unwrap();
    // The compactor sweeps an abandoned IN_PROGRESS record once it expired.
    let other = Key::new("abandoned");
    let _ = acquired(db.reserve(&scope, &other, b"a", LEASE).unwrap());
    clock.advance(LEASE + min(10));
    let report = db.compact_now().unwrap();
    assert_eq!(report.in_flight_expired, 1);
    assert_eq!(db.stats().in_flight_records, 0);
}

#[test]
fn execute_sees_beyond_horizon_in_its_transaction() {
    let (_dir, clock, db) = setup_retained(minutes(10));
    let (scope, key) = (Scope::new("op", "p"), Key::new("k"));
    let run = |db: &idemdb::IdemDb| {
        db.execute(&scope, &key, b"x", |tx| {
            let flag = if tx.is_beyond_horizon() {
                "late"
            } else {
                "fresh"
            };
            Ok::<_, Error>(Outcome::Completed(flag.into()))
        })
        .unwrap()
    };
    assert_eq!(
        run(&db),
        ExecuteOutcome::Executed(Outcome::Completed(b"fresh".to_vec()))
    );
    assert_eq!(run(&db), ExecuteOutcome::Completed(b"fresh".to_vec()));
    clock.advance(min(10));
    assert_eq!(
        run(&db),
        ExecuteOutcome::Executed(Outcome::Completed(b"late".to_vec()))
    );
    assert_eq!(db.stats().beyond_horizon, 1);
}
