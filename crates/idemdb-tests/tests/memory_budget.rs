//! `Builder::memory_budget`: an open counts what the key index and the recognised keys not
//! yet on disk will hold before it allocates them, and refuses with the figures when the caches plus those
//! maps would exceed the budget, changing nothing; within the budget it opens, and
//! `Stats::memory` shows what was allocated, the sizes the open foretold.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{minutes, reopenable};
use idemdb::redb::{ReadableTable, TableDefinition};
use idemdb::{
    Error, ExecuteOutcome, IdemDb, Key, ManualClock, MemoryUse, Outcome, ReserveOutcome, Scope,
};

const THREADS: usize = 8;
const RECOGNISED: TableDefinition<&[u8], &[u8]> = TableDefinition::new("idemdb_recognised");
const UNINDEXED: TableDefinition<&[u8], ()> = TableDefinition::new("idemdb_recognised_unindexed");
const KEYS: TableDefinition<u64, u64> = TableDefinition::new("idemdb_recognised_keys");

/// Completes `count` fresh keys named `{tag}-{i}` from 8 threads.
fn fill(db: &Arc<IdemDb>, tag: &str, count: usize) {
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let db = Arc::clone(db);
            let tag = tag.to_string();
            std::thread::spawn(move || {
                let scope = Scope::new("op", "p");
                for i in (t..count).step_by(THREADS) {
                    let out = db
                        .execute(&scope, &Key::new(format!("{tag}-{i}")), b"x", |_| {
                            Ok::<_, Error>(Outcome::Completed(b"done".to_vec()))
                        })
                        .unwrap();
                    assert!(matches!(out, ExecuteOutcome::Executed(_)));
                }
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
}

fn open(path: &std::path::Path, clock: &ManualClock, budget: Option<u64>) -> Result<IdemDb, Error> {
    let mut builder = IdemDb::builder()
        .clock(clock.clone())
        .retention(minutes(5))
        .cache_size(4 << 20)
        .replay_cache(1 << 20);
    if let Some(budget) = budget {
        builder = builder.memory_budget(budget);
    }
    builder.open(path)
}

/// The refusal's figures; panics on any other answer.
fn refused(opened: Result<IdemDb, Error>) -> (MemoryUse, u64, u64, u64, String) {
    match opened {
        Err(
            e @ Error::MemoryBudget {
                needed,
                budget,
                records,
                horizon_keys,
            },
        ) => (needed, budget, records, horizon_keys, e.to_string()),
        Err(other) => panic!("expected MemoryBudget, got {other}"),
        Ok(_) => panic!("expected MemoryBudget, the open went ahead"),
    }
}

/// Every entry of the closed database's meta table.
fn meta_entries(path: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    use idemdb::redb::{self, ReadableDatabase, ReadableTable, TableDefinition};
    let db = redb::Database::open(path).unwrap();
    let txn = db.begin_read().unwrap();
    let meta = txn
        .open_table(TableDefinition::<&str, &[u8]>::new("idemdb_meta"))
        .unwrap();
    meta.iter()
        .unwrap()
        .map(|e| {
            let (k, v) = e.unwrap();
            (k.value().to_string(), v.value().to_vec())
        })
        .collect()
}

#[test]
fn an_open_over_its_memory_budget_is_refused_with_each_part_and_changes_nothing() {
    let (_dir, path, clock) = reopenable();
    let db = Arc::new(open(&path, &clock, None).unwrap());
    fill(&db, "k", 20_000);
    drop(db);

    // redb rewrites its own header at every open and close; what idemdb writes at open (the
    // log's commit: the log recorded as in use, the token ceiling raised) is in the meta
    // table and the log.
    let files = || {
        let mut log = path.as_os_str().to_owned();
        log.push("-wal");
        (meta_entries(&path), std::fs::read(log).unwrap())
    };
    let before = files();
    // Far too small: the caches alone are over it.
    let (needed, budget, records, horizon_keys, text) = refused(open(&path, &clock, Some(1 << 20)));
    assert!(files() == before, "a refused open wrote its log commit");
    assert_eq!((budget, records, horizon_keys), (1 << 20, 20_000, 0));
    assert_eq!((needed.page_cache, needed.replay_cache), (4 << 20, 1 << 20));
    assert!(needed.key_index >= 20_000 * 8 * 4 / 3, "{needed:?}");
    assert_eq!(needed.horizon, 0);
    for part in [
        "over the memory budget of 1.0 MiB",
        "page cache 4.0 MiB",
        "replay cache 1.0 MiB",
        "for 20000 finished records",
        "Raise Builder::memory_budget",
    ] {
        assert!(text.contains(part), "{part:?} not in: {text}");
    }

    // One byte short of what the open needs: refused; exactly that: opened.
    let (again, ..) = refused(open(&path, &clock, Some(needed.total() - 1)));
    assert_eq!(again, needed);
    assert!(files() == before, "a refused open wrote its log commit");
    let db = open(&path, &clock, Some(needed.total())).unwrap();
    let stats = db.stats();
    assert_eq!(stats.indexed_keys, 20_000);
    assert_eq!(
        stats.memory, needed,
        "what the open allocated is what it foretold"
    );
    // Nothing was lost by the refusals.
    let scope = Scope::new("op", "p");
    for i in (0..20_000).step_by(997) {
        assert_eq!(
            db.reserve(&scope, &Key::new(format!("k-{i}")), b"x", common::LEASE)
                .unwrap(),
            ReserveOutcome::Completed(b"done".to_vec())
        );
    }
}

#[test]
fn recognised_keys_on_disk_cost_no_memory_and_those_not_entered_yet_count_in_the_budget() {
    let (_dir, path, clock) = reopenable();
    let db = Arc::new(open(&path, &clock, None).unwrap());
    fill(&db, "old", 10_000);
    // Past the TTL and the partition's end: the pass drops it and enters its keys' hashes
    // in the table of recognised keys.
    clock.advance(Duration::from_secs(7 * 60));
    let report = db.compact_now().unwrap();
    assert_eq!(report.records_expired, 10_000);
    fill(&db, "new", 5_000);
    let stats = db.stats();
    let recognised = stats.horizon_keys;
    assert_eq!(recognised, 10_000);
    assert_eq!(stats.memory.horizon, 0, "recognised keys held in memory");
    drop(db);

    // The open needs nothing for them.
    let (needed, _, records, horizon_keys, _) = refused(open(&path, &clock, Some(1 << 20)));
    assert_eq!((records, horizon_keys, needed.horizon), (5_000, 0, 0));
    let db = open(&path, &clock, Some(needed.total())).unwrap();
    assert_eq!(db.stats().horizon_keys, recognised);
    assert_eq!(db.stats().memory, needed);
    drop(db);

    // As a crash between the drop and the step that enters its keys leaves the file: the row
    // named unindexed, its hashes not in the table. Memory holds them, and the budget counts
    // 8 bytes each.
    {
        let raw = idemdb::redb::Database::open(&path).unwrap();
        let txn = raw.begin_write().unwrap();
        let row: Vec<u8> = {
            let rows = txn.open_table(RECOGNISED).unwrap();
            let first = rows.iter().unwrap().next().unwrap().unwrap();
            first.0.value().to_vec()
        };
        txn.open_table(UNINDEXED)
            .unwrap()
            .insert(row.as_slice(), ())
            .unwrap();
        txn.delete_table(KEYS).unwrap();
        txn.open_table(KEYS).unwrap();
        txn.commit().unwrap();
    }
    let (needed, _, _, horizon_keys, text) = refused(open(&path, &clock, Some(1 << 20)));
    assert_eq!(horizon_keys, recognised);
    assert!(needed.horizon >= recognised * 8, "{needed:?}");
    assert!(
        text.contains(&format!("for {recognised} recognised keys")),
        "{text}"
    );
    // Without the horizon's share the open is refused.
    let (again, ..) = refused(open(&path, &clock, Some(needed.total() - needed.horizon)));
    assert_eq!(again, needed);
    let db = open(&path, &clock, Some(needed.total())).unwrap();
    let stats = db.stats();
    assert_eq!(stats.horizon_keys, recognised);
    assert_eq!(stats.memory, needed);
    // The next pass enters them on disk, and memory lets them go.
    db.compact_now().unwrap();
    let stats = db.stats();
    assert_eq!((stats.horizon_keys, stats.memory.horizon), (recognised, 0));
}

#[test]
fn stats_show_the_default_caches_and_an_index_that_grows_with_the_records() {
    let (_dir, path, clock) = reopenable();
    let db = Arc::new(IdemDb::builder().clock(clock.clone()).open(&path).unwrap());
    let empty = db.stats().memory;
    assert_eq!((empty.page_cache, empty.replay_cache), (64 << 20, 32 << 20));
    fill(&db, "k", 10_000);
    let filled = db.stats();
    assert_eq!(filled.indexed_keys, 10_000);
    // 8 bytes an entry, at most 3/4 of them full.
    assert!(
        filled.memory.key_index >= 10_000 * 8 * 4 / 3,
        "{:?}",
        filled.memory
    );
    assert_eq!(
        filled.memory.total(),
        filled.memory.page_cache
            + filled.memory.replay_cache
            + filled.memory.key_index
            + filled.memory.horizon
    );
}
