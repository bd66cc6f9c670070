use idemdb::{IdemDb, Key, ReserveOutcome, Scope};
use std::time::Duration;

#[test]
fn reserve_complete_replay() {
    let dir = tempfile::tempdir().unwrap();
    let db = IdemDb::open(dir.path().join("db")).unwrap();
    let scope = Scope::new("purchase", "u1");
    let key = Key::new("k1");
    let lease = Duration::from_secs(30);
    let ReserveOutcome::Acquired(r) = db.reserve(&scope, &key, b"p", lease).unwrap() else {
        panic!("expected acquired");
    };
    assert!(matches!(
        db.reserve(&scope, &key, b"p", lease).unwrap(),
        ReserveOutcome::InProgress { .. }
    ));
    db.complete(&r, b"done".to_vec()).unwrap();
    assert_eq!(
        db.reserve(&scope, &key, b"p", lease).unwrap(),
        ReserveOutcome::Completed(b"done".to_vec())
    );
    drop(db);
    let db = IdemDb::open(dir.path().join("db")).unwrap();
    assert_eq!(
        db.reserve(&scope, &key, b"p", lease).unwrap(),
        ReserveOutcome::Completed(b"done".to_vec())
    );
}
