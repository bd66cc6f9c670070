//! A record as the engine's tables hold it: idemdb-core's encoding, its damage an
//! [`Error::Corrupted`].

use crate::error::Error;
pub use idemdb_core::Record;
pub use idemdb_core::state::RecordState;

/// Decodes a stored record; any malformed input is [`Error::Corrupted`], never a panic.
pub(crate) fn decode(bytes: &[u8]) -> Result<Record, Error> {
    Record::decode(bytes).map_err(|e| Error::Corrupted(e.0))
}
