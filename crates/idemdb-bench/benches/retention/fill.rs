//! What is stored and when: keys spread over hourly windows, and idemdb filled through its
//! public API.

use std::ops::Range;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idemdb::{IdemDb, Key, ManualClock, ReserveOutcome, Retention, Scope};

use crate::settings::{DROP_TTL, HOUR_MS, LEASE, LOAD_OPERATION, LOAD_TTL, THREADS, WIDTH};
use crate::shared::keys::{OPERATION, PAYLOAD, PRINCIPAL, RESPONSE, key_bytes};

/// The baselines' stored key, encoded as idemdb encodes its record keys (length-prefixed
/// operation and principal, then the key): 62 bytes for `OPERATION`.
pub fn stored_key(operation: &str, n: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(4 + operation.len() + PRINCIPAL.len() + 32);
    for part in [operation, PRINCIPAL] {
        k.extend_from_slice(&(part.len() as u16).to_be_bytes());
        k.extend_from_slice(part.as_bytes());
    }
    k.extend_from_slice(&key_bytes(n));
    k
}

/// The ids of window `w` when `ids` are spread evenly over `windows` windows.
pub fn window_ids(ids: &Range<u64>, windows: u64, w: u64) -> Range<u64> {
    let n = ids.end - ids.start;
    ids.start + n * w / windows..ids.start + n * (w + 1) / windows
}

/// A time aligned to the hour, so that windows are whole hours.
pub fn aligned_start() -> u64 {
    1_700_000_000_000u64.div_ceil(HOUR_MS) * HOUR_MS
}

/// The drop store's retention: compaction only when the bench calls `compact_now`.
pub fn drop_retention() -> Retention {
    Retention::default()
        .ttl(DROP_TTL)
        .partition_width(WIDTH)
        .operation_ttl(LOAD_OPERATION, LOAD_TTL)
        .compact_interval(None)
}

pub fn open_idemdb(path: &Path, clock: &ManualClock, retention: Retention, verify: bool) -> IdemDb {
    IdemDb::builder()
        .clock(clock.clone())
        .retention(retention)
        .verify_on_open(verify)
        .open(path)
        .expect("open idemdb")
}

/// reserve + complete of the key `id` of `scope`; returns whether the reservation was flagged
/// beyond the horizon (the key was dropped before and is still recognised).
fn lifecycle(db: &IdemDb, scope: &Scope, id: u64, lease: Duration) -> bool {
    match db
        .reserve(scope, &Key::new(key_bytes(id)), PAYLOAD, lease)
        .expect("reserve")
    {
        ReserveOutcome::Acquired(r) => {
            db.complete(&r, RESPONSE).expect("complete");
            r.is_beyond_horizon()
        }
        other => panic!("key {id} not acquired: {other:?}"),
    }
}

/// Fills `ids` through the public API, spread evenly over `windows` consecutive windows
/// starting at `first_window_ms`: the clock is set inside each window in turn while
/// `THREADS` threads run lifecycles of its ids. Returns the wall time and how many
/// reservations were flagged beyond the horizon.
pub fn fill_idemdb(
    db: &IdemDb,
    clock: &ManualClock,
    first_window_ms: u64,
    windows: u64,
    ids: Range<u64>,
) -> (Duration, u64) {
    let scope = Scope::new(OPERATION, PRINCIPAL);
    let flagged = AtomicU64::new(0);
    let start = Instant::now();
    for w in 0..windows {
        clock.set(first_window_ms + w * HOUR_MS + 1_000);
        let range = window_ids(&ids, windows, w);
        let next = AtomicU64::new(range.start);
        std::thread::scope(|s| {
            for _ in 0..THREADS {
                s.spawn(|| {
                    loop {
                        let id = next.fetch_add(1, Ordering::Relaxed);
                        if id >= range.end {
                            break;
                        }
                        if lifecycle(db, &scope, id, LEASE) {
                            flagged.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
    }
    (start.elapsed(), flagged.load(Ordering::Relaxed))
}
