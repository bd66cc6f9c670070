//! Named regressions for the discrepancies the model-based test (tests/model_based.rs) found
//! between the engine and docs/semantics.md, each the minimal sequence that shows it.

mod common;

use common::{acquired, setup};
use idemdb::Refusal;

use std::time::Duration;

use idemdb::{Error, ExecuteOutcome, Key, Outcome, Scope};

/// Model seed 12: an `execute` that takes over an expired lease is an acquisition and a
/// takeover (semantics.md §11: `acquired` counts "reservations and executions that ran,
/// takeovers … included", and `Stats::takeovers` is "of those, takeovers of an expired
/// lease"), but `stats().takeovers` stayed 0.
#[test]
fn stats_count_an_execute_takeover_as_a_takeover() {
    let (_dir, clock, db) = setup();
    let (scope, key) = (Scope::new("op", "p"), Key::new("k"));
    let lease = Duration::from_millis(100);
    let first = acquired(db.reserve(&scope, &key, b"x", lease).unwrap());
    clock.advance(lease);

    let done = db
        .execute(&scope, &key, b"x", |_tx| {
            Ok::<_, Error>(Outcome::Completed(b"done".to_vec()))
        })
        .unwrap();
    assert_eq!(
        done,
        ExecuteOutcome::Executed(Outcome::Completed(b"done".to_vec()))
    );
    // It was a takeover: the record's second acquisition, and the first owner is fenced.
    assert_eq!(db.get(&scope, &key).unwrap().unwrap().attempts, 2);
    assert!(matches!(
        db.complete(&first, b"late".to_vec()),
        Err(Error::Refused(Refusal::Fenced { .. }))
    ));

    let stats = db.stats();
    assert_eq!(stats.acquired, 2, "the reservation and the execution");
    assert_eq!(
        stats.takeovers, 1,
        "the execution took over an expired lease"
    );
}
