//! Cell 2: the reserve latencies of a 64-caller load on the refilled store, alone, beside the
//! drop of its 48 partitions, and alone again; the same for naive redb beside its sweep.

use std::sync::atomic::AtomicBool;
use std::time::Instant;

use idemdb::{Key, ReserveOutcome, Scope, redb};

use crate::drop::DropStore;
use crate::fill::{aligned_start, window_ids};
use crate::load::{LoadRun, Step, no_side, run_load, schedule, sleep_until};
use crate::naive;
use crate::report::{Cmp, Dist, Report, ms};
use crate::settings::{DROP_TTL, HOUR_MS, LOAD_LEASE, LOAD_OPERATION, Sizes};
use crate::shared::keys::{PAYLOAD, PRINCIPAL, RESPONSE, key_bytes};
use crate::shared::nanos;

/// Reserve latencies of a load run, and the steps beside it.
struct StallResult {
    reserves: Dist,
    /// Reserves that overlapped an expiry step.
    during_steps: Dist,
    lifecycles_per_s: f64,
    steps: usize,
    step_records: u64,
    step_times: Dist,
}

fn summarise(run: LoadRun) -> StallResult {
    let during: Vec<u64> = run
        .reserves
        .iter()
        .filter(|(start, took)| {
            run.steps
                .iter()
                .any(|s| *start < s.start_ns + s.took_ns && start + took > s.start_ns)
        })
        .map(|(_, took)| *took)
        .collect();
    StallResult {
        reserves: Dist::new(run.reserves.iter().map(|r| r.1).collect()),
        during_steps: Dist::new(during),
        lifecycles_per_s: run.lifecycles as f64 / run.wall.as_secs_f64(),
        steps: run.steps.len(),
        step_records: run.steps.iter().map(|s| s.records).sum(),
        step_times: Dist::new(run.steps.iter().map(|s| s.took_ns).collect()),
    }
}

