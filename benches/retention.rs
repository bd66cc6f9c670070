//! Retention by time partitions (issue 5), measured against what a user would otherwise embed.
//!
//! 1. **Drop**: 1,000,000 finished records in 48 hourly partitions (TTL 48 h, so that none is
//!    due when the fill ends). The clock is then moved to each partition's due time in turn
//!    and every `compact_now` (one partition each) is timed. File size before the fill, after
//!    it, after the drop and after refilling the same 1M keys. Baselines on the same records:
//!    naive redb (one table, a scan for expired rows, then removal in durable transactions of
//!    10,000 keys) and SQLite (WAL, `synchronous=FULL`, an index on `expires_at`, `DELETE …
//!    WHERE rowid IN (SELECT rowid … WHERE expires_at <= ? LIMIT 10000)` until nothing is left).
//!    Open time of the 1M-record file, with `verify_on_open` on and off (three each), beside
//!    plain redb opening the same file.
//! 2. **Stall**: 64 threads doing reserve + complete of fresh keys (long TTL) for a fixed time,
//!    every reserve timed, three times on the refilled store: alone, while another thread drops
//!    the 48 refilled partitions one after another, and alone again. The same for naive redb
//!    beside its chunked sweep (redb's single writer lock is the one mutex both share).
//! 3. **Absence**: criterion on `get` of a key never stored (proves it absent) and on `reserve`
//!    of a completed key (a replay, answered without writing), with 200,000 records in 1, 48
//!    or 168 partitions; then the same calls again with the three stores measured in turn, 30
//!    rounds, compared round by round (criterion measures one store after the other, seconds
//!    apart, and the VM drifts by more than the effect sought).
//!
//! Every write is durable (default durability everywhere). idemdb is filled through its
//! public API (64 threads of reserve + complete, so group commit batches them); the baselines
//! are filled with big transactions (their fill is not what is compared).
//!
//! Run: `cargo bench --bench retention` (about 4.5 minutes on the 2-vCPU VM). The summary is
//! printed at the end and written to `target/bench-results/retention.md`. Under
//! `cargo test --benches` (criterion's test mode) every path runs once on tiny sizes, with
//! sanity checks, and nothing is written.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Barrier;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::Criterion;
use idemdb::redb::{self, ReadableDatabase, ReadableTable, TableDefinition};
use idemdb::{IdemDb, Key, ManualClock, ReserveOutcome, Retention, Scope};
use rusqlite::{Connection, params};

// ---------------------------------------------------------------------------------------------
// What is stored.

/// The request body every operation carries (64 bytes).
const PAYLOAD: &[u8] = br#"{"sku":"book-1","cents":1999,"currency":"EUR","qty":1,"u":"42"}"#;
/// The response every finished record stores (64 bytes).
const RESPONSE: &[u8] = br#"201 Created {"order":"o-000000000001","total":1999,"ok":true}"#;
/// The operation of the prefilled (expiring) records.
const OPERATION: &str = "POST /purchases";
/// The operation of the load beside the compactor: a long TTL of its own, so that only the
/// prefilled partitions expire while the clock moves.
const LOAD_OPERATION: &str = "POST /load";
const PRINCIPAL: &str = "tenant-0001";

const HOUR_MS: u64 = 3_600_000;
/// Partition width of every store.
const WIDTH: Duration = Duration::from_secs(3600);
/// TTL of the drop store: 48 h, so that after a 48-window fill no partition is due yet and
/// each can be made due, and dropped, on its own.
const DROP_TTL: Duration = Duration::from_secs(48 * 3600);
/// TTL of the absence stores: longer than 168 windows, so that nothing expires there.
const ABSENT_TTL: Duration = Duration::from_secs(30 * 24 * 3600);
/// TTL and lease of the load's records: the clock moves by days during the stall test.
const LOAD_TTL: Duration = Duration::from_secs(3650 * 24 * 3600);
const LOAD_LEASE: Duration = Duration::from_secs(30 * 24 * 3600);
const LEASE: Duration = Duration::from_secs(60);
/// Caller threads of the fills and of the load.
const THREADS: usize = 64;
/// Opens of the filled file per setting.
const OPEN_REPEATS: usize = 3;
/// Rounds of the interleaved absence cross-check.
const INTERLEAVED_ROUNDS: usize = 30;

/// Sizes of one run.
struct Sizes {
    /// Records of the drop store (and of each baseline).
    drop_records: u64,
    drop_partitions: u64,
    /// Keys per durable transaction of the baselines' sweeps.
    chunk: usize,
    /// Duration of each load phase.
    load: Duration,
    absent_records: u64,
    absent_partitions: [u64; 3],
}

const FULL: Sizes = Sizes {
    drop_records: 1_000_000,
    drop_partitions: 48,
    chunk: 10_000,
    load: Duration::from_secs(8),
    absent_records: 200_000,
    absent_partitions: [1, 48, 168],
};

/// Criterion's test mode: every path once, in a few seconds.
const TINY: Sizes = Sizes {
    drop_records: 2_000,
    drop_partitions: 4,
    chunk: 500,
    load: Duration::from_secs(1),
    absent_records: 2_000,
    absent_partitions: [1, 4, 8],
};

// ---------------------------------------------------------------------------------------------
// Keys.

/// Ids of the load's fresh keys: far above the prefilled ones, unique in the process.
static NEXT_ID: AtomicU64 = AtomicU64::new(1 << 40);

fn fresh_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The 32-byte idempotency key for id `n`: random-looking hex, like a client-minted UUID.
fn key_bytes(n: u64) -> [u8; 32] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let words = [splitmix64(n), splitmix64(n ^ 0x5851_f42d_4c95_7f2d)];
    let mut out = [0u8; 32];
    for (w, word) in words.iter().enumerate() {
        for i in 0..16 {
            out[w * 16 + i] = HEX[((word >> (60 - 4 * i)) & 0xf) as usize];
        }
    }
    out
}

/// The baselines' stored key, encoded as idemdb encodes its record keys (length-prefixed
/// operation and principal, then the key): 62 bytes for `OPERATION`.
fn stored_key(operation: &str, n: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(4 + operation.len() + PRINCIPAL.len() + 32);
    for part in [operation, PRINCIPAL] {
        k.extend_from_slice(&(part.len() as u16).to_be_bytes());
        k.extend_from_slice(part.as_bytes());
    }
    k.extend_from_slice(&key_bytes(n));
    k
}

/// A small generator for picking stored keys.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// The ids of window `w` when `ids` are spread evenly over `windows` windows.
fn window_ids(ids: &Range<u64>, windows: u64, w: u64) -> Range<u64> {
    let n = ids.end - ids.start;
    ids.start + n * w / windows..ids.start + n * (w + 1) / windows
}

/// A time aligned to the hour, so that windows are whole hours.
fn aligned_start() -> u64 {
    1_700_000_000_000u64.div_ceil(HOUR_MS) * HOUR_MS
}

// ---------------------------------------------------------------------------------------------
// idemdb.

fn drop_retention() -> Retention {
    Retention::default()
        .ttl(DROP_TTL)
        .partition_width(WIDTH)
        .operation_ttl(LOAD_OPERATION, LOAD_TTL)
        .compact_interval(None)
}

