//! Open time of the filled file: idemdb rebuilds its key index by scanning every partition;
//! plain redb opening the same file shows what is idemdb's own.

use std::path::Path;
use std::time::Instant;

use idemdb::{IdemDb, ManualClock, redb};

use crate::fill::{drop_retention, open_idemdb};
use crate::report::Report;
use crate::settings::OPEN_REPEATS;

/// Medians over `OPEN_REPEATS` opens, index 0 with page verification, 1 without.
pub struct OpenTimes {
    /// idemdb: (median ms, "lo–hi" range).
    idem: [(f64, String); 2],
    /// Plain redb on the same file, median ms.
    raw: [f64; 2],
}

/// Time to open a file with plain redb (no idemdb layout to load).
fn raw_redb_open_ms(path: &Path, verify: bool) -> f64 {
    let t = Instant::now();
    let db = redb::Builder::new()
        .set_check_integrity_on_open(verify)
        .open(path)
        .expect("open with redb");
    let took = t.elapsed().as_secs_f64() * 1e3;
    drop(db);
    took
}

/// Opens the closed file at `path` `OPEN_REPEATS` times with verification on and off
/// (alternating, plain redb first each time); every open must find `records` records and
/// `indexed` keys. Returns the last open, without verification.
pub fn measure(
    path: &Path,
    clock: &ManualClock,
    records: u64,
    indexed: u64,
) -> (IdemDb, OpenTimes) {
    let mut raw_open_ms = [Vec::new(), Vec::new()];
    let mut open_ms = [Vec::new(), Vec::new()];
    let mut db = None;
    for _ in 0..OPEN_REPEATS {
        for (i, verify) in [true, false].into_iter().enumerate() {
            // One handle at a time: redb locks the file.
            drop(db.take());
            raw_open_ms[i].push(raw_redb_open_ms(path, verify));
            let t = Instant::now();
            let opened = open_idemdb(path, clock, drop_retention(), verify);
            open_ms[i].push(t.elapsed().as_secs_f64() * 1e3);
            let st = opened.stats();
            assert_eq!((st.stored_records, st.indexed_keys), (records, indexed));
            db = Some(opened);
        }
    }
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let spread = |v: &[f64]| {
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(0.0, f64::max);
        format!("{lo:.0}–{hi:.0}")
    };
    let times = OpenTimes {
        idem: [0, 1].map(|i| (median(&open_ms[i]), spread(&open_ms[i]))),
        raw: [median(&raw_open_ms[0]), median(&raw_open_ms[1])],
    };
    println!(
        "  open: {:.0} ms with verify_on_open, {:.0} ms without (plain redb: {:.0} / {:.0} ms)",
        times.idem[0].0, times.idem[1].0, times.raw[0], times.raw[1]
    );
    (db.expect("opened"), times)
}

impl OpenTimes {
    pub fn report(&self, cell: &'static str, report: &mut Report) {
        for (i, setting) in ["on", "off"].into_iter().enumerate() {
            report.idem(
                cell,
                format!(
                    "open the filled file, verify_on_open {setting}, median of {OPEN_REPEATS} ms \
                     (range {})",
                    self.idem[i].1
                ),
                self.idem[i].0,
                0,
            );
        }
        report.idem(
            cell,
            "… the same file opened by plain redb (no key index to rebuild), check on, ms",
            self.raw[0],
            0,
        );
        report.idem(
            cell,
            "… the same file opened by plain redb, check off, ms",
            self.raw[1],
            0,
        );
    }
}
