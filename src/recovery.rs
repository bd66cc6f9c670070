//! Recovery at open: the frames after the checkpoint are replayed into redb in one durable
//! transaction, which is the next checkpoint, unless the two files carry evidence that the
//! log lacks what the database relies on (scan.rs): then the open is refused and nothing is
//! changed, or, when the caller accepts the loss, every intact frame is kept, the token
//! ceiling is raised past every token the files could know of, and the loss is noted.
//!
//! A log the database does not record as its own (a new database, a format-4 file, a
//! cleanly closed database whose log was removed, cut or replaced, an accepted loss) is
//! replaced by a fresh one once what it holds is durable in redb. The order keeps a crash at
//! any step recoverable: the replay commit marks the old log as no longer needed (not in
//! use) before it is replaced, and the database records the new log only after its creation
//! is durable.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::path::{Path, PathBuf};

use redb::{Database, ReadableDatabase, StorageBackend, TableDefinition};

use crate::engine_tables::{
    CHECKPOINT_KEY, INFLIGHT, META, NEXT_TOKEN_KEY, RESERVED_PREFIX, is_outbox_table,
};
use crate::error::Error;
use crate::log_problem::LogProblem;
use crate::records::partition::PartitionName;
use crate::stats::LogLoss;
use crate::tables::TableRegistry;
use crate::wal::frame::{Cycle, Effect, EffectRef, Frame, HEADER_LEN, Header, decode_header};
use crate::wal::log::{Log, LogFile, create, log_io, sync_dir};
use crate::wal::scan::{Recorded, Seen, examine};
use crate::wal::state::{LogState, read_losses, read_state, record_loss};

/// Added to the token ceiling when a loss is accepted, above every token found in the two
/// files: tokens issued by a database file that was rolled back are not in it, and this many
/// more than any it shows is more than any run issues (at a million tokens a second, 12 days).
const LOSS_MARGIN: u64 = 1 << 40;

/// What recovery did at open.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Recovered {
    /// Frames replayed into redb.
    pub(crate) frames: u64,
    /// The loss this open accepted, if it accepted one.
    pub(crate) accepted: Option<LogProblem>,
    /// Losses accepted over the database's life (this one included), and the last.
    pub(crate) losses: u64,
    pub(crate) last_loss: Option<LogLoss>,
    /// The first token to issue: above every token issued before.
    pub(crate) next_token: u64,
    /// The token ceiling now durable, a block above `next_token`.
    pub(crate) token_ceiling: u64,
}

/// How the open was asked to treat the log.
pub(crate) struct Opening<'a> {
    pub(crate) database_id: u64,
    pub(crate) tables: &'a TableRegistry,
    /// Open even if the log lacks acknowledged outcomes ([`LogProblem::can_accept`]).
    pub(crate) accept_loss: bool,
    /// The database clock's time, for the loss note.
    pub(crate) now_ms: u64,
    /// The meta entry `format_version` to write with the log's record.
    pub(crate) format_version: u32,
    /// Tokens the ceiling is raised by, above where they resume.
    pub(crate) token_block: u64,
    /// A new log's size, and the unit logs grow by.
    pub(crate) log_step: u64,
}

/// Opens the log of the open database `db`, replays what redb lacks, and records the log as
/// in use. Refuses (changing nothing) a log that proves acknowledged outcomes missing.
pub(crate) fn open_log(
    db: &Database,
    file: LogFile,
    how: &Opening<'_>,
) -> Result<(Log, Recovered), Error> {
    let path = file.path().map(Path::to_path_buf);
    let recorded = read_recorded(db)?;
    let (file, seen) = read_log(file, path.as_deref(), how.database_id, &recorded)?;
    let accepted = match examine(&seen, how.database_id, &recorded.log) {
        None => None,
        Some(problem) if how.accept_loss && problem.can_accept() => Some(problem),
        Some(problem) => return Err(Error::LogRefused { log: path, problem }),
    };
    let plan = Plan::new(&seen, &recorded, accepted.is_some(), how);
    let recovered = plan.recovered(&recorded, accepted, how);
    let (file, record, replay) = match (file, plan.kept(&seen, &recorded)) {
        (Some(file), Some(kept)) => (file, kept, plan.frames),
        (file, _) => {
            let state = recorded.log.state;
            let (file, record) =
                replace_log(db, file, path.as_deref(), state, &plan, &recovered, how)?;
            (file, record, Vec::new())
        }
    };
    // Every open ends with a durable commit that records the log (a new one only once it is
    // durable: the database never names a log that a crash could take back), and raises the
    // token ceiling a block above where tokens resume, so that the first batches need no
    // durable commit of their own.
    commit(db, &replay, plan.checkpoint, how, |meta| {
        record.0.write(meta)?;
        write_ceiling(meta, plan.token_ceiling)
    })?;
    // The cycle sector says `checkpoint` before any frame follows it.
    let log = Log::opened(
        file,
        path,
        how.database_id,
        record,
        plan.checkpoint,
        how.log_step,
    )?;
    Ok((log, recovered))
}

