//! What survives closing and reopening: records, tokens, and the fingerprint secret.

mod common;

use common::{T0, acquired, open_on, reopenable};
use idemdb::Refusal;

use std::time::Duration;

use idemdb::{
    Error, ExecuteOutcome, Key, ManualClock, Outcome, RecordState, ReserveOutcome, Scope,
};

const LEASE: Duration = Duration::from_secs(60);

fn scope() -> Scope {
    Scope::new("POST /things", "owner")
}

#[test]
fn records_tokens_and_the_secret_survive_reopen() {
    let (_dir, path, clock) = reopenable();
    let payload = b"the request";
    let keys = ["done", "failed", "held", "executed"].map(Key::new);

    let db = open_on(&path, &clock);
    let fp_before = db.fingerprint(payload);
    let mut tokens = Vec::new();

    let r = acquired(db.reserve(&scope(), &keys[0], payload, LEASE).unwrap());
    tokens.push(r.token());
    db.complete(&r, vec![0x00, 0xff, 0xc3, 0x28]).unwrap();

    let r = acquired(db.reserve(&scope(), &keys[1], payload, LEASE).unwrap());
    tokens.push(r.token());
    db.fail(&r, b"declined".to_vec()).unwrap();

    let held = acquired(db.reserve(&scope(), &keys[2], payload, LEASE).unwrap());
    tokens.push(held.token());

    let out = db
        .execute(&scope(), &keys[3], payload, |_tx| {
            Ok::<_, Error>(Outcome::Completed(b"executed".to_vec()))
        })
        .unwrap();
    assert_eq!(
        out,
        ExecuteOutcome::Executed(Outcome::Completed(b"executed".to_vec()))
    );

    let released = acquired(
        db.reserve(&scope(), &Key::new("gone"), payload, LEASE)
            .unwrap(),
    );
    tokens.push(released.token());
    db.release(&released).unwrap();

    let before: Vec<_> = keys
        .iter()
        .map(|k| db.get(&scope(), k).unwrap().expect("record"))
        .collect();
    tokens.push(before[3].token);
    let max_before = *tokens.iter().max().unwrap();
    drop(db);

    clock.advance(Duration::from_secs(15));
    let db = open_on(&path, &clock);
    for (k, rec) in keys.iter().zip(&before) {
        assert_eq!(db.get(&scope(), k).unwrap().as_ref(), Some(rec), "{k:?}");
    }
    assert_eq!(db.get(&scope(), &Key::new("gone")).unwrap(), None);

    // The secret persisted: the same bytes give the same fingerprint, and so replay.
    assert_eq!(db.fingerprint(payload), fp_before);
    assert_eq!(
        db.reserve(&scope(), &keys[0], payload, LEASE).unwrap(),
        ReserveOutcome::Completed(vec![0x00, 0xff, 0xc3, 0x28])
    );
    assert_eq!(
        db.reserve(&scope(), &keys[1], payload, LEASE).unwrap(),
        ReserveOutcome::Failed(b"declined".to_vec())
    );
    assert_eq!(
        db.reserve(&scope(), &keys[2], payload, LEASE).unwrap(),
        ReserveOutcome::InProgress {
            retry_after: Duration::from_secs(45)
        }
    );
    assert_eq!(
        db.reserve(&scope(), &keys[3], payload, LEASE).unwrap(),
        ReserveOutcome::Completed(b"executed".to_vec())
    );
    for k in &keys {
        assert_eq!(
            db.reserve(&scope(), k, b"another request", LEASE).unwrap(),
            ReserveOutcome::Mismatch,
            "{k:?}"
        );
    }

    // Tokens issued after reopen are above every token issued before.
    let fresh = acquired(
        db.reserve(&scope(), &Key::new("new"), payload, LEASE)
            .unwrap(),
    );
    assert!(
        fresh.token() > max_before,
        "{:?} must exceed {max_before:?}",
        fresh.token()
    );
    let again = acquired(
        db.reserve(&scope(), &Key::new("gone"), payload, LEASE)
            .unwrap(),
    );
    assert!(again.token() > fresh.token());
    assert_eq!(again.attempt(), 1);

    // The held reservation from before the restart still works.
    db.complete(&held, b"finished after restart".to_vec())
        .unwrap();
    assert_eq!(
        db.reserve(&scope(), &keys[2], payload, LEASE).unwrap(),
        ReserveOutcome::Completed(b"finished after restart".to_vec())
    );
}