fn open_idemdb(path: &Path, clock: &ManualClock, retention: Retention, verify: bool) -> IdemDb {
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
fn fill_idemdb(
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

fn file_size(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

/// Bytes of the pages redb has allocated (in use by some tree) in an open database, from a
/// write transaction that is then aborted.
fn redb_allocated(db: &redb::Database) -> u64 {
    let txn = db.begin_write().expect("begin_write");
    let stats = txn.stats().expect("stats");
    txn.abort().expect("abort");
    stats.allocated_pages() * stats.page_size() as u64
}

/// [`redb_allocated`] of a closed idemdb file, opened with plain redb (nothing is written).
fn idemdb_allocated(path: &Path) -> u64 {
    let db = redb::Builder::new()
        .set_check_integrity_on_open(false)
        .open(path)
        .expect("open with redb");
    redb_allocated(&db)
}

/// Time to open a file with plain redb (no idemdb layout to load).
fn raw_redb_open_ms(path: &Path, verify: bool) -> f64 {
    let t = Instant::now();
    let db = redb::Builder::new()
        .set_check_integrity_on_open(verify)
        .open(path)
        .expect("open with redb");
    let took = t.elapsed().as_secs_f64() * 1e3;
    drop(db);
    took
}

// ---------------------------------------------------------------------------------------------
// Naive redb: one table, rows carry their expiry; the sweep scans and removes in chunks.

const NAIVE: TableDefinition<&[u8], &[u8]> = TableDefinition::new("idem");
/// Offset of `expires_at` in a naive value.
const NAIVE_EXPIRES_AT: usize = 53;

/// A value of the same size as idemdb's record (62-byte header + response): state,
/// fingerprint, token, lease, created, updated, attempts, expires_at, a spare byte, response.
fn naive_value(state: u8, token: u64, updated: u64, expires: u64, response: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(62 + response.len());
    v.push(state);
    v.extend_from_slice(&xxhash_rust::xxh3::xxh3_128(PAYLOAD).to_le_bytes());
    v.extend_from_slice(&token.to_le_bytes());
    v.extend_from_slice(&updated.to_le_bytes()); // lease end
    v.extend_from_slice(&updated.to_le_bytes()); // created
    v.extend_from_slice(&updated.to_le_bytes()); // updated
    v.extend_from_slice(&1u32.to_le_bytes()); // attempts
    debug_assert_eq!(v.len(), NAIVE_EXPIRES_AT);
    v.extend_from_slice(&expires.to_le_bytes());
    v.push(0);
    v.extend_from_slice(response);
    v
}

fn naive_expires(v: &[u8]) -> u64 {
    u64::from_le_bytes(
        v[NAIVE_EXPIRES_AT..NAIVE_EXPIRES_AT + 8]
            .try_into()
            .expect("8 bytes"),
    )
}

fn open_naive(path: &Path) -> redb::Database {
    let db = redb::Database::create(path).expect("open redb");
    let txn = db.begin_write().expect("begin");
    txn.open_table(NAIVE).expect("table");
    txn.commit().expect("commit");
    db
}

/// Fills `ids` with finished records over `windows` windows, 100,000 rows per durable
/// transaction (not measured).
fn fill_naive(db: &redb::Database, first_window_ms: u64, windows: u64, ids: Range<u64>) {
    let ttl = DROP_TTL.as_millis() as u64;
    let mut rows = Vec::new();
    for w in 0..windows {
        let updated = first_window_ms + w * HOUR_MS + 1_000;
        for id in window_ids(&ids, windows, w) {
            rows.push((id, updated));
        }
    }
    for batch in rows.chunks(100_000) {
        let txn = db.begin_write().expect("begin");
        {
            let mut t = txn.open_table(NAIVE).expect("table");
            for &(id, updated) in batch {
                let v = naive_value(1, id + 1, updated, updated + ttl, RESPONSE);
                t.insert(stored_key(OPERATION, id).as_slice(), v.as_slice())
                    .expect("insert");
            }
        }
        txn.commit().expect("commit");
    }
}

/// Every key whose row expired at `now`, read in one read transaction (key order).
fn naive_scan(db: &redb::Database, now: u64) -> Vec<Vec<u8>> {
    let txn = db.begin_read().expect("begin_read");
    let table = txn.open_table(NAIVE).expect("table");
    let mut keys = Vec::new();
    for row in table.iter().expect("iter") {
        let (k, v) = row.expect("row");
        if naive_expires(v.value()) <= now {
            keys.push(k.value().to_vec());
        }
    }
    keys
}

/// Removes `keys` in one durable write transaction.
fn naive_remove(db: &redb::Database, keys: &[Vec<u8>]) {
    let txn = db.begin_write().expect("begin_write");
    {
        let mut t = txn.open_table(NAIVE).expect("table");
        for k in keys {
            t.remove(k.as_slice())
                .expect("remove")
                .expect("row existed");
        }
    }
    txn.commit().expect("commit");
}

/// Naive reserve (one durable transaction: check, insert IN_PROGRESS) and complete (another:
/// check the token, insert COMPLETED). Returns the reserve's start and latency.
fn naive_lifecycle(db: &redb::Database, id: u64, now: u64) -> (Instant, Duration) {
    let key = stored_key(LOAD_OPERATION, id);
    let expires = now + LOAD_TTL.as_millis() as u64;
    let start = Instant::now();
    let txn = db.begin_write().expect("begin_write");
    {
        let mut t = txn.open_table(NAIVE).expect("table");
        assert!(t.get(key.as_slice()).expect("get").is_none(), "fresh key");
        t.insert(
            key.as_slice(),
            naive_value(0, id, now, expires, &[]).as_slice(),
        )
        .expect("insert");
    }
    txn.commit().expect("commit");
    let reserve = start.elapsed();
    let txn = db.begin_write().expect("begin_write");
    {
        let mut t = txn.open_table(NAIVE).expect("table");
        let v = t
            .get(key.as_slice())
            .expect("get")
            .expect("reserved")
            .value()[0];
        assert_eq!(v, 0, "in progress");
        t.insert(
            key.as_slice(),
            naive_value(1, id, now, expires, RESPONSE).as_slice(),
        )
        .expect("insert");
    }
    txn.commit().expect("commit");
    (start, reserve)
}

// ---------------------------------------------------------------------------------------------
// SQLite: WAL, synchronous=FULL, an index on expires_at, chunked DELETE.

fn connect_sqlite(path: &Path) -> Connection {
    let conn = Connection::open(path).expect("open sqlite");
    let mode: String = conn
        .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
        .expect("journal_mode");
    assert_eq!(mode.to_lowercase(), "wal");
    conn.pragma_update(None, "synchronous", "FULL")
        .expect("synchronous");
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS idem(key BLOB PRIMARY KEY, fp BLOB NOT NULL, \
           state INTEGER NOT NULL, token INTEGER NOT NULL, created_at INTEGER NOT NULL, \
           expires_at INTEGER NOT NULL, response BLOB);
         CREATE INDEX IF NOT EXISTS idem_expires ON idem(expires_at);",
    )
    .expect("schema");
    conn
}

/// Fills `ids` over `windows` windows, 100,000 rows per transaction (not measured).
fn fill_sqlite(conn: &mut Connection, first_window_ms: u64, windows: u64, ids: Range<u64>) {
    let ttl = DROP_TTL.as_millis() as i64;
    let fp = xxhash_rust::xxh3::xxh3_128(PAYLOAD).to_le_bytes();
    let mut rows = Vec::new();
    for w in 0..windows {
        let updated = (first_window_ms + w * HOUR_MS + 1_000) as i64;
        for id in window_ids(&ids, windows, w) {
            rows.push((id, updated));
        }
    }
    for batch in rows.chunks(100_000) {
        let tx = conn.transaction().expect("begin");
        {
            let mut stmt = tx
                .prepare(
                    "INSERT INTO idem(key, fp, state, token, created_at, expires_at, response) \
                     VALUES (?1, ?2, 1, ?3, ?4, ?5, ?6)",
                )
                .expect("prepare");
            for &(id, updated) in batch {
                stmt.execute(params![
                    stored_key(OPERATION, id),
                    &fp[..],
                    id as i64 + 1,
                    updated,
                    updated + ttl,
                    RESPONSE
                ])
                .expect("insert");
            }
        }
        tx.commit().expect("commit");
    }
}

/// The main database file's size once the WAL is checkpointed into it and truncated.
fn sqlite_size(conn: &Connection, path: &Path) -> u64 {
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .expect("checkpoint");
    file_size(path)
}

/// Bytes of the pages SQLite uses (all pages minus the free list).
fn sqlite_in_use(conn: &Connection) -> u64 {
    let get = |pragma: &str| -> i64 {
        conn.query_row(&format!("PRAGMA {pragma}"), [], |r| r.get(0))
            .expect("pragma")
    };
    ((get("page_count") - get("freelist_count")) * get("page_size")) as u64
}

// ---------------------------------------------------------------------------------------------
// Measurements.

/// Distribution of durations, in ns.
struct Dist(Vec<u64>);

impl Dist {
    fn new(mut v: Vec<u64>) -> Dist {
        v.sort_unstable();
        Dist(v)
    }

    fn q(&self, q: f64) -> Option<f64> {
        if self.0.is_empty() {
            return None;
        }
        let i = ((self.0.len() as f64 - 1.0) * q).round() as usize;
        Some(self.0[i] as f64)
    }

    fn sum(&self) -> f64 {
        self.0.iter().map(|&x| x as f64).sum()
    }
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// One expiry step run beside a load: its start (ns since the load began), duration, and the
/// records it removed.
struct Step {
    start_ns: u64,
    took_ns: u64,
    records: u64,
}

/// What a load did: every reserve's start (ns since the load began) and latency.
struct LoadRun {
    reserves: Vec<(u64, u64)>,
    lifecycles: u64,
    wall: Duration,
    steps: Vec<Step>,
}

/// `THREADS` threads run `op` on fresh ids for `dur`, while `side` runs on one more thread
/// (given the load's start and a stop flag) and returns its steps.
fn run_load(
    dur: Duration,
    op: &(dyn Fn(u64) -> (Instant, Duration) + Sync),
    side: &(dyn Fn(Instant, &AtomicBool) -> Vec<Step> + Sync),
) -> LoadRun {
    let stop = AtomicBool::new(false);
    let ready = Barrier::new(THREADS + 2);
    let t0 = std::sync::OnceLock::new();
    std::thread::scope(|s| {
        let callers: Vec<_> = (0..THREADS)
            .map(|_| {
                s.spawn(|| {
                    let mut out = Vec::with_capacity(1 << 14);
                    ready.wait();
                    let t0: Instant = *t0.get().expect("set before the barrier");
                    while !stop.load(Ordering::Relaxed) {
                        let (start, took) = op(fresh_id());
                        out.push((ns(start.saturating_duration_since(t0)), ns(took)));
                    }
                    out
                })
            })
            .collect();
        let side = s.spawn(|| {
            ready.wait();
            side(*t0.get().expect("set before the barrier"), &stop)
        });
        let start = Instant::now();
        t0.set(start).expect("set once");
        ready.wait();
        std::thread::sleep(dur);
        stop.store(true, Ordering::Relaxed);
        let wall = start.elapsed();
        let mut reserves = Vec::new();
        for c in callers {
            reserves.extend(c.join().expect("caller"));
        }
        LoadRun {
            lifecycles: reserves.len() as u64,
            reserves,
            wall,
            steps: side.join().expect("side"),
        }
    })
}

/// Waits until `at` after `t0`, or until stopped; false if stopped.
fn sleep_until(t0: Instant, at: Duration, stop: &AtomicBool) -> bool {
    loop {
        if stop.load(Ordering::Relaxed) {
            return false;
        }
        let now = t0.elapsed();
        if now >= at {
            return true;
        }
        std::thread::sleep((at - now).min(Duration::from_millis(5)));
    }
}

fn no_side(_: Instant, _: &AtomicBool) -> Vec<Step> {
    Vec::new()
}

/// The schedule of `n` expiry steps spread over a load of `dur`: the first after a lead of
/// `dur / 16`, the last a lead before the end.
fn schedule(dur: Duration, n: usize, i: usize) -> Duration {
    let lead = dur / 16;
    let span = dur.saturating_sub(lead * 2);
    lead + span.mul_f64(i as f64 / n.max(1) as f64)
}

// ---------------------------------------------------------------------------------------------
// The report.

#[derive(Clone, Copy, PartialEq)]
enum Cmp {
    /// Show idemdb ÷ baseline.
    Ratio,
    /// Different units per column, or not comparable: no ratio.
    None,
}

struct Row {
    cell: &'static str,
    metric: String,
    vals: [Option<f64>; 3],
    digits: usize,
    cmp: Cmp,
}

#[derive(Default)]
struct Report {
    rows: Vec<Row>,
    targets: Vec<(String, String, Option<bool>)>,
    notes: Vec<String>,
}

impl Report {
    fn row(
        &mut self,
        cell: &'static str,
        metric: impl Into<String>,
        vals: [Option<f64>; 3],
        digits: usize,
        cmp: Cmp,
    ) {
        self.rows.push(Row {
            cell,
            metric: metric.into(),
            vals,
            digits,
            cmp,
        });
    }

    fn idem(&mut self, cell: &'static str, metric: impl Into<String>, v: f64, digits: usize) {
        self.row(cell, metric, [Some(v), None, None], digits, Cmp::None);
    }

    fn markdown(&self, machine: &[(String, String)]) -> String {
        use std::fmt::Write as _;
        let mut md = String::new();
        let _ = writeln!(md, "Machine:");
        for (k, v) in machine {
            let _ = writeln!(md, "- {k}: {v}");
        }
        let _ = writeln!(md);
        let _ = writeln!(
            md,
            "| cell | metric | idemdb | redb naive | SQLite | idemdb ÷ naive | idemdb ÷ SQLite |"
        );
        let _ = writeln!(md, "|---|---|--:|--:|--:|--:|--:|");
        for r in &self.rows {
            let [a, b, c] = r.vals.map(|v| fmt_val(v, r.digits));
            let ratio = |i: usize| match (r.cmp, r.vals[0], r.vals[i]) {
                (Cmp::Ratio, Some(x), Some(y)) if y > 0.0 => fmt_ratio(x / y),
                _ => "–".into(),
            };
            let _ = writeln!(
                md,
                "| {} | {} | {a} | {b} | {c} | {} | {} |",
                r.cell,
                r.metric,
                ratio(1),
                ratio(2)
            );
        }
        if !self.targets.is_empty() {
            let _ = writeln!(md, "\n| target | measured | met? |\n|---|--:|---|");
            for (what, shown, met) in &self.targets {
                let met = match met {
                    Some(true) => "met",
                    Some(false) => "**missed**",
                    None => "not measured",
                };
                let _ = writeln!(md, "| {what} | {shown} | {met} |");
            }
        }
        if !self.notes.is_empty() {
            let _ = writeln!(md);
            for n in &self.notes {
                let _ = writeln!(md, "- {n}");
            }
        }
        md
    }
}

fn fmt_val(v: Option<f64>, digits: usize) -> String {
    match v {
        None => "–".into(),
        Some(v) if digits == 0 && v.abs() >= 10_000.0 => group_thousands(v.round() as i64),
        Some(v) => format!("{v:.digits$}"),
    }
}

fn group_thousands(v: i64) -> String {
    let s = v.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if v < 0 { format!("-{out}") } else { out }
}

fn fmt_ratio(r: f64) -> String {
    if r >= 100.0 {
        format!("{r:.0}×")
    } else if r >= 0.01 {
        format!("{r:.2}×")
    } else {
        format!("{r:.4}×")
    }
}

const MB: f64 = 1024.0 * 1024.0;

fn ms(ns: f64) -> f64 {
    ns / 1e6
}

fn machine() -> Vec<(String, String)> {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "?".into());
    let nproc = std::thread::available_parallelism().map_or(0, |n| n.get());
    let run = |cmd: &str, args: &[&str]| {
        std::process::Command::new(cmd)
            .args(args)
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_else(|| "?".into())
    };
    let tmp = std::env::temp_dir();
    let df = run("df", &["-T", &tmp.to_string_lossy()]);
    let fs = df
        .lines()
        .nth(1)
        .map(|l| {
            let c: Vec<&str> = l.split_whitespace().collect();
            format!(
                "{} on {} (mounted at {})",
                c.get(1).unwrap_or(&"?"),
                c.first().unwrap_or(&"?"),
                c.last().unwrap_or(&"?")
            )
        })
        .unwrap_or_else(|| "?".into());
    vec![
        ("nproc".into(), nproc.to_string()),
        ("CPU".into(), cpu),
        (format!("filesystem of {}", tmp.display()), fs),
        ("run finished (UTC)".into(), run("date", &["-u", "+%F %T"])),
    ]
}

fn target_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR") {
        return PathBuf::from(dir);
    }
    // The bench runs as <target>/<profile>/deps/retention-<hash>.
    std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.parent()?.to_path_buf()))
        .unwrap_or_else(|| PathBuf::from("target"))
}

