//! The scale bench's table: one row per size, printed and written to
//! `target/bench-results/scale.md`.

use std::fmt::Write as _;

use serde_json::Value;

use crate::load::Loaded;
use crate::shared::report::{
    fmt_val, machine, table_row, target_dir, write_machine, write_targets,
};

/// One size's figures.
pub struct Row {
    pub records: u64,
    pub loaded: Loaded,
    /// Whether the page cache was dropped before the cold open.
    pub cold: bool,
    /// idemdb opened first after the load, the file read whole into the page cache first:
    /// replays and fresh reserves.
    pub reads: Value,
    /// idemdb opened after the page cache was dropped (if `cold`).
    pub first: Value,
    /// idemdb opened again at once (page cache warm).
    pub warm: Value,
    /// idemdb opened warm with `verify_on_open(true)`: the open that checks the whole file.
    pub verified: Value,
    /// The same after the page cache was dropped again (`None`: it could not be).
    pub cold_verified: Option<Value>,
    /// idemdb opened (default settings) after a process that wrote to it was killed.
    pub after_kill: Value,
    /// The same with `verify_on_open(true)`, after a second such process.
    pub after_kill_verified: Value,
    /// Plain redb on the same file: open, point reads in the right partition.
    pub redb: Value,
}

#[derive(Default)]
pub struct Report {
    pub rows: Vec<Row>,
    /// Fresh reserves on an empty database: the baseline of the fresh-reserve column.
    pub empty: Option<Value>,
    /// What asking the filters alone costs a lookup: (filters, keys each, ns per lookup
    /// asking all, false "maybe" rate).
    pub filters: Vec<(usize, u64, f64, f64)>,
    /// Hours built beside one caller (`build.rs`'s results).
    pub builds: Vec<Value>,
    /// The table of recognised keys: (keys held, keys a drop enters, its costs).
    pub recognition: Vec<(u64, u64, idemdb::testing::RecognitionCost)>,
}

fn mib(bytes: f64) -> String {
    format!("{:.0}", bytes / (1024.0 * 1024.0))
}

fn f(v: &Value, path: &[&str]) -> f64 {
    path.iter()
        .fold(v, |v, p| &v[*p])
        .as_f64()
        .unwrap_or(f64::NAN)
}

fn us(ns: f64) -> String {
    fmt_val(Some(ns / 1e3), 1)
}

