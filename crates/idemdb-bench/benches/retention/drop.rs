//! Cell 1: fill 1M records into 48 partitions, time opening the file, drop the partitions one
//! by one, refill the same keys; the same records expired by the baselines' sweeps.

use std::path::Path;
use std::time::Instant;

use idemdb::{IdemDb, Key, ManualClock, Scope};

use crate::fill::{aligned_start, drop_retention, fill_idemdb, open_idemdb, window_ids};
use crate::report::{Cmp, Dist, MB, Report, ms};
use crate::settings::{DROP_TTL, HOUR_MS, Sizes, THREADS};
use crate::shared::keys::{OPERATION, PRINCIPAL, key_bytes};
use crate::shared::nanos;
use crate::space::{file_size, idemdb_allocated};
use crate::{naive, open, sqlite};

/// The refilled store, which the stall cell reuses.
pub struct DropStore {
    pub db: IdemDb,
    pub clock: ManualClock,
    /// Start of the refill's first window.
    pub refill_start: u64,
    /// Holds the idemdb file and the baselines' (dropped after `db`).
    pub dir: tempfile::TempDir,
}

pub fn drop_cell(root: &Path, sizes: &Sizes, report: &mut Report) -> DropStore {
    let n = sizes.drop_records;
    let parts = sizes.drop_partitions;
    let dir = tempfile::tempdir_in(root).expect("tempdir");
    let path = dir.path().join("drop.idemdb");
    let start = aligned_start();
    let clock = ManualClock::new(start);
    let db = open_idemdb(&path, &clock, drop_retention(), true);
    let size_empty = file_size(&path);

    println!("drop: filling {n} records into {parts} partitions through the API…");
    let (fill, flagged) = fill_idemdb(&db, &clock, start, parts, 0..n);
    assert_eq!(flagged, 0, "nothing was dropped yet");
    let st = db.stats();
    assert_eq!(st.stored_records, n, "stored records after the fill");
    assert_eq!(st.partitions, parts, "one partition per window");
    let size_filled = file_size(&path);
    let indexed = st.indexed_keys;
    println!(
        "  {:.1} s ({:.0} records/s), {:.1} MB, {} indexed keys",
        fill.as_secs_f64(),
        n as f64 / fill.as_secs_f64(),
        size_filled as f64 / MB,
        indexed
    );

    drop(db);
    let used_filled = idemdb_allocated(&path);
    let (db, open_times) = open::measure(&path, &clock, n, indexed);

    // Drop: each partition made due in turn, each compact_now timed.
    let ttl_ms = DROP_TTL.as_millis() as u64;
    let mut per_part = Vec::new();
    let mut expired = 0;
    for k in 0..parts {
        clock.set(start + (k + 1) * HOUR_MS + ttl_ms);
        let t = Instant::now();
        let r = db.compact_now().expect("compact_now");
        per_part.push(nanos(t.elapsed()));
        let want = window_ids(&(0..n), parts, k);
        assert_eq!(r.partitions_dropped, 1, "one partition due per step");
        assert_eq!(r.records_expired, want.end - want.start);
        expired += r.records_expired;
    }
    assert_eq!(expired, n, "records_expired equals what was filled");
    let st = db.stats();
    assert_eq!((st.partitions, st.stored_records), (0, 0));
    assert_eq!(st.indexed_keys, 0);
    let horizon_keys = st.horizon_keys;
    // A pass with nothing due, while the horizon holds the dropped keys.
    let idle = Dist::new(
        (0..5)
            .map(|_| {
                let t = Instant::now();
                let r = db.compact_now().expect("compact_now");
                assert_eq!(r.partitions_dropped, 0);
                nanos(t.elapsed())
            })
            .collect(),
    );
    let size_dropped = file_size(&path);
    drop(db);
    let used_dropped = idemdb_allocated(&path);
    let db = open_idemdb(&path, &clock, drop_retention(), false);
    let drops = Dist::new(per_part);
    println!(
        "  dropped {parts} partitions: total {:.0} ms, median {:.1} ms, max {:.1} ms; file {:.1} MB",
        ms(drops.sum()),
        ms(drops.q(0.5).unwrap_or(0.0)),
        ms(drops.q(1.0).unwrap_or(0.0)),
        size_dropped as f64 / MB
    );
    // Dropped keys are gone, and recognised beyond the horizon.
    assert!(
        db.get(&Scope::new(OPERATION, PRINCIPAL), &Key::new(key_bytes(0)))
            .expect("get")
            .is_none()
    );

    // Refill the same keys, in later windows.
    let refill_start = start + (parts + 1 + 48) * HOUR_MS;
    println!("  refilling the same {n} keys…");
    let (refill, flagged) = fill_idemdb(&db, &clock, refill_start, parts, 0..n);
    let size_refilled = file_size(&path);
    let st = db.stats();
    assert_eq!(st.stored_records, n);
    drop(db);
    let used_refilled = idemdb_allocated(&path);
    let db = open_idemdb(&path, &clock, drop_retention(), false);
    println!(
        "  {:.1} s, {flagged} of {n} flagged beyond the horizon; file {:.1} MB",
        refill.as_secs_f64(),
        size_refilled as f64 / MB
    );

    // Baselines, on files next to it.
    let naive = naive::drop_baseline(dir.path(), sizes);
    let sqlite = sqlite::drop_baseline(dir.path(), sizes);

    let c = "drop";
    let mb = |b: u64| Some(b as f64 / MB);
    let per_step = |q: f64| [&drops, &naive.chunks, &sqlite.chunks].map(|d| d.q(q).map(ms));
    report.row(
        c,
        format!("fill {n} records, s (idemdb: API, {THREADS} threads; baselines: 100k-row txns)"),
        [
            Some(fill.as_secs_f64()),
            Some(naive.fill_s),
            Some(sqlite.fill_s),
        ],
        1,
        Cmp::None,
    );
    report.row(
        c,
        "time to expire everything, ms ↓",
        [
            Some(ms(drops.sum())),
            Some(naive.total_ms),
            Some(sqlite.total_ms),
        ],
        0,
        Cmp::Ratio,
    );
    report.row(
        c,
        format!(
            "… per step, median ms (idemdb: 1 partition ≈ {} records; baselines: 1 chunk of {})",
            n / parts,
            sizes.chunk
        ),
        per_step(0.5),
        1,
        Cmp::None,
    );
    report.row(c, "… per step, max ms", per_step(1.0), 1, Cmp::None);
    report.row(
        c,
        "… steps (durable transactions)",
        [
            Some(parts as f64),
            Some(naive.chunks.0.len() as f64),
            Some(sqlite.chunks.0.len() as f64),
        ],
        0,
        Cmp::None,
    );
    report.row(
        c,
        "… of which the scan for expired rows, ms",
        [None, naive.scan_ms, None],
        0,
        Cmp::None,
    );
    // File sizes: before the fill, after it, after expiring everything, after the refill.
    let idem_sizes = [size_empty, size_filled, size_dropped, size_refilled];
    for (i, what, digits, cmp) in [
        (0, "before the fill", 2, Cmp::None),
        (1, "after the fill", 1, Cmp::Ratio),
        (2, "after expiring everything", 1, Cmp::None),
        (3, "after refilling the same records", 1, Cmp::Ratio),
    ] {
        report.row(
            c,
            format!("file MB, {what}"),
            [mb(idem_sizes[i]), mb(naive.sizes[i]), mb(sqlite.sizes[i])],
            digits,
            cmp,
        );
    }
    let idem_in_use = [used_filled, used_dropped, used_refilled];
    for (i, what) in [
        "after the fill",
        "after expiring everything",
        "after refilling",
    ]
    .into_iter()
    .enumerate()
    {
        report.row(
            c,
            format!("in use MB (redb: allocated pages; SQLite: pages not free), {what}"),
            [
                mb(idem_in_use[i]),
                mb(naive.in_use[i]),
                mb(sqlite.in_use[i]),
            ],
            1,
            Cmp::None,
        );
    }
    let growth = |before: u64, after: u64| (after as f64 / before as f64 - 1.0) * 100.0;
    let idem_growth = growth(size_filled, size_refilled);
    report.row(
        c,
        "growth of the second fill over the first, %",
        [
            Some(idem_growth),
            Some(growth(naive.sizes[1], naive.sizes[3])),
            Some(growth(sqlite.sizes[1], sqlite.sizes[3])),
        ],
        1,
        Cmp::None,
    );
    report.row(
        c,
        "in use after the refill over in use after the first fill, %",
        [
            Some(growth(used_filled, used_refilled)),
            Some(growth(naive.in_use[0], naive.in_use[2])),
            Some(growth(sqlite.in_use[0], sqlite.in_use[2])),
        ],
        1,
        Cmp::None,
    );
    report.idem(c, "refill: fill time, s", refill.as_secs_f64(), 1);
    report.idem(
        c,
        "refill: keys flagged beyond the horizon (of the refilled)",
        flagged as f64,
        0,
    );
    report.idem(
        c,
        "compact_now with nothing due (horizon holding the dropped keys), median ms",
        ms(idle.q(0.5).unwrap_or(0.0)),
        2,
    );
    open_times.report(c, report);
    report.idem(c, "indexed_keys after the fill", indexed as f64, 0);
    report.idem(
        c,
        "… key index memory at ≈16 B each, MB",
        indexed as f64 * 16.0 / MB,
        1,
    );
    report.idem(c, "horizon_keys after the drop", horizon_keys as f64, 0);
    report.idem(
        c,
        "… horizon memory at ≈12 B each, MB",
        horizon_keys as f64 * 12.0 / MB,
        1,
    );
    report.targets.push((
        "the second fill grows the file by no more than 10%".into(),
        format!("{idem_growth:+.1}%"),
        Some(idem_growth <= 10.0),
    ));
    DropStore {
        db,
        clock,
        refill_start,
        dir,
    }
}
