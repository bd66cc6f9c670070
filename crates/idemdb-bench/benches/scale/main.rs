//! idemdb at the sizes its horizon implies: a 24 h to 7 day retention at 100 to 1,000 requests
//! a second holds millions to hundreds of millions of records. For each size (1M, 10M and 50M
//! records by default; `IDEMDB_SCALE_RECORDS=1000000,10000000` to choose) the bench:
//!
//! 1. loads a new store with that many completed records (100-byte requests, 200-byte
//!    responses, 7-day TTL, default partitions), 64 callers, the clock moving through one
//!    simulated day (`load.rs`): load rate, the loading process's resident memory, file size;
//! 2. waits for the load's writes to reach the disk (`sync`), drops the page cache (root only)
//!    and reads the file whole into it, then opens the store in a new process with the
//!    builder's defaults (no `verify_on_open`) twice, the first untimed: replays of up to
//!    500,000 random stored keys by one caller for 10 s (rate, p50, p99), resident memory
//!    after them, then 2,000 reserves of fresh keys (p50, p99), against the same on an empty
//!    database (`probe.rs`); each probe also says how much it read from the disk meanwhile
//!    (none, when the page cache held the file);
//! 3. drops the page cache and reads the file whole again, opens it with plain redb under the
//!    same page cache, and reads the same keys (once untimed, to find the partition of each)
//!    in the partition that holds each, as if finding the partition were free: the anchor for
//!    open and replays;
//! 4. drops the page cache (root only; the table says when it could not) and opens the store
//!    in a new process: open time, resident memory after the open and its peak; then again,
//!    the page cache warm: open time and memory; then with `verify_on_open`;
//! 5. drops the page cache again and opens idemdb with `verify_on_open`; then opens it,
//!    completes 1,000 new lifecycles and aborts (`kill -9`), and times the open that recovers;
//!    then the same again, the recovering open with `verify_on_open`.
//!
//! Then, apart from the stores: the wide partitions' filters alone; an hour's wide partition
//! built beside one caller timing lifecycles (`build.rs`; `IDEMDB_SCALE_BUILD=records,...`,
//! default 416,667 and 2,083,334: an hour of 10M and 50M records a day); and the table of
//! recognised keys alone (`IDEMDB_SCALE_RECOGNITION=held:entered,...`; default 30M:420k and
//! 150M:2.1M, what factor 4 keeps of a 24 h TTL at 10M and 50M records a day, and an hour's
//! drop).
//!
//! Each measurement runs in a process of its own (this binary, `IDEMDB_SCALE_PROBE` set), so
//! nothing the load left in memory is counted. Not criterion: every figure is one process's
//! one run. Run by hand, not in CI's time: `cargo bench -p idemdb-bench --bench scale` (about
//! 45 minutes and 30 GB of disk for the default sizes). The files live in
//! `IDEMDB_SCALE_DIR` (default: the system's temp dir), outside the repository, and are
//! removed after each size unless `IDEMDB_SCALE_KEEP=1`. `IDEMDB_SCALE_CACHE_MB` sets redb's
//! cache for every open (default: the builder's), `IDEMDB_SCALE_QUICK_REPAIR=1` (or `0`) sets
//! `Builder::quick_repair` for every open. The table is printed and written to
//! `target/bench-results/scale.md`. Under `cargo test --benches` one tiny size runs, and nothing
//! is written.

mod build;
mod load;
mod probe;
mod report;
mod settings;
#[path = "../shared/mod.rs"]
mod shared;

use std::path::PathBuf;

use report::{Report, Row};

