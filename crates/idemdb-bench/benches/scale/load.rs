//! Filling a store the way a service would: completed records, 64 callers, the clock moving
//! through the simulated span (a day unless `IDEMDB_SCALE_DAYS` says more) so that every
//! window of it gets its share.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idemdb::{IdemDb, Key, ManualClock, ReserveOutcome, Retention, Scope};
use parking_lot::Mutex;

use crate::settings::{LEASE, LOAD_THREADS, REQUEST, RESPONSE, T0_MS, TTL, span_ms};
use crate::shared::keys::{OPERATION, PRINCIPAL, key_bytes};

/// The retention every store of the bench runs with: 7-day TTL, default partitions; the
/// background compactor every `compact_every` of real time (none: only `compact_now`).
pub fn retention(compact_every: Option<Duration>) -> Retention {
    Retention::default()
        .ttl(TTL)
        .compact_interval(compact_every)
}

/// The load's compactor interval: the load plays a day in minutes, so its compactor runs far
/// more often than the default minute, to keep up with the windows as a service's would.
const LOAD_COMPACT_EVERY: Duration = Duration::from_secs(1);

pub fn scope() -> Scope {
    Scope::new(OPERATION, PRINCIPAL)
}

/// The simulated time at which record `id` of `records` is written: the span spread evenly.
pub fn written_at(id: u64, records: u64) -> u64 {
    T0_MS + id * span_ms() / records.max(1)
}

/// The moment every measurement runs at: the end of the simulated span.
pub fn day_end() -> u64 {
    T0_MS + span_ms()
}

/// Opens the store for a measurement: no background compactor (the load left nothing to do).
pub fn open(path: &Path, clock: &ManualClock) -> IdemDb {
    open_verified(path, clock, true)
}

/// As [`open`], with `verify_on_open` as given (the check reads the whole file).
pub fn open_verified(path: &Path, clock: &ManualClock, verify: bool) -> IdemDb {
    open_with(path, clock, verify, None)
}

fn open_with(
    path: &Path,
    clock: &ManualClock,
    verify: bool,
    compact_every: Option<Duration>,
) -> IdemDb {
    let mut builder = IdemDb::builder()
        .clock(clock.clone())
        .retention(retention(compact_every))
        .verify_on_open(verify);
    if let Some(on) = quick_repair() {
        builder = builder.quick_repair(on);
    }
    if let Some(bytes) = cache_size() {
        builder = builder.cache_size(bytes);
    }
    builder.open(path).expect("open idemdb")
}

/// `Builder::quick_repair` for every open of the run: `IDEMDB_SCALE_QUICK_REPAIR=1` turns it
/// on, `0` off; unset, the builder's default.
pub fn quick_repair() -> Option<bool> {
    std::env::var("IDEMDB_SCALE_QUICK_REPAIR")
        .ok()
        .map(|v| v.trim() == "1")
}

/// redb's cache for every open of the run: `IDEMDB_SCALE_CACHE_MB` MiB, else the default.
pub fn cache_size() -> Option<usize> {
    std::env::var("IDEMDB_SCALE_CACHE_MB")
        .ok()
        .map(|mb| mb.parse::<usize>().expect("IDEMDB_SCALE_CACHE_MB: MiB") << 20)
}

/// What a load took.
pub struct Loaded {
    pub took: Duration,
    /// The loading process's resident memory at the end, bytes.
    pub rss: u64,
    pub file_bytes: u64,
    /// Partitions the compaction passes after the load summarised, wide partitions they
    /// built, and their time.
    pub summarized: u64,
    pub wide_built: u64,
    pub compact_took: Duration,
    /// Partitions stored after them.
    pub partitions: u64,
}

/// Writes `records` completed records (ids `0..records`) into a new store at `path`, by
/// `LOAD_THREADS` callers, each record at its time of the simulated day, with the background
/// compactor running; then runs compaction passes at the day's end until one widens nothing,
/// as the compactor would have caught up by then.
pub fn fill(path: &Path, records: u64) -> Loaded {
    let clock = ManualClock::new(T0_MS);
    let db = open_with(path, &clock, true, Some(LOAD_COMPACT_EVERY));
    let started = Instant::now();
    write_completed(&db, &clock, records, |id| written_at(id, records), true);
    let took = started.elapsed();
    let rss = rss_bytes();
    let stats = db.stats();
    assert_eq!(stats.stored_records, records, "every record stored");
    // What the compactor did over the day: every closed window summarised and widened
    // (nothing is due with a 7-day TTL).
    let compacted = Instant::now();
    let (mut summarized, mut wide_built) = (0, 0);
    loop {
        let report = db.compact_now().expect("compaction");
        summarized += report.partitions_summarized;
        wide_built += report.wide_partitions_built;
        if report.wide_partitions_built == 0 {
            break;
        }
    }
    let compact_took = compacted.elapsed();
    let partitions = db.stats().partitions;
    drop(db);
    Loaded {
        took,
        rss,
        file_bytes: file_bytes(path),
        summarized,
        wide_built,
        compact_took,
        partitions,
    }
}

/// Writes `records` completed records (ids `0..records`), by `LOAD_THREADS` callers, record
/// `id` at the time `at(id)` (non-decreasing in `id`): the clock only moves forward, and a
/// caller that would set it back leaves it. `progress`: a line every 5M records.
pub fn write_completed(
    db: &IdemDb,
    clock: &ManualClock,
    records: u64,
    at: impl Fn(u64) -> u64 + Sync,
    progress: bool,
) {
    let scope = scope();
    let next = AtomicU64::new(0);
    let done = AtomicU64::new(0);
    let now = Mutex::new(at(0));
    let started = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..LOAD_THREADS {
            s.spawn(|| {
                loop {
                    let id = next.fetch_add(1, Ordering::Relaxed);
                    if id >= records {
                        break;
                    }
                    let at = at(id);
                    {
                        let mut now = now.lock();
                        if at > *now {
                            *now = at;
                            clock.set(at);
                        }
                    }
                    let key = Key::new(key_bytes(id));
                    match db
                        .reserve(&scope, &key, &REQUEST[..], LEASE)
                        .expect("reserve")
                    {
                        ReserveOutcome::Acquired(r) => {
                            db.complete(&r, &RESPONSE[..]).expect("complete")
                        }
                        other => panic!("record {id} not acquired: {other:?}"),
                    }
                    let n = done.fetch_add(1, Ordering::Relaxed) + 1;
                    if progress && n.is_multiple_of(5_000_000) {
                        let rate = n as f64 / started.elapsed().as_secs_f64();
                        println!("  loaded {n} of {records} ({rate:.0}/s)");
                    }
                }
            });
        }
    });
}

/// The size of the database file and its log, bytes.
pub fn file_bytes(path: &Path) -> u64 {
    let len = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.len());
    let mut log = path.as_os_str().to_owned();
    log.push("-wal");
    len(path) + len(Path::new(&log))
}

/// This process's resident set, bytes (Linux `VmRSS`; 0 elsewhere).
pub fn rss_bytes() -> u64 {
    status_kib("VmRSS:") * 1024
}

/// This process's peak resident set, bytes (Linux `VmHWM`).
pub fn peak_rss_bytes() -> u64 {
    status_kib("VmHWM:") * 1024
}

fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}