/// Criterion's median for one benchmark, ns per iteration.
fn criterion_median(group: &str, id: &str) -> Option<f64> {
    let dir = std::env::var_os("CRITERION_HOME")
        .map_or_else(|| target_dir().join("criterion"), PathBuf::from);
    let text = std::fs::read_to_string(dir.join(group).join(id).join("new/estimates.json")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v["median"]["point_estimate"].as_f64()
}

// ---------------------------------------------------------------------------------------------
// The cells.

/// Step 1 (and the store step 2 reuses): fill, open times, per-partition drop, refill.
struct DropStore {
    db: IdemDb,
    clock: ManualClock,
    /// Start of the refill's first window.
    refill_start: u64,
    /// Holds the idemdb file and the baselines' (dropped after `db`).
    dir: tempfile::TempDir,
}

fn drop_cell(root: &Path, sizes: &Sizes, report: &mut Report) -> DropStore {
    let n = sizes.drop_records;
    let parts = sizes.drop_partitions;
    let dir = tempfile::tempdir_in(root).expect("tempdir");
    let path = dir.path().join("drop.idemdb");
    let start = aligned_start();
    let clock = ManualClock::new(start);
    let db = open_idemdb(&path, &clock, drop_retention(), true);
    let size_empty = file_size(&path);

    println!("drop: filling {n} records into {parts} partitions through the API…");
    let (fill, flagged) = fill_idemdb(&db, &clock, start, parts, 0..n);
    assert_eq!(flagged, 0, "nothing was dropped yet");
    let st = db.stats();
    assert_eq!(st.stored_records, n, "stored records after the fill");
    assert_eq!(st.partitions, parts, "one partition per window");
    let size_filled = file_size(&path);
    let indexed = st.indexed_keys;
    println!(
        "  {:.1} s ({:.0} records/s), {:.1} MB, {} indexed keys",
        fill.as_secs_f64(),
        n as f64 / fill.as_secs_f64(),
        size_filled as f64 / MB,
        indexed
    );

    // Open time of the filled file: the key index is rebuilt by scanning every partition.
    drop(db);
    let used_filled = idemdb_allocated(&path);
    // Each open three times, alternating; the median is reported.
    let mut raw_open_ms = [Vec::new(), Vec::new()];
    let mut open_ms = [Vec::new(), Vec::new()];
    let mut db = None;
    for _ in 0..OPEN_REPEATS {
        for (i, verify) in [true, false].into_iter().enumerate() {
            drop(db.take());
            raw_open_ms[i].push(raw_redb_open_ms(&path, verify));
            let t = Instant::now();
            let opened = open_idemdb(&path, &clock, drop_retention(), verify);
            open_ms[i].push(t.elapsed().as_secs_f64() * 1e3);
            let st = opened.stats();
            assert_eq!((st.stored_records, st.indexed_keys), (n, indexed));
            db = Some(opened);
        }
    }
    let db = db.expect("opened");
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let spread = |v: &[f64]| {
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(0.0, f64::max);
        format!("{lo:.0}–{hi:.0}")
    };
    let open_ms: [(f64, String); 2] = [0, 1].map(|i| (median(&open_ms[i]), spread(&open_ms[i])));
    let raw_open_ms = [median(&raw_open_ms[0]), median(&raw_open_ms[1])];
    println!(
        "  open: {:.0} ms with verify_on_open, {:.0} ms without (plain redb: {:.0} / {:.0} ms)",
        open_ms[0].0, open_ms[1].0, raw_open_ms[0], raw_open_ms[1]
    );

    // Drop: each partition made due in turn, each compact_now timed.
    let ttl_ms = DROP_TTL.as_millis() as u64;
    let mut per_part = Vec::new();
    let mut expired = 0;
    for k in 0..parts {
        clock.set(start + (k + 1) * HOUR_MS + ttl_ms);
        let t = Instant::now();
        let r = db.compact_now().expect("compact_now");
        per_part.push(ns(t.elapsed()));
        let want = window_ids(&(0..n), parts, k);
        assert_eq!(r.partitions_dropped, 1, "one partition due per step");
        assert_eq!(r.records_expired, want.end - want.start);
        expired += r.records_expired;
    }
    assert_eq!(expired, n, "records_expired equals what was filled");
    let st = db.stats();
    assert_eq!((st.partitions, st.stored_records), (0, 0));
    assert_eq!(st.indexed_keys, 0);
    let horizon_keys = st.horizon_keys;
    // A pass with nothing due, while the horizon holds the dropped keys.
    let idle = Dist::new(
        (0..5)
            .map(|_| {
                let t = Instant::now();
                let r = db.compact_now().expect("compact_now");
                assert_eq!(r.partitions_dropped, 0);
                ns(t.elapsed())
            })
            .collect(),
    );
    let size_dropped = file_size(&path);
    drop(db);
    let used_dropped = idemdb_allocated(&path);
    let db = open_idemdb(&path, &clock, drop_retention(), false);
    let drops = Dist::new(per_part);
    println!(
        "  dropped {parts} partitions: total {:.0} ms, median {:.1} ms, max {:.1} ms; file {:.1} MB",
        ms(drops.sum()),
        ms(drops.q(0.5).unwrap_or(0.0)),
        ms(drops.q(1.0).unwrap_or(0.0)),
        size_dropped as f64 / MB
    );
    // Dropped keys are gone, and recognised beyond the horizon.
    assert!(
        db.get(&Scope::new(OPERATION, PRINCIPAL), &Key::new(key_bytes(0)))
            .expect("get")
            .is_none()
    );

    // Refill the same keys, in later windows.
    let refill_start = start + (parts + 1 + 48) * HOUR_MS;
    println!("  refilling the same {n} keys…");
    let (refill, flagged) = fill_idemdb(&db, &clock, refill_start, parts, 0..n);
    let size_refilled = file_size(&path);
    let st = db.stats();
    assert_eq!(st.stored_records, n);
    drop(db);
    let used_refilled = idemdb_allocated(&path);
    let db = open_idemdb(&path, &clock, drop_retention(), false);
    println!(
        "  {:.1} s, {flagged} of {n} flagged beyond the horizon; file {:.1} MB",
        refill.as_secs_f64(),
        size_refilled as f64 / MB
    );

    // Baselines, on files next to it.
    let naive = naive_drop(dir.path(), sizes);
    let sqlite = sqlite_drop(dir.path(), sizes);

    let c = "drop";
    let mb = |b: u64| Some(b as f64 / MB);
    report.row(
        c,
        format!("fill {n} records, s (idemdb: API, {THREADS} threads; baselines: 100k-row txns)"),
        [
            Some(fill.as_secs_f64()),
            Some(naive.fill_s),
            Some(sqlite.fill_s),
        ],
        1,
        Cmp::None,
    );
    report.row(
        c,
        "time to expire everything, ms ↓".to_string(),
        [
            Some(ms(drops.sum())),
            Some(naive.total_ms),
            Some(sqlite.total_ms),
        ],
        0,
        Cmp::Ratio,
    );
    report.row(
        c,
        format!(
            "… per step, median ms (idemdb: 1 partition ≈ {} records; baselines: 1 chunk of {})",
            n / parts,
            sizes.chunk
        ),
        [
            drops.q(0.5).map(ms),
            naive.chunks.q(0.5).map(ms),
            sqlite.chunks.q(0.5).map(ms),
        ],
        1,
        Cmp::None,
    );
    report.row(
        c,
        "… per step, max ms",
        [
            drops.q(1.0).map(ms),
            naive.chunks.q(1.0).map(ms),
            sqlite.chunks.q(1.0).map(ms),
        ],
        1,
        Cmp::None,
    );
    report.row(
        c,
        "… steps (durable transactions)",
        [
            Some(parts as f64),
            Some(naive.chunks.0.len() as f64),
            Some(sqlite.chunks.0.len() as f64),
        ],
        0,
        Cmp::None,
    );
    report.row(
        c,
        "… of which the scan for expired rows, ms",
        [None, Some(naive.scan_ms), None],
        0,
        Cmp::None,
    );
    report.row(
        c,
        "file MB, before the fill",
        [mb(size_empty), mb(naive.sizes[0]), mb(sqlite.sizes[0])],
        2,
        Cmp::None,
    );
    report.row(
        c,
        "file MB, after the fill",
        [mb(size_filled), mb(naive.sizes[1]), mb(sqlite.sizes[1])],
        1,
        Cmp::Ratio,
    );
    report.row(
        c,
        "file MB, after expiring everything",
        [mb(size_dropped), mb(naive.sizes[2]), mb(sqlite.sizes[2])],
        1,
        Cmp::None,
    );
    report.row(
        c,
        "file MB, after refilling the same records",
        [mb(size_refilled), mb(naive.sizes[3]), mb(sqlite.sizes[3])],
        1,
        Cmp::Ratio,
    );
    for (i, what) in [
        "after the fill",
        "after expiring everything",
        "after refilling",
    ]
    .into_iter()
    .enumerate()
    {
        let used = [used_filled, used_dropped, used_refilled][i];
        report.row(
            c,
            format!("in use MB (redb: allocated pages; SQLite: pages not free), {what}"),
            [mb(used), mb(naive.in_use[i]), mb(sqlite.in_use[i])],
            1,
            Cmp::None,
        );
    }
    let growth = |s: [u64; 4]| Some((s[3] as f64 / s[1] as f64 - 1.0) * 100.0);
    let idem_growth = (size_refilled as f64 / size_filled as f64 - 1.0) * 100.0;
    let used_growth = |a: u64, b: u64| Some((b as f64 / a as f64 - 1.0) * 100.0);
    report.row(
        c,
        "growth of the second fill over the first, %",
        [Some(idem_growth), growth(naive.sizes), growth(sqlite.sizes)],
        1,
        Cmp::None,
    );
    report.row(
        c,
        "in use after the refill over in use after the first fill, %",
        [
            used_growth(used_filled, used_refilled),
            used_growth(naive.in_use[0], naive.in_use[2]),
            used_growth(sqlite.in_use[0], sqlite.in_use[2]),
        ],
        1,
        Cmp::None,
    );
    report.idem(c, "refill: fill time, s", refill.as_secs_f64(), 1);
    report.idem(
        c,
        "refill: keys flagged beyond the horizon (of the refilled)",
        flagged as f64,
        0,
    );
    report.idem(
        c,
        "compact_now with nothing due (horizon holding the dropped keys), median ms",
        ms(idle.q(0.5).unwrap_or(0.0)),
        2,
    );
    report.idem(
        c,
        format!(
            "open the filled file, verify_on_open on, median of {OPEN_REPEATS} ms (range {})",
            open_ms[0].1
        ),
        open_ms[0].0,
        0,
    );
    report.idem(
        c,
        format!(
            "open the filled file, verify_on_open off, median of {OPEN_REPEATS} ms (range {})",
            open_ms[1].1
        ),
        open_ms[1].0,
        0,
    );
    report.idem(
        c,
        "… the same file opened by plain redb (no key index to rebuild), check on, ms",
        raw_open_ms[0],
        0,
    );
    report.idem(
        c,
        "… the same file opened by plain redb, check off, ms",
        raw_open_ms[1],
        0,
    );
    report.idem(c, "indexed_keys after the fill", indexed as f64, 0);
    report.idem(
        c,
        "… key index memory at ≈16 B each, MB",
        indexed as f64 * 16.0 / MB,
        1,
    );
    report.idem(c, "horizon_keys after the drop", horizon_keys as f64, 0);
    report.idem(
        c,
        "… horizon memory at ≈12 B each, MB",
        horizon_keys as f64 * 12.0 / MB,
        1,
    );
    report.targets.push((
        "the second fill grows the file by no more than 10%".into(),
        format!("{idem_growth:+.1}%"),
        Some(idem_growth <= 10.0),
    ));
    DropStore {
        db,
        clock,
        refill_start,
        dir,
    }
}

struct BaselineDrop {
    fill_s: f64,
    scan_ms: f64,
    chunks: Dist,
    total_ms: f64,
    /// Before the fill, after it, after the sweep, after the refill.
    sizes: [u64; 4],
    /// Bytes in use after the fill, after the sweep, after the refill.
    in_use: [u64; 3],
}

fn naive_drop(dir: &Path, sizes: &Sizes) -> BaselineDrop {
    let n = sizes.drop_records;
    let parts = sizes.drop_partitions;
    let path = dir.join("naive.redb");
    let db = open_naive(&path);
    let s0 = file_size(&path);
    let start = aligned_start();
    let t = Instant::now();
    fill_naive(&db, start, parts, 0..n);
    let fill_s = t.elapsed().as_secs_f64();
    let s1 = file_size(&path);
    let u1 = redb_allocated(&db);
    let now = start + (parts + 1) * HOUR_MS + DROP_TTL.as_millis() as u64;

    let t = Instant::now();
    let keys = naive_scan(&db, now);
    let scan_ms = t.elapsed().as_secs_f64() * 1e3;
    assert_eq!(keys.len() as u64, n, "every row expired");
    let mut chunks = Vec::new();
    for chunk in keys.chunks(sizes.chunk) {
        let t = Instant::now();
        naive_remove(&db, chunk);
        chunks.push(ns(t.elapsed()));
    }
    let total_ms = t.elapsed().as_secs_f64() * 1e3;
    {
        let txn = db.begin_read().expect("read");
        use idemdb::redb::ReadableTableMetadata;
        assert_eq!(txn.open_table(NAIVE).expect("table").len().expect("len"), 0);
    }
    let s2 = file_size(&path);
    let u2 = redb_allocated(&db);
    fill_naive(&db, start + (parts + 1 + 48) * HOUR_MS, parts, 0..n);
    let s3 = file_size(&path);
    let u3 = redb_allocated(&db);
    let chunks = Dist::new(chunks);
    println!(
        "naive redb: fill {fill_s:.1} s; sweep {total_ms:.0} ms (scan {scan_ms:.0} ms, {} chunks, \
         median {:.1} ms, max {:.1} ms); {:.1} / {:.1} / {:.1} MB",
        chunks.0.len(),
        ms(chunks.q(0.5).unwrap_or(0.0)),
        ms(chunks.q(1.0).unwrap_or(0.0)),
        s1 as f64 / MB,
        s2 as f64 / MB,
        s3 as f64 / MB
    );
    BaselineDrop {
        fill_s,
        scan_ms,
        chunks,
        total_ms,
        sizes: [s0, s1, s2, s3],
        in_use: [u1, u2, u3],
    }
}

fn sqlite_drop(dir: &Path, sizes: &Sizes) -> BaselineDrop {
    let n = sizes.drop_records;
    let parts = sizes.drop_partitions;
    let path = dir.join("baseline.sqlite");
    let mut conn = connect_sqlite(&path);
    let s0 = sqlite_size(&conn, &path);
    let start = aligned_start();
    let t = Instant::now();
    fill_sqlite(&mut conn, start, parts, 0..n);
    let fill_s = t.elapsed().as_secs_f64();
    let s1 = sqlite_size(&conn, &path);
    let u1 = sqlite_in_use(&conn);
    // A fresh connection (default cache) for the sweep, as a service's sweeper would have.
    drop(conn);
    let conn = connect_sqlite(&path);
    let now = (start + (parts + 1) * HOUR_MS + DROP_TTL.as_millis() as u64) as i64;
    let sql = format!(
        "DELETE FROM idem WHERE rowid IN \
         (SELECT rowid FROM idem WHERE expires_at <= ?1 LIMIT {})",
        sizes.chunk
    );
    let mut chunks = Vec::new();
    let mut deleted = 0u64;
    let t = Instant::now();
    loop {
        let c = Instant::now();
        let changed = conn
            .prepare_cached(&sql)
            .and_then(|mut s| s.execute(params![now]))
            .expect("delete");
        if changed == 0 {
            break;
        }
        chunks.push(ns(c.elapsed()));
        deleted += changed as u64;
    }
    let total_ms = t.elapsed().as_secs_f64() * 1e3;
    assert_eq!(deleted, n, "every row expired");
    let left: i64 = conn
        .query_row("SELECT count(*) FROM idem", [], |r| r.get(0))
        .expect("count");
    assert_eq!(left, 0);
    let s2 = sqlite_size(&conn, &path);
    let u2 = sqlite_in_use(&conn);
    drop(conn);
    let mut conn = connect_sqlite(&path);
    fill_sqlite(&mut conn, start + (parts + 1 + 48) * HOUR_MS, parts, 0..n);
    let s3 = sqlite_size(&conn, &path);
    let u3 = sqlite_in_use(&conn);
    let chunks = Dist::new(chunks);
    println!(
        "SQLite: fill {fill_s:.1} s; sweep {total_ms:.0} ms ({} chunks, median {:.1} ms, \
         max {:.1} ms); {:.1} / {:.1} / {:.1} MB",
        chunks.0.len(),
        ms(chunks.q(0.5).unwrap_or(0.0)),
        ms(chunks.q(1.0).unwrap_or(0.0)),
        s1 as f64 / MB,
        s2 as f64 / MB,
        s3 as f64 / MB
    );
    BaselineDrop {
        fill_s,
        scan_ms: 0.0,
        chunks,
        total_ms,
        sizes: [s0, s1, s2, s3],
        in_use: [u1, u2, u3],
    }
}

/// Reserve latencies of a load run, and the steps beside it.
struct StallResult {
    reserves: Dist,
    /// Reserves that overlapped an expiry step.
    during_steps: Dist,
    lifecycles_per_s: f64,
    steps: usize,
    step_records: u64,
    step_times: Dist,
}

fn summarise(run: LoadRun) -> StallResult {
    let during: Vec<u64> = run
        .reserves
        .iter()
        .filter(|(start, took)| {
            run.steps
                .iter()
                .any(|s| *start < s.start_ns + s.took_ns && start + took > s.start_ns)
        })
        .map(|(_, took)| *took)
        .collect();
    StallResult {
        reserves: Dist::new(run.reserves.iter().map(|r| r.1).collect()),
        during_steps: Dist::new(during),
        lifecycles_per_s: run.lifecycles as f64 / run.wall.as_secs_f64(),
        steps: run.steps.len(),
        step_records: run.steps.iter().map(|s| s.records).sum(),
        step_times: Dist::new(run.steps.iter().map(|s| s.took_ns).collect()),
    }
}

fn stall_cell(store: &DropStore, sizes: &Sizes, report: &mut Report) {
    let db = &store.db;
    let clock = &store.clock;
    let parts = sizes.drop_partitions;
    let n = sizes.drop_records;
    let scope = Scope::new(LOAD_OPERATION, PRINCIPAL);
    let op = |id: u64| {
        let key = Key::new(key_bytes(id));
        let start = Instant::now();
        let out = db
            .reserve(&scope, &key, PAYLOAD, LOAD_LEASE)
            .expect("reserve");
        let took = start.elapsed();
        match out {
            ReserveOutcome::Acquired(r) => db.complete(&r, RESPONSE).expect("complete"),
            other => panic!("fresh key not acquired: {other:?}"),
        }
        (start, took)
    };
    let st = db.stats();
    assert_eq!(st.partitions, parts, "the refilled partitions");
    let dropped_before = st.partitions_dropped;

    println!("stall: idemdb load alone for {:?}…", sizes.load);
    let alone = summarise(run_load(sizes.load, &op, &no_side));
    assert_eq!(
        db.stats().partitions_dropped,
        dropped_before,
        "nothing dropped without compaction"
    );

    println!("stall: idemdb load beside the drop of {parts} partitions…");
    let ttl_ms = DROP_TTL.as_millis() as u64;
    let refill_start = store.refill_start;
    let dur = sizes.load;
    let compactor = |t0: Instant, stop: &AtomicBool| {
        let mut steps = Vec::new();
        for k in 0..parts {
            if !sleep_until(t0, schedule(dur, parts as usize, k as usize), stop) {
                break;
            }
            // The refilled partition k becomes due (the load's records have a long TTL).
            clock.set(refill_start + (k + 1) * HOUR_MS + ttl_ms);
            let start = t0.elapsed();
            let r = db.compact_now().expect("compact_now");
            let took = t0.elapsed() - start;
            assert_eq!(r.partitions_dropped, 1, "one partition due per step");
            let want = window_ids(&(0..n), parts, k);
            assert_eq!(r.records_expired, want.end - want.start);
            steps.push(Step {
                start_ns: ns(start),
                took_ns: ns(took),
                records: r.records_expired,
            });
        }
        steps
    };
    let beside = summarise(run_load(sizes.load, &op, &compactor));
    let st = db.stats();
    println!(
        "  dropped {} partitions ({} records) during the load; {} partitions left",
        beside.steps, beside.step_records, st.partitions
    );
    if beside.steps as u64 != parts {
        println!(
            "  WARNING: only {} of {parts} partitions dropped during the load",
            beside.steps
        );
    }
    println!("stall: idemdb load alone again, after the expiry…");
    let after = summarise(run_load(sizes.load, &op, &no_side));

    // Naive redb: the same load, one durable transaction per operation, beside its sweep.
    let path = store.dir.path().join("naive.redb");
    let naive = redb::Database::create(&path).expect("reopen naive");
    let now = aligned_start() + 1_000 * HOUR_MS;
    let nop = |id: u64| naive_lifecycle(&naive, id, now);
    println!("stall: naive redb load alone…");
    let naive_alone = summarise(run_load(sizes.load, &nop, &no_side));
    println!("stall: naive redb load beside its chunked sweep…");
    let chunk = sizes.chunk;
    let sweeper = |t0: Instant, stop: &AtomicBool| {
        // The scan is a read transaction: it does not block the load, and is not a step.
        let mut steps = Vec::new();
        let keys = naive_scan(&naive, now);
        let chunks: Vec<&[Vec<u8>]> = keys.chunks(chunk).collect();
        for (i, c) in chunks.iter().enumerate() {
            if !sleep_until(t0, schedule(dur, chunks.len(), i), stop) {
                break;
            }
            let start = t0.elapsed();
            naive_remove(&naive, c);
            steps.push(Step {
                start_ns: ns(start),
                took_ns: ns(t0.elapsed() - start),
                records: c.len() as u64,
            });
        }
        steps
    };
    let naive_beside = summarise(run_load(sizes.load, &nop, &sweeper));
    println!(
        "  naive: {} of {} chunks removed during the load ({} rows)",
        naive_beside.steps,
        n.div_ceil(chunk as u64),
        naive_beside.step_records
    );
    println!("stall: naive redb load alone again, after the sweep…");
    let naive_after = summarise(run_load(sizes.load, &nop, &no_side));

    let c = "stall";
    let us = |d: &Dist, q: f64| d.q(q).map(|v| v / 1e3);
    for (label, idem, base) in [
        ("1. no expiry (before)", &alone, &naive_alone),
        ("2. beside expiry", &beside, &naive_beside),
        ("3. no expiry (after)", &after, &naive_after),
    ] {
        for (q, name) in [(0.5, "p50"), (0.99, "p99"), (0.999, "p99.9"), (1.0, "max")] {
            report.row(
                c,
                format!("{label}: reserve {name}, µs ↓"),
                [us(&idem.reserves, q), us(&base.reserves, q), None],
                0,
                Cmp::Ratio,
            );
        }
        report.row(
            c,
            format!("{label}: reserves timed"),
            [
                Some(idem.reserves.0.len() as f64),
                Some(base.reserves.0.len() as f64),
                None,
            ],
            0,
            Cmp::None,
        );
        report.row(
            c,
            format!("{label}: lifecycles/s ↑"),
            [
                Some(idem.lifecycles_per_s),
                Some(base.lifecycles_per_s),
                None,
            ],
            0,
            Cmp::Ratio,
        );
    }
    report.row(
        c,
        "2. beside expiry: reserves overlapping an expiry step",
        [
            Some(beside.during_steps.0.len() as f64),
            Some(naive_beside.during_steps.0.len() as f64),
            None,
        ],
        0,
        Cmp::None,
    );
    for (q, name) in [(0.99, "p99"), (1.0, "max")] {
        report.row(
            c,
            format!("… their reserve {name}, µs ↓"),
            [
                us(&beside.during_steps, q),
                us(&naive_beside.during_steps, q),
                None,
            ],
            0,
            Cmp::Ratio,
        );
    }
    report.row(
        c,
        "2. beside expiry: steps done during the load (idemdb: partitions; naive: chunks)",
        [
            Some(beside.steps as f64),
            Some(naive_beside.steps as f64),
            None,
        ],
        0,
        Cmp::None,
    );
    report.row(
        c,
        "2. beside expiry: records expired during the load",
        [
            Some(beside.step_records as f64),
            Some(naive_beside.step_records as f64),
            None,
        ],
        0,
        Cmp::Ratio,
    );
    report.row(
        c,
        "2. beside expiry: step time median, ms (idemdb: compact_now; naive: one chunk)",
        [
            beside.step_times.q(0.5).map(ms),
            naive_beside.step_times.q(0.5).map(ms),
            None,
        ],
        1,
        Cmp::None,
    );
    report.row(
        c,
        "2. beside expiry: step time max, ms",
        [
            beside.step_times.q(1.0).map(ms),
            naive_beside.step_times.q(1.0).map(ms),
            None,
        ],
        1,
        Cmp::None,
    );
}

/// Step 3: criterion on `get` of a never-stored key and `reserve` of a completed one.
fn absence_cell(
    c: &mut Criterion,
    root: &Path,
    sizes: &Sizes,
    test_mode: bool,
    report: &mut Report,
) {
    let n = sizes.absent_records;
    let start = aligned_start();
    let mut stores = Vec::new();
    for &parts in &sizes.absent_partitions {
        let dir = tempfile::tempdir_in(root).expect("tempdir");
        let clock = ManualClock::new(start);
        let retention = Retention::default()
            .ttl(ABSENT_TTL)
            .partition_width(WIDTH)
            .compact_interval(None);
        let db = open_idemdb(&dir.path().join("absent.idemdb"), &clock, retention, true);
        println!("absence: filling {n} records into {parts} partitions…");
        let (took, _) = fill_idemdb(&db, &clock, start, parts, 0..n);
        let st = db.stats();
        assert_eq!((st.partitions, st.stored_records), (parts, n));
        println!(
            "  {:.1} s, {} indexed keys",
            took.as_secs_f64(),
            st.indexed_keys
        );
        stores.push((parts, db, st.indexed_keys, st.commits, dir));
    }
    let scope = Scope::new(OPERATION, PRINCIPAL);
    let mut g = c.benchmark_group("retention_absent");
    for (parts, db, ..) in &stores {
        let mut next = 1u64 << 50;
        g.bench_function(format!("get_absent_{parts}p"), |b| {
            b.iter(|| {
                next += 1;
                let found = db.get(&scope, &Key::new(key_bytes(next))).expect("get");
                assert!(found.is_none(), "a fresh key is absent");
            })
        });
    }
    g.finish();
    let mut g = c.benchmark_group("retention_replay");
    for (parts, db, ..) in &stores {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ parts);
        g.bench_function(format!("reserve_replay_{parts}p"), |b| {
            b.iter(|| {
                let id = rng.below(n);
                match db
                    .reserve(&scope, &Key::new(key_bytes(id)), PAYLOAD, LEASE)
                    .expect("reserve")
                {
                    ReserveOutcome::Completed(r) => std::hint::black_box(r.len()),
                    other => panic!("stored key {id} not replayed: {other:?}"),
                }
            })
        });
    }
    g.finish();
    // Cross-check, less exposed to the VM's drift between criterion's benchmarks: the stores
    // measured in turn, round after round (order rotated), and compared round by round.
    let (rounds, gets, replays) = if test_mode {
        (2, 100, 10)
    } else {
        (INTERLEAVED_ROUNDS, 100_000, 10_000)
    };
    let mut get_ns = vec![Vec::new(); stores.len()];
    let mut replay_ns = vec![Vec::new(); stores.len()];
    let mut next = 1u64 << 52;
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    for round in 0..rounds {
        for j in 0..stores.len() {
            let i = (round + j) % stores.len();
            let db = &stores[i].1;
            let t = Instant::now();
            for _ in 0..gets {
                next += 1;
                let found = db.get(&scope, &Key::new(key_bytes(next))).expect("get");
                assert!(found.is_none(), "a fresh key is absent");
            }
            get_ns[i].push(ns(t.elapsed()) as f64 / gets as f64);
            let t = Instant::now();
            for _ in 0..replays {
                let id = rng.below(n);
                match db
                    .reserve(&scope, &Key::new(key_bytes(id)), PAYLOAD, LEASE)
                    .expect("reserve")
                {
                    ReserveOutcome::Completed(r) => {
                        std::hint::black_box(r.len());
                    }
                    other => panic!("stored key {id} not replayed: {other:?}"),
                }
            }
            replay_ns[i].push(ns(t.elapsed()) as f64 / replays as f64);
        }
    }
    for (_, db, indexed, commits, _) in &stores {
        let st = db.stats();
        assert_eq!(
            st.commits, *commits,
            "absent gets and replays write nothing"
        );
        assert_eq!(st.indexed_keys, *indexed);
    }
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied()
    };
    let paired = |v: &[Vec<f64>], i: usize| {
        let ratios: Vec<f64> = v[i].iter().zip(&v[0]).map(|(a, b)| a / b).collect();
        median(&ratios)
    };

    let criterion = |group: &str, id: String| {
        if test_mode {
            None
        } else {
            criterion_median(group, &id)
        }
    };
    let cell = "absence";
    let single = stores[0].0;
    let base_get = criterion("retention_absent", format!("get_absent_{single}p"));
    let base_replay = criterion("retention_replay", format!("reserve_replay_{single}p"));
    for (i, (parts, _, indexed, ..)) in stores.iter().enumerate() {
        let get = criterion("retention_absent", format!("get_absent_{parts}p"));
        let replay = criterion("retention_replay", format!("reserve_replay_{parts}p"));
        report.row(
            cell,
            format!(
                "{parts} partitions ({n} records): get of an absent key, criterion median ns ↓"
            ),
            [get, None, None],
            0,
            Cmp::None,
        );
        report.row(
            cell,
            format!("… interleaved: median of {rounds} rounds × {gets} gets, ns ↓"),
            [median(&get_ns[i]), None, None],
            0,
            Cmp::None,
        );
        report.row(
            cell,
            format!(
                "{parts} partitions: reserve of a completed key (replay), criterion median ns ↓"
            ),
            [replay, None, None],
            0,
            Cmp::None,
        );
        report.row(
            cell,
            format!("… interleaved: median of {rounds} rounds × {replays} replays, ns ↓"),
            [median(&replay_ns[i]), None, None],
            0,
            Cmp::None,
        );
        report.idem(
            cell,
            format!("{parts} partitions: indexed_keys (≈16 B each)"),
            *indexed as f64,
            0,
        );
        if i > 0 {
            let ratio = get.zip(base_get).map(|(a, b)| a / b);
            let ratio_paired = paired(&get_ns, i);
            report.row(
                cell,
                format!("absent get, {parts} ÷ {single} partition: criterion medians"),
                [ratio, None, None],
                2,
                Cmp::None,
            );
            report.row(
                cell,
                format!("absent get, {parts} ÷ {single} partition: interleaved, median of per-round ratios"),
                [ratio_paired, None, None],
                2,
                Cmp::None,
            );
            report.row(
                cell,
                format!("replay, {parts} ÷ {single} partition: criterion medians"),
                [replay.zip(base_replay).map(|(a, b)| a / b), None, None],
                2,
                Cmp::None,
            );
            report.row(
                cell,
                format!(
                    "replay, {parts} ÷ {single} partition: interleaved, median of per-round ratios"
                ),
                [paired(&replay_ns, i), None, None],
                2,
                Cmp::None,
            );
            for (how, r) in [("criterion medians", ratio), ("interleaved", ratio_paired)] {
                report.targets.push((
                    format!("absence check with {parts} partitions ≤ 1.3× one partition ({how})"),
                    r.map_or("–".into(), |r| format!("{r:.2}×")),
                    r.filter(|_| !test_mode).map(|r| r <= 1.3),
                ));
            }
        }
    }
}