fn main() {
    if probe::run_if_probe() {
        return;
    }
    let test_mode = shared::is_test_mode();
    let plan = settings::plan(test_mode);
    let root = match std::env::var_os("IDEMDB_SCALE_DIR") {
        Some(dir) => tempfile::Builder::new()
            .prefix("idemdb-scale-")
            .tempdir_in(PathBuf::from(dir))
            .expect("a directory in IDEMDB_SCALE_DIR"),
        None => shared::temp_root("idemdb-scale-"),
    };
    let keep = std::env::var_os("IDEMDB_SCALE_KEEP").is_some_and(|v| v == "1");
    let mut report = Report::default();

    let empty = root.path().join("empty.idemdb");
    drop(load::open(
        &empty,
        &idemdb::ManualClock::new(load::day_end()),
    ));
    report.empty = Some(probe::run(
        probe::Job::Idemdb {
            replay: std::time::Duration::ZERO,
            fresh: plan.fresh_reserves,
            verify: false,
        },
        &empty,
        0,
    ));

    for &records in &plan.sizes {
        let path = root.path().join(format!("scale-{records}.idemdb"));
        println!("{records} records: loading into {}", path.display());
        let loaded = load::fill(&path, records);
        // The builder's defaults: no `verify_on_open`. Replays and fresh reserves first, then
        // plain redb's point reads, each after the page cache was dropped and the file read
        // whole into it: the load leaves part of the file on the disk only, other files'
        // pages would crowd it out, and plain redb's probe reads each key once before its
        // clock starts (to find its partition), so without this idemdb's replays alone would
        // read the disk. Each probe reports what it read from the disk meanwhile. (After the
        // cache is dropped, an open reads little of the file, and replays read the disk.)
        let idemdb = probe::Job::Idemdb {
            replay: plan.replay_time,
            fresh: plan.fresh_reserves,
            verify: false,
        };
        probe::read_whole(&path, plan.drop_page_cache);
        // Once untimed, as plain redb's probe reads its keys once before its clock starts:
        // the pages its keys are on read once more, which the kernel keeps before pages read
        // only by `read_whole` when memory runs short.
        // (No fresh reserves in it: they would leave the measured run's keys in progress.)
        let warm_up = probe::Job::Idemdb {
            replay: plan.replay_time,
            fresh: 0,
            verify: false,
        };
        probe::run(warm_up, &path, records);
        let reads = probe::run(idemdb, &path, records);
        probe::read_whole(&path, plan.drop_page_cache);
        let redb = probe::run(
            probe::Job::Redb {
                replay: plan.replay_time,
            },
            &path,
            records,
        );
        let open_only = |verify| probe::Job::Idemdb {
            replay: std::time::Duration::ZERO,
            fresh: 0,
            verify,
        };
        let cold = plan.drop_page_cache && probe::drop_page_cache();
        let first = probe::run(open_only(false), &path, records);
        let warm = probe::run(open_only(false), &path, records);
        let verified = probe::run(open_only(true), &path, records);
        let cold_again = plan.drop_page_cache && probe::drop_page_cache();
        let cold_verified = probe::run(open_only(true), &path, records);
        let killed = |from| probe::Job::Killed {
            writes: 1_000,
            from,
        };
        probe::run(killed(0), &path, records);
        let after_kill = probe::run(open_only(false), &path, records);
        probe::run(killed(1_000), &path, records);
        let after_kill_verified = probe::run(open_only(true), &path, records);
        println!(
            "  reads {reads}\n  first open {first}\n  warm open {warm}\n  warm open verified {verified}\n  \
             plain redb {redb}\n  cold open verified {cold_verified}\n  open after kill -9 \
             {after_kill}\n  verified open after kill -9 {after_kill_verified}"
        );
        report.rows.push(Row {
            records,
            loaded,
            cold,
            reads,
            first,
            warm,
            verified,
            cold_verified: cold_again.then_some(cold_verified),
            after_kill,
            after_kill_verified,
            redb,
        });
        if !keep {
            let mut log = path.as_os_str().to_owned();
            log.push("-wal");
            let _ = std::fs::remove_file(&path);
            let _ = std::fs::remove_file(PathBuf::from(log));
        }
    }
    // 24 filters (24 wide partitions) of 40k, 400k and 2M keys; a week of 50M records (24
    // groups of 7 hours and the open group's hours: about 30 filters, here of equal size), and
    // the same week's 168 hours were they not grouped.
    let shapes: &[(usize, u64)] = if test_mode {
        &[(4, 1_000)]
    } else {
        &[
            (24, 40_000),
            (24, 400_000),
            (24, 2_000_000),
            (30, 1_666_667),
            (168, 300_000),
        ]
    };
    for &(filters, keys) in shapes {
        let lookups = if test_mode { 1_000 } else { 1_000_000 };
        let (ns, rate) = idemdb::testing::filter_lookup_cost(filters, keys, lookups);
        println!("  {filters} filters of {keys} keys: {ns:.0} ns a lookup, false rate {rate:.4}");
        report.filters.push((filters, keys, ns, rate));
    }
    // A wide partition built beside one caller: an hour of 10M and 50M records a day.
    for records in settings::build_shapes(test_mode) {
        let alone = test_mode.then_some(std::time::Duration::from_millis(100));
        let stall = build::measure(root.path(), records, alone);
        println!("  an hour of {records} records built beside one caller: {stall}");
        report.builds.push(stall);
    }
    // Recognised keys on disk: what factor 4 keeps (3 TTLs of a 24 h TTL) at 10M and 50M
    // records a day, and an hour's drop entered into it.
    for (held, dropped) in recognition_shapes(test_mode) {
        let path = root.path().join(format!("recognised-{held}.redb"));
        let lookups = if test_mode { 1_000 } else { 200_000 };
        let cost = idemdb::testing::recognition_cost(&path, held, dropped, lookups)
            .expect("the recognition table's costs");
        let _ = std::fs::remove_file(&path);
        println!("  {held} recognised keys held, {dropped} entered: {cost:?}");
        report.recognition.push((held, dropped, cost));
    }
    if keep {
        println!("kept: {}", root.keep().display());
    }
    report.publish(test_mode);
}

/// (keys held, keys a drop enters) for the table of recognised keys;
/// `IDEMDB_SCALE_RECOGNITION=held:dropped,...` to choose.
fn recognition_shapes(test_mode: bool) -> Vec<(u64, u64)> {
    if test_mode {
        return vec![(10_000, 2_000)];
    }
    match std::env::var("IDEMDB_SCALE_RECOGNITION") {
        Ok(list) => list
            .split(',')
            .filter(|s| !s.is_empty())
            .map(|pair| {
                let (held, dropped) = pair.split_once(':').expect("held:dropped");
                (
                    held.parse().expect("keys held"),
                    dropped.parse().expect("keys dropped"),
                )
            })
            .collect(),
        Err(_) => vec![(30_000_000, 420_000), (150_000_000, 2_100_000)],
    }
}
