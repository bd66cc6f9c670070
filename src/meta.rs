//! The meta table: magic, format version, fingerprint secret, token counter; checked or
//! made at open, and the format upgrades. Layout in docs/design.md §1.

use redb::{Database, MultimapTableHandle, ReadableDatabase, ReadableTable, TableHandle};

use crate::engine_tables::{INFLIGHT, META, NEXT_TOKEN_KEY, RECORDS, VERSION_KEY};
use crate::error::Error;
use crate::record::RecordState;
use crate::records::horizon::HORIZON;
use crate::records::locate::Layout;
use crate::records::txn::Records;
use idemdb_core::fingerprint::{Fingerprinter, SECRET_LEN, database_id};
use idemdb_core::retention::Rules;
use idemdb_core::scope::RecordKey;

const MAGIC_KEY: &str = "magic";
const SECRET_KEY: &str = "fingerprint_secret";

const MAGIC: &[u8] = b"idemdb\0\x01";
/// The on-disk format this build writes and the newest it reads. Version 1 kept IN_PROGRESS
/// records in the records table; version 2 kept finished records in one table, without
/// expiry. Version 3 had no write-ahead log: a binary that knows no log must not open a file
/// whose log may hold acknowledged outcomes. Version 4 did not record its log (the meta entry
/// `log`) and let a token ceiling live in the log alone: a binary that does neither must not
/// open a file that relies on both. Version 5 stored records without a checksum (record
/// version 2): a binary that would take a record without one as valid must not open a file
/// where only checksummed records are. Version 6 held every recognised key in memory, loaded
/// from its rows: a binary that does not enter a drop's keys in `idemdb_recognised_keys` must
/// not open a file whose recognition relies on that table. Version 7 had no outbox: a binary
/// that does not replay the outbox tables' frames from the log must not open a file whose log
/// may hold them. All are upgraded on open: up to 4 in [`load_or_init`], 4 → 5 with the log's
/// record when the log is opened (recovery.rs), 5 → 6 by [`checksum_records`] once the log's
/// frames are in the file, 6 → 7 by [`index_recognition_rows`], 7 → 8 by [`admit_outbox`],
/// before anything can be staged.
pub(crate) const FORMAT_VERSION: u32 = 8;
/// The version [`index_recognition_rows`] reaches.
pub(crate) const RECOGNITION_INDEXED: u32 = 7;
/// The version [`checksum_records`] reaches.
pub(crate) const CHECKSUMMED: u32 = 6;
/// The version the upgrades of [`load_or_init`] reach; opening the log takes it to
/// [`LOG_RECORDED`].
const BEFORE_LOG_RECORD: u32 = 4;
/// The version whose log is recorded, with records of any version (older builds' frames
/// replayed into it may hold version-2 records).
const LOG_RECORDED: u32 = 5;
/// Records rewritten per read of a table by [`checksum_records`]: bounds its memory.
const REWRITE_CHUNK: usize = 4096;

/// What open() reads from, or writes to, a database's meta table.
pub(crate) struct Meta {
    pub(crate) fingerprinter: Fingerprinter,
    /// Seed of the key index's hash, derived from the secret.
    pub(crate) index_seed: u64,
    /// The database's identity, derived from the secret (random per database, kept with the
    /// file): every [`Reservation`](crate::Reservation) carries the one that issued it.
    pub(crate) database_id: u64,
    /// The file's format version after the upgrades [`load_or_init`] made.
    pub(crate) version: u32,
}

impl Meta {
    /// The format version the open's log commit writes: [`LOG_RECORDED`] until
    /// [`checksum_records`] has run, then the file's (the later upgrades write their own).
    pub(crate) fn log_version(&self) -> u32 {
        self.version.max(LOG_RECORDED)
    }
}

/// Reads the meta table, creating it in an empty database. A database with other tables and
/// no meta table is not ours.
pub(crate) fn load_or_init(db: &Database, rules: &Rules) -> Result<Meta, Error> {
    if let Some((meta, version)) = load(db)? {
        if version == 1 {
            upgrade_from_1(db)?;
        }
        if version <= 2 {
            upgrade_from_2(db, rules, meta.index_seed)?;
        } else if version == 3 {
            upgrade_from_3(db)?;
        }
        return Ok(Meta {
            version: version.max(BEFORE_LOG_RECORD),
            ..meta
        });
    }
    let txn = db.begin_write()?;
    let foreign = txn
        .list_tables()?
        .map(|t| t.name().to_string())
        .chain(txn.list_multimap_tables()?.map(|t| t.name().to_string()))
        .next();
    if let Some(table) = foreign {
        return Err(Error::NotIdemdb(format!(
            "the redb database holds table {:?} but no {} table",
            table,
            META.name()
        )));
    }
    let secret = Fingerprinter::random_secret().map_err(Error::Entropy)?;
    {
        let mut meta = txn.open_table(META)?;
        meta.insert(MAGIC_KEY, MAGIC)?;
        meta.insert(VERSION_KEY, &FORMAT_VERSION.to_le_bytes()[..])?;
        meta.insert(SECRET_KEY, &secret[..])?;
        meta.insert(NEXT_TOKEN_KEY, &1u64.to_le_bytes()[..])?;
        txn.open_table(INFLIGHT)?;
        txn.open_table(HORIZON)?;
        txn.open_table(crate::records::recognised::RECOGNISED_KEYS)?;
    }
    txn.commit()?;
    Ok(Meta {
        index_seed: index_seed(&secret),
        database_id: database_id(&secret),
        fingerprinter: Fingerprinter::new(secret),
        version: FORMAT_VERSION,
    })
}

