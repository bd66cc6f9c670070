//! Hooks into the engine's internals (feature `test-hooks`), for `idemdb-testkit`'s crash
//! workloads, idemdb's own tests and the fuzz targets. Not part of the API: hidden from the
//! docs, no semver promise, never turned on by a shipped crate.

mod decoders;

pub use decoders::{DECODERS, decode_any, decode_seeds};

use redb::{ReadTransaction, TableDefinition};

/// The table of IN_PROGRESS records (docs/design.md §5.1), for checks of a database's contents.
pub const INFLIGHT: TableDefinition<'static, &[u8], &[u8]> = crate::engine_tables::INFLIGHT;

/// The horizon rows of dropped partitions (docs/design.md §5.4).
pub const HORIZON: TableDefinition<'static, &[u8], &[u8]> = crate::records::horizon::HORIZON;

/// The names of the partition tables `read` holds, oldest first.
/// Decodes a record as stored under `key` in the engine's tables (docs/design.md §3).
pub fn decode_record(
    key: &[u8],
    bytes: &[u8],
) -> Result<crate::record::Record, crate::error::Error> {
    crate::record::decode(key, bytes)
}

/// The partition tables of a read transaction.
pub fn partition_tables(read: &ReadTransaction) -> Result<Vec<String>, crate::error::Error> {
    crate::records::partition::partition_tables(read)
}

/// Reserves every key of `keys` as one group of calls queued together (`call_many`): the batch
/// that as many callers arriving at once make, in one group commit where they fit.
pub fn reserve_many(
    db: &crate::db::IdemDb,
    scope: &idemdb_core::scope::Scope,
    keys: &[idemdb_core::scope::Key],
    payload: &[u8],
    lease: std::time::Duration,
) -> Vec<Result<idemdb_core::outcome::ReserveOutcome, crate::error::Error>> {
    let calls = keys
        .iter()
        .map(|key| db.prepare_reserve(scope, key, payload.into(), lease))
        .collect();
    db.call_many(calls)
}

/// An owner call for [`finish_many`].
#[derive(Debug)]
pub enum Finish {
    /// `complete` with this response.
    Complete(Vec<u8>),
    /// `fail` with this response.
    Fail(Vec<u8>),
    /// `release`.
    Release,
}

/// Runs the owner calls as one group queued together, like [`reserve_many`].
pub fn finish_many(
    db: &crate::db::IdemDb,
    calls: Vec<(&idemdb_core::token::Reservation, Finish)>,
) -> Vec<Result<(), crate::error::Error>> {
    use crate::record::RecordState;
    let calls = calls
        .into_iter()
        .map(|(res, finish)| match finish {
            Finish::Complete(body) => db.prepare_finish(res, RecordState::Completed, body),
            Finish::Fail(body) => db.prepare_finish(res, RecordState::Failed, body),
            Finish::Release => db.prepare_release(res),
        })
        .collect();
    db.call_many(calls)
}

/// Operations queued for the writer and not yet taken into a batch: lets a test line up a
/// batch without sleeping.
pub fn queued_ops(db: &crate::db::IdemDb) -> usize {
    db.writer.queued()
}

/// Whether a batch is being led (by a caller or the committer thread): an op queued now is
/// taken by that leader rather than led by its own caller.
pub fn batch_being_led(db: &crate::db::IdemDb) -> bool {
    db.writer.leading()
}

/// The partitions a lookup of `key` in `scope` reads (docs/design.md §8.3): how many the key
/// index names for it that are still in the catalog, and how many filtered partitions' filters
/// admit it (those that hold it, and about 1 in 256 of the others).
pub fn partitions_probed(
    db: &crate::db::IdemDb,
    scope: &idemdb_core::scope::Scope,
    key: &idemdb_core::scope::Key,
) -> Result<(usize, usize), crate::error::Error> {
    let key = idemdb_core::scope::RecordKey::encode(scope, key, db.limits())?;
    let layout = &db.engine.layout;
    let catalog = layout.partitions.catalog();
    let hash = layout.index.hash(key.as_bytes());
    let (mut named, mut admitted) = (0, 0);
    crate::records::locate::holders(&catalog, &layout.index, hash, |part| {
        match part.filter() {
            Some(f) if f.may_contain(hash) => admitted += 1,
            _ => named += 1,
        }
        Ok(std::ops::ControlFlow::Continue(()))
    })?;
    Ok((named, admitted))
}

/// How many finished records the replay cache holds (docs/design.md §6).
pub fn cached_replays(db: &crate::db::IdemDb) -> usize {
    db.engine.replays.len()
}

