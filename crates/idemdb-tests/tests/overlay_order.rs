//! An entry leaves the overlay only once a snapshot that holds it is installed (design.md
//! §5.7): a reader that looks at the overlay first and the snapshot second finds every
//! acknowledged record at every moment of a pass that writes the overlay into redb. Forgetting
//! the entries before the refresh opens a window in which a record is in neither (§12).

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{LEASE, acquired};
use idemdb::{IdemDb, Key, RecordState, Scope, testing};
use parking_lot::Mutex;

fn scope() -> Scope {
    Scope::new("op", "p")
}

#[test]
fn a_record_is_found_while_the_pass_that_writes_it_into_redb_refreshes_the_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    // No applier: the pass is the one `stats()` runs, on this thread, at a known moment.
    let db = Arc::new(
        IdemDb::builder()
            .without_applier()
            .checkpoint_interval(Duration::from_secs(3600))
            .open(dir.path().join("db"))
            .unwrap(),
    );
    let r = acquired(db.reserve(&scope(), &Key::new("k"), b"p", LEASE).unwrap());
    db.complete(&r, b"done".to_vec()).unwrap();
    // The record is in the overlay alone: the snapshot is from before its reservation.
    let seen = Arc::new(Mutex::new(Vec::new()));
    let look = {
        let (db, seen) = (Arc::downgrade(&db), Arc::clone(&seen));
        move || {
            let Some(db) = db.upgrade() else { return };
            let rec = db.get(&scope(), &Key::new("k")).unwrap();
            seen.lock().push(rec.map(|r| (r.state, r.response)));
        }
    };
    // Runs inside the pass, after its commit, before the new snapshot is installed.
    testing::before_next_refresh(&db, look);
    let stats = db.stats();
    assert_eq!(stats.stored_records, 1);
    let seen = seen.lock().clone();
    assert_eq!(
        seen,
        vec![Some((RecordState::Completed, b"done".to_vec()))],
        "during the pass"
    );
    let after = db.get(&scope(), &Key::new("k")).unwrap().unwrap();
    assert_eq!(after.response, b"done".to_vec());
}
