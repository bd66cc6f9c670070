//! complete / fail / release / extend by the owner, and their refusals for everyone else.

mod common;

use common::{LEASE, T0, acquired, setup};

use std::time::Duration;

use idemdb::{Clock, Error, IdemDb, Key, RecordState, Reservation, ReserveOutcome, Scope};

fn scope() -> Scope {
    Scope::new("POST /transfers", "acct-1")
}

#[test]
fn complete_marks_completed_with_response_and_time() {
    let (_dir, clock, db) = setup();
    let key = Key::new("k");
    let r = acquired(db.reserve(&scope(), &key, b"p", LEASE).unwrap());
    clock.advance(Duration::from_millis(1_234));
    db.complete(&r, vec![0u8, 1, 2, 0xff]).unwrap();

    let rec = db.get(&scope(), &key).unwrap().unwrap();
    assert_eq!(rec.state, RecordState::Completed);
    assert_eq!(rec.response, vec![0u8, 1, 2, 0xff]);
    assert_eq!(rec.token, r.token());
    assert_eq!(rec.created_at, T0);
    assert_eq!(rec.updated_at, T0 + 1_234);
    assert_eq!(rec.lease_expires_at, T0 + 30_000, "lease kept as last set");
    assert_eq!(rec.attempts, 1);
    assert_eq!(rec.fingerprint, db.fingerprint(b"p"));
    assert_eq!(
        db.reserve(&scope(), &key, b"p", LEASE).unwrap(),
        ReserveOutcome::Completed(vec![0u8, 1, 2, 0xff])
    );
}

#[test]
fn fail_marks_failed_with_response_and_time() {
    let (_dir, clock, db) = setup();
    let key = Key::new("k");
    let r = acquired(db.reserve(&scope(), &key, b"p", LEASE).unwrap());
    clock.advance(Duration::from_millis(77));
    db.fail(&r, b"insufficient funds".to_vec()).unwrap();

    let rec = db.get(&scope(), &key).unwrap().unwrap();
    assert_eq!(rec.state, RecordState::Failed);
    assert_eq!(rec.response, b"insufficient funds".to_vec());
    assert_eq!(rec.token, r.token());
    assert_eq!(rec.created_at, T0);
    assert_eq!(rec.updated_at, T0 + 77);
    assert_eq!(rec.attempts, 1);
    assert_eq!(
        db.reserve(&scope(), &key, b"p", LEASE).unwrap(),
        ReserveOutcome::Failed(b"insufficient funds".to_vec())
    );
}

#[test]
fn release_removes_the_record_and_the_next_reserve_acquires_afresh() {
    let (_dir, clock, db) = setup();
    let key = Key::new("k");
    let r = acquired(db.reserve(&scope(), &key, b"p", LEASE).unwrap());
    db.release(&r).unwrap();
    assert_eq!(db.get(&scope(), &key).unwrap(), None);

    clock.advance(Duration::from_secs(1));
    // Even another payload may take the released key: there is no record to mismatch.
    let again = acquired(db.reserve(&scope(), &key, b"other", LEASE).unwrap());
    assert!(again.token() > r.token());
    assert_eq!(again.attempt(), 1);
    assert!(!again.is_takeover());
    assert_eq!(again.lease_expires_at(), T0 + 1_000 + 30_000);
    let rec = db.get(&scope(), &key).unwrap().unwrap();
    assert_eq!(rec.created_at, T0 + 1_000);
    assert_eq!(rec.fingerprint, db.fingerprint(b"other"));
}

