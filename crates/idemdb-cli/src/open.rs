//! Opening an existing database, refusing everything else with a clear error.
//!
//! `IdemDb::open` creates a missing or empty file, and turns an empty redb database into an
//! idemdb one. An operator tool must do neither, so the file is first looked at: it must exist
//! and be a non-empty regular file; then it is opened with redb alone, with every page
//! checksum verified (a damaged file is refused here, before any idemdb code reads it), and
//! must hold idemdb's meta table. Only then is it opened as an `IdemDb` (without checking the
//! pages a second time).

use std::path::Path;

use idemdb::IdemDb;
use idemdb::redb::{self, MultimapTableHandle, ReadableDatabase, TableHandle};

use crate::cli::Global;

use crate::errors::CliError;

/// The meta table every idemdb database has (docs/design.md §1).
const META_TABLE: &str = "idemdb_meta";

/// redb's cache for the verifying open.
const INSPECT_CACHE: usize = 16 << 20;

/// Opens the idemdb database at `path` under the global options' retention and memory
/// budget, with no background compactor and no replay cache (the CLI answers no replays).
pub fn open(path: &Path, global: &Global) -> Result<IdemDb, CliError> {
    open_with(path, global, false)
}

/// `open`, accepting a loss of the write-ahead log if `accept_log_loss`.
pub fn open_with(path: &Path, global: &Global, accept_log_loss: bool) -> Result<IdemDb, CliError> {
    let meta = match std::fs::metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(CliError::Missing(path.to_path_buf()));
        }
        Err(e) => return Err(CliError::Io(path.to_path_buf(), e)),
    };
    if !meta.is_file() {
        return Err(CliError::NotIdemdb(
            path.to_path_buf(),
            "not a regular file".to_string(),
        ));
    }
    if meta.len() == 0 {
        return Err(CliError::NotIdemdb(
            path.to_path_buf(),
            "the file is empty".to_string(),
        ));
    }
    inspect(path)?;
    let mut builder = IdemDb::builder()
        .verify_on_open(false)
        .replay_cache(0)
        .accept_log_loss(accept_log_loss)
        .retention(global.retention().compact_interval(None));
    if let Some(budget) = global.memory_budget {
        builder = builder.memory_budget(budget);
    }
    builder
        .open(path)
        .map_err(|e| CliError::from_engine(path, e))
}

/// Opens the file with redb, verifying every page checksum, and checks that it has idemdb's
/// meta table; closes it again.
fn inspect(path: &Path) -> Result<(), CliError> {
    // A pass over every page: a cache would only fill, not help.
    let db = redb::Builder::new()
        .set_cache_size(INSPECT_CACHE)
        .set_check_integrity_on_open(true)
        .open(path)
        .map_err(|e| CliError::from_open(path, e))?;
    let engine = |e: idemdb::Error| CliError::from_engine(path, e);
    let txn = db.begin_read().map_err(|e| engine(e.into()))?;
    let mut names: Vec<String> = txn
        .list_tables()
        .map_err(|e| engine(e.into()))?
        .map(|t| t.name().to_string())
        .collect();
    if names.iter().any(|n| n == META_TABLE) {
        return Ok(());
    }
    names.extend(
        txn.list_multimap_tables()
            .map_err(|e| engine(e.into()))?
            .map(|t| t.name().to_string()),
    );
    let why = match names.as_slice() {
        [] => "an empty redb database, without idemdb's tables".to_string(),
        [first, rest @ ..] => format!(
            "a redb database without idemdb's meta table (it holds {first:?}{})",
            if rest.is_empty() {
                String::new()
            } else {
                format!(" and {} more tables", rest.len())
            }
        ),
    };
    Err(CliError::NotIdemdb(path.to_path_buf(), why))
}