/// Makes every refresh of the shared read snapshot fail from now on (and drops the current
/// one): readers then open a read transaction of their own, which shows commits that are not
/// durable yet, so only the durability tracker stands between them and such state.
pub fn fail_snapshot_refresh(db: &crate::db::IdemDb) {
    let snapshots = &db.engine.snapshots;
    snapshots
        .fail_refresh
        .store(true, std::sync::atomic::Ordering::SeqCst);
    snapshots.refresh();
}

/// Runs `hook` once, at the start of the next refresh of the shared read snapshot, on the
/// thread that refreshes it (after a pass's or a checkpoint's commit, before its entries leave
/// the overlay): a test can read the database at that moment.
pub fn before_next_refresh(db: &crate::db::IdemDb, hook: impl FnOnce() + Send + 'static) {
    *db.engine.snapshots.before_refresh.lock() = Some(Box::new(hook));
}

/// Runs `hook` once, on the compacting thread, after the next wide partition was built and
/// before the switch to it (docs/design.md §8.8): no lock of the writer is held, so `hook`
/// may write (through a handle it owns).
pub fn before_next_widening_switch(db: &crate::db::IdemDb, hook: impl FnOnce() + Send + 'static) {
    *db.engine.before_widening_switch.lock() = Some(Box::new(hook));
}

/// Runs `hook` once, on the compacting thread, between the first two steps that enter a
/// dropped row's keys in the table of recognised keys (docs/design.md §8.4): no lock of the
/// writer is held, so `hook` may reserve (through a handle it owns).
pub fn between_next_recognition_steps(
    db: &crate::db::IdemDb,
    hook: impl FnOnce() + Send + 'static,
) {
    *db.engine.between_recognition_steps.lock() = Some(Box::new(hook));
}

/// Runs `hook` once, on the writer's leader thread, when the next batch that changes a record
/// reaches its durability point: applied, its transactions committed, its frame not yet
/// written (it waits for `hook` to return).
pub fn after_next_commit(db: &crate::db::IdemDb, hook: impl FnOnce() + Send + 'static) {
    *db.engine.durability.after_commit.lock() = Some(Box::new(hook));
}

/// What a log's bytes say, read from them alone (docs/design.md §5.6): for tests that alter a
/// log and must know whether the change is one an open can detect.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogLayout {
    /// The checkpoint its cycle sector holds (`None`: no valid cycle sector).
    pub cycle: Option<u64>,
    /// The run at the start of its frames: (offset, length in bytes, sequence number).
    pub run: Vec<(u64, u64, u64)>,
}

impl LogLayout {
    /// Reads `log`, a whole log file.
    pub fn read(log: &[u8]) -> LogLayout {
        let (cycle, run) = crate::wal::scan::layout(log);
        LogLayout { cycle, run }
    }

    /// The newest frame of the run.
    pub fn last(&self) -> Option<u64> {
        self.run.last().map(|(_, _, seq)| *seq)
    }
}

/// What a database file's durable image records of its log: the checkpoint (the last frame it
/// holds), and whether it was in use (not closed cleanly). Read with redb alone.
pub fn recorded_log(database: &[u8]) -> Result<(u64, bool), String> {
    use redb::{ReadableDatabase, StorageBackend};
    let backend = redb::backends::InMemoryBackend::new();
    backend
        .set_len(database.len() as u64)
        .and_then(|()| backend.write(0, database))
        .map_err(|e| e.to_string())?;
    let raw = redb::Builder::new()
        .create_with_backend(backend)
        .map_err(|e| e.to_string())?;
    let read = raw.begin_read().map_err(|e| e.to_string())?;
    let meta = read
        .open_table(crate::engine_tables::META)
        .map_err(|e| e.to_string())?;
    let recorded = crate::recovery::read_log_record(&meta).map_err(|e| e.to_string())?;
    Ok((
        recorded.checkpoint,
        recorded.state.is_some_and(|s| s.in_use),
    ))
}