pub fn stall_cell(store: &DropStore, sizes: &Sizes, report: &mut Report) {
    let db = &store.db;
    let clock = &store.clock;
    let parts = sizes.drop_partitions;
    let n = sizes.drop_records;
    let scope = Scope::new(LOAD_OPERATION, PRINCIPAL);
    let op = |id: u64| {
        let key = Key::new(key_bytes(id));
        let start = Instant::now();
        let out = db
            .reserve(&scope, &key, PAYLOAD, LOAD_LEASE)
            .expect("reserve");
        let took = start.elapsed();
        match out {
            ReserveOutcome::Acquired(r) => db.complete(&r, RESPONSE).expect("complete"),
            other => panic!("fresh key not acquired: {other:?}"),
        }
        (start, took)
    };
    let st = db.stats();
    assert_eq!(st.partitions, parts, "the refilled partitions");
    let dropped_before = st.partitions_dropped;

    println!("stall: idemdb load alone for {:?}…", sizes.load);
    let alone = summarise(run_load(sizes.load, &op, &no_side));
    assert_eq!(
        db.stats().partitions_dropped,
        dropped_before,
        "nothing dropped without compaction"
    );

    println!("stall: idemdb load beside the drop of {parts} partitions…");
    let ttl_ms = DROP_TTL.as_millis() as u64;
    let refill_start = store.refill_start;
    let dur = sizes.load;
    let compactor = |t0: Instant, stop: &AtomicBool| {
        let mut steps = Vec::new();
        for k in 0..parts {
            if !sleep_until(t0, schedule(dur, parts as usize, k as usize), stop) {
                break;
            }
            // The refilled partition k becomes due (the load's records have a long TTL).
            clock.set(refill_start + (k + 1) * HOUR_MS + ttl_ms);
            let start = t0.elapsed();
            let r = db.compact_now().expect("compact_now");
            let took = t0.elapsed() - start;
            assert_eq!(r.partitions_dropped, 1, "one partition due per step");
            let want = window_ids(&(0..n), parts, k);
            assert_eq!(r.records_expired, want.end - want.start);
            steps.push(Step {
                start_ns: nanos(start),
                took_ns: nanos(took),
                records: r.records_expired,
            });
        }
        steps
    };
    let beside = summarise(run_load(sizes.load, &op, &compactor));
    let st = db.stats();
    println!(
        "  dropped {} partitions ({} records) during the load; {} partitions left",
        beside.steps, beside.step_records, st.partitions
    );
    if beside.steps as u64 != parts {
        println!(
            "  WARNING: only {} of {parts} partitions dropped during the load",
            beside.steps
        );
    }
    println!("stall: idemdb load alone again, after the expiry…");
    let after = summarise(run_load(sizes.load, &op, &no_side));

    // Naive redb: the same load, one durable transaction per operation, beside its sweep.
    let path = store.dir.path().join("naive.redb");
    let naive = redb::Database::create(&path).expect("reopen naive");
    let now = aligned_start() + 1_000 * HOUR_MS;
    let nop = |id: u64| naive::lifecycle(&naive, id, now);
    println!("stall: naive redb load alone…");
    let naive_alone = summarise(run_load(sizes.load, &nop, &no_side));
    println!("stall: naive redb load beside its chunked sweep…");
    let chunk = sizes.chunk;
    let sweeper = |t0: Instant, stop: &AtomicBool| {
        // The scan is a read transaction: it does not block the load, and is not a step.
        let mut steps = Vec::new();
        let keys = naive::scan(&naive, now);
        let chunks: Vec<&[Vec<u8>]> = keys.chunks(chunk).collect();
        for (i, c) in chunks.iter().enumerate() {
            if !sleep_until(t0, schedule(dur, chunks.len(), i), stop) {
                break;
            }
            let start = t0.elapsed();
            naive::remove(&naive, c);
            steps.push(Step {
                start_ns: nanos(start),
                took_ns: nanos(t0.elapsed() - start),
                records: c.len() as u64,
            });
        }
        steps
    };
    let naive_beside = summarise(run_load(sizes.load, &nop, &sweeper));
    println!(
        "  naive: {} of {} chunks removed during the load ({} rows)",
        naive_beside.steps,
        n.div_ceil(chunk as u64),
        naive_beside.step_records
    );
    println!("stall: naive redb load alone again, after the sweep…");
    let naive_after = summarise(run_load(sizes.load, &nop, &no_side));

    let c = "stall";
    let us = |d: &Dist, q: f64| d.q(q).map(|v| v / 1e3);
    for (label, idem, base) in [
        ("1. no expiry (before)", &alone, &naive_alone),
        ("2. beside expiry", &beside, &naive_beside),
        ("3. no expiry (after)", &after, &naive_after),
    ] {
        let vs = |f: &dyn Fn(&StallResult) -> Option<f64>| [f(idem), f(base), None];
        for (q, name) in [(0.5, "p50"), (0.99, "p99"), (0.999, "p99.9"), (1.0, "max")] {
            report.row(
                c,
                format!("{label}: reserve {name}, µs ↓"),
                vs(&|r| us(&r.reserves, q)),
                0,
                Cmp::Ratio,
            );
        }
        report.row(
            c,
            format!("{label}: reserves timed"),
            vs(&|r| Some(r.reserves.0.len() as f64)),
            0,
            Cmp::None,
        );
        report.row(
            c,
            format!("{label}: lifecycles/s ↑"),
            vs(&|r| Some(r.lifecycles_per_s)),
            0,
            Cmp::Ratio,
        );
    }
    type Metric<'a> = &'a dyn Fn(&StallResult) -> Option<f64>;
    let beside_rows: [(&str, Metric, usize, Cmp); 7] = [
        (
            "2. beside expiry: reserves overlapping an expiry step",
            &|r| Some(r.during_steps.0.len() as f64),
            0,
            Cmp::None,
        ),
        (
            "… their reserve p99, µs ↓",
            &|r| us(&r.during_steps, 0.99),
            0,
            Cmp::Ratio,
        ),
        (
            "… their reserve max, µs ↓",
            &|r| us(&r.during_steps, 1.0),
            0,
            Cmp::Ratio,
        ),
        (
            "2. beside expiry: steps done during the load (idemdb: partitions; naive: chunks)",
            &|r| Some(r.steps as f64),
            0,
            Cmp::None,
        ),
        (
            "2. beside expiry: records expired during the load",
            &|r| Some(r.step_records as f64),
            0,
            Cmp::Ratio,
        ),
        (
            "2. beside expiry: step time median, ms (idemdb: compact_now; naive: one chunk)",
            &|r| r.step_times.q(0.5).map(ms),
            1,
            Cmp::None,
        ),
        (
            "2. beside expiry: step time max, ms",
            &|r| r.step_times.q(1.0).map(ms),
            1,
            Cmp::None,
        ),
    ];
    for (metric, f, digits, cmp) in beside_rows {
        report.row(c, metric, [f(&beside), f(&naive_beside), None], digits, cmp);
    }
}
