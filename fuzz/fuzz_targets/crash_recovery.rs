//! A workload of dozens of keys, with several callers in one group commit, loses power inside
//! one sync (of the database or its log) with the pending writes dropped, kept or torn; then,
//! for half the inputs, the log is altered as an operator alters it (deleted, cut at a sector,
//! rolled back to an earlier image of itself, a byte flipped). The reopen must refuse with
//! `LogRefused`, or hold every acknowledged outcome with tokens above all issued; where the
//! alteration is one no open can tell from a crash (docs/design.md §5.6, the undetectable
//! rows), it must still open with every record whole and tokens above all issued.
//!
//! Input layout (every byte counts, the workload first in length):
//! - bytes 0–1: the sync after open inside which the power goes (`u16` LE, modulo three per
//!   key and some: most runs crash, and late syncs are reached as often as early ones);
//! - byte 2: 0 drop the pending writes, 1 keep them, otherwise tear them at random;
//! - byte 3: the log's alteration (below 128: none; then deleted, cut, rolled back, flipped);
//! - bytes 4–5: the alteration's parameter (`u16` LE);
//! - then the steps, until the input ends or the workload holds 64 keys: a byte below 160 is
//!   a script on a fresh key (`Script::ALL`, modulo 9); 160–199 a batch (the next byte: how
//!   many keys, the one after: how each is finished); 200–239 an inbox poll (the next byte:
//!   how many messages, the one after: which handlers fail); 240 and above a clean reopen.
//!
//! At exit it prints how big the workloads were, how many batches shared a commit, and what
//! the reopens answered: `fuzz/campaign.sh` reads the last report.

#![no_main]

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use idemdb::ManualClock;
use idemdb::testing::{LogLayout, recorded_log};
use idemdb_testkit::{
    Checkpoints, FaultBackend, KeyLog, SECTOR, Script, Step, TearMode, check_recovered,
    check_recovered_or_refused, check_tokens_after_loss, open_workload_as, run_steps,
};
use libfuzzer_sys::fuzz_target;

/// Every execution allocates and frees thousands of small blocks (redb's pages and nodes, the
/// disk's pending writes): mimalloc takes a tenth of an execution less than glibc's malloc.
/// Off (`--no-default-features`) for sanitizer runs, whose allocator must see every block.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Keys at the most in one workload.
const MAX_KEYS: usize = 64;

/// Counters printed at exit.
static COUNTS: [AtomicU64; 12] = [const { AtomicU64::new(0) }; 12];
const RUNS: usize = 0;
/// Workload sizes in keys: 0–7, 8–15, 16–31, 32–47, 48–64.
const SIZES: usize = 1;
const BATCHES: usize = 6;
const CRASHED: usize = 7;
const ALTERED: usize = 8;
const REFUSED: usize = 9;
const UNDETECTABLE: usize = 10;
const REOPENS: usize = 11;

fn count(i: usize) {
    COUNTS[i].fetch_add(1, Ordering::Relaxed);
}

extern "C" fn report() {
    let c: Vec<u64> = COUNTS.iter().map(|c| c.load(Ordering::Relaxed)).collect();
    eprintln!(
        "crash_recovery report: {} runs; keys per workload 0-7: {}, 8-15: {}, 16-31: {}, \
         32-47: {}, 48-64: {}; batches of several callers: {}; crashed: {}; logs altered: {} \
         (refused {}, undetectable and checked for tokens {}); clean reopens inside: {}",
        c[RUNS],
        c[SIZES],
        c[SIZES + 1],
        c[SIZES + 2],
        c[SIZES + 3],
        c[SIZES + 4],
        c[BATCHES],
        c[CRASHED],
        c[ALTERED],
        c[REFUSED],
        c[UNDETECTABLE],
        c[REOPENS]
    );
}

unsafe extern "C" {
    fn atexit(f: extern "C" fn()) -> i32;
    fn mallopt(param: i32, value: i32) -> i32;
}

/// glibc's `M_TRIM_THRESHOLD` and `M_MMAP_THRESHOLD`.
const M_TRIM_THRESHOLD: i32 = -1;
const M_MMAP_THRESHOLD: i32 = -3;