impl Report {
    pub fn markdown(&self) -> String {
        let mut md = String::new();
        write_machine(&mut md, &machine());
        let empty_p50 = self
            .empty
            .as_ref()
            .map_or(f64::NAN, |e| f(e, &["fresh_reserves", "p50_ns"]));
        let _ = writeln!(
            md,
            "\nRecords of 100-byte requests and 200-byte responses, 7-day TTL, default partitions (10 s), \
             written by 64 callers over {} simulated day(s). Each measurement runs in a process of its own. \
             A fresh reserve on an empty database: p50 {} µs. redb's cache: {}. Quick-repair: {}.\n",
            crate::settings::days(),
            us(empty_p50),
            crate::load::cache_size()
                .map_or("the default".to_string(), |b| format!("{} MiB", b >> 20)),
            match crate::load::quick_repair() {
                Some(true) => "on",
                Some(false) => "off",
                None => "the builder's default",
            }
        );
        table_row(
            &mut md,
            &[
                "records",
                "load, lifecycles/s",
                "RSS after load, MiB",
                "file, bytes/record",
                "after the load: summarised / wide partitions built (passes, s), partitions",
                "partitions read at open",
                "open, first (cold?), ms",
                "open, warm, ms",
                "open with verify_on_open, cold / warm, ms",
                "open after kill -9, default / verify_on_open, ms",
                "plain redb open, ms",
                "RSS after open, MiB (peak); after the replays",
                "indexed keys (key index + filters, MiB)",
                "replays/s, 1 caller (read from the disk meanwhile, MiB)",
                "replay p50 / p99, µs",
                "plain redb point reads/s, partition known (from the disk, MiB)",
                "fresh reserve p50 / p99, µs",
                "fresh p50 ÷ empty",
            ],
        );
        table_row(&mut md, &["--:"; 18]);
        for r in &self.rows {
            let n = r.records as f64;
            let fresh_p50 = f(&r.reads, &["fresh_reserves", "p50_ns"]);
            table_row(
                &mut md,
                &[
                    fmt_val(Some(n), 0),
                    fmt_val(Some(n / r.loaded.took.as_secs_f64()), 0),
                    mib(r.loaded.rss as f64),
                    fmt_val(Some(r.loaded.file_bytes as f64 / n), 0),
                    format!(
                        "{} / {} ({:.1}), {}",
                        r.loaded.summarized,
                        r.loaded.wide_built,
                        r.loaded.compact_took.as_secs_f64(),
                        r.loaded.partitions
                    ),
                    fmt_val(Some(f(&r.warm, &["partitions_read_at_open"])), 0),
                    format!(
                        "{} ({})",
                        fmt_val(Some(f(&r.first, &["open_ms"])), 0),
                        if r.cold { "cold" } else { "warm" }
                    ),
                    fmt_val(Some(f(&r.warm, &["open_ms"])), 0),
                    format!(
                        "{} / {}",
                        r.cold_verified
                            .as_ref()
                            .map_or("–".to_string(), |v| fmt_val(Some(f(v, &["open_ms"])), 0)),
                        fmt_val(Some(f(&r.verified, &["open_ms"])), 0)
                    ),
                    format!(
                        "{} / {}",
                        fmt_val(Some(f(&r.after_kill, &["open_ms"])), 0),
                        fmt_val(Some(f(&r.after_kill_verified, &["open_ms"])), 0)
                    ),
                    fmt_val(Some(f(&r.redb, &["open_ms"])), 0),
                    format!(
                        "{} ({}); {}",
                        mib(f(&r.warm, &["rss_after_open"])),
                        mib(f(&r.warm, &["peak_rss_open"])),
                        mib(f(&r.reads, &["rss_after_reads"]))
                    ),
                    format!(
                        "{} ({} + {})",
                        fmt_val(Some(f(&r.warm, &["indexed_keys"])), 0),
                        mib(f(&r.warm, &["key_index_bytes"])),
                        mib(f(&r.warm, &["key_filter_bytes"]))
                    ),
                    format!(
                        "{} ({})",
                        fmt_val(Some(f(&r.reads, &["replays", "per_s"])), 0),
                        mib(f(&r.reads, &["replays", "disk_read_bytes"]))
                    ),
                    format!(
                        "{} / {}",
                        us(f(&r.reads, &["replays", "p50_ns"])),
                        us(f(&r.reads, &["replays", "p99_ns"]))
                    ),
                    format!(
                        "{} ({})",
                        fmt_val(Some(f(&r.redb, &["replays", "per_s"])), 0),
                        mib(f(&r.redb, &["replays", "disk_read_bytes"]))
                    ),
                    format!(
                        "{} / {}",
                        us(fresh_p50),
                        us(f(&r.reads, &["fresh_reserves", "p99_ns"]))
                    ),
                    format!("{:.2}×", fresh_p50 / empty_p50),
                ],
            );
        }
        self.targets(&mut md, empty_p50);
        if !self.filters.is_empty() {
            md.push_str(
                "\nThe filters alone (`idemdb::testing::filter_lookup_cost`): lookups of absent \
                 hashes, each asking every filter.\n\n",
            );
            table_row(
                &mut md,
                &[
                    "filters",
                    "keys each",
                    "ns per lookup",
                    "false \"maybe\" per filter",
                ],
            );
            table_row(&mut md, &["--:"; 4]);
            for &(filters, keys, ns, rate) in &self.filters {
                table_row(
                    &mut md,
                    &[
                        filters.to_string(),
                        fmt_val(Some(keys as f64), 0),
                        format!("{ns:.0}"),
                        format!("{:.2} %", rate * 100.0),
                    ],
                );
            }
        }
        if !self.builds.is_empty() {
            md.push_str(
                "\nAn hour's wide partition built beside one caller (`build.rs`): lifecycles of \
                 fresh keys, reserve and complete timed apart, 3 s alone before the build, \
                 during it, 3 s alone after.\n\n",
            );
            table_row(
                &mut md,
                &[
                    "records in the hour",
                    "build, s",
                    "lifecycles during it",
                    "reserve during it: p50 / p99 / p99.9 / max, µs",
                    "complete during it: p99.9 / max, µs",
                    "reserve alone, before; after: p99.9 / max, µs",
                ],
            );
            table_row(&mut md, &["--:"; 6]);
            for b in &self.builds {
                let q = |phase: &str, op: &str, q: &str| us(f(b, &[phase, op, q]));
                table_row(
                    &mut md,
                    &[
                        fmt_val(Some(f(b, &["records"])), 0),
                        format!("{:.1}", f(b, &["build_ms"]) / 1e3),
                        fmt_val(Some(f(b, &["beside", "lifecycles"])), 0),
                        format!(
                            "{} / {} / {} / {}",
                            q("beside", "reserve", "p50_ns"),
                            q("beside", "reserve", "p99_ns"),
                            q("beside", "reserve", "p999_ns"),
                            q("beside", "reserve", "max_ns")
                        ),
                        format!(
                            "{} / {}",
                            q("beside", "complete", "p999_ns"),
                            q("beside", "complete", "max_ns")
                        ),
                        format!(
                            "{} / {}; {} / {}",
                            q("before", "reserve", "p999_ns"),
                            q("before", "reserve", "max_ns"),
                            q("after", "reserve", "p999_ns"),
                            q("after", "reserve", "max_ns")
                        ),
                    ],
                );
            }
        }
        if !self.recognition.is_empty() {
            md.push_str(
                "\nThe table of recognised keys alone (`idemdb::testing::recognition_cost`, \
                 the default page cache): a drop's keys entered in the pass's steps and retired \
                 again; lookups through a read transaction.\n\n",
            );
            table_row(
                &mut md,
                &[
                    "keys held",
                    "file, bytes/key",
                    "keys entered",
                    "enter, ms (longest step)",
                    "retire, ms",
                    "lookup absent / held, µs",
                ],
            );
            table_row(&mut md, &["--:"; 6]);
            for (held, dropped, c) in &self.recognition {
                table_row(
                    &mut md,
                    &[
                        fmt_val(Some(*held as f64), 0),
                        format!("{:.1}", c.file_bytes_per_key),
                        fmt_val(Some(*dropped as f64), 0),
                        format!("{:.0} ({:.0})", c.enter_ms, c.longest_step_ms),
                        format!("{:.0}", c.retire_ms),
                        format!("{} / {}", us(c.absent_ns), us(c.present_ns)),
                    ],
                );
            }
        }
        md
    }

