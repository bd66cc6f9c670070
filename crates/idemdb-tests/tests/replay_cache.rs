//! The replay cache (design.md §6.4) answers exactly what the snapshot path answers: the
//! stored bytes, and never a generation that a newer one, an expiry or a dropped partition
//! has replaced, whatever the clock does. Each scenario runs with the cache and without it
//! (`replay_cache(0)`), and the answers must be the same.

mod common;

use common::{LEASE, T0, acquired, minutes};

use idemdb::{IdemDb, Key, ManualClock, ReserveOutcome, Retention, Scope};

fn open(clock: &ManualClock, retention: Retention, cache: usize) -> (tempfile::TempDir, IdemDb) {
    let dir = tempfile::tempdir().unwrap();
    let db = IdemDb::builder()
        .clock(clock.clone())
        .retention(retention)
        .replay_cache(cache)
        .open(dir.path().join("db"))
        .unwrap();
    (dir, db)
}

/// Runs `scenario` with the cache on and off; returns both runs' answers.
fn both<T: std::fmt::Debug>(
    retention: impl Fn() -> Retention,
    scenario: impl Fn(&IdemDb, &ManualClock) -> T,
) -> T {
    let answers: Vec<T> = [32 << 20, 0]
        .into_iter()
        .map(|cache| {
            let clock = ManualClock::new(T0);
            let (_dir, db) = open(&clock, retention(), cache);
            scenario(&db, &clock)
        })
        .collect();
    let mut answers = answers.into_iter();
    let (with, without) = (answers.next().unwrap(), answers.next().unwrap());
    // Compared as printed: a reservation also holds its database's id, which differs.
    assert_eq!(
        format!("{with:?}"),
        format!("{without:?}"),
        "the cache changed an answer"
    );
    with
}

fn scope() -> Scope {
    Scope::new("POST /orders", "user-1")
}

#[test]
fn a_replay_from_memory_is_the_stored_answer_byte_for_byte() {
    let response: Vec<u8> = (0..=255u8).chain([0, 0, 13, 10]).collect();
    let answers = both(
        || minutes(60),
        |db, _| {
            let ok = acquired(db.reserve(&scope(), &Key::new("ok"), b"p", LEASE).unwrap());
            db.complete(&ok, response.clone()).unwrap();
            let bad = acquired(db.reserve(&scope(), &Key::new("bad"), b"p", LEASE).unwrap());
            db.fail(&bad, b"card declined".to_vec()).unwrap();
            // The first duplicate marks the key, the second fills the cache, the third is
            // answered from it.
            let mut seen = Vec::new();
            for _ in 0..3 {
                for key in ["ok", "bad"] {
                    seen.push(db.reserve(&scope(), &Key::new(key), b"p", LEASE).unwrap());
                }
                seen.push(
                    db.reserve(&scope(), &Key::new("ok"), b"other", LEASE)
                        .unwrap(),
                );
            }
            seen
        },
    );
    assert_eq!(answers[0], ReserveOutcome::Completed(response));
    assert_eq!(
        answers[1],
        ReserveOutcome::Failed(b"card declined".to_vec())
    );
    assert_eq!(answers[2], ReserveOutcome::Mismatch);
    assert_eq!(answers[..3], answers[3..6]);
    assert_eq!(answers[..3], answers[6..9]);
}

#[test]
fn a_cached_generation_never_hides_a_newer_one_when_the_clock_steps_back() {
    // The writer forgets a key it changes: here generation 1 stays cached through its expiry
    // unless the acquisition of generation 2 removes it, and the clock going back would make
    // it live again.
    let answers = both(
        || minutes(1),
        |db, clock| {
            let key = Key::new("order-1");
            let first = acquired(db.reserve(&scope(), &key, b"order", LEASE).unwrap());
            db.complete(&first, b"generation 1".to_vec()).unwrap();
            // Twice: the second replay fills the cache.
            let mut seen = vec![db.reserve(&scope(), &key, b"order", LEASE).unwrap()];
            seen.push(db.reserve(&scope(), &key, b"order", LEASE).unwrap());
            clock.set(T0 + 61_000);
            let second = acquired(db.reserve(&scope(), &key, b"order", LEASE).unwrap());
            clock.set(T0 + 30_000);
            seen.push(db.reserve(&scope(), &key, b"order", LEASE).unwrap());
            db.complete(&second, b"generation 2".to_vec()).unwrap();
            seen.push(db.reserve(&scope(), &key, b"order", LEASE).unwrap());
            clock.set(T0 + 62_000);
            seen.push(db.reserve(&scope(), &key, b"order", LEASE).unwrap());
            seen
        },
    );
    assert_eq!(
        answers[0],
        ReserveOutcome::Completed(b"generation 1".to_vec())
    );
    assert_eq!(answers[1], answers[0]);
    assert!(
        matches!(answers[2], ReserveOutcome::InProgress { .. }),
        "{:?}",
        answers[2]
    );
    assert_eq!(
        answers[3],
        ReserveOutcome::Completed(b"generation 2".to_vec())
    );
    assert_eq!(answers[4], answers[3]);
}

