//! The measurements of a loaded store, each in a process of its own, so that the open, its
//! memory and the reads that follow start from nothing the load left behind: open time and
//! resident memory, replays of random stored keys, reserves of fresh keys; and plain redb on
//! the same file, as the anchor.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use idemdb::redb::{self, ReadableDatabase, TableDefinition};
use idemdb::{Builder, Key, ManualClock, ReserveOutcome};
use serde_json::{Value, json};

use crate::load::{self, day_end, peak_rss_bytes, rss_bytes, scope, written_at};
use crate::settings::{LEASE, REQUEST, RESPONSE, TTL};
use crate::shared::keys::{Rng, fresh_id, key_bytes};
use crate::shared::nanos;

/// The environment variable that makes the bench binary a probe: its value is the job.
const CHILD: &str = "IDEMDB_SCALE_PROBE";

/// One measurement of a store at `path` holding `records` records.
#[derive(Clone, Copy)]
pub enum Job {
    /// Open idemdb; then, for `replay` (if not zero), replays of random stored keys; then
    /// `fresh` reserves of keys never stored. `verify`: the builder's `verify_on_open`.
    Idemdb {
        replay: Duration,
        fresh: usize,
        verify: bool,
    },
    /// Plain redb: open the same file, then point reads of random stored keys in the
    /// partition that holds each (as if the key's partition were known for free).
    Redb { replay: Duration },
    /// Open idemdb, complete `writes` lifecycles of new keys (ids from 2^41 + `from`), and
    /// abort the process (as `kill -9` would): the next open recovers.
    Killed { writes: u64, from: u64 },
}