    /// The targets, at the largest size measured.
    fn targets(&self, md: &mut String, empty_p50: f64) {
        let Some(r) = self.rows.iter().max_by_key(|r| r.records) else {
            return;
        };
        let n = r.records as f64;
        let open = f(&r.first, &["open_ms"]);
        let base = self
            .empty
            .as_ref()
            .map_or(0.0, |e| f(e, &["rss_after_open"]));
        // The measure: memory per record beyond the configured caches, after the
        // replays have filled them (redb's page cache and the replay cache, each counted at
        // its limit).
        let cache = f(&r.reads, &["page_cache_limit"]) + f(&r.reads, &["replay_cache_limit"]);
        let per_record = (f(&r.reads, &["rss_after_reads"]) - base - cache).max(0.0) / n;
        let replays = f(&r.reads, &["replays", "per_s"]);
        let fresh = f(&r.reads, &["fresh_reserves", "p50_ns"]) / empty_p50;
        let lines = [
            (
                format!(
                    "open ≤ 1 s at {} records, {}",
                    fmt_val(Some(n), 0),
                    if r.cold {
                        "page cache dropped"
                    } else {
                        "page cache warm (not dropped)"
                    }
                ),
                format!("{open:.0} ms"),
                open <= 1000.0,
            ),
            (
                "resident memory after the replays ≤ 2 B per record above an empty database's and the caches' limits".to_string(),
                format!("{per_record:.1} B/record"),
                per_record <= 2.0,
            ),
            (
                "≥ 100,000 replays/s at 1 caller".to_string(),
                fmt_val(Some(replays), 0),
                replays >= 100_000.0,
            ),
            (
                "fresh reserve p50 ≤ 1.2× the empty database's".to_string(),
                format!("{fresh:.2}×"),
                fresh <= 1.2,
            ),
        ];
        write_targets(
            md,
            lines
                .iter()
                .map(|(t, m, ok)| (t.as_str(), m.as_str(), Some(*ok))),
        );
    }

    /// Prints the table and, unless `test_mode`, writes it to `target/bench-results/scale.md`
    /// (`scale-{days}d.md` for a span of more than a day).
    pub fn publish(&self, test_mode: bool) {
        let md = self.markdown();
        println!("\n{md}");
        if test_mode {
            return;
        }
        let dir = target_dir().join("bench-results");
        std::fs::create_dir_all(&dir).expect("bench-results");
        let path = dir.join(match crate::settings::days() {
            1 => "scale.md".to_string(),
            days => format!("scale-{days}d.md"),
        });
        std::fs::write(&path, &md).expect("write scale.md");
        println!("written: {}", path.display());
    }
}