#[test]
fn a_dropped_partition_takes_its_cached_records_with_it() {
    // Compaction removes records outside any batch: the cache must not outlive them, even
    // when the clock then goes back to before their expiry.
    let answers = both(
        || minutes(1),
        |db, clock| {
            let key = Key::new("order-2");
            let first = acquired(db.reserve(&scope(), &key, b"order", LEASE).unwrap());
            db.complete(&first, b"dropped".to_vec()).unwrap();
            // Twice: the second replay fills the cache.
            assert_eq!(
                db.reserve(&scope(), &key, b"order", LEASE).unwrap(),
                ReserveOutcome::Completed(b"dropped".to_vec())
            );
            let replayed = db.reserve(&scope(), &key, b"order", LEASE).unwrap();
            clock.set(T0 + 10 * 60_000);
            let report = db.compact_now().unwrap();
            clock.set(T0 + 30_000);
            let after = db.reserve(&scope(), &key, b"order", LEASE).unwrap();
            (replayed, report.partitions_dropped, after)
        },
    );
    assert_eq!(answers.0, ReserveOutcome::Completed(b"dropped".to_vec()));
    assert_eq!(answers.1, 1);
    assert!(
        !matches!(answers.2, ReserveOutcome::Completed(_)),
        "a dropped record was replayed: {:?}",
        answers.2
    );
}

#[test]
fn an_expired_cached_record_is_absent() {
    let answers = both(
        || minutes(1),
        |db, clock| {
            let key = Key::new("order-3");
            let first = acquired(db.reserve(&scope(), &key, b"order", LEASE).unwrap());
            db.complete(&first, b"one".to_vec()).unwrap();
            // Twice: the second replay fills the cache.
            assert_eq!(
                db.reserve(&scope(), &key, b"order", LEASE).unwrap(),
                ReserveOutcome::Completed(b"one".to_vec())
            );
            let replayed = db.reserve(&scope(), &key, b"order", LEASE).unwrap();
            clock.set(T0 + 61_000);
            let after = db.reserve(&scope(), &key, b"order", LEASE).unwrap();
            (replayed, matches!(after, ReserveOutcome::Acquired(_)))
        },
    );
    assert_eq!(answers, (ReserveOutcome::Completed(b"one".to_vec()), true));
}

/// Completes `key` with `response` under the cache's store; returns a replay of it.
fn completed<'a>(
    db: &'a IdemDb,
    key: &'static str,
    response: &[u8],
) -> impl Fn() -> ReserveOutcome + 'a {
    let first = acquired(
        db.reserve(&scope(), &Key::new(key), b"order", LEASE)
            .unwrap(),
    );
    db.complete(&first, response.to_vec()).unwrap();
    move || {
        db.reserve(&scope(), &Key::new(key), b"order", LEASE)
            .unwrap()
    }
}

#[test]
fn a_pass_that_only_writes_rows_beside_the_records_keeps_the_cache() {
    // Summaries (and retired recognition rows) change no record: the cached answers stay.
    // A drop removes records: they go.
    let clock = ManualClock::new(T0);
    let (_dir, db) = open(&clock, minutes(60), 32 << 20);
    let replay = completed(&db, "order-3", b"kept");
    for _ in 0..2 {
        assert_eq!(replay(), ReserveOutcome::Completed(b"kept".to_vec()));
    }
    assert_eq!(idemdb::testing::cached_replays(&db), 1);
    clock.set(T0 + 2 * 60_000);
    let report = db.compact_now().unwrap();
    assert_eq!(
        (report.partitions_summarized, report.partitions_dropped),
        (1, 0)
    );
    assert_eq!(
        idemdb::testing::cached_replays(&db),
        1,
        "a summary cleared the cache"
    );
    assert_eq!(replay(), ReserveOutcome::Completed(b"kept".to_vec()));
    clock.set(T0 + 2 * 3_600_000);
    assert_eq!(db.compact_now().unwrap().partitions_dropped, 1);
    assert_eq!(idemdb::testing::cached_replays(&db), 0);
}

#[test]
fn a_key_is_cached_at_its_second_replay_not_its_first() {
    // Most replayed intents are replayed once: filling at the first replay would only evict
    // the keys replayed again and again.
    let clock = ManualClock::new(T0);
    let (_dir, db) = open(&clock, minutes(60), 32 << 20);
    let replay = completed(&db, "order-4", b"once");
    assert_eq!(replay(), ReserveOutcome::Completed(b"once".to_vec()));
    assert_eq!(
        idemdb::testing::cached_replays(&db),
        0,
        "filled at first sight"
    );
    assert_eq!(replay(), ReserveOutcome::Completed(b"once".to_vec()));
    assert_eq!(idemdb::testing::cached_replays(&db), 1, "never admitted");
    assert_eq!(replay(), ReserveOutcome::Completed(b"once".to_vec()));
    assert_eq!(idemdb::testing::cached_replays(&db), 1);
}