#[test]
fn extend_moves_the_lease_and_prevents_a_takeover() {
    let (_dir, clock, db) = setup();
    let key = Key::new("k");
    let mut r = acquired(db.reserve(&scope(), &key, b"p", LEASE).unwrap());
    assert_eq!(r.lease_expires_at(), T0 + 30_000);

    clock.advance(Duration::from_secs(20));
    db.extend(&mut r, Duration::from_secs(60)).unwrap();
    assert_eq!(r.lease_expires_at(), T0 + 20_000 + 60_000);
    let rec = db.get(&scope(), &key).unwrap().unwrap();
    assert_eq!(rec.state, RecordState::InProgress);
    assert_eq!(rec.lease_expires_at, T0 + 80_000);
    assert_eq!(rec.updated_at, T0 + 20_000);
    assert_eq!(rec.token, r.token());
    assert_eq!(rec.attempts, 1);

    // Past the original lease: without the extension this would be a takeover.
    clock.set(T0 + 45_000);
    assert_eq!(
        db.reserve(&scope(), &key, b"p", LEASE).unwrap(),
        ReserveOutcome::InProgress {
            retry_after: Duration::from_millis(35_000)
        }
    );
    // The owner finishes normally.
    db.complete(&r, b"long work done".to_vec()).unwrap();
    assert_eq!(
        db.reserve(&scope(), &key, b"p", LEASE).unwrap(),
        ReserveOutcome::Completed(b"long work done".to_vec())
    );
}

#[test]
fn extend_can_shorten_and_a_takeover_follows_the_new_lease() {
    let (_dir, clock, db) = setup();
    let key = Key::new("k");
    let mut r = acquired(db.reserve(&scope(), &key, b"p", LEASE).unwrap());
    clock.advance(Duration::from_secs(1));
    db.extend(&mut r, Duration::from_secs(2)).unwrap();
    assert_eq!(r.lease_expires_at(), T0 + 3_000);
    clock.set(T0 + 3_000);
    let b = acquired(db.reserve(&scope(), &key, b"p", LEASE).unwrap());
    assert!(b.is_takeover());
    assert_eq!(b.attempt(), 2);
}

/// All four owner calls of a stale reservation, each refused with `expected` and changing
/// nothing, neither the record nor the reservation.
fn assert_all_refused(
    db: &IdemDb,
    key: &Key,
    stale: &Reservation,
    expected: impl Fn(&Error) -> bool,
) {
    let before = db.get(&scope(), key).unwrap();
    let mut stale_mut = stale.clone();
    let results = [
        ("complete", db.complete(stale, b"late".to_vec())),
        ("fail", db.fail(stale, b"late".to_vec())),
        ("release", db.release(stale)),
        (
            "extend",
            db.extend(&mut stale_mut, Duration::from_secs(600)),
        ),
    ];
    for (what, result) in results {
        match result {
            Err(e) if expected(&e) => {}
            other => panic!("{what}: unexpected {other:?}"),
        }
        assert_eq!(
            db.get(&scope(), key).unwrap(),
            before,
            "{what} changed nothing"
        );
    }
    assert_eq!(&stale_mut, stale, "a refused extend leaves the reservation");
}

#[test]
fn after_a_takeover_the_old_owner_is_fenced() {
    let (_dir, clock, db) = setup();
    let key = Key::new("k");
    let a = acquired(db.reserve(&scope(), &key, b"p", LEASE).unwrap());
    clock.advance(Duration::from_secs(31));
    let b = acquired(db.reserve(&scope(), &key, b"p", LEASE).unwrap());
    assert!(b.is_takeover());

    let (presented, current) = (a.token(), b.token());
    assert_all_refused(
        &db,
        &key,
        &a,
        |e| matches!(e, Error::Fenced { presented: p, current: c } if *p == presented && *c == current),
    );
    let rec = db.get(&scope(), &key).unwrap().unwrap();
    assert_eq!(rec.state, RecordState::InProgress);
    assert_eq!(rec.token, b.token());
    assert_eq!(rec.lease_expires_at, T0 + 31_000 + 30_000);

    // The new owner is unaffected.
    db.complete(&b, b"from b".to_vec()).unwrap();
    // And the old owner is still fenced (not NotInProgress) after b finished.
    assert_all_refused(
        &db,
        &key,
        &a,
        |e| matches!(e, Error::Fenced { presented: p, current: c } if *p == presented && *c == current),
    );
    assert_eq!(
        db.reserve(&scope(), &key, b"p", LEASE).unwrap(),
        ReserveOutcome::Completed(b"from b".to_vec())
    );
}

