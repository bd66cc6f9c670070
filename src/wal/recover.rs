//! Recovery at open: the frames after the checkpoint are replayed into redb in one durable
//! transaction, which is the next checkpoint.
//!
//! redb comes back at its last durable commit, which recorded the checkpoint `c`. The log
//! holds, from its start, a run of frames with consecutive sequence numbers; the ones above
//! `c` are replayed, and the run must then start at `c + 1`. The run ends at the first frame
//! that is torn, zeroed, damaged, or older than its predecessor (one left from before a
//! recycle). A torn tail is the normal result of a crash mid-append, never an error; but a
//! valid frame newer than the run anywhere past its end means a frame that was once durable
//! is damaged: the database is `Corrupted`, and nothing is replayed.

use std::collections::HashMap;
use std::collections::hash_map::Entry;

use redb::{Database, ReadableDatabase, StorageBackend, TableDefinition};

use super::frame::{Effect, Frame, HEADER_LEN, Header, decode_frame, decode_header, encode_header};
use super::{Log, LogGauges, create};
use crate::error::Error;
use crate::meta::{CHECKPOINT_KEY, INFLIGHT, META, NEXT_TOKEN_KEY, RESERVED_PREFIX};
use crate::retention::partition::PartitionName;
use crate::tables::TableRegistry;

/// What recovery did at open.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Recovered {
    /// Frames replayed into redb.
    pub(crate) frames: u64,
}

/// Opens the log of the open database `db` (whose identity is `database_id`), creating it if
/// missing, and replays what redb lacks.
pub(crate) fn open_log(
    db: &Database,
    file: Box<dyn StorageBackend>,
    database_id: u64,
    tables: &TableRegistry,
) -> Result<(Log, Recovered), Error> {
    let checkpoint = read_checkpoint(db)?;
    let len = file.len().map_err(io)?;
    let mut log = Log {
        file,
        database_id,
        end: HEADER_LEN,
        len,
        last_seq: checkpoint,
        gauges: LogGauges::default(),
    };
    if len < HEADER_LEN {
        log.len = create(&*log.file, database_id).map_err(io)?;
        log.gauges.set(log.len, 0);
        return Ok((log, Recovered::default()));
    }
    log.gauges.set(len, 0);
    let mut bytes = vec![0u8; usize::try_from(len).map_err(|_| too_big())?];
    log.file.read(0, &mut bytes).map_err(io)?;
    let header = decode_header(&bytes);
    if let Header::Of(other) = header
        && other != database_id
    {
        return Err(Error::Corrupted(format!(
            "the log belongs to another database (identity {other:016x}, this one is \
             {database_id:016x}): it was copied or renamed beside the wrong file"
        )));
    }
    let frames = scan(&bytes, database_id, checkpoint)?;
    let recovered = Recovered {
        frames: frames.len() as u64,
    };
    if let Some(last) = frames.last().map(|f| f.seq) {
        replay(db, &frames, last, tables)?;
        log.last_seq = last;
    }
    if header == Header::Invalid {
        // Never written whole (a crash while the log was created), or damaged: every frame
        // it held is in redb now.
        log.file
            .write(0, &encode_header(database_id))
            .and_then(|()| log.file.sync_data())
            .map_err(io)?;
    }
    Ok((log, recovered))
}

/// The frames above `checkpoint`, in order; `Corrupted` if the log proves one is missing.
fn scan(bytes: &[u8], database_id: u64, checkpoint: u64) -> Result<Vec<Frame>, Error> {
    let mut at = HEADER_LEN as usize;
    let mut run: Vec<Frame> = Vec::new();
    let mut last: Option<u64> = None;
    while let Some(frame) = bytes.get(at..).and_then(|b| decode_frame(b, database_id)) {
        if last.is_some_and(|l| frame.seq != l + 1) {
            break;
        }
        last = Some(frame.seq);
        at += frame.len as usize;
        if frame.seq > checkpoint {
            run.push(frame);
        }
    }
    let newest = last.unwrap_or(0).max(checkpoint);
    if let Some(first) = run.first()
        && first.seq != checkpoint + 1
    {
        return Err(Error::Corrupted(format!(
            "the log's frames resume at {} but the database was checkpointed at {checkpoint}: \
             frames in between are lost",
            first.seq
        )));
    }
    // Past the end of the run, only frames older than it may be valid: those left from
    // before the log was last recycled.
    let mut probe = at;
    while probe < bytes.len() {
        if let Some(f) = decode_frame(&bytes[probe..], database_id)
            && f.seq > newest
        {
            return Err(Error::Corrupted(format!(
                "the log's frame at offset {at} is damaged but frame {} at offset {probe} \
                 is intact: a durable frame was lost",
                f.seq
            )));
        }
        probe += super::frame::ALIGN as usize;
    }
    Ok(run)
}

