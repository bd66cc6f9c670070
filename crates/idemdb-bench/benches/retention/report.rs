//! The retention table: rows of idemdb, naive redb and SQLite, with idemdb ÷ baseline where
//! the columns are comparable, then targets and notes.

use std::fmt::Write as _;

use crate::shared::report::{fmt_val, quantile, table_row, write_machine, write_targets};

pub const MB: f64 = 1024.0 * 1024.0;

pub fn ms(ns: f64) -> f64 {
    ns / 1e6
}

/// Distribution of durations, in ns (sorted).
pub struct Dist(pub Vec<u64>);

impl Dist {
    pub fn new(mut v: Vec<u64>) -> Dist {
        v.sort_unstable();
        Dist(v)
    }

    pub fn q(&self, q: f64) -> Option<f64> {
        quantile(&self.0, q)
    }

    pub fn sum(&self) -> f64 {
        self.0.iter().map(|&x| x as f64).sum()
    }
}

#[derive(Clone, Copy, PartialEq)]
pub enum Cmp {
    /// Show idemdb ÷ baseline.
    Ratio,
    /// Different units per column, or not comparable: no ratio.
    None,
}

struct Row {
    cell: &'static str,
    metric: String,
    vals: [Option<f64>; 3],
    digits: usize,
    cmp: Cmp,
}

#[derive(Default)]
pub struct Report {
    rows: Vec<Row>,
    /// (target, measured, met); `None`: not measured.
    pub targets: Vec<(String, String, Option<bool>)>,
    pub notes: Vec<String>,
}

impl Report {
    /// Values of idemdb, naive redb and SQLite.
    pub fn row(
        &mut self,
        cell: &'static str,
        metric: impl Into<String>,
        vals: [Option<f64>; 3],
        digits: usize,
        cmp: Cmp,
    ) {
        self.rows.push(Row {
            cell,
            metric: metric.into(),
            vals,
            digits,
            cmp,
        });
    }

    /// A row with an idemdb value only.
    pub fn idem(
        &mut self,
        cell: &'static str,
        metric: impl Into<String>,
        v: impl Into<Option<f64>>,
        digits: usize,
    ) {
        self.row(cell, metric, [v.into(), None, None], digits, Cmp::None);
    }

    pub fn markdown(&self, machine: &[(String, String)]) -> String {
        let mut md = String::new();
        write_machine(&mut md, machine);
        table_row(
            &mut md,
            &[
                "cell",
                "metric",
                "idemdb",
                "redb naive",
                "SQLite",
                "idemdb ÷ naive",
                "idemdb ÷ SQLite",
            ],
        );
        let _ = writeln!(md, "|---|---|--:|--:|--:|--:|--:|");
        for r in &self.rows {
            let [a, b, c] = r.vals.map(|v| fmt_val(v, r.digits));
            let ratio = |i: usize| match (r.cmp, r.vals[0], r.vals[i]) {
                (Cmp::Ratio, Some(x), Some(y)) if y > 0.0 => fmt_ratio(x / y),
                _ => "–".into(),
            };
            table_row(
                &mut md,
                &[r.cell, &r.metric, &a, &b, &c, &ratio(1), &ratio(2)],
            );
        }
        if !self.targets.is_empty() {
            write_targets(
                &mut md,
                self.targets
                    .iter()
                    .map(|(what, shown, met)| (what.as_str(), shown.as_str(), *met)),
            );
        }
        if !self.notes.is_empty() {
            let _ = writeln!(md);
            for n in &self.notes {
                let _ = writeln!(md, "- {n}");
            }
        }
        md
    }
}

/// Not compare's format: two decimals up to 100× and four below 0.01×, so that the retention
/// table keeps the digits it was first published with.
fn fmt_ratio(r: f64) -> String {
    if r >= 100.0 {
        format!("{r:.0}×")
    } else if r >= 0.01 {
        format!("{r:.2}×")
    } else {
        format!("{r:.4}×")
    }
}

/// The shared machine description, and when the run finished.
pub fn machine() -> Vec<(String, String)> {
    let mut m = crate::shared::report::machine();
    let finished = std::process::Command::new("date")
        .args(["-u", "+%F %T"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "?".into());
    m.push(("run finished (UTC)".into(), finished));
    m
}