/// Version 5 → 6: every stored record of an older version (in the in-flight table and the
/// partitions) is rewritten as the current one, checksummed under its key; then the version
/// is set. Called after the log's frames are replayed into the file (they may hold older
/// records too). One durable commit per table: a crash leaves version 5 with some tables
/// rewritten, and the next open rewrites what is left (a record already current is kept).
/// Keys do not change, so the summaries and filters of the partitions still hold.
pub(crate) fn checksum_records(db: &Database) -> Result<(), Error> {
    let tables = {
        let txn = db.begin_read()?;
        let mut tables = crate::records::partition::partition_tables(&txn)?;
        tables.push(INFLIGHT.name().to_string());
        tables
    };
    for name in &tables {
        let txn = db.begin_write()?;
        rewrite_records(&txn, redb::TableDefinition::new(name))?;
        txn.commit()?;
    }
    let txn = db.begin_write()?;
    crate::engine_tables::write_format_version(&mut txn.open_table(META)?, CHECKSUMMED)?;
    txn.commit()?;
    Ok(())
}

/// Version 6 → 7: every recognition row is named as not yet entered in the table of
/// recognised keys (records/recognised.rs), which is created; the open loads such rows into
/// memory, and the next compaction pass enters them. One commit, with the version.
pub(crate) fn index_recognition_rows(db: &Database) -> Result<(), Error> {
    use crate::records::horizon::RECOGNISED;
    use crate::records::recognised::{RECOGNISED_KEYS, mark_unindexed};
    let txn = db.begin_write()?;
    txn.open_table(RECOGNISED_KEYS)?;
    let keys: Vec<Vec<u8>> = txn
        .open_table(RECOGNISED)?
        .iter()?
        .map(|row| row.map(|(k, _)| k.value().to_vec()))
        .collect::<Result<_, _>>()?;
    for key in &keys {
        mark_unindexed(&txn, key)?;
    }
    crate::engine_tables::write_format_version(&mut txn.open_table(META)?, RECOGNITION_INDEXED)?;
    txn.commit()?;
    Ok(())
}

/// Version 7 → 8: only the version, in one durable commit before the open returns, so before
/// any outbox frame can reach the log: a build that knows no outbox refuses the file
/// (`UnsupportedFormat`) instead of calling its log corrupt.
pub(crate) fn admit_outbox(db: &Database) -> Result<(), Error> {
    let txn = db.begin_write()?;
    crate::engine_tables::write_format_version(&mut txn.open_table(META)?, FORMAT_VERSION)?;
    txn.commit()?;
    Ok(())
}

/// Rewrites the records of `table` that are not of the current version, [`REWRITE_CHUNK`] at a
/// time. A record that does not decode refuses the upgrade (`Corrupted`), as it would a read.
fn rewrite_records(
    txn: &redb::WriteTransaction,
    table: redb::TableDefinition<&[u8], &[u8]>,
) -> Result<(), Error> {
    use std::ops::Bound;
    let mut table = txn.open_table(table)?;
    let mut after: Option<Vec<u8>> = None;
    loop {
        let mut rewrites = Vec::new();
        let mut last = None;
        {
            let from = match &after {
                Some(key) => Bound::Excluded(key.as_slice()),
                None => Bound::Unbounded,
            };
            for entry in table
                .range::<&[u8]>((from, Bound::Unbounded))?
                .take(REWRITE_CHUNK)
            {
                let (k, v) = entry?;
                let (key, value) = (k.value(), v.value());
                if value.first() != Some(&idemdb_core::record::RECORD_VERSION) {
                    let record = crate::record::decode_any_version(key, value)?;
                    rewrites.push((key.to_vec(), record.encode(key)));
                }
                last = Some(key.to_vec());
            }
        }
        let Some(last) = last else {
            return Ok(());
        };
        for (key, value) in &rewrites {
            table.insert(key.as_slice(), value.as_slice())?;
        }
        after = Some(last);
    }
}

fn index_seed(secret: &[u8; SECRET_LEN]) -> u64 {
    xxhash_rust::xxh3::xxh3_64_with_seed(secret, 0x6964_656d_6462_0001)
}

