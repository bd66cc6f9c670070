//! Regression (issue 11, defect 2): a `Reservation` issued by one database was accepted by
//! another when the token numbers matched, and the real owner was then refused.

mod common;

use common::{T0, acquired, open_on, reopenable};
use idemdb::Refusal;

use std::time::Duration;

use idemdb::{Error, ExecuteError, IdemDb, Key, ManualClock, RecordState, Scope};

const LEASE: Duration = Duration::from_secs(10);

#[test]
fn a_reservation_from_another_database_is_refused_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let open = |name: &str| open_on(&dir.path().join(name), &clock);
    let a = open("a.idemdb");
    let b = open("b.idemdb");
    let scope = Scope::new("POST /payments", "merchant-1");
    let key = Key::new("pay-1");

    let owner_a = acquired(a.reserve(&scope, &key, b"pay", LEASE).unwrap());
    let mut owner_b = acquired(b.reserve(&scope, &key, b"pay", LEASE).unwrap());
    assert_eq!(
        owner_a.token(),
        owner_b.token(),
        "same numbers: only the issuer tells them apart"
    );
    let before = a.get(&scope, &key).unwrap();

    // Every owner call on A with B's reservation is refused, before anything is written.
    assert!(matches!(
        a.complete(&owner_b, b"wrong".to_vec()),
        Err(Error::Refused(Refusal::ForeignReservation))
    ));
    assert!(matches!(
        a.fail(&owner_b, b"wrong".to_vec()),
        Err(Error::Refused(Refusal::ForeignReservation))
    ));
    assert!(matches!(
        a.release(&owner_b),
        Err(Error::Refused(Refusal::ForeignReservation))
    ));
    assert!(matches!(
        a.extend(&mut owner_b, LEASE * 2),
        Err(Error::Refused(Refusal::ForeignReservation))
    ));
    assert!(matches!(
        a.complete_with(&owner_b, b"wrong".to_vec(), |_tx| Ok::<(), Error>(())),
        Err(ExecuteError::Db(Error::Refused(
            Refusal::ForeignReservation
        )))
    ));
    assert!(matches!(
        a.fail_with(&owner_b, b"wrong".to_vec(), |_tx| Ok::<(), Error>(())),
        Err(ExecuteError::Db(Error::Refused(
            Refusal::ForeignReservation
        )))
    ));
    assert_eq!(a.get(&scope, &key).unwrap(), before);
    assert_eq!(
        a.stats().fenced,
        0,
        "a foreign reservation is misuse, not fencing"
    );

    // The real owners finish their own records.
    a.complete(&owner_a, b"from a".to_vec()).unwrap();
    b.complete(&owner_b, b"from b".to_vec()).unwrap();
    for (db, body) in [(&a, b"from a"), (&b, b"from b")] {
        let rec = db.get(&scope, &key).unwrap().unwrap();
        assert_eq!(rec.state, RecordState::Completed);
        assert_eq!(rec.response, body);
    }
}

#[test]
fn a_reservation_stays_valid_across_a_reopen_of_the_same_file() {
    let (_dir, path, clock) = reopenable();
    let open = || open_on(&path, &clock);
    let scope = Scope::new("POST /payments", "merchant-1");
    let key = Key::new("pay-1");

    let db = open();
    let owner = acquired(db.reserve(&scope, &key, b"pay", LEASE).unwrap());
    db.close();
    let db = open();
    db.complete(&owner, b"done".to_vec()).unwrap();
    assert_eq!(db.get(&scope, &key).unwrap().unwrap().response, b"done");
}

#[tokio::test]
async fn async_owner_calls_refuse_a_foreign_reservation_too() {
    let dir = tempfile::tempdir().unwrap();
    let a = IdemDb::open(dir.path().join("a.idemdb")).unwrap();
    let b = IdemDb::open(dir.path().join("b.idemdb")).unwrap();
    let scope = Scope::new("op", "p");
    let key = Key::new("k");
    let _owner_a = acquired(a.reserve(&scope, &key, b"x", LEASE).unwrap());
    let mut owner_b = acquired(b.reserve(&scope, &key, b"x", LEASE).unwrap());
    assert!(matches!(
        a.complete_async(&owner_b, b"no".to_vec()).await,
        Err(Error::Refused(Refusal::ForeignReservation))
    ));
    assert!(matches!(
        a.release_async(&owner_b).await,
        Err(Error::Refused(Refusal::ForeignReservation))
    ));
    assert!(matches!(
        a.extend_async(&mut owner_b, LEASE).await,
        Err(Error::Refused(Refusal::ForeignReservation))
    ));
    assert_eq!(
        a.get(&scope, &key).unwrap().unwrap().state,
        RecordState::InProgress
    );
}
