//! The record: what a store keeps for one key, and its versioned byte encoding (the embedded
//! engine's tables hold it; docs/design.md §3 gives the layout).

use std::fmt;

use crate::fencing::FencingToken;
use crate::fingerprint::Fingerprint;
use crate::state::RecordState;

/// A read-only view of one record, as a store's `get` returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The record's state.
    pub state: RecordState,
    /// Fingerprint of the request that created it.
    pub fingerprint: Fingerprint,
    /// The token of the current (or last) owner.
    pub token: FencingToken,
    /// When the lease of an IN_PROGRESS record runs out, ms since the epoch. Kept as it was
    /// last set once the record is finished.
    pub lease_expires_at: u64,
    /// When the record was first reserved, ms since the epoch.
    pub created_at: u64,
    /// When the record was last written (reserved, taken over, extended or finished), ms since
    /// the epoch.
    pub updated_at: u64,
    /// How many times the record has been acquired (1 + takeovers).
    pub attempts: u32,
    /// When the record stops counting, ms since the epoch: its last change plus its
    /// operation's TTL (for IN_PROGRESS, the lease's end plus the TTL). From then on it is
    /// treated as absent, whether or not its partition was dropped yet.
    pub expires_at: u64,
    /// The stored response of a COMPLETED or FAILED record, byte for byte; empty while
    /// IN_PROGRESS.
    pub response: Vec<u8>,
}

/// Version byte that starts every encoded record. Version 1 (formats 1 and 2) lacked
/// `expires_at`; it is read only while a database is upgraded.
pub const RECORD_VERSION: u8 = 2;
/// Bytes before the response: version, state, fingerprint, token, lease, created, updated,
/// attempts, expires.
pub const HEADER_LEN: usize = 1 + 1 + 16 + 8 + 8 + 8 + 8 + 4 + 8;
/// The header of a version-1 record: the same fields without `expires_at`.
const HEADER_LEN_V1: usize = HEADER_LEN - 8;

/// A stored record that does not decode: what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CorruptRecord(pub String);

impl fmt::Display for CorruptRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CorruptRecord {}

impl Record {
    /// Encodes the record. The layout is documented in docs/design.md.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_LEN + self.response.len());
        out.push(RECORD_VERSION);
        out.push(self.state.to_byte());
        out.extend_from_slice(&self.fingerprint.as_u128().to_le_bytes());
        out.extend_from_slice(&self.token.get().to_le_bytes());
        out.extend_from_slice(&self.lease_expires_at.to_le_bytes());
        out.extend_from_slice(&self.created_at.to_le_bytes());
        out.extend_from_slice(&self.updated_at.to_le_bytes());
        out.extend_from_slice(&self.attempts.to_le_bytes());
        out.extend_from_slice(&self.expires_at.to_le_bytes());
        out.extend_from_slice(&self.response);
        out
    }

    /// Decodes a stored record; any malformed input is a [`CorruptRecord`], never a panic.
    pub fn decode(bytes: &[u8]) -> Result<Record, CorruptRecord> {
        let header_len = match bytes.first() {
            Some(&RECORD_VERSION) => HEADER_LEN,
            Some(1) => HEADER_LEN_V1,
            Some(&version) => return Err(corrupt(format!("unknown record version {version}"))),
            None => return Err(corrupt("record of 0 bytes".to_string())),
        };
        let header = bytes
            .get(..header_len)
            .ok_or_else(|| corrupt(format!("record of {} bytes is truncated", bytes.len())))?;
        let mut r = Reader(header);
        let version = r.u8();
        let state_byte = r.u8();
        let state = RecordState::from_byte(state_byte)
            .ok_or_else(|| corrupt(format!("unknown record state {state_byte}")))?;
        let fingerprint = Fingerprint::from_u128(u128::from_le_bytes(r.array()));
        let token = FencingToken::new(u64::from_le_bytes(r.array()))
            .ok_or_else(|| corrupt("record holds fencing token 0".to_string()))?;
        let lease_expires_at = u64::from_le_bytes(r.array());
        let created_at = u64::from_le_bytes(r.array());
        let updated_at = u64::from_le_bytes(r.array());
        let attempts = u32::from_le_bytes(r.array());
        // A version-1 record never expires until the upgrade gives it its retention.
        let expires_at = if version == 1 {
            u64::MAX
        } else {
            u64::from_le_bytes(r.array())
        };
        let response = &bytes[header_len..];
        if state == RecordState::InProgress && !response.is_empty() {
            return Err(corrupt("IN_PROGRESS record carries a response".to_string()));
        }
        if attempts == 0 {
            return Err(corrupt("record with zero attempts".to_string()));
        }
        Ok(Record {
            state,
            fingerprint,
            token,
            lease_expires_at,
            created_at,
            updated_at,
            attempts,
            expires_at,
            response: response.to_vec(),
        })
    }

    /// Whether the record no longer counts at `now_ms` (see [`Record::expires_at`]).
    pub fn is_expired(&self, now_ms: u64) -> bool {
        now_ms >= self.expires_at
    }
}