/// Runs `job` in a new process of this binary and returns what it printed.
pub fn run(job: Job, path: &Path, records: u64) -> Value {
    let spec = match job {
        Job::Idemdb {
            replay,
            fresh,
            verify,
        } => json!({
            "kind": "idemdb",
            "replay_ms": replay.as_millis() as u64,
            "fresh": fresh,
            "verify": verify,
        }),
        Job::Redb { replay } => json!({"kind": "redb", "replay_ms": replay.as_millis() as u64}),
        Job::Killed { writes, from } => {
            json!({"kind": "killed", "writes": writes, "from": from})
        }
    };
    let spec = json!({"job": spec, "path": path, "records": records});
    let out = Command::new(std::env::current_exe().expect("this binary"))
        .env(CHILD, spec.to_string())
        .output()
        .expect("start a probe");
    let stdout = String::from_utf8_lossy(&out.stdout);
    if let Job::Killed { .. } = job {
        // It aborts after printing its result.
        assert!(!out.status.success(), "the killed probe exited: {stdout}");
    } else {
        assert!(
            out.status.success(),
            "probe failed: {}\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("RESULT "))
        .unwrap_or_else(|| {
            panic!(
                "no result line from the probe: {stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    serde_json::from_str(line).expect("the probe's result")
}

/// In a probe: runs the job its environment names, prints the result, and says it did.
pub fn run_if_probe() -> bool {
    let Ok(spec) = std::env::var(CHILD) else {
        return false;
    };
    let spec: Value = serde_json::from_str(&spec).expect("probe spec");
    let path = PathBuf::from(spec["path"].as_str().expect("path"));
    let records = spec["records"].as_u64().expect("records");
    let job = &spec["job"];
    let replay = Duration::from_millis(job["replay_ms"].as_u64().unwrap_or(0));
    let result = match job["kind"].as_str() {
        Some("idemdb") => idemdb(
            &path,
            records,
            replay,
            job["fresh"].as_u64().unwrap_or(0) as usize,
            job["verify"].as_bool().unwrap_or(true),
        ),
        Some("redb") => plain_redb(&path, records, replay),
        Some("killed") => {
            let result = killed(
                &path,
                job["writes"].as_u64().unwrap_or(0),
                job["from"].as_u64().unwrap_or(0),
            );
            println!("RESULT {result}");
            // Nothing closes: no checkpoint, no clean-close mark, redb's file left as is.
            std::process::abort();
        }
        other => panic!("unknown probe {other:?}"),
    };
    println!("RESULT {result}");
    true
}

/// The records a probe replays, in this order: `MAX_PROBES` random ones at most (a repeat
/// only by chance).
fn probe_ids(records: u64) -> Vec<u64> {
    let mut rng = Rng::new(records);
    (0..MAX_PROBES.min(records))
        .map(|_| rng.below(records))
        .collect()
}

/// How many random records a probe replays at most: few enough that each is read once (none
/// answered from memory an earlier read of the same key filled), many enough for 10 s.
const MAX_PROBES: u64 = 500_000;

/// Latencies in ns, sorted: (ops per second over `spent`, p50, p99), and the bytes this
/// process read from the storage device meanwhile (`disk_from`: [`storage_read_bytes`] when
/// the clock started), which says whether the page cache held what the operations read.
fn summary(mut ns: Vec<u64>, spent: Duration, disk_from: u64) -> Value {
    ns.sort_unstable();
    let q = |q: f64| crate::shared::report::quantile(&ns, q).unwrap_or(0.0);
    json!({
        "ops": ns.len(),
        "per_s": ns.len() as f64 / spent.as_secs_f64().max(1e-9),
        "p50_ns": q(0.5),
        "p99_ns": q(0.99),
        "disk_read_bytes": storage_read_bytes().saturating_sub(disk_from),
    })
}

/// The bytes this process caused to be read from the storage device so far (Linux
/// `/proc/self/io` `read_bytes`: reads the page cache answered are not counted; 0 elsewhere).
fn storage_read_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/io")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("read_bytes:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

fn idemdb(path: &Path, records: u64, replay: Duration, fresh: usize, verify: bool) -> Value {
    let clock = ManualClock::new(day_end());
    let started = Instant::now();
    let db = load::open_verified(path, &clock, verify);
    let open_ms = started.elapsed().as_secs_f64() * 1e3;
    let rss_open = rss_bytes();
    let peak_open = peak_rss_bytes();
    let stats = db.stats();
    let scope = scope();
    let mut lat = Vec::new();
    let disk_from = storage_read_bytes();
    let t = Instant::now();
    for id in probe_ids(records) {
        if t.elapsed() >= replay {
            break;
        }
        let key = Key::new(key_bytes(id));
        let op = Instant::now();
        let answer = db
            .reserve(&scope, &key, &REQUEST[..], LEASE)
            .expect("replay");
        lat.push(nanos(op.elapsed()));
        // Compared in place: a copy of the expected response per replay would be the
        // bench's own cost in the rate.
        assert!(
            matches!(&answer, ReserveOutcome::Completed(r) if r[..] == RESPONSE[..]),
            "record {id}: {answer:?}"
        );
    }
    let replays = summary(lat, t.elapsed(), disk_from);
    let mut lat = Vec::with_capacity(fresh);
    let disk_from = storage_read_bytes();
    let t = Instant::now();
    for _ in 0..fresh {
        let key = Key::new(key_bytes(fresh_id()));
        let op = Instant::now();
        let answer = db
            .reserve(&scope, &key, &REQUEST[..], LEASE)
            .expect("fresh reserve");
        lat.push(nanos(op.elapsed()));
        assert!(matches!(answer, ReserveOutcome::Acquired(_)), "{answer:?}");
    }
    let reserves = summary(lat, t.elapsed(), disk_from);
    if replay > Duration::ZERO {
        fill_replay_cache(&db, records, stats.memory.replay_cache);
    }
    json!({
        "open_ms": open_ms,
        "rss_after_open": rss_open,
        "peak_rss_open": peak_open,
        "indexed_keys": stats.indexed_keys,
        "key_index_bytes": stats.memory.key_index,
        "key_filter_bytes": stats.memory.key_filters,
        "page_cache_limit": stats.memory.page_cache,
        "replay_cache_limit": stats.memory.replay_cache,
        "stored_records": stats.stored_records,
        "partitions": stats.partitions,
        "partitions_read_at_open": stats.partitions_read_at_open,
        "replays": replays,
        "fresh_reserves": reserves,
        "rss_after_reads": rss_bytes(),
    })
}

/// Replays stored keys twice each, untimed, until twice the replay cache's limit in entries
/// went in: the cache is full when the memory after the reads is taken. A key is admitted at
/// its second replay (design.md §6), and the timed replays read each key once.
fn fill_replay_cache(db: &idemdb::IdemDb, records: u64, limit: u64) {
    let scope = scope();
    let entry = (62 + 77 + RESPONSE.len()) as u64;
    let mut rng = Rng::new(records ^ 0x5eed_f111);
    for _ in 0..(2 * limit / entry).min(records) {
        let key = Key::new(key_bytes(rng.below(records)));
        for _ in 0..2 {
            let answer = db
                .reserve(&scope, &key, &REQUEST[..], LEASE)
                .expect("replay");
            assert!(matches!(answer, ReserveOutcome::Completed(_)), "{answer:?}");
        }
    }
}

/// Opens the store, completes `writes` lifecycles of keys never stored, and returns what the
/// open found; the caller aborts the process then.
fn killed(path: &Path, writes: u64, from: u64) -> Value {
    let clock = ManualClock::new(day_end());
    let db = load::open_verified(path, &clock, false);
    let scope = scope();
    // Ids above the first probe's fresh keys (reserved from 2^40 and left in progress).
    let first = (1u64 << 41) + from;
    for id in first..first + writes {
        let key = Key::new(key_bytes(id));
        match db
            .reserve(&scope, &key, &REQUEST[..], LEASE)
            .expect("reserve")
        {
            ReserveOutcome::Acquired(r) => db.complete(&r, &RESPONSE[..]).expect("complete"),
            other => panic!("a new key answered {other:?}"),
        }
    }
    json!({ "writes": writes })
}

/// The table of the partition that holds record `id`: the wide partition of its window once
/// widened (docs/design.md §8.8: 1 hour wide under a 7-day TTL, and the hours of a closed
/// 7-hour group merged into it), else the narrow partition of its write, or a later one. The
/// load's clock only moves forward, so a caller that fell behind the others writes at their
/// time; with records milliseconds apart that is the same window or the next (whose wide
/// partitions are tried too).
fn table_of(txn: &redb::ReadTransaction, id: u64, records: u64) -> String {
    const HOUR_MS: u64 = 3_600_000;
    const GROUP_MS: u64 = 7 * HOUR_MS;
    let width = Builder::DEFAULT_PARTITION_WIDTH.as_millis() as u64;
    let ttl = TTL.as_millis() as u64;
    let key = stored_key(id);
    let first = written_at(id, records) / width * width;
    let wide = |start: u64, wide: u64| {
        let start = start - start % wide;
        format!("idemdb_p_{start:020}_{wide}_{ttl}")
    };
    (first..=day_end())
        .step_by(width as usize)
        .flat_map(|start| {
            [
                wide(start, GROUP_MS),
                wide(start, HOUR_MS),
                format!("idemdb_p_{start:020}_{width}_{ttl}"),
            ]
        })
        .find(|name| {
            txn.open_table(TableDefinition::<&[u8], &[u8]>::new(name))
                .is_ok_and(|t| {
                    redb::ReadableTable::get(&t, key.as_slice()).is_ok_and(|v| v.is_some())
                })
        })
        .unwrap_or_else(|| panic!("record {id} in no partition of the day from its window on"))
}

/// idemdb's stored key of record `id`: length-prefixed operation and principal, then the key.
fn stored_key(id: u64) -> Vec<u8> {
    let mut k = Vec::new();
    for part in [
        crate::shared::keys::OPERATION,
        crate::shared::keys::PRINCIPAL,
    ] {
        k.extend_from_slice(&(part.len() as u16).to_be_bytes());
        k.extend_from_slice(part.as_bytes());
    }
    k.extend_from_slice(&key_bytes(id));
    k
}

fn plain_redb(path: &Path, records: u64, replay: Duration) -> Value {
    let started = Instant::now();
    // The page cache idemdb's probes open with (the builder's default: 64 MiB).
    let cache = load::cache_size().unwrap_or(64 << 20);
    let db = redb::Builder::new()
        .set_cache_size(cache)
        .open(path)
        .expect("open with redb");
    let open_ms = started.elapsed().as_secs_f64() * 1e3;
    let rss_open = rss_bytes();
    let txn = db.begin_read().expect("read");
    // Where each probed key is, found before the clock starts (the same keys, in the same
    // order, as idemdb's replays).
    let found_by = Instant::now() + replay;
    let probes: Vec<(Vec<u8>, String)> = probe_ids(records)
        .into_iter()
        .take_while(|_| Instant::now() < found_by)
        .map(|id| (stored_key(id), table_of(&txn, id, records)))
        .collect();
    let mut lat = Vec::new();
    let disk_from = storage_read_bytes();
    let t = Instant::now();
    for (key, table) in &probes {
        if t.elapsed() >= replay {
            break;
        }
        let op = Instant::now();
        let table = txn
            .open_table(TableDefinition::<&[u8], &[u8]>::new(table))
            .expect("table");
        let found = redb::ReadableTable::get(&table, key.as_slice()).expect("get");
        lat.push(nanos(op.elapsed()));
        assert!(found.is_some());
    }
    json!({
        "open_ms": open_ms,
        "rss_after_open": rss_open,
        "replays": summary(lat, t.elapsed(), disk_from),
    })
}

/// Makes the operating system's page cache hold the file at `path` and its log, as much of
/// them as it can: drops the page cache if `drop_first` (the plan's: not in test mode; root
/// only; after a `sync`, so that the load's
/// gigabytes still being written back take neither the CPU nor the disk from the probe that
/// follows), then reads both files from start to end. Dropped first because pages another
/// file was read into more than once (an earlier size's, a kept file's) sit on the kernel's
/// active list, and a file read once is evicted before them.
pub fn read_whole(path: &Path, drop_first: bool) {
    if !(drop_first && drop_page_cache()) {
        let _ = Command::new("sync").status();
    }
    let mut log = path.as_os_str().to_owned();
    log.push("-wal");
    for file in [path.to_path_buf(), PathBuf::from(log)] {
        if let Ok(mut f) = std::fs::File::open(&file) {
            let _ = std::io::copy(&mut f, &mut std::io::sink());
        }
    }
}

/// Asks the kernel to drop its page cache (clean pages), so that the next open reads the file
/// from the disk. Says whether it could (root only).
pub fn drop_page_cache() -> bool {
    let synced = Command::new("sync").status().is_ok_and(|s| s.success());
    synced && std::fs::write("/proc/sys/vm/drop_caches", "3\n").is_ok()
}
