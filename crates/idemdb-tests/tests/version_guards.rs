//! Version guards: each for the equal, older and newer version, and their writes rolled back
//! with the rest of the closure.

mod common;

use common::fresh;
use idemdb::Refusal;

use idemdb::redb::{ReadableTableMetadata, TableDefinition};
use idemdb::{Error, ExecuteError, Guarded, IdemDb, Upserted, Versioned};

const STATE: TableDefinition<&str, Versioned> = TableDefinition::new("state");
const LIKES: TableDefinition<(&str, &str), u64> = TableDefinition::new("likes");

fn stored(db: &IdemDb, id: &str) -> Option<(u64, Vec<u8>)> {
    let read = db.begin_read().unwrap();
    let table = match read.open_table(STATE) {
        Ok(t) => t,
        Err(idemdb::redb::TableError::TableDoesNotExist(_)) => return None,
        Err(e) => panic!("{e}"),
    };
    let guard = table.get(id).unwrap()?;
    let (version, bytes) = guard.value();
    Some((version, bytes.to_vec()))
}

fn newer(db: &IdemDb, version: u64, value: &'static str) -> Guarded {
    db.run(move |tx| tx.apply_if_newer(STATE, "e", version, value.as_bytes()))
        .unwrap()
}

#[test]
fn apply_if_newer_takes_only_a_greater_version() {
    let (_dir, db) = fresh();
    assert_eq!(newer(&db, 5, "five"), Guarded::Applied { version: 5 });
    assert_eq!(
        newer(&db, 5, "five again"),
        Guarded::Rejected { current: Some(5) },
        "equal"
    );
    assert_eq!(
        newer(&db, 3, "three"),
        Guarded::Rejected { current: Some(5) },
        "older"
    );
    assert_eq!(stored(&db, "e"), Some((5, b"five".to_vec())));
    assert_eq!(
        newer(&db, 9, "nine"),
        Guarded::Applied { version: 9 },
        "newer"
    );
    assert_eq!(stored(&db, "e"), Some((9, b"nine".to_vec())));
}

fn cas(db: &IdemDb, expected: u64, value: &'static str) -> Guarded {
    db.run(move |tx| tx.compare_and_set(STATE, "c", expected, value.as_bytes()))
        .unwrap()
}

#[test]
fn compare_and_set_takes_only_the_expected_version() {
    let (_dir, db) = fresh();
    assert_eq!(
        cas(&db, 1, "x"),
        Guarded::Rejected { current: None },
        "no entity yet"
    );
    assert_eq!(cas(&db, 0, "1"), Guarded::Applied { version: 1 });
    assert_eq!(
        cas(&db, 1, "2"),
        Guarded::Applied { version: 2 },
        "equal: applied"
    );
    assert_eq!(
        cas(&db, 1, "2"),
        Guarded::Rejected { current: Some(2) },
        "older: a retry"
    );
    assert_eq!(
        cas(&db, 7, "8"),
        Guarded::Rejected { current: Some(2) },
        "newer: not yet"
    );
    assert_eq!(stored(&db, "c"), Some((2, b"2".to_vec())));
}

#[test]
fn upsert_on_a_natural_key_leaves_one_row() {
    let (_dir, db) = fresh();
    let like = |at: u64| {
        db.run(move |tx| tx.upsert(LIKES, ("u1", "p1"), at))
            .unwrap()
    };
    assert_eq!(like(10), Upserted::Inserted);
    assert_eq!(like(10), Upserted::Unchanged);
    assert_eq!(like(5), Upserted::Updated);
    let read = db.begin_read().unwrap();
    let likes = read.open_table(LIKES).unwrap();
    assert_eq!(likes.len().unwrap(), 1);
    assert_eq!(likes.get(("u1", "p1")).unwrap().unwrap().value(), 5);
}

#[test]
fn a_failing_closure_rolls_its_guarded_writes_back() {
    let (_dir, db) = fresh();
    let failed = db.run(|tx| {
        let _ = tx.apply_if_newer(STATE, "r", 1, b"one")?;
        Err::<(), Error>(Error::Closed)
    });
    assert!(matches!(failed, Err(ExecuteError::Closure(Error::Closed))));
    assert_eq!(stored(&db, "r"), None);
    // Guards refuse idemdb's own tables like every Tx method.
    const OURS: TableDefinition<&str, Versioned> = TableDefinition::new("idemdb_meta");
    let refused = db.run(|tx| tx.apply_if_newer(OURS, "x", 1, b"x"));
    assert!(matches!(
        refused,
        Err(ExecuteError::Closure(Error::Refused(
            Refusal::InvalidInput(_)
        )))
    ));
}
