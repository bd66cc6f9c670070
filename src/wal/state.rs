//! What the database file records of its log, so that an open can tell a log that lost
//! acknowledged outcomes from one that holds all of them (docs/design.md §5.6): the meta
//! entries `log` (which log, how long, since when, in use or closed cleanly) and
//! `log_losses` (the losses an operator accepted).

use redb::{ReadableTable, Table};

use crate::error::Error;
use crate::stats::LogLoss;

/// Meta key of the [`LogState`].
pub(crate) const LOG_KEY: &str = "log";
/// Meta key of the accepted-loss note: count `u64` LE, time of the last `u64` LE (ms), then
/// what was accepted, UTF-8.
pub(crate) const LOSSES_KEY: &str = "log_losses";

type MetaTable<'t> = Table<'t, &'static str, &'static [u8]>;

/// The database's record of its log, rewritten by every durable commit of the writer (every
/// checkpoint) and at open. 32 bytes: id, len, since, flags, each `u64` LE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LogState {
    /// The identity in the log's header: random per log file created.
    pub(crate) id: u64,
    /// The log's length when it was recorded. The file only grows, and only a durable commit
    /// that records the new length lets frames be written past the old one: a shorter file
    /// was cut.
    pub(crate) len: u64,
    /// The checkpoint when the log was created. A checkpoint above it means a frame was
    /// synced at the log's first frame offset, whose sector can never be zero again.
    pub(crate) since: u64,
    /// From open until a clean close: frames above the checkpoint may hold acknowledged
    /// outcomes. A cleanly closed database's log holds nothing it needs.
    pub(crate) in_use: bool,
}

const IN_USE: u64 = 1;

impl LogState {
    pub(crate) fn encode(&self) -> [u8; 32] {
        let mut out = [0u8; 32];
        out[0..8].copy_from_slice(&self.id.to_le_bytes());
        out[8..16].copy_from_slice(&self.len.to_le_bytes());
        out[16..24].copy_from_slice(&self.since.to_le_bytes());
        let flags = if self.in_use { IN_USE } else { 0 };
        out[24..32].copy_from_slice(&flags.to_le_bytes());
        out
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<LogState, Error> {
        let field = |i: usize| -> Result<u64, Error> {
            bytes
                .get(i * 8..i * 8 + 8)
                .and_then(|b| b.try_into().ok())
                .map(u64::from_le_bytes)
                .ok_or_else(|| corrupted(format!("is {} bytes, expected 32", bytes.len())))
        };
        if bytes.len() != 32 {
            return Err(corrupted(format!("is {} bytes, expected 32", bytes.len())));
        }
        let flags = field(3)?;
        if flags & !IN_USE != 0 {
            return Err(corrupted(format!("has unknown flags {flags:#x}")));
        }
        Ok(LogState {
            id: field(0)?,
            len: field(1)?,
            since: field(2)?,
            in_use: flags == IN_USE,
        })
    }

    pub(crate) fn write(&self, meta: &mut MetaTable<'_>) -> Result<(), Error> {
        meta.insert(LOG_KEY, &self.encode()[..])?;
        Ok(())
    }
}

fn corrupted(why: String) -> Error {
    Error::Corrupted(format!("the meta entry {LOG_KEY:?} {why}"))
}

/// The log the database records, if any (none in a new database, or one of format 4).
pub(crate) fn read_state(
    meta: &impl ReadableTable<&'static str, &'static [u8]>,
) -> Result<Option<LogState>, Error> {
    meta.get(LOG_KEY)?
        .map(|v| LogState::decode(v.value()))
        .transpose()
}

/// The losses accepted over the database's life: how many, and the last.
pub(crate) fn read_losses(
    meta: &impl ReadableTable<&'static str, &'static [u8]>,
) -> Result<(u64, Option<LogLoss>), Error> {
    let Some(v) = meta.get(LOSSES_KEY)? else {
        return Ok((0, None));
    };
    let bytes = v.value();
    let (Some(count), Some(at)) = (bytes.get(0..8), bytes.get(8..16)) else {
        return Err(Error::Corrupted(format!(
            "the meta entry {LOSSES_KEY:?} is {} bytes, expected at least 16",
            bytes.len()
        )));
    };
    let u64_of = |b: &[u8]| b.try_into().map(u64::from_le_bytes).unwrap_or(0);
    let what = String::from_utf8_lossy(&bytes[16..]).into_owned();
    Ok((
        u64_of(count),
        Some(LogLoss {
            at_ms: u64_of(at),
            what,
        }),
    ))
}

/// Adds an accepted loss to the note: the count goes up, the last one is replaced.
pub(crate) fn record_loss(meta: &mut MetaTable<'_>, at_ms: u64, what: &str) -> Result<(), Error> {
    let (count, _) = read_losses(meta)?;
    let mut out = Vec::with_capacity(16 + what.len());
    out.extend_from_slice(&count.saturating_add(1).to_le_bytes());
    out.extend_from_slice(&at_ms.to_le_bytes());
    out.extend_from_slice(what.as_bytes());
    meta.insert(LOSSES_KEY, out.as_slice())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_round_trips_and_refuses_other_lengths_and_flags() {
        for in_use in [false, true] {
            let s = LogState {
                id: 0xdead_beef,
                len: 1 << 20,
                since: 77,
                in_use,
            };
            assert_eq!(LogState::decode(&s.encode()).unwrap(), s);
        }
        assert!(LogState::decode(&[0u8; 31]).is_err());
        assert!(LogState::decode(&[0u8; 33]).is_err());
        let mut bad = [0u8; 32];
        bad[24] = 2;
        assert!(LogState::decode(&bad).is_err());
    }
}