/// Applies `frames` and records `last` as the checkpoint, in one durable transaction: a crash
/// during recovery leaves redb as it was, and the log untouched.
fn replay(db: &Database, frames: &[Frame], last: u64, tables: &TableRegistry) -> Result<(), Error> {
    let txn = db.begin_write()?;
    {
        let mut meta = txn.open_table(META)?;
        // Opening a table costs several µs: once per table, not per effect.
        let mut open_tables = HashMap::new();
        for effect in frames.iter().flat_map(|f| &f.effects) {
            match effect {
                // Caller tables cannot have idemdb's prefix (Tx refuses it).
                Effect::Put { table, key, value } if !table.starts_with(RESERVED_PREFIX) => {
                    tables.replay(&txn, table, key, Some(value))?;
                }
                Effect::Remove { table, key } if !table.starts_with(RESERVED_PREFIX) => {
                    tables.replay(&txn, table, key, None)?;
                }
                Effect::Put { table, key, value } => {
                    open(&txn, &mut open_tables, table)?
                        .insert(key.as_slice(), value.as_slice())?;
                }
                Effect::Remove { table, key } => {
                    open(&txn, &mut open_tables, table)?.remove(key.as_slice())?;
                }
                Effect::Ceiling(c) => {
                    meta.insert(NEXT_TOKEN_KEY, &c.to_le_bytes()[..])?;
                }
            }
        }
        meta.insert(CHECKPOINT_KEY, &last.to_le_bytes()[..])?;
    }
    txn.commit()?;
    Ok(())
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
    if name == redb::TableHandle::name(&INFLIGHT) || PartitionName::parse(name).is_some() {
        Ok(TableDefinition::new(name))
    } else {
        Err(Error::Corrupted(format!(
            "a checksummed log frame names the table {name:?}, which is not a record table"
        )))
    }
}

/// The checkpoint recorded in meta: 0 before the first.
pub(crate) fn read_checkpoint(db: &Database) -> Result<u64, Error> {
    let txn = db.begin_read()?;
    let meta = txn.open_table(META)?;
    Ok(match meta.get(CHECKPOINT_KEY)? {
        Some(v) => {
            let b: [u8; 8] = v
                .value()
                .try_into()
                .map_err(|_| Error::Corrupted("the log checkpoint is not 8 bytes".into()))?;
            u64::from_le_bytes(b)
        }
        None => 0,
    })
}

/// Refuses to create a database whose file is missing or empty while its log has a valid
/// header: the log alone holds only what followed the last checkpoint, so starting afresh
/// would silently drop every record.
pub(crate) fn check_not_orphaned(db_len: u64, log: &dyn StorageBackend) -> Result<(), Error> {
    if db_len > 0 {
        return Ok(());
    }
    let len = log.len().map_err(io)?;
    if len < HEADER_LEN {
        return Ok(());
    }
    let mut head = vec![0u8; HEADER_LEN as usize];
    log.read(0, &mut head).map_err(io)?;
    match decode_header(&head) {
        Header::Invalid => Ok(()),
        Header::Of(id) => Err(Error::Corrupted(format!(
            "the database file is missing or empty but its log (of database {id:016x}) is \
             there: restore the file, or delete the log to start an empty database"
        ))),
    }
}

use super::io_error as io;

fn too_big() -> Error {
    Error::Corrupted("the log is larger than this platform can address".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wal::frame::encode_frame;

    fn effect(n: u8) -> Vec<Effect> {
        vec![Effect::Put {
            table: "idemdb_inflight".into(),
            key: vec![n],
            value: vec![n; 700],
        }]
    }

    fn log_of(seqs: &[u64]) -> Vec<u8> {
        let mut bytes = encode_header(5);
        for &s in seqs {
            bytes.extend(encode_frame(s, 5, &effect(s as u8)));
        }
        bytes.resize(bytes.len() + 4096, 0);
        bytes
    }

    fn seqs(frames: &[Frame]) -> Vec<u64> {
        frames.iter().map(|f| f.seq).collect()
    }

    #[test]
    fn frames_above_the_checkpoint_are_replayed_in_order() {
        let bytes = log_of(&[4, 5, 6, 7]);
        assert_eq!(seqs(&scan(&bytes, 5, 5).unwrap()), [6, 7]);
        assert_eq!(seqs(&scan(&bytes, 5, 3).unwrap()), [4, 5, 6, 7]);
        assert!(scan(&bytes, 5, 7).unwrap().is_empty());
    }

    #[test]
    fn an_older_frame_left_from_before_a_recycle_ends_the_run() {
        // 9 and 10 were written at the start after a checkpoint at 8; 3.. are left behind.
        let mut bytes = log_of(&[3, 4, 5, 6, 7, 8]);
        let new = log_of(&[9, 10]);
        let n = new.len() - 4096;
        bytes[..n].copy_from_slice(&new[..n]);
        assert_eq!(seqs(&scan(&bytes, 5, 8).unwrap()), [9, 10]);
    }

    #[test]
    fn a_gap_after_the_checkpoint_is_corruption() {
        let bytes = log_of(&[7, 8]);
        assert!(matches!(scan(&bytes, 5, 5), Err(Error::Corrupted(_))));
    }

    #[test]
    fn a_damaged_frame_followed_by_an_intact_one_is_corruption() {
        let mut bytes = log_of(&[1, 2, 3]);
        let second = HEADER_LEN as usize + encode_frame(1, 5, &effect(1)).len();
        bytes[second + 40] ^= 1;
        assert!(matches!(scan(&bytes, 5, 0), Err(Error::Corrupted(_))));
        // The same damage to the last frame is a torn tail.
        let mut bytes = log_of(&[1, 2, 3]);
        let third = second + encode_frame(2, 5, &effect(2)).len();
        bytes[third + 40] ^= 1;
        assert_eq!(seqs(&scan(&bytes, 5, 0).unwrap()), [1, 2]);
    }
}