/// How the log is altered after the crash.
#[derive(Debug, Clone, Copy)]
enum Alteration {
    None,
    Deleted,
    /// Cut at this many sectors past the header.
    Cut(u16),
    /// Rolled back to this earlier durable image of itself (modulo how many there are).
    RolledBack(u16),
    /// This byte (modulo the log's length) flipped.
    Flipped(u16),
}

struct Input {
    crash_sync: u64,
    mode: TearMode,
    alteration: Alteration,
    steps: Vec<Step>,
    keys: usize,
}

fn parse(data: &[u8]) -> Option<Input> {
    let (head, mut rest) = data.split_at_checked(6)?;
    let param = u16::from_le_bytes([head[4], head[5]]);
    let alteration = match head[3] {
        0..=127 => Alteration::None,
        128..=159 => Alteration::Deleted,
        160..=191 => Alteration::Cut(param),
        192..=223 => Alteration::RolledBack(param),
        _ => Alteration::Flipped(param),
    };
    let seed = xxhash_rust::xxh3::xxh3_64(data);
    let mode = match head[2] % 3 {
        0 => TearMode::DropAll,
        1 => TearMode::KeepAll,
        _ => TearMode::Random(seed),
    };
    let mut steps = Vec::new();
    let mut keys = 0;
    while let Some((&b, tail)) = rest.split_first() {
        rest = tail;
        let mut next = || {
            let (&x, tail) = rest.split_first().unwrap_or((&0, &[]));
            rest = tail;
            x
        };
        let step = match b {
            0..=159 => Step::Script(Script::ALL[usize::from(b) % Script::ALL.len()]),
            160..=199 => Step::Batch {
                keys: 2 + next() % 15,
                finish: u32::from(next()).wrapping_mul(0x9e37_79b9),
            },
            200..=239 => Step::Poll {
                messages: 2 + next() % 15,
                failing: u16::from(next()).wrapping_mul(0x9e37),
            },
            _ => Step::Reopen,
        };
        keys += match step {
            Step::Script(_) => 1,
            Step::Batch { keys, .. } => usize::from(keys),
            Step::Poll { messages, .. } => usize::from(messages),
            Step::Reopen => 0,
        };
        if keys > MAX_KEYS {
            break;
        }
        steps.push(step);
    }
    let syncs = 8 + 3 * keys.min(MAX_KEYS) as u64;
    Some(Input {
        crash_sync: u64::from(u16::from_le_bytes([head[0], head[1]])) % syncs,
        mode,
        alteration,
        steps,
        keys: keys.min(MAX_KEYS),
    })
}

/// The log after `alteration`, and whether an open could tell it from a crash's.
fn alter(
    alteration: Alteration,
    log: &[u8],
    history: &[Vec<u8>],
    recorded: impl FnOnce() -> (u64, bool),
) -> (Vec<u8>, bool) {
    match alteration {
        Alteration::None => (log.to_vec(), true),
        Alteration::Deleted => (Vec::new(), true),
        Alteration::Cut(sectors) => {
            let at = (SECTOR * (1 + usize::from(sectors))).min(log.len());
            (log[..at].to_vec(), true)
        }
        Alteration::RolledBack(i) => match history.get(usize::from(i) % history.len().max(1)) {
            Some(image) => {
                let (checkpoint, in_use) = recorded();
                // Within the checkpoint's cycle (its cycle sector current, or its run
                // reaching the checkpoint) it is a log a crash could leave.
                let layout = LogLayout::read(image);
                let detectable = layout.cycle.is_some_and(|h| h < checkpoint)
                    && layout.last() != Some(checkpoint);
                (image.clone(), detectable || !in_use)
            }
            None => (log.to_vec(), true),
        },
        Alteration::Flipped(at) => {
            let mut flipped = log.to_vec();
            if flipped.is_empty() {
                return (flipped, true);
            }
            let at = usize::from(at) * 97 % flipped.len();
            flipped[at] ^= 0x20;
            let (checkpoint, in_use) = recorded();
            // Inside the run's last frame above the checkpoint: it reads as a torn tail.
            let layout = LogLayout::read(log);
            let torn_tail = layout.run.last().is_some_and(|&(off, len, seq)| {
                seq > checkpoint && (off as usize..(off + len) as usize).contains(&at)
            });
            (flipped, !torn_tail || !in_use)
        }
    }
}