#[test]
fn after_release_the_old_reservation_is_unknown_then_fenced() {
    let (_dir, _clock, db) = setup();
    let key = Key::new("k");
    let a = acquired(db.reserve(&scope(), &key, b"p", LEASE).unwrap());
    db.release(&a).unwrap();

    assert_all_refused(&db, &key, &a, |e| matches!(e, Error::UnknownRecord));
    assert_eq!(db.get(&scope(), &key).unwrap(), None, "nothing recreated");

    let b = acquired(db.reserve(&scope(), &key, b"p", LEASE).unwrap());
    assert!(b.token() > a.token());
    assert_eq!(b.attempt(), 1);
    assert!(!b.is_takeover());

    let (presented, current) = (a.token(), b.token());
    assert_all_refused(
        &db,
        &key,
        &a,
        |e| matches!(e, Error::Fenced { presented: p, current: c } if *p == presented && *c == current),
    );
    db.complete(&b, b"b".to_vec()).unwrap();
}

#[test]
fn finishing_twice_is_not_in_progress() {
    let (_dir, _clock, db) = setup();
    let key = Key::new("done");
    let r = acquired(db.reserve(&scope(), &key, b"p", LEASE).unwrap());
    db.complete(&r, b"first".to_vec()).unwrap();
    assert_all_refused(&db, &key, &r, |e| {
        matches!(
            e,
            Error::NotInProgress {
                state: RecordState::Completed
            }
        )
    });
    assert_eq!(
        db.get(&scope(), &key).unwrap().unwrap().response,
        b"first".to_vec()
    );

    let key = Key::new("failed");
    let r = acquired(db.reserve(&scope(), &key, b"p", LEASE).unwrap());
    db.fail(&r, b"no".to_vec()).unwrap();
    assert_all_refused(&db, &key, &r, |e| {
        matches!(
            e,
            Error::NotInProgress {
                state: RecordState::Failed
            }
        )
    });
    assert_eq!(
        db.reserve(&scope(), &key, b"p", LEASE).unwrap(),
        ReserveOutcome::Failed(b"no".to_vec())
    );
}

#[test]
fn a_lapsed_owner_not_taken_over_may_still_finish_and_extend() {
    let (_dir, clock, db) = setup();

    let key = Key::new("complete-late");
    let r = acquired(db.reserve(&scope(), &key, b"p", LEASE).unwrap());
    clock.advance(Duration::from_secs(120));
    db.complete(&r, b"late but fine".to_vec()).unwrap();
    let rec = db.get(&scope(), &key).unwrap().unwrap();
    assert_eq!(rec.state, RecordState::Completed);
    assert_eq!(rec.updated_at, T0 + 120_000);
    assert_eq!(
        db.reserve(&scope(), &key, b"p", LEASE).unwrap(),
        ReserveOutcome::Completed(b"late but fine".to_vec())
    );

    let key = Key::new("extend-late");
    let mut r = acquired(db.reserve(&scope(), &key, b"p", LEASE).unwrap());
    clock.advance(Duration::from_secs(120));
    db.extend(&mut r, LEASE).unwrap();
    assert_eq!(r.lease_expires_at(), clock.now_ms() + 30_000);
    assert_eq!(
        db.reserve(&scope(), &key, b"p", LEASE).unwrap(),
        ReserveOutcome::InProgress { retry_after: LEASE }
    );

    let key = Key::new("release-late");
    let r = acquired(db.reserve(&scope(), &key, b"p", LEASE).unwrap());
    clock.advance(Duration::from_secs(120));
    db.release(&r).unwrap();
    assert_eq!(db.get(&scope(), &key).unwrap(), None);
}

#[test]
fn owner_calls_touch_only_their_own_record() {
    let (_dir, _clock, db) = setup();
    let k1 = Key::new("one");
    let k2 = Key::new("two");
    let r1 = acquired(db.reserve(&scope(), &k1, b"p", LEASE).unwrap());
    let r2 = acquired(db.reserve(&scope(), &k2, b"p", LEASE).unwrap());
    let before2 = db.get(&scope(), &k2).unwrap();
    db.complete(&r1, b"1".to_vec()).unwrap();
    assert_eq!(db.get(&scope(), &k2).unwrap(), before2);
    db.release(&r2).unwrap();
    assert_eq!(
        db.reserve(&scope(), &k1, b"p", LEASE).unwrap(),
        ReserveOutcome::Completed(b"1".to_vec())
    );
    assert_eq!(db.get(&scope(), &k2).unwrap(), None);
}
