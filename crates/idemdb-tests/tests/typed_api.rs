//! The typed layer: responses as serde types, stored as JSON.

mod common;

use common::{LEASE, setup};
use idemdb::Refusal;

use std::time::Duration;

use idemdb::{Error, Key, RecordState, Reservation, ReserveOutcome, Scope, TypedOutcome};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Receipt {
    order: u64,
    items: Vec<String>,
    note: Option<String>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
enum Declined {
    InsufficientFunds { missing_cents: u64 },
    Fraud,
}

fn scope() -> Scope {
    Scope::new("POST /purchases", "user-9")
}

fn acquired(outcome: TypedOutcome<Receipt, Declined>) -> Reservation {
    match outcome {
        TypedOutcome::Acquired(r) => r,
        other => panic!("expected Acquired, got {other:?}"),
    }
}

#[test]
fn completed_round_trip() {
    let (_dir, _clock, db) = setup();
    let purchases = db.typed::<Receipt, Declined>();
    let key = Key::new("p1");
    let receipt = Receipt {
        order: 7,
        items: vec!["book".into(), "ünïcödé \u{0}".into()],
        note: None,
    };
    let r = acquired(purchases.reserve(&scope(), &key, b"req", LEASE).unwrap());
    assert_eq!(r.attempt(), 1);
    purchases.complete(&r, &receipt).unwrap();

    assert_eq!(
        purchases.reserve(&scope(), &key, b"req", LEASE).unwrap(),
        TypedOutcome::Completed(receipt.clone())
    );
    // Stored as JSON bytes, visible to the untyped API too.
    let rec = db.get(&scope(), &key).unwrap().unwrap();
    assert_eq!(rec.state, RecordState::Completed);
    assert_eq!(rec.response, serde_json::to_vec(&receipt).unwrap());
    assert_eq!(
        db.reserve(&scope(), &key, b"req", LEASE).unwrap(),
        ReserveOutcome::Completed(serde_json::to_vec(&receipt).unwrap())
    );
}

#[test]
fn failed_round_trip() {
    let (_dir, _clock, db) = setup();
    let purchases = db.typed::<Receipt, Declined>();
    let key = Key::new("p2");
    let declined = Declined::InsufficientFunds { missing_cents: 250 };
    let r = acquired(purchases.reserve(&scope(), &key, b"req", LEASE).unwrap());
    purchases.fail(&r, &declined).unwrap();
    assert_eq!(
        purchases.reserve(&scope(), &key, b"req", LEASE).unwrap(),
        TypedOutcome::Failed(declined.clone())
    );
    let rec = db.get(&scope(), &key).unwrap().unwrap();
    assert_eq!(rec.state, RecordState::Failed);
    assert_eq!(rec.response, serde_json::to_vec(&declined).unwrap());

    let key = Key::new("p3");
    let r = acquired(purchases.reserve(&scope(), &key, b"req", LEASE).unwrap());
    purchases.fail(&r, &Declined::Fraud).unwrap();
    assert_eq!(
        purchases.reserve(&scope(), &key, b"req", LEASE).unwrap(),
        TypedOutcome::Failed(Declined::Fraud)
    );
}

#[test]
fn mismatch_and_in_progress() {
    let (_dir, clock, db) = setup();
    let purchases = db.typed::<Receipt, Declined>();
    let key = Key::new("p4");
    let r = acquired(purchases.reserve(&scope(), &key, b"req", LEASE).unwrap());
    clock.advance(Duration::from_millis(4_321));
    assert_eq!(
        purchases.reserve(&scope(), &key, b"req", LEASE).unwrap(),
        TypedOutcome::InProgress {
            retry_after: Duration::from_millis(25_679)
        }
    );
    assert_eq!(
        purchases.reserve(&scope(), &key, b"other", LEASE).unwrap(),
        TypedOutcome::Mismatch
    );
    purchases
        .complete(
            &r,
            &Receipt {
                order: 1,
                items: vec![],
                note: Some("n".into()),
            },
        )
        .unwrap();
    assert_eq!(
        purchases.reserve(&scope(), &key, b"other", LEASE).unwrap(),
        TypedOutcome::Mismatch
    );
}

#[test]
fn typed_owner_calls_are_fenced_like_untyped_ones() {
    let (_dir, clock, db) = setup();
    let purchases = db.typed::<Receipt, Declined>();
    let key = Key::new("p5");
    let a = acquired(purchases.reserve(&scope(), &key, b"req", LEASE).unwrap());
    clock.advance(LEASE);
    let b = acquired(purchases.reserve(&scope(), &key, b"req", LEASE).unwrap());
    assert!(b.is_takeover());
    let receipt = Receipt {
        order: 2,
        items: vec!["x".into()],
        note: None,
    };
    match purchases.complete(&a, &receipt) {
        Err(Error::Refused(Refusal::Fenced { presented, current })) => {
            assert_eq!((presented, current), (a.token(), b.token()));
        }
        other => panic!("expected Fenced, got {other:?}"),
    }
    match purchases.fail(&a, &Declined::Fraud) {
        Err(Error::Refused(Refusal::Fenced { .. })) => {}
        other => panic!("expected Fenced, got {other:?}"),
    }
    assert_eq!(
        db.get(&scope(), &key).unwrap().unwrap().state,
        RecordState::InProgress
    );
    purchases.complete(&b, &receipt).unwrap();
    assert_eq!(
        purchases.reserve(&scope(), &key, b"req", LEASE).unwrap(),
        TypedOutcome::Completed(receipt)
    );
}

#[test]
fn a_stored_response_of_another_shape_is_a_codec_error() {
    let (_dir, _clock, db) = setup();
    let key = Key::new("p6");
    let r = match db.reserve(&scope(), &key, b"req", LEASE).unwrap() {
        ReserveOutcome::Acquired(r) => r,
        other => panic!("{other:?}"),
    };
    db.complete(&r, b"\xff not json".to_vec()).unwrap();
    match db
        .typed::<Receipt, Declined>()
        .reserve(&scope(), &key, b"req", LEASE)
    {
        Err(Error::Codec(_)) => {}
        other => panic!("expected Codec, got {other:?}"),
    }
    // Valid JSON, wrong shape.
    let key = Key::new("p7");
    let r = match db.reserve(&scope(), &key, b"req", LEASE).unwrap() {
        ReserveOutcome::Acquired(r) => r,
        other => panic!("{other:?}"),
    };
    db.fail(&r, br#"{"order": 1}"#.to_vec()).unwrap();
    match db
        .typed::<Receipt, Declined>()
        .reserve(&scope(), &key, b"req", LEASE)
    {
        Err(Error::Codec(_)) => {}
        other => panic!("expected Codec, got {other:?}"),
    }
    // The bytes themselves are intact.
    assert_eq!(
        db.reserve(&scope(), &key, b"req", LEASE).unwrap(),
        ReserveOutcome::Failed(br#"{"order": 1}"#.to_vec())
    );
}

#[test]
fn one_type_for_both_outcomes_by_default() {
    let (_dir, _clock, db) = setup();
    let messages: idemdb::Typed<'_, String> = db.typed::<String, String>();
    let key = Key::new("p8");
    let r = match messages.reserve(&scope(), &key, b"req", LEASE).unwrap() {
        TypedOutcome::Acquired(r) => r,
        other => panic!("{other:?}"),
    };
    messages.fail(&r, &"nope".to_string()).unwrap();
    assert_eq!(
        messages.reserve(&scope(), &key, b"req", LEASE).unwrap(),
        TypedOutcome::Failed("nope".to_string())
    );
}
