//! The run's settings: the operation of the load, the stores' partition width, TTLs and
//! leases, the threads of the fills and of the load, and the sizes of a full run and of
//! criterion's test mode.

use std::time::Duration;

/// The operation of the load beside the compactor: a long TTL of its own, so that only the
/// prefilled partitions expire while the clock moves.
pub const LOAD_OPERATION: &str = "POST /load";

pub const HOUR_MS: u64 = 3_600_000;
/// Partition width of every store.
pub const WIDTH: Duration = Duration::from_secs(3600);
/// TTL of the drop store: 48 h, so that after a 48-window fill no partition is due yet and
/// each can be made due, and dropped, on its own.
pub const DROP_TTL: Duration = Duration::from_secs(48 * 3600);
/// TTL of the absence stores: longer than 168 windows, so that nothing expires there.
pub const ABSENT_TTL: Duration = Duration::from_secs(30 * 24 * 3600);
/// TTL and lease of the load's records: the clock moves by days during the stall test.
pub const LOAD_TTL: Duration = Duration::from_secs(3650 * 24 * 3600);
pub const LOAD_LEASE: Duration = Duration::from_secs(30 * 24 * 3600);
pub const LEASE: Duration = Duration::from_secs(60);
/// Caller threads of the fills and of the load.
pub const THREADS: usize = 64;
/// Opens of the filled file per setting.
pub const OPEN_REPEATS: usize = 3;
/// Rounds of the interleaved absence cross-check.
pub const INTERLEAVED_ROUNDS: usize = 30;

/// Sizes of one run.
pub struct Sizes {
    /// Records of the drop store (and of each baseline).
    pub drop_records: u64,
    pub drop_partitions: u64,
    /// Keys per durable transaction of the baselines' sweeps.
    pub chunk: usize,
    /// Duration of each load phase.
    pub load: Duration,
    pub absent_records: u64,
    pub absent_partitions: [u64; 3],
}

pub const FULL: Sizes = Sizes {
    drop_records: 1_000_000,
    drop_partitions: 48,
    chunk: 10_000,
    load: Duration::from_secs(8),
    absent_records: 200_000,
    absent_partitions: [1, 48, 168],
};

/// Criterion's test mode: every path once, in a few seconds.
pub const TINY: Sizes = Sizes {
    drop_records: 2_000,
    drop_partitions: 4,
    chunk: 500,
    load: Duration::from_secs(1),
    absent_records: 2_000,
    absent_partitions: [1, 4, 8],
};
