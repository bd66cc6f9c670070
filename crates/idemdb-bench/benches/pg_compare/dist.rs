//! A distribution of durations, timed by the drop-stall cell and summarized by the report.

use crate::shared::report::quantile;

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
}
