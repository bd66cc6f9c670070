//! The engine's own redb tables, and the meta table's keys other modules read: below every
//! module that opens them (docs/design.md §1).

use redb::TableDefinition;

use crate::error::Error;

/// Prefix of every table idemdb owns; callers' business tables may not use it.
pub(crate) const RESERVED_PREFIX: &str = "idemdb_";

pub(crate) const META: TableDefinition<&str, &[u8]> = TableDefinition::new("idemdb_meta");
/// The records table of formats 1 (all records) and 2 (finished records); format 3 keeps
/// finished records in time partitions (partition.rs). Read only by the upgrades.
pub(crate) const RECORDS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("idemdb_records");
/// IN_PROGRESS records only. Kept apart because it stays small (bounded by the work in flight):
/// a batch of reservations dirties a few of its pages instead of random leaves of the
/// partitions.
pub(crate) const INFLIGHT: TableDefinition<&[u8], &[u8]> = TableDefinition::new("idemdb_inflight");

/// Outbox messages staged and not yet delivered, by sequence number (commit order); a value
/// is an encoded message (outbox_row.rs). Written through the log like a registered caller
/// table, so that a staging commit is durable with its record's frame.
pub(crate) const OUTBOX: TableDefinition<u64, &[u8]> = TableDefinition::new("idemdb_outbox");
/// Parked outbox messages (a permanent failure, or the attempt cap reached), by the same
/// sequence numbers, until an operator retries or purges them.
pub(crate) const OUTBOX_PARKED: TableDefinition<u64, &[u8]> =
    TableDefinition::new("idemdb_outbox_parked");

/// Whether `name` is one of the outbox tables: idemdb's, yet logged and replayed as a
/// registered caller table is.
pub(crate) fn is_outbox_table(name: &str) -> bool {
    use redb::TableHandle;
    name == OUTBOX.name() || name == OUTBOX_PARKED.name()
}

pub(crate) const NEXT_TOKEN_KEY: &str = "next_token";
/// The sequence number of the last log frame this file holds (wal/): absent before the first
/// checkpoint.
pub(crate) const CHECKPOINT_KEY: &str = "log_checkpoint";
/// The meta entry holding the file's format version (`u32` little-endian).
pub(crate) const VERSION_KEY: &str = "format_version";

/// Writes `version` as the file's format version.
pub(crate) fn write_format_version(
    meta: &mut redb::Table<'_, &'static str, &'static [u8]>,
    version: u32,
) -> Result<(), Error> {
    meta.insert(VERSION_KEY, &version.to_le_bytes()[..])?;
    Ok(())
}