fn is_test_mode() -> bool {
    let args: Vec<String> = std::env::args().collect();
    let bench = args.iter().any(|a| a == "--bench");
    let test = args.iter().any(|a| a == "--test");
    !bench || test
}

fn main() {
    let test_mode = is_test_mode();
    let sizes = if test_mode { &TINY } else { &FULL };
    let mut c = Criterion::default()
        .sample_size(30)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2))
        .without_plots()
        .configure_from_args();
    let root = tempfile::Builder::new()
        .prefix("idemdb-retention-")
        .tempdir()
        .expect("tempdir");
    let started = Instant::now();
    let mut report = Report::default();

    let store = drop_cell(root.path(), sizes, &mut report);
    stall_cell(&store, sizes, &mut report);
    drop(store);
    absence_cell(&mut c, root.path(), sizes, test_mode, &mut report);

    c.final_summary();
    report.notes.push(format!(
        "whole run: {:.0} s",
        started.elapsed().as_secs_f64()
    ));
    let md = report.markdown(&machine());
    println!("\n{md}");
    if test_mode {
        println!("(test mode: tiny sizes, nothing written)");
        return;
    }
    let dir = target_dir().join("bench-results");
    std::fs::create_dir_all(&dir).expect("create target/bench-results");
    std::fs::write(dir.join("retention.md"), &md).expect("write retention.md");
    println!("written: {}", dir.join("retention.md").display());
}
