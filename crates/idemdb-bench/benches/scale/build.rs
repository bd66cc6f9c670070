//! A wide partition built beside one caller: what a build's steps cost the calls that wait
//! for the writer. Each step is one durable commit of at most 2 MiB of records taken under
//! the writer's lock (docs/design.md §8.8), so a reserve that arrives during one waits for it.
//!
//! One hour of records (10 s partitions, the 7-day TTL) is written by 64 callers, its narrow
//! partitions summarised while the hour is open; then the hour closes and one caller runs
//! lifecycles of fresh keys (reserve, then complete, each timed) for 3 s alone, then while
//! another thread's `compact_now` builds the hour's wide partition, then 3 s alone again.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use idemdb::{IdemDb, Key, ManualClock, ReserveOutcome};
use serde_json::{Value, json};

use crate::load::{retention, scope, write_completed};
use crate::settings::{LEASE, REQUEST, RESPONSE};
use crate::shared::keys::{fresh_id, key_bytes};
use crate::shared::nanos;

const HOUR_MS: u64 = 3_600_000;
/// The hour the records are written in (the bench's clock start, aligned to an hour).
const HOUR: u64 = crate::settings::T0_MS - crate::settings::T0_MS % HOUR_MS;
/// How long the caller runs alone before and after the build.
const ALONE: Duration = Duration::from_secs(3);

/// Builds one hour of `records` records beside one caller, in a new store in `dir`; returns
/// the build's time and the caller's latencies alone and beside it.
pub fn measure(dir: &std::path::Path, records: u64, alone: Option<Duration>) -> Value {
    let alone = alone.unwrap_or(ALONE);
    let path = dir.join(format!("build-{records}.idemdb"));
    let clock = ManualClock::new(HOUR);
    let db = IdemDb::builder()
        .clock(clock.clone())
        .retention(retention(None))
        .open(&path)
        .expect("open idemdb");
    write_completed(
        &db,
        &clock,
        records,
        |id| HOUR + id * HOUR_MS / records,
        false,
    );
    // The hour's last 10 s window closes at its end: every other one is summarised now, as
    // the compactor does while the hour is open; the pass measured builds the hour.
    clock.set(HOUR + HOUR_MS - 1);
    db.compact_now().expect("summaries");
    clock.set(HOUR + HOUR_MS + 1_000);
    let before = lifecycles(&db, &|t| t.elapsed() < alone);
    let building = AtomicBool::new(true);
    let (build_ms, beside) = std::thread::scope(|s| {
        let build = s.spawn(|| {
            let t = Instant::now();
            let report = db.compact_now().expect("the build");
            building.store(false, Ordering::Release);
            assert_eq!(report.wide_partitions_built, 1, "{report:?}");
            t.elapsed().as_secs_f64() * 1e3
        });
        let beside = lifecycles(&db, &|_| building.load(Ordering::Acquire));
        (build.join().expect("the build's thread"), beside)
    });
    let after = lifecycles(&db, &|t| t.elapsed() < alone);
    drop(db);
    let _ = std::fs::remove_file(&path);
    let mut log = path.into_os_string();
    log.push("-wal");
    let _ = std::fs::remove_file(log);
    json!({
        "records": records,
        "build_ms": build_ms,
        "before": before,
        "beside": beside,
        "after": after,
    })
}

/// Lifecycles of fresh keys by one caller while `go` says so: reserve and complete timed
/// apart. p50, p99, p99.9 and the longest of each, in ns.
fn lifecycles(db: &IdemDb, go: &dyn Fn(Instant) -> bool) -> Value {
    let scope = scope();
    let (mut reserves, mut completes) = (Vec::new(), Vec::new());
    // When the longest reserve began, ms into the phase.
    let (mut longest, mut longest_at) = (0, 0.0);
    let t = Instant::now();
    while go(t) {
        let key = Key::new(key_bytes(fresh_id()));
        let op = Instant::now();
        let answer = db
            .reserve(&scope, &key, &REQUEST[..], LEASE)
            .expect("reserve");
        let took = nanos(op.elapsed());
        if took > longest {
            (longest, longest_at) = (took, (op - t).as_secs_f64() * 1e3);
        }
        reserves.push(took);
        let ReserveOutcome::Acquired(r) = answer else {
            panic!("a fresh key answered {answer:?}");
        };
        let op = Instant::now();
        db.complete(&r, &RESPONSE[..]).expect("complete");
        completes.push(nanos(op.elapsed()));
    }
    json!({
        "lifecycles": reserves.len(),
        "longest_reserve_at_ms": longest_at,
        "reserve": tail(reserves),
        "complete": tail(completes),
    })
}

fn tail(mut ns: Vec<u64>) -> Value {
    ns.sort_unstable();
    let q = |q: f64| crate::shared::report::quantile(&ns, q).unwrap_or(0.0);
    json!({
        "p50_ns": q(0.5),
        "p99_ns": q(0.99),
        "p999_ns": q(0.999),
        "max_ns": ns.last().copied().unwrap_or(0),
    })
}
