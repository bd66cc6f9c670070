//! Cell 3: proving a key absent, and replaying a stored one, with the records in 1, 48 or 168
//! partitions; by criterion, then interleaved round by round.

use std::path::Path;
use std::time::Instant;

use criterion::Criterion;
use idemdb::{IdemDb, Key, ManualClock, ReserveOutcome, Retention, Scope};

use crate::fill::{aligned_start, fill_idemdb, open_idemdb};
use crate::report::Report;
use crate::settings::{ABSENT_TTL, INTERLEAVED_ROUNDS, LEASE, Sizes, WIDTH};
use crate::shared::keys::{OPERATION, PAYLOAD, PRINCIPAL, Rng, key_bytes};
use crate::shared::nanos;
use crate::shared::report::estimate;

/// `get` of a key never stored: must prove it absent.
fn get_absent(db: &IdemDb, scope: &Scope, id: u64) {
    let found = db.get(scope, &Key::new(key_bytes(id))).expect("get");
    assert!(found.is_none(), "a fresh key is absent");
}

/// `reserve` of a stored, completed key: must replay its response (without writing).
fn replay(db: &IdemDb, scope: &Scope, id: u64) -> usize {
    match db
        .reserve(scope, &Key::new(key_bytes(id)), PAYLOAD, LEASE)
        .expect("reserve")
    {
        ReserveOutcome::Completed(r) => r.len(),
        other => panic!("stored key {id} not replayed: {other:?}"),
    }
}

/// Mean ns per call of `calls` calls of `f`.
fn per_call_ns(calls: u64, mut f: impl FnMut()) -> f64 {
    let t = Instant::now();
    for _ in 0..calls {
        f();
    }
    nanos(t.elapsed()) as f64 / calls as f64
}

fn median(v: &[f64]) -> Option<f64> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied()
}

