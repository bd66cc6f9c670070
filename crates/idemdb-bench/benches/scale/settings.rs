//! What the scale bench stores, how it spreads it in time, and how long it measures.

use std::time::Duration;

/// The request every record fingerprints (100 bytes).
pub const REQUEST: &[u8; 100] = b"{\"sku\":\"book-000000000001\",\"cents\":1999,\"currency\":\"EUR\",\"qty\":1,\"ship\":\"std\",\"note\":\"scale-bench!\"}";
/// The response every record stores and every replay returns (200 bytes).
pub const RESPONSE: &[u8; 200] = b"201 Created\r\ncontent-type: application/json\r\n\r\n{\"order\":\"o-000000000001\",\"total\":1999,\"currency\":\"EUR\",\"items\":[{\"sku\":\"book-000000000001\",\"qty\":1}],\"status\":\"paid\",\"receipt\":\"r-00000000000001\"}......";
/// The domain's horizon: records count for 7 days.
pub const TTL: Duration = Duration::from_secs(7 * 24 * 3600);
/// The simulated days the records of one size are written over: `IDEMDB_SCALE_DAYS` (1 to 7,
/// the TTL: nothing expires), one by default. Seven is the steady state of a 7-day TTL: 24
/// groups of 7 hours (docs/design.md §8.8).
pub fn days() -> u64 {
    std::env::var("IDEMDB_SCALE_DAYS")
        .ok()
        .map(|d| d.trim().parse().expect("IDEMDB_SCALE_DAYS: 1 to 7"))
        .unwrap_or(1u64)
        .clamp(1, 7)
}

/// The simulated span the records of one size are written over, in ms.
pub fn span_ms() -> u64 {
    days() * 24 * 3600 * 1000
}
/// The simulated clock's start, aligned to the partition width.
pub const T0_MS: u64 = 1_700_006_400_000;
/// Callers loading the store (group commit batches them).
pub const LOAD_THREADS: usize = 64;
/// The lease of every reservation (completed at once).
pub const LEASE: Duration = Duration::from_secs(30);

/// The sizes measured, the time spent on each measurement, and whether the page cache is
/// dropped before the cold open (root only).
pub struct Plan {
    pub sizes: Vec<u64>,
    pub replay_time: Duration,
    pub fresh_reserves: usize,
    pub drop_page_cache: bool,
}

/// `IDEMDB_SCALE_RECORDS` (comma-separated record counts, default 1M, 10M, 50M; empty: none,
/// only the empty store and the filters alone); in
/// criterion's test mode (`cargo test --benches`) one tiny size and short measurements.
pub fn plan(test_mode: bool) -> Plan {
    if test_mode {
        return Plan {
            sizes: vec![3_000],
            replay_time: Duration::from_millis(200),
            fresh_reserves: 20,
            drop_page_cache: false,
        };
    }
    let sizes = std::env::var("IDEMDB_SCALE_RECORDS")
        .ok()
        .map(|s| {
            s.split(',')
                .filter(|n| !n.trim().is_empty())
                .map(|n| {
                    n.trim()
                        .replace('_', "")
                        .parse()
                        .expect("IDEMDB_SCALE_RECORDS: record counts")
                })
                .collect()
        })
        .unwrap_or_else(|| vec![1_000_000, 10_000_000, 50_000_000]);
    Plan {
        sizes,
        replay_time: Duration::from_secs(10),
        fresh_reserves: 2_000,
        drop_page_cache: true,
    }
}

/// The hours of records built beside one caller (`build.rs`): `IDEMDB_SCALE_BUILD`
/// (comma-separated record counts; empty: none), default an hour of 10M and of 50M records a
/// day.
pub fn build_shapes(test_mode: bool) -> Vec<u64> {
    if test_mode {
        return vec![2_000];
    }
    match std::env::var("IDEMDB_SCALE_BUILD") {
        Ok(list) => list
            .split(',')
            .filter(|n| !n.trim().is_empty())
            .map(|n| n.trim().parse().expect("IDEMDB_SCALE_BUILD: record counts"))
            .collect(),
        Err(_) => vec![416_667, 2_083_334],
    }
}
