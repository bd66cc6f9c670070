//! Retired tables (src/records/retired.rs, src/reclaim.rs, docs/design.md §8.9): a partition
//! dropped or merged leaves the catalog by a rename in the commit that removes it, and its
//! pages are freed by later steps of at most 65,536 records each, so that no step holds the
//! writer for as long as visiting every page of a large table. A retired table is never read;
//! a power loss inside any step loses nothing live, and a later pass finishes the work.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};

use common::{LEASE, T0, acquired, each_power_loss, finish, minutes};
use idemdb::redb::{ReadableDatabase, ReadableTableMetadata, TableDefinition, TableHandle};
use idemdb::{IdemDb, Key, ManualClock, ReserveOutcome, Scope};
use idemdb_testkit::{FaultBackend, TearMode};

/// 1-minute partitions under a 60-minute TTL.
const MINUTE: u64 = 60_000;
const TTL: u64 = 60 * MINUTE;
/// The first minute window that starts after T0.
const W: u64 = T0 - T0 % MINUTE + MINUTE;
/// Records in the partition dropped: more than one reclaim step holds.
const DROPPED: usize = 70_000;
/// What a reclaim step removes at most (src/reclaim.rs).
const STEP: u64 = 1 << 16;

fn scope() -> Scope {
    Scope::new("op", "p")
}

fn open_on_disk(disk: &FaultBackend, clock: &ManualClock) -> Result<IdemDb, idemdb::Error> {
    IdemDb::builder()
        .clock(clock.clone())
        .retention(minutes(TTL / MINUTE))
        .open_with_backend(disk.clone(), disk.log())
}

/// The retired tables of the image `disk` and their lengths, read with redb itself.
fn retired(disk: &FaultBackend) -> Vec<(String, u64)> {
    let db = idemdb::redb::Builder::new()
        .create_with_backend(disk.durable_disk())
        .unwrap();
    let read = db.begin_read().unwrap();
    let names: Vec<String> = read
        .list_tables()
        .unwrap()
        .map(|t| t.name().to_string())
        .filter(|n| n.starts_with("idemdb_x_"))
        .collect();
    names
        .into_iter()
        .map(|n| {
            let len = read
                .open_table(TableDefinition::<&[u8], &[u8]>::new(&n))
                .unwrap()
                .len()
                .unwrap();
            (n, len)
        })
        .collect()
}

/// A disk holding [`DROPPED`] completed records in the minute window `W` (one partition),
/// and 100 records written an hour later, live when the first partition is due.
fn one_big_partition(clock: &ManualClock) -> FaultBackend {
    let disk = FaultBackend::new();
    {
        clock.set(W + 1_000);
        let db = open_on_disk(&disk, clock).unwrap();
        let next = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= DROPPED {
                            break;
                        }
                        finish(&db, &scope(), &format!("old-{i}"), b"r");
                    }
                });
            }
        });
        clock.set(W + TTL);
        for i in 0..100 {
            finish(&db, &scope(), &format!("live-{i}"), format!("r-live-{i}"));
        }
        assert_eq!(db.stats().partitions, 2);
    }
    // Past the first partition's drop (its window's end + TTL), before the second's.
    clock.set(W + MINUTE + TTL + 1_000);
    disk.durable_disk()
}

fn live_answer(db: &IdemDb) {
    for i in 0..100 {
        let key = format!("live-{i}");
        let got = db.reserve(&scope(), &Key::new(&key), b"x", LEASE).unwrap();
        assert_eq!(
            got,
            ReserveOutcome::Completed(format!("r-{key}").into_bytes())
        );
    }
}

#[test]
fn a_dropped_partition_is_retired_and_its_pages_freed_in_bounded_steps() {
    let clock = ManualClock::new(W);
    let disk = one_big_partition(&clock);
    let db = open_on_disk(&disk, &clock).unwrap();
    let report = db.compact_now().unwrap();
    assert_eq!(
        (
            report.partitions_dropped,
            report.records_expired,
            report.tables_reclaimed
        ),
        (1, DROPPED as u64, 1)
    );
    assert_eq!(retired(&disk), vec![]);
    live_answer(&db);
    // The dropped keys are recognised, not replayed: the retired copy is never read.
    for i in (0..DROPPED).step_by(7_001) {
        let r = acquired(
            db.reserve(&scope(), &Key::new(format!("old-{i}")), b"x", LEASE)
                .unwrap(),
        );
        assert!(r.is_beyond_horizon(), "old-{i}");
    }
    let report = db.verify(10, |_| {}).unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
}

/// Power lost inside each sync of the pass that drops and reclaims (pending writes dropped or
/// kept): every image opens, answers every live record, passes `verify` with whatever retired
/// table it holds, and the next pass leaves none. Some image holds the retired table part-way
/// reclaimed (one step of 65,536 records done): the pages are freed in steps.
#[test]
fn power_lost_inside_each_step_of_a_reclaim_loses_nothing_and_a_later_pass_finishes() {
    let clock = ManualClock::new(W);
    let before = one_big_partition(&clock);
    let mut part_way = 0;
    let mut whole = 0;
    let (syncs, reclaimed) = each_power_loss(
        &before,
        |_| vec![TearMode::DropAll, TearMode::KeepAll],
        |disk| open_on_disk(disk, &clock).unwrap(),
        |db| Ok(db.compact_now()?.tables_reclaimed),
        |n, mode, image| {
            for (_, len) in retired(&image) {
                if len == DROPPED as u64 - STEP {
                    part_way += 1;
                } else if len == DROPPED as u64 {
                    whole += 1;
                }
            }
            let db =
                open_on_disk(&image, &clock).unwrap_or_else(|e| panic!("sync {n} {mode:?}: {e}"));
            live_answer(&db);
            let report = db.verify(10, |_| {}).unwrap();
            assert!(report.is_ok(), "sync {n} {mode:?}: {:?}", report.problems);
            db.compact_now().unwrap();
            assert_eq!(db.stats().partitions, 1, "sync {n} {mode:?}");
            live_answer(&db);
            drop(db);
            assert_eq!(retired(&image), vec![], "sync {n} {mode:?}");
        },
    );
    assert_eq!(reclaimed, 1);
    assert!(
        part_way > 0 && whole > 0,
        "{syncs} syncs: {whole} images with the retired table whole, {part_way} part-way"
    );
}
