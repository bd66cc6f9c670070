//! What a run is: its setup from the environment ([`Setup`]), the workloads of its one caller
//! ([`Workload`]), and what one idemdb benchmark measured ([`Run`]).

use std::time::Duration;

use idemdb::Stats;

/// The run issue 24's target names.
pub const RUN_TIME: Duration = Duration::from_secs(60);

/// What the command line's environment changes: the run's length (`IDEMDB_BENCH_TAIL_SECS`,
/// default 60) and the stores' partition width (`IDEMDB_BENCH_TAIL_WIDTH_MS`, default the
/// store's own), to see how the tail moves as the current partition grows.
#[derive(Debug, Clone, Copy)]
pub struct Setup {
    pub run_time: Duration,
    pub width: Option<Duration>,
}

impl Setup {
    pub fn from_env() -> Setup {
        let number = |var: &str| {
            let value = std::env::var(var).ok()?;
            match value.parse::<u64>() {
                Ok(n) if n > 0 => Some(n),
                _ => panic!("{var}={value:?}: expected a whole number above 0"),
            }
        };
        Setup {
            run_time: number("IDEMDB_BENCH_TAIL_SECS").map_or(RUN_TIME, Duration::from_secs),
            width: number("IDEMDB_BENCH_TAIL_WIDTH_MS").map(Duration::from_millis),
        }
    }
}

/// What one idemdb benchmark measured.
pub struct Run {
    pub workload: Workload,
    /// Every reserve's latency, in ns.
    pub reserves: Vec<u64>,
    /// Every complete's latency, in ns (none for [`Workload::Reserves`]).
    pub completes: Vec<u64>,
    /// The store's stats after open, before the first reserve.
    pub before: Stats,
    /// Its stats after the last call, before close (whose checkpoint is not counted).
    pub after: Stats,
    /// From the store's open to the last call's end (criterion's work between samples
    /// included).
    pub wall: Duration,
    /// From the first sample's start to the last one's end.
    pub measured: Duration,
    /// Iterations criterion asked for in its samples, and calls the time slices ran.
    pub planned: u64,
    pub ran: u64,
}

/// What one caller does with each fresh key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    /// Reserve, then complete: the in-flight table holds only the one reservation in flight,
    /// and the finished records go to the current time partition, as in service.
    Lifecycles,
    /// Reserve and never complete: every reservation stays in the in-flight table, which grows
    /// by each one (about 600,000 in 60 s), so each checkpoint rewrites most of its leaves.
    /// The stress case: no service leaves every reservation open.
    Reserves,
}

impl Workload {
    /// The benchmark's name.
    pub fn bench(self) -> &'static str {
        match self {
            Workload::Lifecycles => "idemdb_lifecycle_1",
            Workload::Reserves => "idemdb_reserve_1",
        }
    }
}
