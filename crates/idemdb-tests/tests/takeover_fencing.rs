//! The full takeover story with a manual clock: a stalled owner, a successor, a late write.

mod common;

use common::{T0, acquired, setup};
use idemdb::Refusal;

use std::time::Duration;

use idemdb::{Error, Key, RecordState, ReserveOutcome, Scope};

const LEASE: Duration = Duration::from_secs(10);

#[test]
fn stalled_owner_is_taken_over_and_its_late_complete_is_fenced() {
    let (_dir, clock, db) = setup();
    let scope = Scope::new("POST /payments", "merchant-9");
    let key = Key::new("pay-0001");
    let payload = br#"{"amount":1000,"currency":"EUR"}"#;

    // A reserves and stalls.
    let a = acquired(db.reserve(&scope, &key, payload, LEASE).unwrap());
    assert_eq!(a.attempt(), 1);
    assert!(!a.is_takeover());

    // While A's lease is live, B is told to wait.
    clock.advance(Duration::from_secs(4));
    assert_eq!(
        db.reserve(&scope, &key, payload, LEASE).unwrap(),
        ReserveOutcome::InProgress {
            retry_after: Duration::from_secs(6)
        }
    );

    // The lease runs out: B takes over.
    clock.advance(Duration::from_millis(6_001));
    let b = acquired(db.reserve(&scope, &key, payload, LEASE).unwrap());
    assert!(b.is_takeover());
    assert_eq!(b.attempt(), 2);
    assert!(b.token() > a.token());
    assert_eq!(b.lease_expires_at(), T0 + 10_001 + 10_000);

    // A third caller now waits on B's lease.
    assert_eq!(
        db.reserve(&scope, &key, payload, LEASE).unwrap(),
        ReserveOutcome::InProgress { retry_after: LEASE }
    );

    // A wakes up and tries to record its result: refused, nothing changes.
    let before = db.get(&scope, &key).unwrap();
    match db.complete(&a, b"A's late answer".to_vec()) {
        Err(Error::Refused(Refusal::Fenced { presented, current })) => {
            assert_eq!(presented, a.token());
            assert_eq!(current, b.token());
        }
        other => panic!("expected Fenced, got {other:?}"),
    }
    assert_eq!(db.get(&scope, &key).unwrap(), before);

    // B completes.
    clock.advance(Duration::from_secs(1));
    db.complete(&b, b"B's answer \x00\xff".to_vec()).unwrap();
    let rec = db.get(&scope, &key).unwrap().unwrap();
    assert_eq!(rec.state, RecordState::Completed);
    assert_eq!(rec.token, b.token());
    assert_eq!(rec.attempts, 2);
    assert_eq!(rec.created_at, T0);
    assert_eq!(rec.updated_at, T0 + 11_001);
    assert_eq!(rec.response, b"B's answer \x00\xff".to_vec());

    // A third caller gets B's bytes, not A's.
    assert_eq!(
        db.reserve(&scope, &key, payload, LEASE).unwrap(),
        ReserveOutcome::Completed(b"B's answer \x00\xff".to_vec())
    );

    // A's other late calls are fenced too, and still change nothing.
    let before = db.get(&scope, &key).unwrap();
    let mut a2 = a.clone();
    for result in [
        db.fail(&a, b"A failed".to_vec()),
        db.release(&a),
        db.extend(&mut a2, LEASE),
        db.complete(&a, b"A again".to_vec()),
    ] {
        match result {
            Err(Error::Refused(Refusal::Fenced { presented, current })) => {
                assert_eq!((presented, current), (a.token(), b.token()));
            }
            other => panic!("expected Fenced, got {other:?}"),
        }
    }
    assert_eq!(db.get(&scope, &key).unwrap(), before);
    assert_eq!(
        db.reserve(&scope, &key, payload, LEASE).unwrap(),
        ReserveOutcome::Completed(b"B's answer \x00\xff".to_vec())
    );
}

#[test]
fn chain_of_takeovers_fences_every_earlier_owner() {
    let (_dir, clock, db) = setup();
    let scope = Scope::new("job", "");
    let key = Key::new("nightly");

    let mut owners = vec![acquired(db.reserve(&scope, &key, b"j", LEASE).unwrap())];
    for n in 2..=5u32 {
        clock.advance(LEASE);
        let next = acquired(db.reserve(&scope, &key, b"j", LEASE).unwrap());
        assert!(next.is_takeover());
        assert_eq!(next.attempt(), n);
        assert!(next.token() > owners.last().unwrap().token());
        owners.push(next);
    }
    let last = owners.pop().unwrap();
    for stale in &owners {
        match db.fail(stale, b"stale".to_vec()) {
            Err(Error::Refused(Refusal::Fenced { presented, current })) => {
                assert_eq!(presented, stale.token());
                assert_eq!(current, last.token());
            }
            other => panic!("expected Fenced, got {other:?}"),
        }
    }
    db.fail(&last, b"given up".to_vec()).unwrap();
    assert_eq!(
        db.reserve(&scope, &key, b"j", LEASE).unwrap(),
        ReserveOutcome::Failed(b"given up".to_vec())
    );
    assert_eq!(db.get(&scope, &key).unwrap().unwrap().attempts, 5);
}
