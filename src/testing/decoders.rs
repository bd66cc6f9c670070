//! Every decoder of stored bytes behind one entry point, for the `decode` fuzz target: each
//! answers a value or an error for any input, never panics, and what it decodes encodes back
//! to what it read (canonical forms only). And valid samples of each, its seed corpus.

use crate::record::Record;
use crate::records::filter::{FilterRow, KeyFilter};
use crate::records::head::TableHead;
use crate::records::horizon::{
    decode_hashes, decode_tags, encode_hashes, encode_tags, row_key, row_source, row_until,
};
use crate::records::partition::PartitionName;
use crate::records::summary::Summary;
use crate::wal::frame::fuzz as wal;
use crate::wal::state::LogState;

/// Which decoder an input is for: its first byte, modulo this.
pub const DECODERS: u8 = 8;

/// Runs the decoder the first byte of `data` selects (modulo [`DECODERS`]) on the rest, and
/// checks that what it accepts round-trips. Panics on a violation (the fuzzer's finding).
pub fn decode_any(data: &[u8]) {
    let Some((which, bytes)) = data.split_first() else {
        return;
    };
    match which % DECODERS {
        0 => {
            // A record: its key's length, its key, then its value.
            let Some((&len, row)) = bytes.split_first() else {
                return;
            };
            let (key, value) = row.split_at(usize::from(len).min(row.len()));
            let current = crate::record::decode(key, value);
            if let Ok(record) = crate::record::decode_any_version(key, value) {
                // A record that decodes describes itself consistently, and its current
                // encoding decodes to it again (an older version is re-encoded as the
                // current one); the current version's decoder takes exactly the current ones.
                assert!(record.attempts > 0 && record.token.get() > 0);
                let encoded = record.encode(key);
                let again = crate::record::decode(key, &encoded).expect("a re-encoded record");
                assert_eq!(again, record);
                let is_current = value.first() == Some(&idemdb_core::record::RECORD_VERSION);
                assert_eq!(current.is_ok(), is_current);
                if is_current {
                    assert_eq!(encoded, value, "a current record is canonical");
                }
            } else {
                assert!(
                    current.is_err(),
                    "decode takes what decode_any_version refuses"
                );
            }
        }
        1 => wal::frame_round_trips(bytes),
        2 => {
            if let Ok(name) = std::str::from_utf8(bytes)
                && let Some(partition) = PartitionName::parse(name)
            {
                assert_eq!(
                    partition.table_name(),
                    name,
                    "a partition name is canonical"
                );
            }
        }
        3 => {
            // A horizon row: its key's length, its key, then its value.
            let Some((&len, row)) = bytes.split_first() else {
                return;
            };
            let (key, value) = row.split_at(usize::from(len).min(row.len()));
            if let (Ok(until), Ok(source)) = (row_until(key), row_source(key)) {
                assert_eq!(row_key(until, source), key);
            }
            if let Ok(tags) = decode_tags(value) {
                let tags: Vec<u32> = tags.collect();
                assert_eq!(encode_tags(&tags), value);
            }
            if let Ok(hashes) = decode_hashes(value) {
                let hashes: Vec<u64> = hashes.collect();
                assert_eq!(encode_hashes(&hashes), value);
            }
        }
        4 => wal::header_and_cycle_round_trip(bytes),
        5 => {
            if let Ok(state) = LogState::decode(bytes) {
                assert_eq!(&state.encode()[..], bytes);
            }
        }
        6 => {
            if let Ok(summary) = Summary::decode(bytes, "t") {
                assert_eq!(summary.encode(), bytes);
            }
        }
        _ => {
            if let Ok(row) = FilterRow::decode(bytes, "t") {
                assert_eq!(row.encode(), bytes);
                // A filter that decodes answers any hash (its slots stay inside its array).
                for hash in [0, 1, u64::MAX, le_hash(bytes)] {
                    let _ = row.filter.may_contain(hash);
                }
            }
        }
    }
}

/// Some hash of `bytes`, for a lookup that depends on the input.
fn le_hash(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(bytes)
}

