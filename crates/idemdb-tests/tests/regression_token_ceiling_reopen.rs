//! Regression (issue 11, defect 1): fencing tokens went backwards across a reopen.
//!
//! An aborted `execute` issued a token past the durable ceiling without writing one; a refused
//! owner call then raised the in-memory ceiling in a transaction that was never committed; the
//! next reservation's token was covered by that in-memory ceiling only. After a reopen the
//! takeover could be issued the same token, and the stale owner's `complete` was accepted.

mod common;

use common::{acquired, open_on, reopenable};
use idemdb::Refusal;

use std::time::Duration;

use idemdb::{Error, ExecuteError, Key, Outcome, RecordState, Scope};

const LEASE: Duration = Duration::from_secs(10);

#[test]
fn token_ceiling_survives_an_aborted_execute_and_a_refused_owner_call() {
    let (_dir, path, clock) = reopenable();
    let open = || open_on(&path, &clock);
    let scope = Scope::new("POST /payments", "merchant-1");
    let key = Key::new("pay-1");

    // A reservation released before the reopen, to be released again after it.
    let db = open();
    let spare = acquired(db.reserve(&scope, &Key::new("spare"), b"s", LEASE).unwrap());
    db.release(&spare).unwrap();
    db.close();

    // Freshly reopened: the in-memory ceiling equals the one on disk.
    let db = open();

    // 1. An execute whose closure fails: a token is taken, nothing commits.
    let failed = db.execute(&scope, &Key::new("other"), b"x", |_tx| {
        Err::<Outcome, _>("declined upstream")
    });
    assert!(matches!(
        failed,
        Err(ExecuteError::Closure("declined upstream"))
    ));

    // 2. A refused owner call that changes nothing.
    assert!(matches!(
        db.release(&spare),
        Err(Error::Refused(Refusal::UnknownRecord))
    ));

    // 3. The stale owner-to-be.
    let o1 = acquired(db.reserve(&scope, &key, b"pay", LEASE).unwrap());
    db.close();

    // 4. Reopen, let o1's lease run out, take over.
    let db = open();
    clock.advance(LEASE + Duration::from_millis(1));
    let filler = acquired(
        db.reserve(&scope, &Key::new("filler"), b"f", LEASE)
            .unwrap(),
    );
    let o2 = acquired(db.reserve(&scope, &key, b"pay", LEASE).unwrap());
    assert!(o2.is_takeover());
    assert!(
        filler.token() > o1.token() && o2.token() > o1.token(),
        "tokens went backwards across the reopen: o1 {}, then {} and {}",
        o1.token(),
        filler.token(),
        o2.token()
    );

    // The stale owner is fenced; the new owner's work stands.
    assert!(matches!(
        db.complete(&o1, b"stale".to_vec()),
        Err(Error::Refused(Refusal::Fenced { .. }))
    ));
    db.complete(&o2, b"fresh".to_vec()).unwrap();
    let rec = db.get(&scope, &key).unwrap().unwrap();
    assert_eq!(rec.state, RecordState::Completed);
    assert_eq!(rec.response, b"fresh");
    assert_eq!(rec.token, o2.token());
}