/// The log's file, if there is one, and what it holds.
fn read_log(
    file: LogFile,
    path: Option<&Path>,
    database_id: u64,
    recorded: &Known,
) -> Result<(Option<Box<dyn StorageBackend>>, Seen), Error> {
    Ok(match file {
        LogFile::Open { file, .. } => {
            let bytes = read_all(&*file).map_err(|e| log_io(path, "read", e))?;
            let seen = Seen::read_above(
                Some(&bytes),
                database_id,
                recorded.log.state.map(|s| s.id),
                recorded.log.checkpoint,
                &token_bound_of,
            );
            (Some(file), seen)
        }
        LogFile::Absent { .. } => (
            None,
            Seen::read_above(None, database_id, None, 0, &token_bound_of),
        ),
    })
}

/// The record of the log the open keeps or creates, and the checkpoint its cycle sector says
/// (if it says one).
type LogRecord = (LogState, Option<u64>);

/// What recovery replays, where the log's sequence numbers resume, and where tokens do.
struct Plan<'s> {
    /// The frames to replay into redb: the run above the checkpoint, or with an accepted loss
    /// every intact frame above it.
    frames: Vec<&'s Frame>,
    /// The checkpoint the open's commit records.
    checkpoint: u64,
    /// The log stays (it is the one the file records, at its length, and nothing was lost).
    keep: bool,
    /// The first token to issue, and the ceiling the open makes durable a block above it.
    next_token: u64,
    token_ceiling: u64,
}

impl<'s> Plan<'s> {
    fn new(seen: &'s Seen, recorded: &Known, loss: bool, how: &Opening<'_>) -> Plan<'s> {
        let c = recorded.log.checkpoint;
        let frames = if loss {
            seen.every_frame_above(c)
        } else {
            seen.run_above(c)
        };
        let checkpoint = if loss {
            // Sequence numbers go on above every frame either file has seen.
            c.max(seen.newest_seq())
        } else {
            frames.last().map_or(c, |f| f.seq)
        };
        let keep = !loss
            && recorded.log.state.is_some_and(|s| {
                seen.header
                    == Header::Of {
                        database_id: how.database_id,
                        log_id: Some(s.id),
                    }
                    && seen.len >= s.len
            });
        // Tokens resume above the ceiling and above every token the log's intact frames show
        // (a database file restored from a copy has an older ceiling; a format-4 log may have
        // raised it); accepting a loss adds a margin for what the two files do not show.
        let shown = token_bound(seen).max(recorded.ceiling);
        let next_token = if loss {
            shown.saturating_add(LOSS_MARGIN)
        } else {
            shown
        };
        Plan {
            frames,
            checkpoint,
            keep,
            next_token,
            token_ceiling: next_token.saturating_add(how.token_block),
        }
    }

    /// What recovery tells the handle, with the loss it accepted noted.
    fn recovered(
        &self,
        recorded: &Known,
        accepted: Option<LogProblem>,
        how: &Opening<'_>,
    ) -> Recovered {
        let mut recovered = Recovered {
            frames: self.frames.len() as u64,
            accepted,
            losses: recorded.losses,
            last_loss: recorded.last_loss.clone(),
            next_token: self.next_token,
            token_ceiling: self.token_ceiling,
        };
        if let Some(problem) = &recovered.accepted {
            recovered.losses += 1;
            recovered.last_loss = Some(LogLoss {
                at_ms: how.now_ms,
                what: format!("the write-ahead log {problem}"),
            });
        }
        recovered
    }

    /// The record of a log that stays, and its cycle sector's checkpoint if the sector said
    /// one; `None` when the log is replaced.
    fn kept(&self, seen: &Seen, recorded: &Known) -> Option<LogRecord> {
        let state = recorded.log.state.filter(|_| self.keep)?;
        let record = LogState {
            len: seen.len,
            in_use: true,
            ..state
        };
        let cycle = match seen.cycle {
            Some(Cycle::After(h)) => Some(h),
            _ => None,
        };
        Some((record, cycle))
    }
}