fn corrupt(what: String) -> CorruptRecord {
    CorruptRecord(what)
}

/// Reads fixed-size fields from a slice already checked to be long enough.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn u8(&mut self) -> u8 {
        let [b] = self.array::<1>();
        b
    }

    fn array<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        let n = N.min(self.0.len());
        out[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(state: RecordState, response: &[u8]) -> Record {
        Record {
            state,
            fingerprint: Fingerprint::from_u128(0x0102_0304_0506_0708_090a_0b0c_0d0e_0f10),
            token: FencingToken::new(42).unwrap(),
            lease_expires_at: 5_000,
            created_at: 1_000,
            updated_at: 2_000,
            attempts: 2,
            expires_at: 9_000,
            response: response.to_vec(),
        }
    }

    #[test]
    fn round_trips() {
        for r in [
            sample(RecordState::InProgress, b""),
            sample(RecordState::Completed, b"HTTP/1.1 201\r\n\r\n{\"id\":1}"),
            sample(RecordState::Failed, &[0, 255, 0]),
        ] {
            assert_eq!(Record::decode(&r.encode()).unwrap(), r);
        }
    }

    #[test]
    fn layout_is_stable() {
        let bytes = sample(RecordState::Completed, b"ok").encode();
        assert_eq!(bytes.len(), HEADER_LEN + 2);
        assert_eq!(&bytes[..2], &[2, 2]);
        assert_eq!(bytes[2], 0x10, "fingerprint is little-endian");
        assert_eq!(&bytes[18..26], &42u64.to_le_bytes());
        assert_eq!(&bytes[50..54], &2u32.to_le_bytes());
        assert_eq!(&bytes[54..62], &9_000u64.to_le_bytes());
        assert_eq!(&bytes[62..], b"ok");
    }

    #[test]
    fn rejects_malformed() {
        let good = sample(RecordState::InProgress, b"").encode();
        for cut in 0..good.len() {
            assert!(Record::decode(&good[..cut]).is_err(), "cut at {cut}");
        }
        let mut bad = good.clone();
        bad[0] = 9;
        assert!(Record::decode(&bad).is_err());
        let mut bad = good.clone();
        bad[1] = 0;
        assert!(Record::decode(&bad).is_err());
        let mut bad = good.clone();
        bad.push(1);
        assert!(Record::decode(&bad).is_err(), "IN_PROGRESS with a response");
        let mut bad = good;
        bad[18..26].copy_from_slice(&0u64.to_le_bytes());
        assert!(Record::decode(&bad).is_err(), "token 0");
    }

    #[test]
    fn reads_version_1_as_never_expiring() {
        let rec = sample(RecordState::Completed, b"ok");
        let mut v1 = rec.encode();
        v1.drain(54..62);
        v1[0] = 1;
        let read = Record::decode(&v1).unwrap();
        assert_eq!(read.expires_at, u64::MAX);
        assert_eq!(read.response, b"ok");
    }
}
