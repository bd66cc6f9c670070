//! One outbox message as stored in `idemdb_outbox` and `idemdb_outbox_parked` (design.md
//! §1, "Outbox"): the message, when it was staged, the attempts that failed and when the next
//! may run, and a checksum over the row's key and bytes.

use idemdb_core::outbox::{Message, MessageId, OutboxMessage};

use crate::error::Error;

/// The only row format so far.
const FORMAT: u8 = 1;
/// Format, staged_at, attempts, next attempt, id.
const FIXED: usize = 1 + 8 + 4 + 8 + 16;
const CHECKSUM: usize = 8;

/// A stored message and its delivery state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OutboxRow {
    pub(crate) message: OutboxMessage,
    /// The store's time before which no attempt runs (after a transient failure), ms.
    pub(crate) next_attempt_ms: u64,
}

impl OutboxRow {
    /// The row's bytes; `seq` (the table key) is covered by the checksum, so a row copied
    /// under another key reads as corrupt.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let m = &self.message;
        let mut out = Vec::with_capacity(FIXED + m.destination.len() + m.payload.len() + 64);
        out.push(FORMAT);
        out.extend_from_slice(&m.staged_at_ms.to_le_bytes());
        out.extend_from_slice(&m.attempts.to_le_bytes());
        out.extend_from_slice(&self.next_attempt_ms.to_le_bytes());
        out.extend_from_slice(m.id.as_bytes());
        put_bytes(&mut out, m.destination.as_bytes());
        match &m.ordering_key {
            Some(k) => {
                out.push(1);
                put_bytes(&mut out, k);
            }
            None => out.push(0),
        }
        put_len(&mut out, m.headers.len());
        for (name, value) in &m.headers {
            put_bytes(&mut out, name.as_bytes());
            put_bytes(&mut out, value);
        }
        put_bytes(&mut out, &m.payload);
        put_bytes(&mut out, m.last_error.as_deref().unwrap_or("").as_bytes());
        let sum = checksum(m.seq, &out);
        out.extend_from_slice(&sum.to_le_bytes());
        out
    }

    /// Reads the row stored under `seq`; a wrong checksum, format or length is corruption.
    pub(crate) fn decode(seq: u64, bytes: &[u8]) -> Result<OutboxRow, Error> {
        let corrupt = |why: &str| Error::Corrupted(format!("outbox message {seq}: {why}"));
        let body_len = bytes
            .len()
            .checked_sub(CHECKSUM)
            .ok_or_else(|| corrupt("shorter than its checksum"))?;
        let (body, sum) = bytes.split_at(body_len);
        let mut sum_bytes = [0u8; CHECKSUM];
        sum_bytes.copy_from_slice(sum);
        if u64::from_le_bytes(sum_bytes) != checksum(seq, body) {
            return Err(corrupt("checksum mismatch"));
        }
        let mut r = Reader { bytes: body };
        if r.take(1)? != [FORMAT] {
            return Err(corrupt("unknown row format"));
        }
        let staged_at_ms = r.u64()?;
        let attempts = r.u32()?;
        let next_attempt_ms = r.u64()?;
        let mut id = [0u8; 16];
        id.copy_from_slice(r.take(16)?);
        let destination = r.string()?;
        let ordering_key = match r.take(1)? {
            [0] => None,
            [1] => Some(r.bytes()?.to_vec()),
            _ => return Err(corrupt("bad ordering-key flag")),
        };
        let n = r.len()?;
        let mut headers = Vec::with_capacity(n.min(1024));
        for _ in 0..n {
            headers.push((r.string()?, r.bytes()?.to_vec()));
        }
        let payload = r.bytes()?.to_vec();
        let last_error = Some(r.string()?).filter(|e| !e.is_empty());
        if !r.bytes.is_empty() {
            return Err(corrupt("trailing bytes"));
        }
        let staged = headers.into_iter().fold(
            Message::new(destination, payload).with_ordering_key(ordering_key),
            |m, (name, value)| m.header(name, value),
        );
        let mut message =
            OutboxMessage::staged(MessageId::from_bytes(id), seq, staged, staged_at_ms);
        message.attempts = attempts;
        message.last_error = last_error;
        Ok(OutboxRow {
            message,
            next_attempt_ms,
        })
    }
}

fn checksum(seq: u64, body: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64_with_seed(body, seq)
}

/// Lengths are u32; every part is bounded far below 4 GiB (limits.rs).
fn put_len(out: &mut Vec<u8>, len: usize) {
    out.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_le_bytes());
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    put_len(out, bytes.len());
    out.extend_from_slice(bytes);
}

struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Error> {
        if self.bytes.len() < n {
            return Err(Error::Corrupted("outbox message: truncated".into()));
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    fn u32(&mut self) -> Result<u32, Error> {
        let mut b = [0u8; 4];
        b.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(b))
    }

    fn u64(&mut self) -> Result<u64, Error> {
        let mut b = [0u8; 8];
        b.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(b))
    }

    fn len(&mut self) -> Result<usize, Error> {
        usize::try_from(self.u32()?)
            .map_err(|_| Error::Corrupted("outbox message: length too large".into()))
    }

    fn bytes(&mut self) -> Result<&'a [u8], Error> {
        let n = self.len()?;
        self.take(n)
    }

    fn string(&mut self) -> Result<String, Error> {
        String::from_utf8(self.bytes()?.to_vec())
            .map_err(|_| Error::Corrupted("outbox message: text that is not UTF-8".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row() -> OutboxRow {
        let staged = Message::new("orders", b"{\"id\":1}".to_vec())
            .ordering_key(b"o-1".to_vec())
            .header("content-type", b"json".to_vec());
        let mut message = OutboxMessage::staged(
            MessageId::from_bytes([7; 16]),
            42,
            staged,
            1_700_000_000_000,
        );
        message.attempts = 3;
        message.last_error = Some("503 from broker".into());
        OutboxRow {
            message,
            next_attempt_ms: 1_700_000_000_500,
        }
    }

    #[test]
    fn a_row_reads_back_as_written() {
        let r = row();
        assert_eq!(OutboxRow::decode(42, &r.encode()).unwrap(), r);
        let mut bare = row();
        bare.message.ordering_key = None;
        bare.message.headers.clear();
        bare.message.last_error = None;
        assert_eq!(OutboxRow::decode(42, &bare.encode()).unwrap(), bare);
    }

    #[test]
    fn a_flipped_byte_a_cut_row_or_another_key_is_corruption() {
        let bytes = row().encode();
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x40;
            assert!(
                matches!(OutboxRow::decode(42, &b), Err(Error::Corrupted(_))),
                "byte {i}"
            );
        }
        for n in 0..bytes.len() {
            assert!(OutboxRow::decode(42, &bytes[..n]).is_err(), "cut at {n}");
        }
        assert!(OutboxRow::decode(43, &bytes).is_err());
    }
}