/// Valid inputs for every decoder (each with its selector byte first), named: the `decode`
/// target's seed corpus (`fuzz/seeds.rs` writes them).
pub fn decode_seeds() -> Vec<(String, Vec<u8>)> {
    let mut seeds = Vec::new();
    let mut add = |name: String, which: u8, bytes: Vec<u8>| {
        let mut input = vec![which];
        input.extend(bytes);
        seeds.push((name, input));
    };
    for (i, record) in sample_records().into_iter().enumerate() {
        let key = b"\x00\x02op\x00\x01p-key";
        let mut row = vec![key.len() as u8];
        row.extend_from_slice(key);
        row.extend(record.encode(key));
        add(format!("record-{i}"), 0, row);
    }
    for (i, frame) in wal::sample_frames().into_iter().enumerate() {
        add(format!("frame-{i}"), 1, frame);
    }
    for (start, width, ttl) in [(0, 1, 1), (3_600_000, 3_600_000, 60_000), (u64::MAX, 7, 9)] {
        let name = PartitionName { start, width, ttl }.table_name();
        add(format!("partition-{start}"), 2, name.into_bytes());
    }
    for (i, (until, source, tags)) in [
        (
            5_000u64,
            PartitionName {
                start: 0,
                width: 1_000,
                ttl: 1_000,
            }
            .table_name(),
            vec![1u32, 7, 0xdead_beef],
        ),
        (9_999, "idemdb_inflight@1234".to_string(), vec![42]),
    ]
    .into_iter()
    .enumerate()
    {
        let key = row_key(until, &source);
        let mut row = vec![key.len() as u8];
        row.extend(key);
        row.extend(encode_tags(&tags));
        add(format!("horizon-{i}"), 3, row);
    }
    for (i, sectors) in wal::sample_headers().into_iter().enumerate() {
        add(format!("log-header-{i}"), 4, sectors);
    }
    for (i, in_use) in [false, true].into_iter().enumerate() {
        let state = LogState {
            id: 0x1234_5678_9abc_def0,
            len: 1 << 20,
            since: 77,
            in_use,
        };
        add(format!("log-state-{i}"), 5, state.encode().to_vec());
    }
    for (i, n) in [0u64, 3, 1_000].into_iter().enumerate() {
        let hashes: Vec<u64> = (0..n)
            .map(|k| k.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
            .collect();
        let mut sorted = hashes.clone();
        sorted.sort_unstable();
        let head = TableHead {
            count: n,
            first: sorted.first().copied().unwrap_or(0),
            last: sorted.last().copied().unwrap_or(0),
        };
        add(
            format!("summary-{i}"),
            6,
            Summary::new(head, sorted).encode(),
        );
        if let Some(filter) = KeyFilter::build(&hashes) {
            add(
                format!("filter-{i}"),
                7,
                FilterRow::new(head, filter).encode(),
            );
        }
    }
    seeds
}

/// A record in every state, with and without a response.
fn sample_records() -> Vec<Record> {
    use crate::record::RecordState;
    use idemdb_core::fingerprint::Fingerprint;
    use idemdb_core::token::FencingToken;
    let base = Record {
        state: RecordState::InProgress,
        fingerprint: Fingerprint::from_u128(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef),
        token: const {
            match FencingToken::new(42) {
                Some(token) => token,
                None => panic!("42 is not 0"),
            }
        },
        lease_expires_at: 1_700_000_030_000,
        created_at: 1_700_000_000_000,
        updated_at: 1_700_000_000_000,
        attempts: 1,
        expires_at: 1_700_086_430_000,
        response: Vec::new(),
    };
    vec![
        base.clone(),
        Record {
            state: RecordState::Completed,
            response: b"201 Created\r\n\r\n{\"order\":\"o-1\"}".to_vec(),
            attempts: 2,
            ..base.clone()
        },
        Record {
            state: RecordState::Failed,
            response: b"402 declined".to_vec(),
            ..base
        },
    ]
}
