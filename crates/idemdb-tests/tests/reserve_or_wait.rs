//! Duplicates that wait for the owner instead of polling.

mod common;

use common::{T0, acquired, setup};

use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use idemdb::{IdemDb, Key, RecordState, ReserveOutcome, Scope};

const LEASE: Duration = Duration::from_secs(60);
const LONG_WAIT: Duration = Duration::from_secs(30);
const PROMPT: Duration = Duration::from_secs(5);
const WAITERS: usize = 6;

fn scope() -> Scope {
    Scope::new("POST /orders", "user-1")
}

/// Starts `WAITERS` threads in `reserve_or_wait` on `key`, runs `owner_action` once they are
/// all started (after a pause so they are asleep), and returns each waiter's outcome and how
/// long it waited.
fn waiters_around(
    db: &IdemDb,
    key: &Key,
    owner_action: impl FnOnce() + Send,
    per_waiter: impl Fn(ReserveOutcome) -> ReserveOutcome + Sync,
) -> Vec<(ReserveOutcome, Duration)> {
    let barrier = Barrier::new(WAITERS + 1);
    thread::scope(|s| {
        let handles: Vec<_> = (0..WAITERS)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    let start = Instant::now();
                    let outcome = db
                        .reserve_or_wait(&scope(), key, b"payload", LEASE, LONG_WAIT)
                        .unwrap();
                    let outcome = per_waiter(outcome);
                    (outcome, start.elapsed())
                })
            })
            .collect();
        barrier.wait();
        thread::sleep(Duration::from_millis(300));
        owner_action();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn waiters_are_woken_with_the_completed_response() {
    let (_dir, _clock, db) = setup();
    let key = Key::new("k");
    let owner = acquired(db.reserve(&scope(), &key, b"payload", LEASE).unwrap());
    let response = b"201 \x00\xff{\"order\":1}".to_vec();

    let results = waiters_around(
        &db,
        &key,
        || db.complete(&owner, response.clone()).unwrap(),
        |o| o,
    );
    assert_eq!(results.len(), WAITERS);
    for (outcome, waited) in results {
        assert_eq!(outcome, ReserveOutcome::Completed(response.clone()));
        assert!(
            waited < PROMPT,
            "woken by the commit, not the timeout: {waited:?}"
        );
        assert!(
            waited >= Duration::from_millis(100),
            "they did wait for the owner: {waited:?}"
        );
    }
}

#[test]
fn waiters_are_woken_with_the_failed_response() {
    let (_dir, _clock, db) = setup();
    let key = Key::new("k");
    let owner = acquired(db.reserve(&scope(), &key, b"payload", LEASE).unwrap());

    let results = waiters_around(
        &db,
        &key,
        || db.fail(&owner, b"402 declined".to_vec()).unwrap(),
        |o| o,
    );
    for (outcome, waited) in results {
        assert_eq!(outcome, ReserveOutcome::Failed(b"402 declined".to_vec()));
        assert!(waited < PROMPT, "{waited:?}");
    }
}

#[test]
fn after_release_exactly_one_waiter_acquires() {
    let (_dir, _clock, db) = setup();
    let key = Key::new("k");
    let owner = acquired(db.reserve(&scope(), &key, b"payload", LEASE).unwrap());
    let owner_token = owner.token();

    let results = waiters_around(
        &db,
        &key,
        || db.release(&owner).unwrap(),
        |outcome| {
            if let ReserveOutcome::Acquired(r) = &outcome {
                // The new owner finishes quickly; the others are woken by this.
                assert!(r.token() > owner_token);
                assert_eq!(r.attempt(), 1, "a released record starts afresh");
                assert!(!r.is_takeover());
                db.complete(r, b"second try".to_vec()).unwrap();
            }
            outcome
        },
    );
    let acquired_count = results
        .iter()
        .filter(|(o, _)| matches!(o, ReserveOutcome::Acquired(_)))
        .count();
    assert_eq!(
        acquired_count, 1,
        "exactly one waiter acquires: {results:?}"
    );
    for (outcome, waited) in &results {
        match outcome {
            ReserveOutcome::Acquired(_) => {}
            other => assert_eq!(other, &ReserveOutcome::Completed(b"second try".to_vec())),
        }
        assert!(*waited < PROMPT, "{waited:?}");
    }
    let rec = db.get(&scope(), &key).unwrap().unwrap();
    assert_eq!(rec.state, RecordState::Completed);
    assert_eq!(rec.response, b"second try".to_vec());
}

