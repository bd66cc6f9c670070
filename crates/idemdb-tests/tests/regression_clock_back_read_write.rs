//! Regression (issue 11, defect 3b): after the clock stepped back, `get` and `reserve`
//! replayed an older generation's COMPLETED record (expired, but live again under the earlier
//! clock) while the writer treated the newer IN_PROGRESS record as live. Both paths must pick
//! the same record under any clock: the newest copy (highest token).

mod common;

use common::{LEASE, T0, acquired, minutes, open_retained, reopenable, setup_retained};

use idemdb::{Key, RecordState, ReserveOutcome, Scope};

#[test]
fn reads_and_writes_pick_the_same_record_after_the_clock_steps_back() {
    // TTL 1 min.
    let (_dir, path, clock) = reopenable();
    let db = open_retained(&path, &clock, minutes(1));
    let scope = Scope::new("POST /orders", "user-1");
    let key = Key::new("order-1");

    // Generation 1 completes at T0 and expires at T0 + 1 min.
    let first = acquired(db.reserve(&scope, &key, b"order", LEASE).unwrap());
    db.complete(&first, b"generation 1".to_vec()).unwrap();

    // Generation 2 is acquired after the expiry (a redrive) and is in progress.
    clock.set(T0 + 61_000);
    let mut second = acquired(db.reserve(&scope, &key, b"order", LEASE).unwrap());
    assert!(second.is_beyond_horizon());
    assert!(second.token() > first.token());

    // The clock steps back: generation 1 is within its TTL again.
    clock.set(T0 + 30_000);
    let token = second.token();
    let check = |db: &idemdb::IdemDb| {
        let rec = db.get(&scope, &key).unwrap().unwrap();
        assert_eq!(rec.state, RecordState::InProgress, "get served {rec:?}");
        assert_eq!(rec.token, token);
        assert!(
            matches!(
                db.reserve(&scope, &key, b"order", LEASE).unwrap(),
                ReserveOutcome::InProgress { .. }
            ),
            "a duplicate must see generation 2 in progress, not generation 1's replay"
        );
    };
    check(&db);
    // The writer agrees: generation 2's owner may extend.
    db.extend(&mut second, LEASE).unwrap();
    check(&db);

    // The same after a reopen (the bound on write times is rebuilt from the file).
    db.close();
    let db = open_retained(&path, &clock, minutes(1));
    check(&db);
    db.complete(&second, b"generation 2".to_vec()).unwrap();
    assert_eq!(
        db.reserve(&scope, &key, b"order", LEASE).unwrap(),
        ReserveOutcome::Completed(b"generation 2".to_vec())
    );
    assert_eq!(
        db.get(&scope, &key).unwrap().unwrap().response,
        b"generation 2"
    );
}

#[test]
fn a_completed_newer_generation_wins_over_an_older_one_after_the_clock_steps_back() {
    let (_dir, clock, db) = setup_retained(minutes(1));
    let (scope, key) = (Scope::new("POST /orders", "user-1"), Key::new("order-2"));
    let second = two_completed_generations(&db, &clock, &scope, &key);

    clock.set(T0 + 30_000);
    assert_eq!(
        db.reserve(&scope, &key, b"order", LEASE).unwrap(),
        ReserveOutcome::Completed(b"generation 2".to_vec())
    );
    assert_eq!(db.get(&scope, &key).unwrap().unwrap().token, second);
}

/// Generation 1 of `key` completed at T0 (TTL 1 min), generation 2 acquired after its expiry
/// and completed: the second's token.
fn two_completed_generations(
    db: &idemdb::IdemDb,
    clock: &idemdb::ManualClock,
    scope: &Scope,
    key: &Key,
) -> idemdb::FencingToken {
    let first = acquired(db.reserve(scope, key, b"order", LEASE).unwrap());
    db.complete(&first, b"generation 1".to_vec()).unwrap();
    clock.set(T0 + 61_000);
    let second = acquired(db.reserve(scope, key, b"order", LEASE).unwrap());
    db.complete(&second, b"generation 2".to_vec()).unwrap();
    second.token()
}

/// A replay stops at a live finished copy only when no newer copy can exist beside it. After
/// a reopen, with the clock back inside the older generation's TTL, both generations are in
/// partitions and both look live: the bound on earlier writes comes from the partitions'
/// windows, so the lookup reads on and the newer generation answers.
#[test]
fn a_newer_generation_wins_after_a_reopen_with_the_clock_back() {
    let (_dir, path, clock) = reopenable();
    let db = open_retained(&path, &clock, minutes(1));
    let (scope, key) = (Scope::new("POST /orders", "user-1"), Key::new("order-3"));
    let second = two_completed_generations(&db, &clock, &scope, &key);
    db.close();

    clock.set(T0 + 30_000);
    let db = open_retained(&path, &clock, minutes(1));
    for _ in 0..2 {
        // The second time from the replay cache, which the first filled.
        assert_eq!(
            db.reserve(&scope, &key, b"order", LEASE).unwrap(),
            ReserveOutcome::Completed(b"generation 2".to_vec())
        );
        assert_eq!(db.get(&scope, &key).unwrap().unwrap().token, second);
    }
}
