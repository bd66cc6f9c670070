//! Filling a store the way a service would: completed records, 64 callers, the clock moving
//! through one simulated day so that every window of the day gets its share.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idemdb::{IdemDb, Key, ManualClock, ReserveOutcome, Retention, Scope};
use parking_lot::Mutex;

use crate::settings::{LEASE, LOAD_THREADS, REQUEST, RESPONSE, SPAN_MS, T0_MS, TTL};
use crate::shared::keys::{OPERATION, PRINCIPAL, key_bytes};

/// The retention every store of the bench runs with: 7-day TTL, default partitions.
pub fn retention() -> Retention {
    Retention::default().ttl(TTL)
}

pub fn scope() -> Scope {
    Scope::new(OPERATION, PRINCIPAL)
}

/// The simulated time at which record `id` of `records` is written: the day spread evenly.
pub fn written_at(id: u64, records: u64) -> u64 {
    T0_MS + id * SPAN_MS / records.max(1)
}

/// The moment every measurement runs at: the end of the simulated day.
pub fn day_end() -> u64 {
    T0_MS + SPAN_MS
}

pub fn open(path: &Path, clock: &ManualClock) -> IdemDb {
    open_verified(path, clock, true)
}

/// As [`open`], with `verify_on_open` as given (the check reads the whole file).
pub fn open_verified(path: &Path, clock: &ManualClock, verify: bool) -> IdemDb {
    let mut builder = IdemDb::builder()
        .clock(clock.clone())
        .retention(retention())
        .verify_on_open(verify);
    if let Some(bytes) = cache_size() {
        builder = builder.cache_size(bytes);
    }
    builder.open(path).expect("open idemdb")
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
    /// Partitions the compaction pass after the load summarised, and its time.
    pub summarized: u64,
    pub compact_took: Duration,
}

/// Writes `records` completed records (ids `0..records`) into a new store at `path`, by
/// `LOAD_THREADS` callers, each record at its time of the simulated day; then runs a
/// compaction pass at the day's end, as the compactor would have run during it.
pub fn fill(path: &Path, records: u64) -> Loaded {
    let clock = ManualClock::new(T0_MS);
    let db = open(path, &clock);
    let scope = scope();
    let next = AtomicU64::new(0);
    let done = AtomicU64::new(0);
    // The clock only moves forward: a caller that would set it back leaves it.
    let now = Mutex::new(T0_MS);
    let started = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..LOAD_THREADS {
            s.spawn(|| {
                loop {
                    let id = next.fetch_add(1, Ordering::Relaxed);
                    if id >= records {
                        break;
                    }
                    let at = written_at(id, records);
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
                    if n.is_multiple_of(5_000_000) {
                        let rate = n as f64 / started.elapsed().as_secs_f64();
                        println!("  loaded {n} of {records} ({rate:.0}/s)");
                    }
                }
            });
        }
    });
    let took = started.elapsed();
    let rss = rss_bytes();
    let stats = db.stats();
    assert_eq!(stats.stored_records, records, "every record stored");
    // What the compactor did over the day: every closed window summarised (nothing is due
    // with a 7-day TTL).
    let compacted = Instant::now();
    let summarized = db.compact_now().expect("compaction").partitions_summarized;
    let compact_took = compacted.elapsed();
    drop(db);
    Loaded {
        took,
        rss,
        file_bytes: file_bytes(path),
        summarized,
        compact_took,
    }
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