#[test]
fn a_short_timeout_returns_in_progress() {
    let (_dir, _clock, db) = setup();
    let key = Key::new("k");
    let _owner = acquired(db.reserve(&scope(), &key, b"payload", LEASE).unwrap());
    let before = db.get(&scope(), &key).unwrap();

    let start = Instant::now();
    let outcome = db
        .reserve_or_wait(
            &scope(),
            &key,
            b"payload",
            LEASE,
            Duration::from_millis(100),
        )
        .unwrap();
    let waited = start.elapsed();
    // The manual clock did not move: the whole lease is left.
    assert_eq!(outcome, ReserveOutcome::InProgress { retry_after: LEASE });
    assert!(waited >= Duration::from_millis(100), "{waited:?}");
    assert!(waited < PROMPT, "{waited:?}");
    assert_eq!(db.get(&scope(), &key).unwrap(), before);

    // A zero timeout answers at once.
    let start = Instant::now();
    assert_eq!(
        db.reserve_or_wait(&scope(), &key, b"payload", LEASE, Duration::ZERO)
            .unwrap(),
        ReserveOutcome::InProgress { retry_after: LEASE }
    );
    assert!(start.elapsed() < PROMPT);
}

#[test]
fn a_short_timeout_waiter_among_long_ones() {
    let (_dir, _clock, db) = setup();
    let key = Key::new("k");
    let owner = acquired(db.reserve(&scope(), &key, b"payload", LEASE).unwrap());
    thread::scope(|s| {
        let short = s.spawn(|| {
            db.reserve_or_wait(
                &scope(),
                &key,
                b"payload",
                LEASE,
                Duration::from_millis(100),
            )
            .unwrap()
        });
        let long = s.spawn(|| {
            db.reserve_or_wait(&scope(), &key, b"payload", LEASE, LONG_WAIT)
                .unwrap()
        });
        assert_eq!(
            short.join().unwrap(),
            ReserveOutcome::InProgress { retry_after: LEASE }
        );
        db.complete(&owner, b"done".to_vec()).unwrap();
        assert_eq!(
            long.join().unwrap(),
            ReserveOutcome::Completed(b"done".to_vec())
        );
    });
}

#[test]
fn no_waiting_when_the_answer_is_known() {
    let (_dir, _clock, db) = setup();
    let start = Instant::now();

    // Fresh key: acquired at once.
    let r = acquired(
        db.reserve_or_wait(&scope(), &Key::new("fresh"), b"payload", LEASE, LONG_WAIT)
            .unwrap(),
    );
    assert_eq!(r.attempt(), 1);
    assert_eq!(r.lease_expires_at(), T0 + 60_000);

    // Another payload on a held key: Mismatch at once.
    assert_eq!(
        db.reserve_or_wait(&scope(), &Key::new("fresh"), b"different", LEASE, LONG_WAIT)
            .unwrap(),
        ReserveOutcome::Mismatch
    );

    // Finished key: its response at once.
    db.complete(&r, b"ok".to_vec()).unwrap();
    assert_eq!(
        db.reserve_or_wait(&scope(), &Key::new("fresh"), b"payload", LEASE, LONG_WAIT)
            .unwrap(),
        ReserveOutcome::Completed(b"ok".to_vec())
    );
    assert!(start.elapsed() < PROMPT, "{:?}", start.elapsed());
}

#[test]
fn a_waiter_takes_over_when_the_lease_runs_out_by_the_database_clock() {
    let (_dir, clock, db) = setup();
    let key = Key::new("k");
    let short_lease = Duration::from_millis(200);
    let owner = acquired(db.reserve(&scope(), &key, b"payload", short_lease).unwrap());
    thread::scope(|s| {
        let waiter = s.spawn(|| {
            let start = Instant::now();
            let o = db
                .reserve_or_wait(&scope(), &key, b"payload", LEASE, LONG_WAIT)
                .unwrap();
            (o, start.elapsed())
        });
        thread::sleep(Duration::from_millis(50));
        clock.advance(short_lease);
        let (outcome, waited) = waiter.join().unwrap();
        let r = acquired(outcome);
        assert!(r.is_takeover());
        assert_eq!(r.attempt(), 2);
        assert!(r.token() > owner.token());
        assert_eq!(r.lease_expires_at(), T0 + 200 + 60_000);
        assert!(waited < PROMPT, "{waited:?}");
    });
}
