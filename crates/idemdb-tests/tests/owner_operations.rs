//! complete / fail / release / extend by the owner, and their refusals for everyone else: each
//! scenario runs on the embedded engine and on PostgreSQL, with the same assertions.

mod common;

use common::stores::Under;
use common::{LEASE, T0, acquired};

use std::time::Duration;

use idemdb::{Key, RecordState, Refusal, Reservation, ReserveOutcome, Scope, Store, StoreError};

fn scope() -> Scope {
    Scope::new("POST /transfers", "acct-1")
}

async fn complete_marks_completed_with_response_and_time<S: Store>(under: Under<S>) {
    let (clock, db) = (&under.clock, &*under.db);
    let key = Key::new("k");
    let r = acquired(db.reserve(&scope(), &key, b"p", LEASE).await.unwrap());
    clock.advance(Duration::from_millis(1_234));
    db.complete(&r, vec![0u8, 1, 2, 0xff]).await.unwrap();

    let rec = db.get(&scope(), &key).await.unwrap().unwrap();
    assert_eq!(rec.state, RecordState::Completed);
    assert_eq!(rec.response, vec![0u8, 1, 2, 0xff]);
    assert_eq!(rec.token, r.token());
    assert_eq!(rec.created_at, T0);
    assert_eq!(rec.updated_at, T0 + 1_234);
    assert_eq!(rec.lease_expires_at, T0 + 30_000, "lease kept as last set");
    assert_eq!(rec.attempts, 1);
    assert_eq!(rec.fingerprint, db.fingerprint(b"p"));
    assert_eq!(
        db.reserve(&scope(), &key, b"p", LEASE).await.unwrap(),
        ReserveOutcome::Completed(vec![0u8, 1, 2, 0xff])
    );
}

async fn fail_marks_failed_with_response_and_time<S: Store>(under: Under<S>) {
    let (clock, db) = (&under.clock, &*under.db);
    let key = Key::new("k");
    let r = acquired(db.reserve(&scope(), &key, b"p", LEASE).await.unwrap());
    clock.advance(Duration::from_millis(77));
    db.fail(&r, b"insufficient funds".to_vec()).await.unwrap();

    let rec = db.get(&scope(), &key).await.unwrap().unwrap();
    assert_eq!(rec.state, RecordState::Failed);
    assert_eq!(rec.response, b"insufficient funds".to_vec());
    assert_eq!(rec.token, r.token());
    assert_eq!(rec.created_at, T0);
    assert_eq!(rec.updated_at, T0 + 77);
    assert_eq!(rec.attempts, 1);
    assert_eq!(
        db.reserve(&scope(), &key, b"p", LEASE).await.unwrap(),
        ReserveOutcome::Failed(b"insufficient funds".to_vec())
    );
}

async fn release_removes_the_record_and_the_next_reserve_acquires_afresh<S: Store>(
    under: Under<S>,
) {
    let (clock, db) = (&under.clock, &*under.db);
    let key = Key::new("k");
    let r = acquired(db.reserve(&scope(), &key, b"p", LEASE).await.unwrap());
    db.release(&r).await.unwrap();
    assert_eq!(db.get(&scope(), &key).await.unwrap(), None);

    clock.advance(Duration::from_secs(1));
    // Even another payload may take the released key: there is no record to mismatch.
    let again = acquired(db.reserve(&scope(), &key, b"other", LEASE).await.unwrap());
    assert!(again.token() > r.token());
    assert_eq!(again.attempt(), 1);
    assert!(!again.is_takeover());
    assert_eq!(again.lease_expires_at(), T0 + 1_000 + 30_000);
    let rec = db.get(&scope(), &key).await.unwrap().unwrap();
    assert_eq!(rec.created_at, T0 + 1_000);
    assert_eq!(rec.fingerprint, db.fingerprint(b"other"));
}

async fn extend_moves_the_lease_and_prevents_a_takeover<S: Store>(under: Under<S>) {
    let (clock, db) = (&under.clock, &*under.db);
    let key = Key::new("k");
    let mut r = acquired(db.reserve(&scope(), &key, b"p", LEASE).await.unwrap());
    assert_eq!(r.lease_expires_at(), T0 + 30_000);

    clock.advance(Duration::from_secs(20));
    db.extend(&mut r, Duration::from_secs(60)).await.unwrap();
    assert_eq!(r.lease_expires_at(), T0 + 20_000 + 60_000);
    let rec = db.get(&scope(), &key).await.unwrap().unwrap();
    assert_eq!(rec.state, RecordState::InProgress);
    assert_eq!(rec.lease_expires_at, T0 + 80_000);
    assert_eq!(rec.updated_at, T0 + 20_000);
    assert_eq!(rec.token, r.token());
    assert_eq!(rec.attempts, 1);

    // Past the original lease: without the extension this would be a takeover.
    clock.set(T0 + 45_000);
    assert_eq!(
        db.reserve(&scope(), &key, b"p", LEASE).await.unwrap(),
        ReserveOutcome::InProgress {
            retry_after: Duration::from_millis(35_000)
        }
    );
    // The owner finishes normally.
    db.complete(&r, b"long work done".to_vec()).await.unwrap();
    assert_eq!(
        db.reserve(&scope(), &key, b"p", LEASE).await.unwrap(),
        ReserveOutcome::Completed(b"long work done".to_vec())
    );
}