fuzz_target!(
    init: {
        // SAFETY: `report` is a plain function that only reads atomics and writes stderr.
        unsafe {
            atexit(report);
        }
        // Every execution allocates and frees the same few MiB (disk images, redb's pages):
        // kept by glibc's allocator (libFuzzer's, and Rust's without mimalloc) instead of
        // handed back to the kernel and faulted in again, a tenth of an execution.
        // SAFETY: glibc's mallopt, called before any other thread exists.
        unsafe {
            mallopt(M_TRIM_THRESHOLD, 256 << 20);
            mallopt(M_MMAP_THRESHOLD, 64 << 20);
        }
    },
    |data: &[u8]| {
        let Some(input) = parse(data) else { return };
        count(RUNS);
        count(SIZES + size_bucket(input.keys));
        if input.steps.iter().any(|s| matches!(s, Step::Batch { .. } | Step::Poll { .. })) {
            count(BATCHES);
        }
        if input.steps.contains(&Step::Reopen) {
            count(REOPENS);
        }
        // Every run starts from the same new database, made once: creating one per run would
        // cost as much as the run.
        let (database, log) = empty_database();
        let backend = FaultBackend::from_images(database.clone(), log.clone());
        let clock = ManualClock::new(1_700_000_000_000);
        let db = open_workload_as(backend.clone(), &clock, Checkpoints::WriterOnly)
            .expect("open the new database");
        if matches!(input.alteration, Alteration::RolledBack(_)) {
            backend.keep_log_history();
        }
        backend.crash_at_sync(input.crash_sync, input.mode);
        let logs: Vec<KeyLog> =
            run_steps(db, &backend, &clock, Checkpoints::WriterOnly, &input.steps);
        let crashed = backend.crashed_disk();
        if crashed.is_some() {
            count(CRASHED);
        }
        let history = backend.log_history();
        let disk = crashed.unwrap_or_else(|| backend.durable_disk());
        if matches!(input.alteration, Alteration::None) {
            if let Err(violation) = check_recovered(disk, clock, &logs) {
                panic!("after the crash ({:?}): {violation}", input.mode);
            }
            return;
        }
        count(ALTERED);
        let database = disk.live_image();
        // Read only where detectability depends on it: it opens the image with redb.
        let recorded = || recorded_log(&database).expect("the crash image's meta");
        let (log, detectable) = alter(input.alteration, &disk.log().live_image(), &history, recorded);
        let altered = FaultBackend::from_images(database, log);
        let checked = if detectable {
            check_recovered_or_refused(altered, clock, &logs)
        } else {
            count(UNDETECTABLE);
            check_tokens_after_loss(altered, clock, &logs)
        };
        match checked {
            Ok(None) => count(REFUSED),
            Ok(Some(_)) => {}
            Err(violation) => panic!(
                "after the crash ({:?}) and the log {:?}: {violation}",
                input.mode, input.alteration
            ),
        }
    }
);

/// A new workload database, closed cleanly: both files' images.
fn empty_database() -> &'static (Vec<u8>, Vec<u8>) {
    static EMPTY: OnceLock<(Vec<u8>, Vec<u8>)> = OnceLock::new();
    EMPTY.get_or_init(|| {
        let backend = FaultBackend::new();
        let clock = ManualClock::new(1_700_000_000_000);
        let db = open_workload_as(backend.clone(), &clock, Checkpoints::WriterOnly)
            .expect("open an empty backend");
        drop(db);
        (backend.durable_image(), backend.log().durable_image())
    })
}

fn size_bucket(keys: usize) -> usize {
    match keys {
        0..=7 => 0,
        8..=15 => 1,
        16..=31 => 2,
        32..=47 => 3,
        _ => 4,
    }
}