/// Replaces the log: first everything it holds that the file lacks becomes durable in redb,
/// and the database stops relying on it (a crash after this commit opens cleanly); then a
/// fresh log is created in its place. `state` is the record of the log replaced, if the file
/// has one. Returns the file and the new log's record.
fn replace_log(
    db: &Database,
    file: Option<Box<dyn StorageBackend>>,
    path: Option<&Path>,
    state: Option<LogState>,
    plan: &Plan<'_>,
    recovered: &Recovered,
    how: &Opening<'_>,
) -> Result<(Box<dyn StorageBackend>, LogRecord), Error> {
    let accepted = recovered.accepted.is_some();
    if !plan.frames.is_empty() || accepted || state.is_some_and(|s| s.in_use) {
        commit(db, &plan.frames, plan.checkpoint, how, |meta| {
            if let Some(s) = state {
                LogState { in_use: false, ..s }.write(meta)?;
            }
            if let (Some(loss), true) = (&recovered.last_loss, accepted) {
                write_ceiling(meta, plan.token_ceiling)?;
                record_loss(meta, loss.at_ms, &loss.what)?;
            }
            Ok(())
        })?;
    }
    let file = match file {
        Some(file) => file,
        None => create_file(path)?,
    };
    let id = random_id()?;
    let len = create(&*file, (how.database_id, id), plan.checkpoint, how.log_step)
        .map_err(|e| log_io(path, "create", e))?;
    let record = LogState {
        id,
        len,
        since: plan.checkpoint,
        in_use: true,
    };
    Ok((file, (record, Some(plan.checkpoint))))
}

/// The token ceiling in meta.
fn write_ceiling(meta: &mut MetaTable<'_>, ceiling: u64) -> Result<(), Error> {
    meta.insert(NEXT_TOKEN_KEY, &ceiling.to_le_bytes()[..])?;
    Ok(())
}

/// Creates the log file at `path` (it did not exist), and makes its name durable.
fn create_file(path: Option<&Path>) -> Result<Box<dyn StorageBackend>, Error> {
    let Some(path) = path else {
        return Err(Error::Internal("an absent log without a path".into()));
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|e| log_io(Some(path), "create", e))?;
    sync_dir(path).map_err(|e| log_io(Some(path), "sync the directory of", e))?;
    Ok(Box::new(redb::backends::FileBackend::new(file)?))
}

fn random_id() -> Result<u64, Error> {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).map_err(|e| Error::Entropy(e.to_string()))?;
    Ok(u64::from_le_bytes(bytes))
}

fn read_all(file: &dyn StorageBackend) -> std::io::Result<Vec<u8>> {
    let len = file.len()?;
    let len = usize::try_from(len)
        .map_err(|_| std::io::Error::other("the log is larger than this platform can address"))?;
    let mut bytes = vec![0u8; len];
    file.read(0, &mut bytes)?;
    Ok(bytes)
}

/// What the database file says of its log, token ceiling and accepted losses.
struct Known {
    log: Recorded,
    ceiling: u64,
    losses: u64,
    last_loss: Option<LogLoss>,
}

type ReadMeta = redb::ReadOnlyTable<&'static str, &'static [u8]>;

fn read_recorded(db: &Database) -> Result<Known, Error> {
    let txn = db.begin_read()?;
    let meta = txn.open_table(META)?;
    let (losses, last_loss) = read_losses(&meta)?;
    Ok(Known {
        log: read_log_record(&meta)?,
        ceiling: u64_entry(&meta, NEXT_TOKEN_KEY)?.unwrap_or(1),
        losses,
        last_loss,
    })
}

/// The checkpoint and the log's record, from the meta table.
pub(crate) fn read_log_record(meta: &ReadMeta) -> Result<Recorded, Error> {
    Ok(Recorded {
        checkpoint: u64_entry(meta, CHECKPOINT_KEY)?.unwrap_or(0),
        state: read_state(meta)?,
    })
}

fn u64_entry(meta: &ReadMeta, key: &str) -> Result<Option<u64>, Error> {
    meta.get(key)?
        .map(|v| {
            v.value()
                .try_into()
                .map(u64::from_le_bytes)
                .map_err(|_| Error::Corrupted(format!("the meta entry {key:?} is not 8 bytes")))
        })
        .transpose()
}

/// Above every token the log's intact frames show: in records they store, or ceilings they
/// set (format 4).
fn token_bound(seen: &Seen) -> u64 {
    seen.all_frames().map(|f| f.token_bound).max().unwrap_or(0)
}

/// Above the token `effect` shows, if it stores a record (of any version: an older build's
/// frames hold older ones) or sets a ceiling.
fn token_bound_of(effect: &EffectRef<'_>) -> u64 {
    match effect {
        EffectRef::Put { table, value, .. } if is_record_table(table) => {
            idemdb_core::record::token_in(value).map_or(0, |t| t.saturating_add(1))
        }
        EffectRef::Ceiling(c) => *c,
        _ => 0,
    }
}