async fn extend_can_shorten_and_a_takeover_follows_the_new_lease<S: Store>(under: Under<S>) {
    let (clock, db) = (&under.clock, &*under.db);
    let key = Key::new("k");
    let mut r = acquired(db.reserve(&scope(), &key, b"p", LEASE).await.unwrap());
    clock.advance(Duration::from_secs(1));
    db.extend(&mut r, Duration::from_secs(2)).await.unwrap();
    assert_eq!(r.lease_expires_at(), T0 + 3_000);
    clock.set(T0 + 3_000);
    let b = acquired(db.reserve(&scope(), &key, b"p", LEASE).await.unwrap());
    assert!(b.is_takeover());
    assert_eq!(b.attempt(), 2);
}

/// All four owner calls of a stale reservation, each refused with `expected` and changing
/// nothing, neither the record nor the reservation.
async fn assert_all_refused<S: Store>(
    db: &S,
    key: &Key,
    stale: &Reservation,
    expected: impl Fn(&Refusal) -> bool,
) {
    let before = db.get(&scope(), key).await.unwrap();
    let mut stale_mut = stale.clone();
    let results = [
        ("complete", db.complete(stale, b"late".to_vec()).await),
        ("fail", db.fail(stale, b"late".to_vec()).await),
        ("release", db.release(stale).await),
        (
            "extend",
            db.extend(&mut stale_mut, Duration::from_secs(600)).await,
        ),
    ];
    for (what, result) in results {
        match result {
            Err(e) if e.refusal().is_some_and(&expected) => {}
            other => panic!("{what}: unexpected {other:?}"),
        }
        assert_eq!(
            db.get(&scope(), key).await.unwrap(),
            before,
            "{what} changed nothing"
        );
    }
    assert_eq!(&stale_mut, stale, "a refused extend leaves the reservation");
}

async fn after_a_takeover_the_old_owner_is_fenced<S: Store>(under: Under<S>) {
    let (clock, db) = (&under.clock, &*under.db);
    let key = Key::new("k");
    let a = acquired(db.reserve(&scope(), &key, b"p", LEASE).await.unwrap());
    clock.advance(Duration::from_secs(31));
    let b = acquired(db.reserve(&scope(), &key, b"p", LEASE).await.unwrap());
    assert!(b.is_takeover());

    let (presented, current) = (a.token(), b.token());
    assert_all_refused(
        db,
        &key,
        &a,
        |e| matches!(e, Refusal::Fenced { presented: p, current: c } if *p == presented && *c == current),
    ).await;
    let rec = db.get(&scope(), &key).await.unwrap().unwrap();
    assert_eq!(rec.state, RecordState::InProgress);
    assert_eq!(rec.token, b.token());
    assert_eq!(rec.lease_expires_at, T0 + 31_000 + 30_000);

    // The new owner is unaffected.
    db.complete(&b, b"from b".to_vec()).await.unwrap();
    // And the old owner is still fenced (not NotInProgress) after b finished.
    assert_all_refused(
        db,
        &key,
        &a,
        |e| matches!(e, Refusal::Fenced { presented: p, current: c } if *p == presented && *c == current),
    ).await;
    assert_eq!(
        db.reserve(&scope(), &key, b"p", LEASE).await.unwrap(),
        ReserveOutcome::Completed(b"from b".to_vec())
    );
}

async fn after_release_the_old_reservation_is_unknown_then_fenced<S: Store>(under: Under<S>) {
    let (clock, db) = (&under.clock, &*under.db);
    let _ = clock;
    let key = Key::new("k");
    let a = acquired(db.reserve(&scope(), &key, b"p", LEASE).await.unwrap());
    db.release(&a).await.unwrap();

    assert_all_refused(db, &key, &a, |e| matches!(e, Refusal::UnknownRecord)).await;
    assert_eq!(
        db.get(&scope(), &key).await.unwrap(),
        None,
        "nothing recreated"
    );

    let b = acquired(db.reserve(&scope(), &key, b"p", LEASE).await.unwrap());
    assert!(b.token() > a.token());
    assert_eq!(b.attempt(), 1);
    assert!(!b.is_takeover());

    let (presented, current) = (a.token(), b.token());
    assert_all_refused(
        db,
        &key,
        &a,
        |e| matches!(e, Refusal::Fenced { presented: p, current: c } if *p == presented && *c == current),
    ).await;
    db.complete(&b, b"b".to_vec()).await.unwrap();
}

