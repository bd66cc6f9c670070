//! A record as the engine's tables hold it: idemdb-core's encoding, its damage an
//! [`Error::Corrupted`].

use crate::error::Error;
pub use idemdb_core::Record;
pub use idemdb_core::state::RecordState;

/// Decodes the record stored under `key` (its stored bytes); any malformed input, a failed
/// checksum or an older record version is [`Error::Corrupted`], never a panic.
pub(crate) fn decode(key: &[u8], bytes: &[u8]) -> Result<Record, Error> {
    Record::decode(key, bytes).map_err(|e| Error::Corrupted(e.0))
}

/// [`decode`] for the upgrades of older files and the frames of their logs: older record
/// versions too.
pub(crate) fn decode_any_version(key: &[u8], bytes: &[u8]) -> Result<Record, Error> {
    Record::decode_any_version(key, bytes).map_err(|e| Error::Corrupted(e.0))
}
