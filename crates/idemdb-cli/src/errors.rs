//! What can go wrong, each with its own message and exit code.

use std::fmt;
use std::path::{Path, PathBuf};

use idemdb::Error;
use idemdb::redb;
use idemdb_postgres::PgError;

/// Exit codes. 1 is a negative answer (no record; problems found), 2 a usage error.
pub mod code {
    /// Success.
    pub const OK: u8 = 0;
    /// `get`: no live record; `verify`: problems found.
    pub const NEGATIVE: u8 = 1;
    /// Bad arguments (clap exits with the same code for its own).
    pub const USAGE: u8 = 2;
    /// The file does not exist.
    pub const MISSING: u8 = 3;
    /// Another process has the file open.
    pub const LOCKED: u8 = 4;
    /// The file is not an idemdb database.
    pub const NOT_IDEMDB: u8 = 5;
    /// The file is damaged.
    pub const CORRUPT: u8 = 6;
    /// The file was written by a newer idemdb (or an older redb).
    pub const UNSUPPORTED: u8 = 7;
    /// Any other failure: I/O, storage, output.
    pub const OTHER: u8 = 8;
}

/// A failure of the command, reported on stderr.
#[derive(Debug)]
pub enum CliError {
    Missing(PathBuf),
    Locked(PathBuf, String),
    NotIdemdb(PathBuf, String),
    Corrupt(PathBuf, String),
    /// The open refused the write-ahead log (missing, cut, older, damaged, another
    /// database's): the engine's words, which name the log.
    LogRefused(PathBuf, Error),
    Unsupported(PathBuf, String),
    Io(PathBuf, std::io::Error),
    /// A bad option value (clap's own errors exit before this).
    Usage(String),
    /// Anything else the engine reported.
    Engine(PathBuf, Error),
    /// What PostgreSQL or `PgStore` reported (the server's words included), with the URL
    /// without its password.
    Postgres(String, idemdb_postgres::PgError),
    /// Writing the output failed (other than a closed pipe, which ends quietly).
    Output(std::io::Error),
}

impl CliError {
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Missing(_) => code::MISSING,
            CliError::Locked(..) => code::LOCKED,
            CliError::NotIdemdb(..) => code::NOT_IDEMDB,
            CliError::Corrupt(..) | CliError::LogRefused(..) => code::CORRUPT,
            CliError::Unsupported(..) => code::UNSUPPORTED,
            CliError::Usage(_) => code::USAGE,
            CliError::Postgres(_, e) => match e {
                PgError::NotMigrated(_) => code::NOT_IDEMDB,
                PgError::UnsupportedFormat { .. } => code::UNSUPPORTED,
                PgError::Corrupted(_) => code::CORRUPT,
                _ => code::OTHER,
            },
            CliError::Io(..) | CliError::Engine(..) | CliError::Output(_) => code::OTHER,
        }
    }

    /// A short stable name, for `--json` error objects.
    pub fn kind(&self) -> &'static str {
        match self {
            CliError::Missing(_) => "missing",
            CliError::Locked(..) => "locked",
            CliError::NotIdemdb(..) => "not_idemdb",
            CliError::Corrupt(..) | CliError::LogRefused(..) => "corrupt",
            CliError::Unsupported(..) => "unsupported",
            CliError::Io(..) => "io",
            CliError::Usage(_) => "usage",
            CliError::Engine(..) => "engine",
            CliError::Output(_) => "output",
            CliError::Postgres(_, e) => match e {
                PgError::NotMigrated(_) => "not_idemdb",
                PgError::UnsupportedFormat { .. } => "unsupported",
                PgError::Corrupted(_) => "corrupt",
                _ => "postgres",
            },
        }
    }

    /// An engine error, sorted into the kinds above.
    pub fn from_engine(path: &Path, e: Error) -> CliError {
        let path = path.to_path_buf();
        match e {
            Error::NotIdemdb(why) => CliError::NotIdemdb(path, why),
            Error::Corrupted(why) => CliError::Corrupt(path, why),
            e @ Error::LogRefused { .. } => CliError::LogRefused(path, e),
            Error::UnsupportedFormat { found, supported } => CliError::Unsupported(
                path,
                format!(
                    "format version {found}, newer than this build reads ({supported}); use a \
                     newer idemdb"
                ),
            ),
            Error::Storage(inner) => match &*inner {
                redb::Error::DatabaseAlreadyOpen => CliError::Locked(path, inner.to_string()),
                redb::Error::LockProtocolMismatch => CliError::Locked(path, inner.to_string()),
                redb::Error::Corrupted(why) => CliError::Corrupt(path, why.clone()),
                redb::Error::UpgradeRequired(v) => CliError::Unsupported(
                    path,
                    format!("redb file format {v} needs an upgrade by an older redb"),
                ),
                _ => CliError::Engine(path, Error::Storage(inner)),
            },
            other => CliError::Engine(path, other),
        }
    }

    /// A redb error from opening the file directly.
    pub fn from_open(path: &Path, e: redb::DatabaseError) -> CliError {
        match e {
            redb::DatabaseError::Storage(redb::StorageError::Io(io))
                if io.kind() == std::io::ErrorKind::InvalidData
                    && io.to_string().contains("magic number") =>
            {
                CliError::NotIdemdb(
                    path.to_path_buf(),
                    format!("not a redb database file ({io})"),
                )
            }
            redb::DatabaseError::Storage(redb::StorageError::Corrupted(why))
                if why.contains("magic number") =>
            {
                CliError::NotIdemdb(
                    path.to_path_buf(),
                    format!("not a redb database file ({why})"),
                )
            }
            redb::DatabaseError::Storage(redb::StorageError::Io(io)) => {
                CliError::Io(path.to_path_buf(), io)
            }
            other => CliError::from_engine(path, Error::Storage(std::sync::Arc::new(other.into()))),
        }
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CliError::Missing(p) => write!(
                f,
                "{}: no such file (the CLI never creates a database)",
                p.display()
            ),
            CliError::Locked(p, why) => write!(
                f,
                "{}: the database is locked: another process has it open ({why}); stop that \
                 process first, or ask it for its stats",
                p.display()
            ),
            CliError::NotIdemdb(p, why) => {
                write!(f, "{}: not an idemdb database: {why}", p.display())
            }
            CliError::Corrupt(p, why) => {
                write!(f, "{}: the database is corrupt: {why}", p.display())
            }
            CliError::LogRefused(p, e) => write!(f, "{}: {e}", p.display()),
            CliError::Unsupported(p, why) => {
                write!(f, "{}: unsupported file format: {why}", p.display())
            }
            CliError::Io(p, e) => write!(f, "{}: {e}", p.display()),
            CliError::Usage(why) => write!(f, "{why}"),
            CliError::Engine(p, e) => write!(f, "{}: {e}", p.display()),
            CliError::Output(e) => write!(f, "cannot write the output: {e}"),
            CliError::Postgres(url, e) => write!(f, "{url}: {e}"),
        }
    }
}
