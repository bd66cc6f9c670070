//! What a baseline's sweep of the drop cell's records measured: made by `naive.rs` and
//! `sqlite.rs`, reported by the drop cell (`drop.rs`).

use crate::report::{Dist, MB, ms};

/// What a baseline's sweep of the same records measured.
pub struct BaselineDrop {
    pub fill_s: f64,
    /// Naive redb's read pass that finds the expired keys (SQLite's index makes it part of
    /// each `DELETE`).
    pub scan_ms: Option<f64>,
    pub chunks: Dist,
    pub total_ms: f64,
    /// Before the fill, after it, after the sweep, after the refill.
    pub sizes: [u64; 4],
    /// Bytes in use after the fill, after the sweep, after the refill.
    pub in_use: [u64; 3],
}

impl BaselineDrop {
    /// The measurements of baseline `name`, printed as they come in.
    pub fn new(
        name: &str,
        fill_s: f64,
        scan_ms: Option<f64>,
        chunks: Vec<u64>,
        total_ms: f64,
        sizes: [u64; 4],
        in_use: [u64; 3],
    ) -> BaselineDrop {
        let result = BaselineDrop {
            fill_s,
            scan_ms,
            chunks: Dist::new(chunks),
            total_ms,
            sizes,
            in_use,
        };
        result.print(name);
        result
    }

    fn print(&self, name: &str) {
        let scan = self
            .scan_ms
            .map_or(String::new(), |s| format!("scan {s:.0} ms, "));
        let [_, s1, s2, s3] = self.sizes.map(|b| b as f64 / MB);
        println!(
            "{name}: fill {:.1} s; sweep {:.0} ms ({scan}{} chunks, median {:.1} ms, \
             max {:.1} ms); {s1:.1} / {s2:.1} / {s3:.1} MB",
            self.fill_s,
            self.total_ms,
            self.chunks.0.len(),
            ms(self.chunks.q(0.5).unwrap_or(0.0)),
            ms(self.chunks.q(1.0).unwrap_or(0.0)),
        );
    }
}
