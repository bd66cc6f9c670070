//! Space: dropped partitions' pages are reused, so repeated fill-and-expire cycles of the same
//! size keep the file level instead of growing by a cycle's worth each time.
//!
//! The file is the high-water mark of live pages plus pages freed but not yet reusable (a page
//! is reused only after a durable commit frees it). How many of those there are at a fill's
//! peak depends on where the applier's checkpoints fall in it, so the file may take one more of
//! redb's growth steps in a later cycle than in the first (measured: up to 2.0x the first
//! fill's size, once, then level). Without reuse, CYCLES cycles would need CYCLES times the
//! first fill's pages.
//!
//! One caller fills, so that every cycle commits the same batches: with concurrent callers the
//! batches (and so redb's page allocation and the file's growth steps) differ from run to run,
//! by up to ±40% for the same data (docs/benchmarks.md measures that case, with data in use).

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{minutes, reopenable};
use idemdb::{Error, ExecuteOutcome, IdemDb, Key, Outcome, Scope};

const THREADS: usize = 1;
const PER_THREAD: usize = 3_000;
const CYCLES: usize = 8;
/// One growth step of redb's, with room: see the module's comment.
const HIGH_WATER: f64 = 2.25;

fn fill(db: &Arc<idemdb::IdemDb>, cycle: usize) {
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let db = Arc::clone(db);
            std::thread::spawn(move || {
                let scope = Scope::new("op", format!("user-{t}"));
                for i in 0..PER_THREAD {
                    let key = Key::new(format!("c{cycle}-{i:06}-{:032x}", i * 7919 + t));
                    let response = vec![(i % 251) as u8; 200];
                    let out = db
                        .execute(&scope, &key, b"payload", move |_| {
                            Ok::<_, Error>(Outcome::Completed(response))
                        })
                        .unwrap();
                    assert!(matches!(out, ExecuteOutcome::Executed(_)));
                }
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
}

#[test]
fn fill_and_expire_cycles_reuse_the_space() {
    let (dir, path, clock) = reopenable();
    // Batches commit to redb without fsync; pages they free are reused only after the next
    // durable commit (a checkpoint). A service fills a partition over its whole width, across
    // many checkpoints; this test fills one in a fraction of a second, so it checkpoints by
    // size, often, to stand for that.
    let db = IdemDb::builder()
        .clock(clock.clone())
        .retention(minutes(5))
        .checkpoint_bytes(64 << 10)
        .open(&path)
        .unwrap();
    let _dir = dir;
    let db = Arc::new(db);
    let mut sizes = Vec::new();
    for cycle in 0..CYCLES {
        fill(&db, cycle);
        let stats = db.stats();
        assert_eq!(stats.stored_records, (THREADS * PER_THREAD) as u64);
        sizes.push(stats.bytes_on_disk);
        clock.advance(Duration::from_secs(10 * 60));
        let report = db.compact_now().unwrap();
        assert_eq!(report.records_expired, (THREADS * PER_THREAD) as u64);
        assert_eq!(db.stats().stored_records, 0);
    }
    eprintln!("file size after each fill: {sizes:?}");
    let first = sizes[0];
    for (cycle, size) in sizes.iter().enumerate() {
        assert!(
            *size as f64 <= first as f64 * HIGH_WATER,
            "cycle {cycle}: {size} bytes against {first} after the first fill ({sizes:?})"
        );
    }
}