/// Criterion on `get` of a never-stored key and `reserve` of a completed one, then the
/// interleaved cross-check.
pub fn absence_cell(
    c: &mut Criterion,
    root: &Path,
    sizes: &Sizes,
    test_mode: bool,
    report: &mut Report,
) {
    let n = sizes.absent_records;
    let start = aligned_start();
    let mut stores = Vec::new();
    for &parts in &sizes.absent_partitions {
        let dir = tempfile::tempdir_in(root).expect("tempdir");
        let clock = ManualClock::new(start);
        let retention = Retention::default()
            .ttl(ABSENT_TTL)
            .partition_width(WIDTH)
            .compact_interval(None);
        let db = open_idemdb(&dir.path().join("absent.idemdb"), &clock, retention, true);
        println!("absence: filling {n} records into {parts} partitions…");
        let (took, _) = fill_idemdb(&db, &clock, start, parts, 0..n);
        let st = db.stats();
        assert_eq!((st.partitions, st.stored_records), (parts, n));
        println!(
            "  {:.1} s, {} indexed keys",
            took.as_secs_f64(),
            st.indexed_keys
        );
        stores.push((parts, db, st.indexed_keys, st.commits, dir));
    }
    let scope = Scope::new(OPERATION, PRINCIPAL);
    let mut g = c.benchmark_group("retention_absent");
    for (parts, db, ..) in &stores {
        let mut next = 1u64 << 50;
        g.bench_function(format!("get_absent_{parts}p"), |b| {
            b.iter(|| {
                next += 1;
                get_absent(db, &scope, next);
            })
        });
    }
    g.finish();
    let mut g = c.benchmark_group("retention_replay");
    for (parts, db, ..) in &stores {
        let mut rng = Rng::from_state(0x9e37_79b9_7f4a_7c15 ^ parts);
        g.bench_function(format!("reserve_replay_{parts}p"), |b| {
            b.iter(|| replay(db, &scope, rng.below(n)))
        });
    }
    g.finish();
    // Cross-check, less exposed to the VM's drift between criterion's benchmarks: the stores
    // measured in turn, round after round (order rotated), and compared round by round.
    let (rounds, gets, replays) = if test_mode {
        (2, 100, 10)
    } else {
        (INTERLEAVED_ROUNDS, 100_000, 10_000)
    };
    let mut get_ns = vec![Vec::new(); stores.len()];
    let mut replay_ns = vec![Vec::new(); stores.len()];
    let mut next = 1u64 << 52;
    let mut rng = Rng::from_state(0x2545_f491_4f6c_dd1d);
    for round in 0..rounds {
        for j in 0..stores.len() {
            let i = (round + j) % stores.len();
            let db = &stores[i].1;
            get_ns[i].push(per_call_ns(gets, || {
                next += 1;
                get_absent(db, &scope, next);
            }));
            replay_ns[i].push(per_call_ns(replays, || {
                std::hint::black_box(replay(db, &scope, rng.below(n)));
            }));
        }
    }
    for (_, db, indexed, commits, _) in &stores {
        let st = db.stats();
        assert_eq!(
            st.commits, *commits,
            "absent gets and replays write nothing"
        );
        assert_eq!(st.indexed_keys, *indexed);
    }
    let paired = |v: &[Vec<f64>], i: usize| {
        let ratios: Vec<f64> = v[i].iter().zip(&v[0]).map(|(a, b)| a / b).collect();
        median(&ratios)
    };

    // Test mode leaves criterion's files of the last real run: not this run's.
    let criterion = |group: &str, id: String| {
        if test_mode {
            None
        } else {
            estimate(group, &id).map(|e| e.median)
        }
    };
    let cell = "absence";
    let single = stores[0].0;
    let base_get = criterion("retention_absent", format!("get_absent_{single}p"));
    let base_replay = criterion("retention_replay", format!("reserve_replay_{single}p"));
    for (i, (parts, _, indexed, ..)) in stores.iter().enumerate() {
        let get = criterion("retention_absent", format!("get_absent_{parts}p"));
        let replay = criterion("retention_replay", format!("reserve_replay_{parts}p"));
        report.idem(
            cell,
            format!(
                "{parts} partitions ({n} records): get of an absent key, criterion median ns ↓"
            ),
            get,
            0,
        );
        report.idem(
            cell,
            format!("… interleaved: median of {rounds} rounds × {gets} gets, ns ↓"),
            median(&get_ns[i]),
            0,
        );
        report.idem(
            cell,
            format!(
                "{parts} partitions: reserve of a completed key (replay), criterion median ns ↓"
            ),
            replay,
            0,
        );
        report.idem(
            cell,
            format!("… interleaved: median of {rounds} rounds × {replays} replays, ns ↓"),
            median(&replay_ns[i]),
            0,
        );
        report.idem(
            cell,
            format!("{parts} partitions: indexed_keys (≈16 B each)"),
            *indexed as f64,
            0,
        );
        if i == 0 {
            continue;
        }
        let ratio = get.zip(base_get).map(|(a, b)| a / b);
        let ratio_paired = paired(&get_ns, i);
        let per_part = format!("{parts} ÷ {single} partition");
        for (what, r) in [
            (format!("absent get, {per_part}: criterion medians"), ratio),
            (
                format!("absent get, {per_part}: interleaved, median of per-round ratios"),
                ratio_paired,
            ),
            (
                format!("replay, {per_part}: criterion medians"),
                replay.zip(base_replay).map(|(a, b)| a / b),
            ),
            (
                format!("replay, {per_part}: interleaved, median of per-round ratios"),
                paired(&replay_ns, i),
            ),
        ] {
            report.idem(cell, what, r, 2);
        }
        for (how, r) in [("criterion medians", ratio), ("interleaved", ratio_paired)] {
            report.targets.push((
                format!("absence check with {parts} partitions ≤ 1.3× one partition ({how})"),
                r.map_or("–".into(), |r| format!("{r:.2}×")),
                r.filter(|_| !test_mode).map(|r| r <= 1.3),
            ));
        }
    }
}