/// Version 1 → 2: IN_PROGRESS records move from the records table to the in-flight table, in
/// one durable transaction with the version change (a crash leaves version 1 intact).
fn upgrade_from_1(db: &Database) -> Result<(), Error> {
    let txn = db.begin_write()?;
    {
        let mut records = txn.open_table(RECORDS)?;
        let mut inflight = txn.open_table(INFLIGHT)?;
        let mut moving = Vec::new();
        for entry in records.iter()? {
            let (k, v) = entry?;
            if crate::record::decode_any_version(k.value(), v.value())?.state
                == RecordState::InProgress
            {
                moving.push((k.value().to_vec(), v.value().to_vec()));
            }
        }
        for (k, v) in moving {
            records.remove(k.as_slice())?;
            inflight.insert(k.as_slice(), v.as_slice())?;
        }
        txn.open_table(META)?
            .insert(VERSION_KEY, &2u32.to_le_bytes()[..])?;
    }
    txn.commit()?;
    Ok(())
}

/// Version 2 → 3: every record gets its expiry under today's retention and is rewritten in the
/// current record version, through the writer's record store: finished records move to the
/// time partition of their last change, the format-2 records table is dropped. One durable
/// transaction, as above.
fn upgrade_from_2(db: &Database, rules: &Rules, seed: u64) -> Result<(), Error> {
    // A scratch layout: the real one is loaded from the upgraded tables afterwards.
    let layout = Layout::empty(rules.clone(), seed);
    let txn = db.begin_write()?;
    {
        let old = txn.open_table(RECORDS)?;
        let mut records = Records::open(&txn, &layout)?;
        let mut rewrite = records.in_flight()?;
        for entry in old.iter()? {
            let (k, v) = entry?;
            rewrite.push((
                RecordKey::from_stored(k.value()),
                crate::record::decode_any_version(k.value(), v.value())?,
            ));
        }
        for (key, mut rec) in rewrite {
            records.store(&key, layout.index.hash(key.as_bytes()), &mut rec)?;
        }
        txn.open_table(HORIZON)?;
        txn.open_table(META)?
            .insert(VERSION_KEY, &BEFORE_LOG_RECORD.to_le_bytes()[..])?;
    }
    txn.delete_table(RECORDS)?;
    txn.commit()?;
    Ok(())
}

/// Version 3 → 4: the layout is the same; the log beside the file is new.
fn upgrade_from_3(db: &Database) -> Result<(), Error> {
    let txn = db.begin_write()?;
    txn.open_table(META)?
        .insert(VERSION_KEY, &BEFORE_LOG_RECORD.to_le_bytes()[..])?;
    txn.commit()?;
    Ok(())
}

fn load(db: &Database) -> Result<Option<(Meta, u32)>, Error> {
    let txn = db.begin_read()?;
    let meta = match txn.open_table(META) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
        Err(redb::TableError::TableTypeMismatch { .. }) => {
            return Err(Error::NotIdemdb(format!(
                "table {} has foreign key or value types",
                META.name()
            )));
        }
        Err(e) => return Err(e.into()),
    };
    let get = |key: &str| -> Result<Vec<u8>, Error> {
        match meta.get(key)? {
            Some(v) => Ok(v.value().to_vec()),
            None => Err(Error::NotIdemdb(format!("meta entry {key:?} is missing"))),
        }
    };
    if get(MAGIC_KEY)? != MAGIC {
        return Err(Error::NotIdemdb("wrong magic in the meta table".into()));
    }
    let version = u32::from_le_bytes(fixed(&get(VERSION_KEY)?, VERSION_KEY)?);
    if version == 0 {
        return Err(Error::Corrupted("format_version is 0".into()));
    }
    if version > FORMAT_VERSION {
        return Err(Error::UnsupportedFormat {
            found: version,
            supported: FORMAT_VERSION,
        });
    }
    let secret: [u8; SECRET_LEN] = fixed(&get(SECRET_KEY)?, SECRET_KEY)?;
    // The token ceiling: read where tokens resume (wal/recover.rs), validated here.
    let next_token = u64::from_le_bytes(fixed(&get(NEXT_TOKEN_KEY)?, NEXT_TOKEN_KEY)?);
    if next_token == 0 {
        return Err(Error::Corrupted("next_token is 0".into()));
    }
    // The tables of its version must exist and have our types; open() fails clearly
    // otherwise.
    let required = [
        (RECORDS, version <= 2),
        (INFLIGHT, version >= 2),
        (HORIZON, version >= 3),
    ];
    for (table, needed) in required {
        if needed {
            txn.open_table(table).map_err(|e| match e {
                redb::TableError::TableDoesNotExist(_) => {
                    Error::Corrupted(format!("table {} is missing", table.name()))
                }
                other => Error::from(other),
            })?;
        }
    }
    Ok(Some((
        Meta {
            index_seed: index_seed(&secret),
            database_id: database_id(&secret),
            fingerprinter: Fingerprinter::new(secret),
            version,
        },
        version,
    )))
}

fn fixed<const N: usize>(bytes: &[u8], what: &str) -> Result<[u8; N], Error> {
    bytes.try_into().map_err(|_| {
        Error::Corrupted(format!(
            "meta entry {what:?} is {} bytes, expected {N}",
            bytes.len()
        ))
    })
}
