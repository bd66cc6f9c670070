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
/// open a file that relies on both. All are upgraded on open; the last step, 4 → 5, with the
/// log's record when the log is opened (wal/recover.rs).
pub(crate) const FORMAT_VERSION: u32 = 5;
/// The version the upgrades below reach; opening the log takes it to [`FORMAT_VERSION`].
const BEFORE_LOG_RECORD: u32 = 4;

/// What open() reads from, or writes to, a database's meta table.
pub(crate) struct Meta {
    pub(crate) fingerprinter: Fingerprinter,
    /// Seed of the key index's hash, derived from the secret.
    pub(crate) index_seed: u64,
    /// The database's identity, derived from the secret (random per database, kept with the
    /// file): every [`Reservation`](crate::Reservation) carries the one that issued it.
    pub(crate) database_id: u64,
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
        return Ok(meta);
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
    }
    txn.commit()?;
    Ok(Meta {
        index_seed: index_seed(&secret),
        database_id: database_id(&secret),
        fingerprinter: Fingerprinter::new(secret),
    })
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
            if crate::record::decode(v.value())?.state == RecordState::InProgress {
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
                crate::record::decode(v.value())?,
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
