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
/// `expires_at`; version 2 (formats 3 to 5) lacked the checksum. Both are read only while a
/// database is upgraded ([`Record::decode_any_version`]).
pub const RECORD_VERSION: u8 = 3;
/// Bytes before the response: version, state, fingerprint, token, lease, created, updated,
/// attempts, expires.
pub const HEADER_LEN: usize = 1 + 1 + 16 + 8 + 8 + 8 + 8 + 4 + 8;
/// Bytes after the response: the checksum of the key and of every byte before it.
pub const CHECKSUM_LEN: usize = 8;
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

/// The checksum a version-3 record stored under `key` ends with: XXH3-64 of the bytes before
/// it, seeded with XXH3-64 of the key. A record read under another key than it was written
/// under (a damaged page, a value moved) fails it as surely as damaged bytes do.
fn checksum(key: &[u8], body: &[u8]) -> u64 {
    use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};
    xxh3_64_with_seed(body, xxh3_64(key))
}

impl Record {
    /// Encodes the record stored under `key` (the layout is documented in docs/design.md §3):
    /// the key is not stored in the value, only its part of the checksum.
    pub fn encode(&self, key: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_LEN + self.response.len() + CHECKSUM_LEN);
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
        let sum = checksum(key, &out);
        out.extend_from_slice(&sum.to_le_bytes());
        out
    }

    /// Decodes the record stored under `key`: only the current version, its checksum
    /// verified. Any malformed input is a [`CorruptRecord`], never a panic.
    pub fn decode(key: &[u8], bytes: &[u8]) -> Result<Record, CorruptRecord> {
        match bytes.first() {
            Some(&RECORD_VERSION) => Record::decode_any_version(key, bytes),
            Some(&version @ (1 | 2)) => Err(corrupt(format!(
                "record of version {version} where only version {RECORD_VERSION} is stored"
            ))),
            Some(&version) => Err(corrupt(format!("unknown record version {version}"))),
            None => Err(corrupt("record of 0 bytes".to_string())),
        }
    }

    /// Decodes a record of any version this build knows: version 3 with its checksum
    /// verified, versions 1 and 2 (written by older builds, without one) as they are. For the
    /// upgrades of older files and their logs only: everywhere else a record of an older
    /// version is damage ([`Record::decode`]).
    pub fn decode_any_version(key: &[u8], bytes: &[u8]) -> Result<Record, CorruptRecord> {
        let (header_len, body) = match bytes.first() {
            Some(&RECORD_VERSION) => {
                let split = bytes.len().checked_sub(CHECKSUM_LEN).ok_or_else(|| {
                    corrupt(format!("record of {} bytes is truncated", bytes.len()))
                })?;
                let (body, sum) = bytes.split_at(split);
                let mut stored = [0u8; CHECKSUM_LEN];
                stored.copy_from_slice(sum);
                if u64::from_le_bytes(stored) != checksum(key, body) {
                    return Err(corrupt(format!(
                        "record of {} bytes fails its checksum (damaged, or not the value of \
                         this key)",
                        bytes.len()
                    )));
                }
                (HEADER_LEN, body)
            }
            Some(2) => (HEADER_LEN, bytes),
            Some(1) => (HEADER_LEN_V1, bytes),
            Some(&version) => return Err(corrupt(format!("unknown record version {version}"))),
            None => return Err(corrupt("record of 0 bytes".to_string())),
        };
        let header = body
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
        let response = &body[header_len..];
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

/// The fencing token an encoded record of any version holds (bytes 18..26 in each), read
/// without decoding or checking the rest: for bounding the tokens a log's frames show, whose
/// own checksums hold. `None` for bytes too short or of no version this build knows.
pub fn token_in(bytes: &[u8]) -> Option<u64> {
    match bytes.first() {
        Some(1..=RECORD_VERSION) => bytes
            .get(18..26)
            .and_then(|t| t.try_into().ok())
            .map(u64::from_le_bytes),
        _ => None,
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

    const KEY: &[u8] = b"\x00\x02op\x00\x01pk";

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

    /// The version-2 encoding (formats 3 to 5): the header and the response, no checksum.
    fn version_2(rec: &Record) -> Vec<u8> {
        let mut v2 = rec.encode(KEY);
        v2.truncate(v2.len() - CHECKSUM_LEN);
        v2[0] = 2;
        v2
    }

    #[test]
    fn round_trips() {
        for r in [
            sample(RecordState::InProgress, b""),
            sample(RecordState::Completed, b"HTTP/1.1 201\r\n\r\n{\"id\":1}"),
            sample(RecordState::Failed, &[0, 255, 0]),
        ] {
            assert_eq!(Record::decode(KEY, &r.encode(KEY)).unwrap(), r);
            assert_eq!(Record::decode_any_version(KEY, &r.encode(KEY)).unwrap(), r);
        }
    }

    #[test]
    fn layout_is_stable() {
        let bytes = sample(RecordState::Completed, b"ok").encode(KEY);
        assert_eq!(bytes.len(), HEADER_LEN + 2 + CHECKSUM_LEN);
        assert_eq!(&bytes[..2], &[3, 2]);
        assert_eq!(bytes[2], 0x10, "fingerprint is little-endian");
        assert_eq!(&bytes[18..26], &42u64.to_le_bytes());
        assert_eq!(&bytes[50..54], &2u32.to_le_bytes());
        assert_eq!(&bytes[54..62], &9_000u64.to_le_bytes());
        assert_eq!(&bytes[62..64], b"ok");
        let sum =
            xxhash_rust::xxh3::xxh3_64_with_seed(&bytes[..64], xxhash_rust::xxh3::xxh3_64(KEY));
        assert_eq!(&bytes[64..], &sum.to_le_bytes());
        // docs/design.md §3's example, to the byte.
        assert_eq!(
            &bytes[64..],
            &[0xb3, 0xfb, 0x59, 0x31, 0xb3, 0x1f, 0x6c, 0x88]
        );
    }

    #[test]
    fn rejects_malformed() {
        let good = sample(RecordState::InProgress, b"").encode(KEY);
        for cut in 0..good.len() {
            assert!(Record::decode(KEY, &good[..cut]).is_err(), "cut at {cut}");
        }
        let mut bad = good.clone();
        bad[0] = 9;
        assert!(Record::decode(KEY, &bad).is_err());
        // Each check below is reached only by a record whose checksum holds: re-sealed.
        let seal = |mut body: Vec<u8>| {
            body.truncate(body.len() - CHECKSUM_LEN);
            let sum = checksum(KEY, &body);
            body.extend_from_slice(&sum.to_le_bytes());
            body
        };
        let mut bad = good.clone();
        bad[1] = 0;
        assert!(
            Record::decode(KEY, &seal(bad))
                .unwrap_err()
                .0
                .contains("state")
        );
        let mut bad = good.clone();
        bad.insert(HEADER_LEN, 1);
        assert!(
            Record::decode(KEY, &seal(bad))
                .unwrap_err()
                .0
                .contains("IN_PROGRESS")
        );
        let mut bad = good.clone();
        bad[18..26].copy_from_slice(&0u64.to_le_bytes());
        assert!(
            Record::decode(KEY, &seal(bad))
                .unwrap_err()
                .0
                .contains("token 0")
        );
        let mut bad = good;
        bad[50..54].copy_from_slice(&0u32.to_le_bytes());
        assert!(
            Record::decode(KEY, &seal(bad))
                .unwrap_err()
                .0
                .contains("zero attempts")
        );
    }

    #[test]
    fn every_damaged_bit_and_every_other_key_fails_the_checksum() {
        let good = sample(RecordState::Completed, b"a response").encode(KEY);
        for bit in 0..good.len() * 8 {
            let mut bad = good.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            assert!(Record::decode(KEY, &bad).is_err(), "bit {bit} flipped");
            // The upgrade's decoder reads a version byte of 1 or 2 as an unchecked older
            // record: it never reads a current file.
            if bit >= 8 {
                assert!(
                    Record::decode_any_version(KEY, &bad).is_err(),
                    "bit {bit} flipped"
                );
            }
        }
        let err = Record::decode(b"\x00\x02op\x00\x01pj", &good).unwrap_err();
        assert!(err.0.contains("checksum"), "{err}");
        assert!(Record::decode(b"", &good).is_err());
    }

    #[test]
    fn the_token_is_read_from_every_version() {
        let rec = sample(RecordState::Completed, b"ok");
        let v3 = rec.encode(KEY);
        let v2 = version_2(&rec);
        let mut v1 = v2.clone();
        v1.drain(54..62);
        v1[0] = 1;
        for bytes in [&v3, &v2, &v1] {
            assert_eq!(token_in(bytes), Some(42));
        }
        assert_eq!(token_in(&v3[..25]), None);
        assert_eq!(token_in(&[4; 30]), None);
        assert_eq!(token_in(&[]), None);
    }

    #[test]
    fn older_versions_are_read_only_by_the_upgrade() {
        let rec = sample(RecordState::Completed, b"ok");
        let v2 = version_2(&rec);
        assert_eq!(Record::decode_any_version(KEY, &v2).unwrap(), rec);
        let err = Record::decode(KEY, &v2).unwrap_err();
        assert!(err.0.contains("version 2"), "{err}");
        let mut v1 = v2;
        v1.drain(54..62);
        v1[0] = 1;
        let read = Record::decode_any_version(KEY, &v1).unwrap();
        assert_eq!(read.expires_at, u64::MAX);
        assert_eq!(read.response, b"ok");
        assert!(Record::decode(KEY, &v1).is_err());
    }
}