/// Whether `name` may be a table of records: the in-flight table or any name with the
/// partition prefix. A superset is safe (a bound taken from more values only raises the token
/// ceiling) and checking the prefix spares a parse per effect of a whole log.
fn is_record_table(name: &str) -> bool {
    name == redb::TableHandle::name(&INFLIGHT) || PartitionName::is_partition_table(name)
}

type MetaTable<'t> = redb::Table<'t, &'static str, &'static [u8]>;

/// Applies `frames` and records `checkpoint` (with `extra` meta writes and the current format
/// version), in one durable transaction: a crash during recovery leaves redb as it was, and
/// the log untouched.
fn commit(
    db: &Database,
    frames: &[&Frame],
    checkpoint: u64,
    how: &Opening<'_>,
    extra: impl FnOnce(&mut MetaTable<'_>) -> Result<(), Error>,
) -> Result<(), Error> {
    let txn = db.begin_write()?;
    {
        let mut meta = txn.open_table(META)?;
        // Opening a table costs several µs: once per table, not per effect.
        let mut open_tables = HashMap::new();
        for effect in frames.iter().flat_map(|f| &f.effects) {
            match effect {
                // Caller tables cannot have idemdb's prefix (Tx refuses it); the outbox's
                // tables are registered as caller tables are (db.rs).
                Effect::Put { table, key, value } if replayed_as_registered(table) => {
                    how.tables.replay(&txn, table, key, Some(value))?;
                }
                Effect::Remove { table, key } if replayed_as_registered(table) => {
                    how.tables.replay(&txn, table, key, None)?;
                }
                Effect::Put { table, key, value } => {
                    open(&txn, &mut open_tables, table)?.insert(&key[..], &value[..])?;
                }
                Effect::Remove { table, key } => {
                    open(&txn, &mut open_tables, table)?.remove(&key[..])?;
                }
                Effect::Ceiling(c) => {
                    meta.insert(NEXT_TOKEN_KEY, &c.to_le_bytes()[..])?;
                }
            }
        }
        meta.insert(CHECKPOINT_KEY, &checkpoint.to_le_bytes()[..])?;
        crate::engine_tables::write_format_version(&mut meta, how.format_version)?;
        extra(&mut meta)?;
    }
    txn.commit()?;
    Ok(())
}

/// A caller table's writes, or the outbox's: replayed through the table registry, typed.
fn replayed_as_registered(name: &str) -> bool {
    !name.starts_with(RESERVED_PREFIX) || is_outbox_table(name)
}

type RecordTable<'t> = redb::Table<'t, &'static [u8], &'static [u8]>;

fn open<'a, 't>(
    txn: &'t redb::WriteTransaction,
    tables: &'a mut HashMap<String, RecordTable<'t>>,
    name: &str,
) -> Result<&'a mut RecordTable<'t>, Error> {
    Ok(match tables.entry(name.to_string()) {
        Entry::Occupied(e) => e.into_mut(),
        Entry::Vacant(e) => e.insert(txn.open_table(record_table(name)?)?),
    })
}

/// A record table named in a frame: the in-flight table or a partition, never another.
fn record_table(name: &str) -> Result<TableDefinition<'_, &'static [u8], &'static [u8]>, Error> {
    if is_record_table(name) {
        Ok(TableDefinition::new(name))
    } else {
        Err(Error::Corrupted(format!(
            "a checksummed log frame names the table {name:?}, which is not a record table"
        )))
    }
}

/// Refuses to create a database whose file is missing or empty while its log has a valid
/// header: the log alone holds only what followed the last checkpoint, so starting afresh
/// would silently drop every record.
pub(crate) fn check_not_orphaned(
    db_len: u64,
    log: &dyn StorageBackend,
    path: Option<&Path>,
) -> Result<(), Error> {
    if db_len > 0 {
        return Ok(());
    }
    let len = log.len().map_err(|e| log_io(path, "read", e))?;
    if len < HEADER_LEN {
        return Ok(());
    }
    let mut head = vec![0u8; HEADER_LEN as usize];
    log.read(0, &mut head)
        .map_err(|e| log_io(path, "read", e))?;
    match decode_header(&head) {
        Header::Invalid => Ok(()),
        Header::Of { database_id, .. } => Err(Error::LogRefused {
            log: path.map(PathBuf::from),
            problem: LogProblem::DatabaseMissing {
                database: database_id,
            },
        }),
    }
}
