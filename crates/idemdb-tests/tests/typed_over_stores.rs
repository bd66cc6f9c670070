//! The typed layer over any `Store`: the same scenario on the embedded engine and on
//! PostgreSQL (`Typed::over`).

mod common;

use common::stores::Under;
use common::{LEASE, T0};
use idemdb::{Key, Scope, Store, Typed, TypedOutcome};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Debug, PartialEq)]
struct Receipt {
    order: u64,
}

#[derive(Serialize, Deserialize, Debug, PartialEq)]
struct Declined {
    reason: String,
}

async fn typed_responses_replay_decoded<S: Store>(under: Under<S>) {
    let purchases = Typed::<Receipt, Declined, S>::over(&*under.db);
    let scope = Scope::new("purchase", "u1");
    let (paid, declined) = (Key::new("paid"), Key::new("declined"));
    let TypedOutcome::Acquired(r) = purchases
        .reserve_async(&scope, &paid, b"req", LEASE)
        .await
        .unwrap()
    else {
        panic!("a fresh key is acquired");
    };
    assert_eq!(r.lease_expires_at(), T0 + 30_000);
    assert_eq!(
        purchases
            .reserve_async(&scope, &paid, b"req", LEASE)
            .await
            .unwrap(),
        TypedOutcome::InProgress { retry_after: LEASE }
    );
    purchases
        .complete_async(&r, &Receipt { order: 7 })
        .await
        .unwrap();
    assert_eq!(
        purchases
            .reserve_async(&scope, &paid, b"req", LEASE)
            .await
            .unwrap(),
        TypedOutcome::Completed(Receipt { order: 7 })
    );
    assert_eq!(
        purchases
            .reserve_async(&scope, &paid, b"other", LEASE)
            .await
            .unwrap(),
        TypedOutcome::Mismatch
    );
    let TypedOutcome::Acquired(r) = purchases
        .reserve_async(&scope, &declined, b"req", LEASE)
        .await
        .unwrap()
    else {
        panic!("a fresh key is acquired");
    };
    let why = Declined {
        reason: "insufficient funds".into(),
    };
    purchases.fail_async(&r, &why).await.unwrap();
    assert_eq!(
        purchases
            .reserve_async(&scope, &declined, b"req", LEASE)
            .await
            .unwrap(),
        TypedOutcome::Failed(why)
    );
    // The stored bytes are the JSON, readable by an untyped caller.
    let rec = under.db.get(&scope, &paid).await.unwrap().unwrap();
    assert_eq!(rec.response, br#"{"order":7}"#);
}

on_both_stores!(typed_responses_replay_decoded);
