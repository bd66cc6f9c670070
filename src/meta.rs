//! Table definitions and the meta table: magic, format version, fingerprint secret, token
//! counter. Layout in docs/design.md.

use redb::{Database, MultimapTableHandle, ReadableDatabase, TableDefinition, TableHandle};

use crate::error::Error;
use crate::fingerprint::{Fingerprinter, SECRET_LEN};

/// Prefix of every table idemdb owns; callers' business tables may not use it.
pub(crate) const RESERVED_PREFIX: &str = "idemdb_";

pub(crate) const META: TableDefinition<&str, &[u8]> = TableDefinition::new("idemdb_meta");
pub(crate) const RECORDS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("idemdb_records");

const MAGIC_KEY: &str = "magic";
const VERSION_KEY: &str = "format_version";
const SECRET_KEY: &str = "fingerprint_secret";
pub(crate) const NEXT_TOKEN_KEY: &str = "next_token";

const MAGIC: &[u8] = b"idemdb\0\x01";
/// The on-disk format this build writes and the newest it reads.
pub(crate) const FORMAT_VERSION: u32 = 1;

/// What open() reads from, or writes to, a database's meta table.
pub(crate) struct Meta {
    pub(crate) fingerprinter: Fingerprinter,
    /// The next fencing token to issue; every issued token is below it.
    pub(crate) next_token: u64,
}

/// Reads the meta table, creating it in an empty database. A database with other tables and
/// no meta table is not ours.
pub(crate) fn load_or_init(db: &Database) -> Result<Meta, Error> {
    if let Some(meta) = load(db)? {
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
    let secret = Fingerprinter::random_secret()?;
    {
        let mut meta = txn.open_table(META)?;
        meta.insert(MAGIC_KEY, MAGIC)?;
        meta.insert(VERSION_KEY, &FORMAT_VERSION.to_le_bytes()[..])?;
        meta.insert(SECRET_KEY, &secret[..])?;
        meta.insert(NEXT_TOKEN_KEY, &1u64.to_le_bytes()[..])?;
        txn.open_table(RECORDS)?;
    }
    txn.commit()?;
    Ok(Meta {
        fingerprinter: Fingerprinter::new(secret),
        next_token: 1,
    })
}

fn load(db: &Database) -> Result<Option<Meta>, Error> {
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
    let next_token = u64::from_le_bytes(fixed(&get(NEXT_TOKEN_KEY)?, NEXT_TOKEN_KEY)?);
    if next_token == 0 {
        return Err(Error::Corrupted("next_token is 0".into()));
    }
    // The records table must exist and have our types; open() fails clearly otherwise.
    txn.open_table(RECORDS).map_err(|e| match e {
        redb::TableError::TableDoesNotExist(_) => {
            Error::Corrupted(format!("table {} is missing", RECORDS.name()))
        }
        other => Error::from(other),
    })?;
    Ok(Some(Meta {
        fingerprinter: Fingerprinter::new(secret),
        next_token,
    }))
}

fn fixed<const N: usize>(bytes: &[u8], what: &str) -> Result<[u8; N], Error> {
    bytes.try_into().map_err(|_| {
        Error::Corrupted(format!(
            "meta entry {what:?} is {} bytes, expected {N}",
            bytes.len()
        ))
    })
}