/// What asking the wide partitions' filters costs a lookup (docs/benchmarks.md §6): builds
/// `filters` filters of `keys` distinct random hashes each, then times `lookups` lookups of
/// hashes none of them holds, each asking every filter. Returns the mean ns per lookup and the
/// share of (lookup, filter) pairs answered with a false "maybe".
pub fn filter_lookup_cost(filters: usize, keys: u64, lookups: u64) -> (f64, f64) {
    use crate::records::filter::KeyFilter;
    // SplitMix64: distinct outputs for distinct inputs.
    let hash = |n: u64| {
        let mut z = n.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let built: Vec<KeyFilter> = (0..filters as u64)
        .filter_map(|f| {
            let mut hashes: Vec<u64> = (0..keys).map(|i| hash((f << 40) | i)).collect();
            hashes.sort_unstable();
            KeyFilter::build(&hashes)
        })
        .collect();
    let started = std::time::Instant::now();
    let mut maybe = 0u64;
    for i in 0..lookups {
        let h = hash((1 << 62) | i);
        maybe += built.iter().filter(|f| f.may_contain(h)).count() as u64;
    }
    let ns = started.elapsed().as_nanos() as f64 / lookups.max(1) as f64;
    let pairs = (lookups.max(1) * built.len().max(1) as u64) as f64;
    (ns, maybe as f64 / pairs)
}

/// What the table of recognised keys costs at size (docs/benchmarks.md §6), measured on a
/// redb file of its own under the engine's default page cache.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RecognitionCost {
    /// File bytes per key held, after the table was filled.
    pub file_bytes_per_key: f64,
    /// Entering the dropped keys, in durable steps as a pass does: ms in all, and the
    /// longest step (how long one step holds the writer).
    pub enter_ms: f64,
    pub longest_step_ms: f64,
    /// Removing them again as a retiring pass does, in steps: ms in all.
    pub retire_ms: f64,
    /// Mean ns of a lookup of a hash the table does not hold (a fresh acquisition's cost)
    /// and of one it holds.
    pub absent_ns: f64,
    pub present_ns: f64,
}

/// One step's work on the table of recognised keys.
type StepFn<'a> =
    dyn FnMut(&mut redb::Table<'_, u64, u64>, &[u64]) -> Result<(), crate::error::Error> + 'a;

/// Fills the table of recognised keys in a new redb file at `path` with `held` random
/// hashes, then enters `dropped` more (sorted, as a drop's) in the pass's steps, times
/// `lookups` lookups of absent and of held hashes through read transactions, and retires the
/// dropped ones again. Uses the engine's own functions for each.
pub fn recognition_cost(
    path: &std::path::Path,
    held: u64,
    dropped: u64,
    lookups: u64,
) -> Result<RecognitionCost, crate::error::Error> {
    use crate::records::recognised::{INDEX_STEP, RECOGNISED_KEYS, index, unindex, until_of};
    use redb::ReadableDatabase;
    use std::time::Instant;
    let hash = |n: u64| {
        let mut z = n.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let db = redb::Builder::new()
        .set_cache_size(crate::config::PAGE_CACHE_BYTES)
        .create(path)?;
    // Filled in hash order, a million a commit (drops fill it in any order, leaving its
    // pages less full: the file figure is a floor).
    let until = u64::MAX;
    let mut all: Vec<u64> = (0..held).map(hash).collect();
    all.sort_unstable();
    for chunk in all.chunks(1 << 20) {
        let txn = db.begin_write()?;
        index(&mut txn.open_table(RECOGNISED_KEYS)?, chunk, until)?;
        txn.commit()?;
    }
    drop(all);
    let file_bytes_per_key =
        std::fs::metadata(path).map_or(f64::NAN, |m| m.len() as f64) / held.max(1) as f64;
    let mut new: Vec<u64> = (0..dropped).map(|i| hash((1 << 62) | i)).collect();
    new.sort_unstable();
    let steps = |f: &mut StepFn<'_>| -> Result<(f64, f64), crate::error::Error> {
        let began = Instant::now();
        let mut longest = 0f64;
        for step in new.chunks(INDEX_STEP) {
            let t = Instant::now();
            let txn = db.begin_write()?;
            f(&mut txn.open_table(RECOGNISED_KEYS)?, step)?;
            txn.commit()?;
            longest = longest.max(t.elapsed().as_secs_f64() * 1e3);
        }
        Ok((began.elapsed().as_secs_f64() * 1e3, longest))
    };
    let (enter_ms, longest_step_ms) = steps(&mut |t, step| index(t, step, until))?;
    let read = db.begin_read()?;
    let table = read.open_table(RECOGNISED_KEYS)?;
    let time = |of: &dyn Fn(u64) -> u64| -> Result<f64, crate::error::Error> {
        let began = Instant::now();
        let mut found = 0u64;
        for i in 0..lookups {
            found += u64::from(until_of(&table, of(i))?.is_some());
        }
        std::hint::black_box(found);
        Ok(began.elapsed().as_nanos() as f64 / lookups.max(1) as f64)
    };
    let absent_ns = time(&|i| hash((3 << 61) | i))?;
    let present_ns = time(&|i| hash(i.wrapping_mul(7_919) % held.max(1)))?;
    drop(table);
    drop(read);
    let (retire_ms, _) = steps(&mut |t, step| unindex(t, step, until).map(drop))?;
    Ok(RecognitionCost {
        file_bytes_per_key,
        enter_ms,
        longest_step_ms,
        retire_ms,
        absent_ns,
        present_ns,
    })
}