#[test]
fn each_database_has_its_own_secret() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let a = open_on(&dir.path().join("a.idemdb"), &clock);
    let b = open_on(&dir.path().join("b.idemdb"), &clock);
    assert_ne!(a.fingerprint(b"same bytes"), b.fingerprint(b"same bytes"));
    let fp_a = a.fingerprint(b"same bytes");
    drop(a);
    let a = open_on(&dir.path().join("a.idemdb"), &clock);
    assert_eq!(a.fingerprint(b"same bytes"), fp_a);
}

#[test]
fn takeover_after_reopen_fences_the_owner_from_before() {
    let (_dir, path, clock) = reopenable();
    let key = Key::new("job");

    let db = open_on(&path, &clock);
    let a = acquired(
        db.reserve(&scope(), &key, b"p", Duration::from_secs(10))
            .unwrap(),
    );
    drop(db);

    // The process died; it comes back after the lease ran out.
    clock.advance(Duration::from_secs(10));
    let db = open_on(&path, &clock);
    let b = acquired(db.reserve(&scope(), &key, b"p", LEASE).unwrap());
    assert!(b.is_takeover());
    assert_eq!(b.attempt(), 2);
    assert!(b.token() > a.token());
    assert_eq!(b.lease_expires_at(), T0 + 10_000 + 60_000);

    let before = db.get(&scope(), &key).unwrap();
    match db.complete(&a, b"from the dead".to_vec()) {
        Err(Error::Refused(Refusal::Fenced { presented, current })) => {
            assert_eq!(presented, a.token());
            assert_eq!(current, b.token());
        }
        other => panic!("expected Fenced, got {other:?}"),
    }
    assert_eq!(db.get(&scope(), &key).unwrap(), before);

    db.complete(&b, b"from b".to_vec()).unwrap();
    drop(db);
    let db = open_on(&path, &clock);
    let rec = db.get(&scope(), &key).unwrap().unwrap();
    assert_eq!(rec.state, RecordState::Completed);
    assert_eq!(rec.token, b.token());
    assert_eq!(rec.attempts, 2);
    assert_eq!(rec.created_at, T0);
    assert_eq!(
        db.reserve(&scope(), &key, b"p", LEASE).unwrap(),
        ReserveOutcome::Completed(b"from b".to_vec())
    );
}

#[test]
fn tokens_increase_across_many_reopens() {
    let (_dir, path, clock) = reopenable();
    let mut last_max = 0u64;
    for round in 0..5u32 {
        let db = open_on(&path, &clock);
        let mut this_round = Vec::new();
        for i in 0..3u32 {
            let key = Key::new(format!("r{round}-k{i}"));
            let r = acquired(db.reserve(&scope(), &key, b"p", LEASE).unwrap());
            this_round.push(r.token().get());
            if i == 0 {
                db.release(&r).unwrap();
            } else {
                db.complete(&r, format!("{round}-{i}").into_bytes())
                    .unwrap();
            }
        }
        // A closure that errs consumes nothing visible; the next round must still be above.
        let _ = db.execute(&scope(), &Key::new(format!("r{round}-x")), b"p", |_tx| {
            Err::<Outcome, _>("no")
        });
        assert!(
            this_round.iter().all(|t| *t > last_max),
            "round {round}: {this_round:?} vs {last_max}"
        );
        assert!(this_round.windows(2).all(|w| w[0] < w[1]));
        last_max = *this_round.iter().max().unwrap();
        drop(db);
    }
    // Everything completed in earlier rounds is still there.
    let db = open_on(&path, &clock);
    for round in 0..5u32 {
        assert_eq!(
            db.get(&scope(), &Key::new(format!("r{round}-k0"))).unwrap(),
            None
        );
        for i in 1..3u32 {
            assert_eq!(
                db.reserve(&scope(), &Key::new(format!("r{round}-k{i}")), b"p", LEASE)
                    .unwrap(),
                ReserveOutcome::Completed(format!("{round}-{i}").into_bytes())
            );
        }
        assert_eq!(
            db.get(&scope(), &Key::new(format!("r{round}-x"))).unwrap(),
            None
        );
    }
}

#[test]
fn close_is_the_same_as_drop() {
    let (_dir, path, clock) = reopenable();
    let db = open_on(&path, &clock);
    let r = acquired(db.reserve(&scope(), &Key::new("k"), b"p", LEASE).unwrap());
    db.complete(&r, b"closed".to_vec()).unwrap();
    db.close();
    let db = open_on(&path, &clock);
    assert_eq!(
        db.reserve(&scope(), &Key::new("k"), b"p", LEASE).unwrap(),
        ReserveOutcome::Completed(b"closed".to_vec())
    );
}
