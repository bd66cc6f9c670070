//! Pieces of both benches' reports: number formats, quantiles, the machine, criterion's
//! estimates, and markdown table lines.

use std::fmt::Write as _;
use std::path::PathBuf;

use serde_json::Value;

/// A value with `digits` decimals; whole numbers of 10,000 and more grouped by thousands.
pub fn fmt_val(v: Option<f64>, digits: usize) -> String {
    match v {
        None => "–".into(),
        Some(v) if v.abs() >= 10_000.0 && digits == 0 => group_thousands(v.round() as i64),
        Some(v) => format!("{v:.digits$}"),
    }
}

fn group_thousands(v: i64) -> String {
    let s = v.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if v < 0 { format!("-{out}") } else { out }
}

/// The `q` quantile of sorted values (nearest rank, rounded), or `None` if there are none.
pub fn quantile(sorted: &[u64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    Some(sorted[i] as f64)
}

/// nproc, the CPU's model name and the temp dir's filesystem, as `(name, value)`.
pub fn machine() -> Vec<(String, String)> {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "?".into());
    let nproc = std::thread::available_parallelism().map_or(0, |n| n.get());
    let fs = std::process::Command::new("df")
        .args(["-T", &std::env::temp_dir().to_string_lossy()])
        .output()
        .ok()
        .and_then(|o| {
            let text = String::from_utf8_lossy(&o.stdout).into_owned();
            let line = text.lines().nth(1)?.to_string();
            let cols: Vec<&str> = line.split_whitespace().collect();
            Some(format!(
                "{} on {} (mounted at {})",
                cols.get(1)?,
                cols.first()?,
                cols.last()?
            ))
        })
        .unwrap_or_else(|| "?".into());
    vec![
        ("nproc".into(), nproc.to_string()),
        ("CPU".into(), cpu),
        (
            format!("filesystem of {}", std::env::temp_dir().display()),
            fs,
        ),
    ]
}

pub fn target_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR") {
        return PathBuf::from(dir);
    }
    // A bench runs as <target>/<profile>/deps/<bench>-<hash>.
    std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.parent()?.to_path_buf()))
        .unwrap_or_else(|| PathBuf::from("target"))
}

fn criterion_dir() -> PathBuf {
    std::env::var_os("CRITERION_HOME").map_or_else(|| target_dir().join("criterion"), PathBuf::from)
}

/// Criterion's estimate for one benchmark: ns per iteration.
#[derive(Clone, Copy)]
pub struct Est {
    pub median: f64,
    pub median_lo: f64,
    pub median_hi: f64,
    pub mean: f64,
}

/// What criterion wrote for `group/bench` in its last run of it, if it ran.
pub fn estimate(group: &str, bench: &str) -> Option<Est> {
    let path = criterion_dir()
        .join(group)
        .join(bench)
        .join("new")
        .join("estimates.json");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()?;
    let get = |stat: &str, field: &str| -> Option<f64> {
        match field {
            "point" => v[stat]["point_estimate"].as_f64(),
            bound => v[stat]["confidence_interval"][bound].as_f64(),
        }
    };
    Some(Est {
        median: get("median", "point")?,
        median_lo: get("median", "lower_bound")?,
        median_hi: get("median", "upper_bound")?,
        mean: get("mean", "point")?,
    })
}

/// The "Machine:" list, then a blank line.
pub fn write_machine(md: &mut String, machine: &[(String, String)]) {
    let _ = writeln!(md, "Machine:");
    for (k, v) in machine {
        let _ = writeln!(md, "- {k}: {v}");
    }
    let _ = writeln!(md);
}

/// One markdown table line: `| a | b | … |`.
pub fn table_row<S: AsRef<str>>(md: &mut String, cells: &[S]) {
    let cells: Vec<&str> = cells.iter().map(AsRef::as_ref).collect();
    let _ = writeln!(md, "| {} |", cells.join(" | "));
}

/// The targets table, after a blank line: `(target, measured, met)`; `None` is not measured.
pub fn write_targets<'a>(
    md: &mut String,
    targets: impl IntoIterator<Item = (&'a str, &'a str, Option<bool>)>,
) {
    let _ = writeln!(md, "\n| target | measured | met? |\n|---|--:|---|");
    for (what, shown, met) in targets {
        let met = match met {
            Some(true) => "met",
            Some(false) => "**missed**",
            None => "not measured",
        };
        table_row(md, &[what, shown, met]);
    }
}