async fn finishing_twice_is_not_in_progress<S: Store>(under: Under<S>) {
    let (clock, db) = (&under.clock, &*under.db);
    let _ = clock;
    let key = Key::new("done");
    let r = acquired(db.reserve(&scope(), &key, b"p", LEASE).await.unwrap());
    db.complete(&r, b"first".to_vec()).await.unwrap();
    assert_all_refused(db, &key, &r, |e| {
        matches!(
            e,
            Refusal::NotInProgress {
                state: RecordState::Completed
            }
        )
    })
    .await;
    assert_eq!(
        db.get(&scope(), &key).await.unwrap().unwrap().response,
        b"first".to_vec()
    );

    let key = Key::new("failed");
    let r = acquired(db.reserve(&scope(), &key, b"p", LEASE).await.unwrap());
    db.fail(&r, b"no".to_vec()).await.unwrap();
    assert_all_refused(db, &key, &r, |e| {
        matches!(
            e,
            Refusal::NotInProgress {
                state: RecordState::Failed
            }
        )
    })
    .await;
    assert_eq!(
        db.reserve(&scope(), &key, b"p", LEASE).await.unwrap(),
        ReserveOutcome::Failed(b"no".to_vec())
    );
}

async fn a_lapsed_owner_not_taken_over_may_still_finish_and_extend<S: Store>(under: Under<S>) {
    let (clock, db) = (&under.clock, &*under.db);

    let key = Key::new("complete-late");
    let r = acquired(db.reserve(&scope(), &key, b"p", LEASE).await.unwrap());
    clock.advance(Duration::from_secs(120));
    db.complete(&r, b"late but fine".to_vec()).await.unwrap();
    let rec = db.get(&scope(), &key).await.unwrap().unwrap();
    assert_eq!(rec.state, RecordState::Completed);
    assert_eq!(rec.updated_at, T0 + 120_000);
    assert_eq!(
        db.reserve(&scope(), &key, b"p", LEASE).await.unwrap(),
        ReserveOutcome::Completed(b"late but fine".to_vec())
    );

    let key = Key::new("extend-late");
    let mut r = acquired(db.reserve(&scope(), &key, b"p", LEASE).await.unwrap());
    clock.advance(Duration::from_secs(120));
    db.extend(&mut r, LEASE).await.unwrap();
    assert_eq!(r.lease_expires_at(), clock.now_ms() + 30_000);
    assert_eq!(
        db.reserve(&scope(), &key, b"p", LEASE).await.unwrap(),
        ReserveOutcome::InProgress { retry_after: LEASE }
    );

    let key = Key::new("release-late");
    let r = acquired(db.reserve(&scope(), &key, b"p", LEASE).await.unwrap());
    clock.advance(Duration::from_secs(120));
    db.release(&r).await.unwrap();
    assert_eq!(db.get(&scope(), &key).await.unwrap(), None);
}

async fn owner_calls_touch_only_their_own_record<S: Store>(under: Under<S>) {
    let (clock, db) = (&under.clock, &*under.db);
    let _ = clock;
    let k1 = Key::new("one");
    let k2 = Key::new("two");
    let r1 = acquired(db.reserve(&scope(), &k1, b"p", LEASE).await.unwrap());
    let r2 = acquired(db.reserve(&scope(), &k2, b"p", LEASE).await.unwrap());
    let before2 = db.get(&scope(), &k2).await.unwrap();
    db.complete(&r1, b"1".to_vec()).await.unwrap();
    assert_eq!(db.get(&scope(), &k2).await.unwrap(), before2);
    db.release(&r2).await.unwrap();
    assert_eq!(
        db.reserve(&scope(), &k1, b"p", LEASE).await.unwrap(),
        ReserveOutcome::Completed(b"1".to_vec())
    );
    assert_eq!(db.get(&scope(), &k2).await.unwrap(), None);
}

on_both_stores!(
    complete_marks_completed_with_response_and_time,
    fail_marks_failed_with_response_and_time,
    release_removes_the_record_and_the_next_reserve_acquires_afresh,
    extend_moves_the_lease_and_prevents_a_takeover,
    extend_can_shorten_and_a_takeover_follows_the_new_lease,
    after_a_takeover_the_old_owner_is_fenced,
    after_release_the_old_reservation_is_unknown_then_fenced,
    finishing_twice_is_not_in_progress,
    a_lapsed_owner_not_taken_over_may_still_finish_and_extend,
    owner_calls_touch_only_their_own_record,
);
