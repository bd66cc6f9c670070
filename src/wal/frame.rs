//! The log's byte layout: the segment header and the frames (docs/design.md §5.6).
//!
//! All integers are little-endian. A frame starts on a 512-byte boundary and is padded with
//! zeros to the next one, so that recovery can look for valid frames past a bad one.

use std::sync::Arc;

use xxhash_rust::xxh3::xxh3_64;

/// Bytes of the segment header.
pub(crate) const HEADER_LEN: u64 = 512;
/// Where the cycle sector is (version 2), and where frames start in a version-1 log.
pub(crate) const CYCLE_AT: u64 = HEADER_LEN;
/// Where frames start in a version-2 log: after the header and the cycle sector.
pub(crate) const FRAMES_START: u64 = CYCLE_AT + ALIGN;
/// Frames are aligned (and padded) to this.
pub(crate) const ALIGN: u64 = 512;
/// Bytes of a frame's own header, before its payload.
pub(crate) const FRAME_HEADER_LEN: usize = 32;

const SEGMENT_MAGIC: &[u8; 8] = b"idemwal\0";
/// Version 1 (format 4) had no log identity; version 2 names the log the database uses.
const SEGMENT_VERSION: u32 = 2;
const FRAME_MAGIC: u32 = u32::from_le_bytes(*b"IDMF");
const CYCLE_MAGIC: u32 = u32::from_le_bytes(*b"IDMC");

const PUT: u8 = 1;
const REMOVE: u8 = 2;
const CEILING: u8 = 3;

/// One effect of a batch, as an absolute post-image: applying it twice is applying it once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Effect {
    /// `table` (the in-flight table or a partition) holds `value` under `key`.
    Put {
        table: Arc<str>,
        key: Arc<[u8]>,
        value: Arc<[u8]>,
    },
    /// `table` holds nothing under `key`.
    Remove { table: Arc<str>, key: Arc<[u8]> },
    /// The token ceiling in meta is this.
    Ceiling(u64),
}

/// The largest payload a frame holds: its length field is a `u32`. Kept well below it so
/// that a frame stays one allocation of sane size.
const MAX_PAYLOAD: u64 = 1 << 30;

/// Whether `effects` fit one frame: every length within its field, the payload within
/// [`MAX_PAYLOAD`]. A batch whose effects do not fit is made durable by a durable commit.
pub(crate) fn fits(effects: &[Effect]) -> bool {
    lengths_fit(effects.iter().map(field_lengths))
}

/// An effect's variable parts: (table name, key, value) lengths.
fn field_lengths(e: &Effect) -> (usize, usize, usize) {
    match e {
        Effect::Put { table, key, value } => (table.len(), key.len(), value.len()),
        Effect::Remove { table, key } => (table.len(), key.len(), 0),
        Effect::Ceiling(_) => (0, 0, 0),
    }
}

/// At most this many bytes of an encoded effect are not its variable parts: tag, name
/// length, key length, value length (or ceiling).
const EFFECT_FIXED: usize = 1 + 2 + 4 + 4 + 8;

/// `fits` over (table name, key, value) lengths.
fn lengths_fit(lengths: impl Iterator<Item = (usize, usize, usize)>) -> bool {
    let mut total: u64 = 4;
    for (name, key, value) in lengths {
        if name > usize::from(u16::MAX) {
            return false;
        }
        for n in [EFFECT_FIXED, name, key, value] {
            total = total.saturating_add(n as u64);
        }
    }
    total <= MAX_PAYLOAD
}

/// The segment header, in sector 0 of the log file: the database's identity, and the
/// identity of this log (random per log file created, recorded in the database's meta).
pub(crate) fn encode_header(database_id: u64, log_id: u64) -> Vec<u8> {
    let mut out = vec![0u8; HEADER_LEN as usize];
    out[0..8].copy_from_slice(SEGMENT_MAGIC);
    out[8..12].copy_from_slice(&SEGMENT_VERSION.to_le_bytes());
    seal(&mut out, database_id, log_id);
    out
}

/// Bytes 16..40 of the header and of the cycle sector: whose log it is, and xxh3 of bytes
/// 0..32.
fn seal(out: &mut [u8], database_id: u64, log_id: u64) {
    out[16..24].copy_from_slice(&database_id.to_le_bytes());
    out[24..32].copy_from_slice(&log_id.to_le_bytes());
    let sum = xxh3_64(&out[0..32]);
    out[32..40].copy_from_slice(&sum.to_le_bytes());
}

/// What sector 0 of a log file says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Header {
    /// A valid header: the identity of the database it belongs to, and its own (`None` for
    /// a version-1 header, written before logs had one).
    Of {
        database_id: u64,
        log_id: Option<u64>,
    },
    /// Not a valid header: never written, torn while it was created, or damaged.
    Invalid,
}

pub(crate) fn decode_header(bytes: &[u8]) -> Header {
    let Some(h) = bytes.get(0..40) else {
        return Header::Invalid;
    };
    if &h[0..8] != SEGMENT_MAGIC {
        return Header::Invalid;
    }
    match u32_at(h, 8) {
        1 if u64_at(h, 24) == xxh3_64(&h[0..24]) => Header::Of {
            database_id: u64_at(h, 16),
            log_id: None,
        },
        SEGMENT_VERSION if u64_at(h, 32) == xxh3_64(&h[0..32]) => Header::Of {
            database_id: u64_at(h, 16),
            log_id: Some(u64_at(h, 24)),
        },
        _ => Header::Invalid,
    }
}

/// The cycle sector: the checkpoint the frames after it follow. Rewritten (and synced) after a
/// checkpoint moved, before any frame of the new cycle is written.
pub(crate) fn encode_cycle(database_id: u64, log_id: u64, checkpoint: u64) -> Vec<u8> {
    let mut out = vec![0u8; ALIGN as usize];
    out[0..4].copy_from_slice(&CYCLE_MAGIC.to_le_bytes());
    out[8..16].copy_from_slice(&checkpoint.to_le_bytes());
    seal(&mut out, database_id, log_id);
    out
}

/// What the cycle sector says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cycle {
    /// The frames after it follow this checkpoint.
    After(u64),
    /// All zeros: never written.
    Zero,
    /// Torn while it was rewritten, damaged, or another log's.
    Invalid,
}

pub(crate) fn decode_cycle(sector: &[u8], database_id: u64, log_id: u64) -> Cycle {
    let Some(s) = sector.get(0..ALIGN as usize) else {
        return Cycle::Zero;
    };
    if s.iter().all(|&b| b == 0) {
        return Cycle::Zero;
    }
    if u32_at(s, 0) != CYCLE_MAGIC
        || u64_at(s, 16) != database_id
        || u64_at(s, 24) != log_id
        || u64_at(s, 32) != xxh3_64(&s[0..32])
    {
        return Cycle::Invalid;
    }
    Cycle::After(u64_at(s, 8))
}

/// A frame, padded to [`ALIGN`].
pub(crate) fn encode_frame(seq: u64, database_id: u64, effects: &[Effect]) -> Vec<u8> {
    // Sized once (at most): the frame is built on the writer's path, batch after batch.
    let payload: usize = effects
        .iter()
        .map(|e| {
            let (name, key, value) = field_lengths(e);
            EFFECT_FIXED + name + key + value
        })
        .sum();
    let mut out = Vec::with_capacity(align_up((FRAME_HEADER_LEN + 4 + payload) as u64) as usize);
    out.resize(FRAME_HEADER_LEN, 0);
    out.extend_from_slice(&(effects.len() as u32).to_le_bytes());
    for e in effects {
        match e {
            Effect::Put { table, key, value } => {
                out.push(PUT);
                put_name(&mut out, table);
                put_bytes(&mut out, key);
                put_bytes(&mut out, value);
            }
            Effect::Remove { table, key } => {
                out.push(REMOVE);
                put_name(&mut out, table);
                put_bytes(&mut out, key);
            }
            Effect::Ceiling(c) => {
                out.push(CEILING);
                out.extend_from_slice(&c.to_le_bytes());
            }
        }
    }
    let payload_len = (out.len() - FRAME_HEADER_LEN) as u32;
    out[0..4].copy_from_slice(&FRAME_MAGIC.to_le_bytes());
    out[4..8].copy_from_slice(&payload_len.to_le_bytes());
    out[8..16].copy_from_slice(&seq.to_le_bytes());
    out[16..24].copy_from_slice(&database_id.to_le_bytes());
    let sum = checksum(&out[0..24], &out[FRAME_HEADER_LEN..]);
    out[24..32].copy_from_slice(&sum.to_le_bytes());
    let padded = align_up(out.len() as u64) as usize;
    out.resize(padded, 0);
    out
}

/// A valid frame found in the log.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Frame {
    pub(crate) seq: u64,
    /// Its effects, if the reader kept them ([`FrameRef::keep`]; every frame an open may
    /// replay keeps them).
    pub(crate) effects: Vec<Effect>,
    /// Bytes it occupies, padding included.
    pub(crate) len: u64,
    /// Above every token its effects show, as the reader's `bound` measured them.
    pub(crate) token_bound: u64,
}

/// One effect as a frame's bytes hold it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EffectRef<'a> {
    Put {
        table: &'a str,
        key: &'a [u8],
        value: &'a [u8],
    },
    Remove {
        table: &'a str,
        key: &'a [u8],
    },
    Ceiling(u64),
}

impl EffectRef<'_> {
    fn to_owned(self) -> Effect {
        match self {
            EffectRef::Put { table, key, value } => Effect::Put {
                table: table.into(),
                key: key.into(),
                value: value.into(),
            },
            EffectRef::Remove { table, key } => Effect::Remove {
                table: table.into(),
                key: key.into(),
            },
            EffectRef::Ceiling(c) => Effect::Ceiling(c),
        }
    }
}

/// A valid frame, its effects borrowed from the log's bytes: an open reads every frame of
/// the log, and keeps the effects of those it may replay only (a log of 128 MiB holds some
/// 400,000 records, each two allocations once owned).
pub(crate) struct FrameRef<'a> {
    pub(crate) seq: u64,
    pub(crate) effects: Vec<EffectRef<'a>>,
    pub(crate) len: u64,
}

impl FrameRef<'_> {
    /// The frame, its effects owned if `keep`, with `bound`'s maximum over its effects.
    pub(crate) fn keep(self, keep: bool, bound: &dyn Fn(&EffectRef<'_>) -> u64) -> Frame {
        Frame {
            seq: self.seq,
            len: self.len,
            token_bound: self.effects.iter().map(bound).max().unwrap_or(0),
            effects: if keep {
                self.effects.into_iter().map(EffectRef::to_owned).collect()
            } else {
                Vec::new()
            },
        }
    }
}

/// The frame at the start of `bytes`, if one of `database_id` is there whole and intact,
/// with all its effects. Torn, zeroed, foreign and damaged frames all read as `None`.
#[cfg(any(test, feature = "test-hooks"))]
pub(crate) fn decode_frame(bytes: &[u8], database_id: u64) -> Option<Frame> {
    Some(read_frame(bytes, database_id)?.keep(true, &|_| 0))
}

/// [`decode_frame`], its effects borrowed.
pub(crate) fn read_frame(bytes: &[u8], database_id: u64) -> Option<FrameRef<'_>> {
    let head = bytes.get(0..FRAME_HEADER_LEN)?;
    if u32_at(head, 0) != FRAME_MAGIC || u64_at(head, 16) != database_id {
        return None;
    }
    let payload_len = u32_at(head, 4) as usize;
    let payload = bytes.get(FRAME_HEADER_LEN..FRAME_HEADER_LEN.checked_add(payload_len)?)?;
    if checksum(&head[0..24], payload) != u64_at(head, 24) {
        return None;
    }
    let effects = read_effects(payload)?;
    Some(FrameRef {
        seq: u64_at(head, 8),
        effects,
        len: align_up((FRAME_HEADER_LEN + payload_len) as u64),
    })
}

/// Rounds up to the frame alignment.
pub(crate) fn align_up(n: u64) -> u64 {
    n.div_ceil(ALIGN).saturating_mul(ALIGN)
}

fn checksum(head: &[u8], payload: &[u8]) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(head);
    h.update(payload);
    h.digest()
}

/// A checksummed payload that does not parse was written by a bug, or is a collision: it is
/// read as not a frame, and recovery decides what that means by its position.
fn read_effects(payload: &[u8]) -> Option<Vec<EffectRef<'_>>> {
    let mut r = Reader { bytes: payload };
    let n = r.u32()?;
    // Every effect takes at least 9 bytes: a count beyond that is not a frame.
    let mut effects = Vec::with_capacity((n as usize).min(payload.len() / 9));
    for _ in 0..n {
        effects.push(match r.u8()? {
            PUT => EffectRef::Put {
                table: r.name()?,
                key: r.bytes()?,
                value: r.bytes()?,
            },
            REMOVE => EffectRef::Remove {
                table: r.name()?,
                key: r.bytes()?,
            },
            CEILING => EffectRef::Ceiling(r.u64()?),
            _ => return None,
        });
    }
    r.bytes.is_empty().then_some(effects)
}

fn put_name(out: &mut Vec<u8>, name: &str) {
    // Table names are idemdb's own (at most ~60 bytes): u16 is ample.
    out.extend_from_slice(&(name.len() as u16).to_le_bytes());
    out.extend_from_slice(name.as_bytes());
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(bytes);
}

struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.bytes.len() < n {
            return None;
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Some(head)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4).map(|b| u32_at(b, 0))
    }
    fn u64(&mut self) -> Option<u64> {
        self.take(8).map(|b| u64_at(b, 0))
    }
    fn bytes(&mut self) -> Option<&'a [u8]> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    fn name(&mut self) -> Option<&'a str> {
        let n = u16::from_le_bytes(self.take(2)?.try_into().ok()?) as usize;
        std::str::from_utf8(self.take(n)?).ok()
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// For the `decode` fuzz target (testing::decoders): the log's decoders on any bytes, and
/// valid samples.
#[cfg(feature = "test-hooks")]
pub(crate) mod fuzz {
    use super::*;

    const DATABASE: u64 = 0x6964_656d_6462_0005;
    const LOG: u64 = 0x0bad_cafe_f00d_0001;

    /// A frame that decodes (with the database identity its own bytes carry) encodes back to
    /// the same bytes, padding included.
    pub(crate) fn frame_round_trips(bytes: &[u8]) {
        let Some(id) = bytes.get(16..24).map(|b| u64_at(b, 0)) else {
            return;
        };
        if let Some(frame) = decode_frame(bytes, id) {
            let again = encode_frame(frame.seq, id, &frame.effects);
            assert_eq!(again.len() as u64, frame.len);
            let used = FRAME_HEADER_LEN + u32_at(bytes, 4) as usize;
            assert_eq!(&again[..used], &bytes[..used]);
        }
    }

    /// A header and a cycle sector (the first 512 bytes, then the next 512) that decode
    /// encode back to the same bytes.
    pub(crate) fn header_and_cycle_round_trip(bytes: &[u8]) {
        let (header, cycle) = bytes.split_at(bytes.len().min(HEADER_LEN as usize));
        if let Header::Of {
            database_id,
            log_id: Some(log_id),
        } = decode_header(header)
        {
            assert_eq!(&encode_header(database_id, log_id)[..40], &header[..40]);
            if let Cycle::After(c) = decode_cycle(cycle, database_id, log_id) {
                assert_eq!(&encode_cycle(database_id, log_id, c)[..40], &cycle[..40]);
            }
        }
    }

    /// Frames of every effect.
    pub(crate) fn sample_frames() -> Vec<Vec<u8>> {
        let put = Effect::Put {
            table: "idemdb_inflight".into(),
            key: b"\x00\x02opk".to_vec().into(),
            value: vec![7; 90].into(),
        };
        let remove = Effect::Remove {
            table: "idemdb_p_00000000000003600000_3600000_60000".into(),
            key: b"key".to_vec().into(),
        };
        let row = Effect::Put {
            table: "orders".into(),
            key: b"o-1".to_vec().into(),
            value: 1999u64.to_le_bytes().to_vec().into(),
        };
        vec![
            encode_frame(1, DATABASE, std::slice::from_ref(&put)),
            encode_frame(2, DATABASE, &[put, remove.clone(), row]),
            encode_frame(9, DATABASE, &[remove, Effect::Ceiling(4096)]),
        ]
    }

    /// A header followed by a cycle sector.
    pub(crate) fn sample_headers() -> Vec<Vec<u8>> {
        [0, 17]
            .into_iter()
            .map(|c| {
                let mut sectors = encode_header(DATABASE, LOG);
                sectors.extend(encode_cycle(DATABASE, LOG, c));
                sectors
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<Effect> {
        vec![
            Effect::Put {
                table: "idemdb_inflight".into(),
                key: b"k1".to_vec().into(),
                value: vec![7; 300].into(),
            },
            Effect::Remove {
                table: "idemdb_inflight".into(),
                key: b"k0".to_vec().into(),
            },
            Effect::Ceiling(8192),
        ]
    }

    #[test]
    fn effects_that_overflow_a_field_do_not_fit() {
        assert!(fits(&sample()));
        let long_name = Effect::Remove {
            table: "t".repeat(usize::from(u16::MAX) + 1).into(),
            key: Vec::new().into(),
        };
        assert!(!fits(&[long_name]));
        let half = (15, 40, 1 << 29);
        assert!(lengths_fit([half].into_iter()));
        assert!(!lengths_fit([half, half, half].into_iter()));
        assert!(!lengths_fit([(1, usize::MAX, usize::MAX)].into_iter()));
    }

    #[test]
    fn a_frame_round_trips_and_is_padded_to_a_sector() {
        let bytes = encode_frame(42, 9, &sample());
        assert_eq!(bytes.len() % ALIGN as usize, 0);
        let frame = decode_frame(&bytes, 9).unwrap();
        assert_eq!((frame.seq, frame.len), (42, bytes.len() as u64));
        assert_eq!(frame.effects, sample());
    }

    #[test]
    fn every_flipped_bit_of_a_frame_is_caught() {
        let bytes = encode_frame(3, 9, &sample());
        let used = FRAME_HEADER_LEN + u32_at(&bytes, 4) as usize;
        for bit in 0..used * 8 {
            let mut bad = bytes.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            assert_eq!(decode_frame(&bad, 9), None, "bit {bit}");
        }
    }

    #[test]
    fn a_frame_of_another_database_or_a_truncated_one_is_not_read() {
        let bytes = encode_frame(3, 9, &sample());
        assert_eq!(decode_frame(&bytes, 10), None);
        assert_eq!(decode_frame(&bytes[..100], 9), None);
        assert_eq!(decode_frame(&[0u8; 1024], 9), None);
    }

    #[test]
    fn the_header_names_its_database_and_log_and_detects_damage() {
        let h = encode_header(77, 5);
        assert_eq!(
            decode_header(&h),
            Header::Of {
                database_id: 77,
                log_id: Some(5)
            }
        );
        for byte in 0..40 {
            let mut bad = h.clone();
            bad[byte] ^= 0x20;
            assert_eq!(decode_header(&bad), Header::Invalid, "byte {byte}");
        }
        assert_eq!(decode_header(&[0u8; 512]), Header::Invalid);
        assert_eq!(decode_header(&h[..10]), Header::Invalid);
    }

    #[test]
    fn the_cycle_sector_names_its_checkpoint_and_detects_damage() {
        let c = encode_cycle(7, 8, 99);
        assert_eq!(decode_cycle(&c, 7, 8), Cycle::After(99));
        assert_eq!(decode_cycle(&c, 7, 9), Cycle::Invalid);
        assert_eq!(decode_cycle(&c, 6, 8), Cycle::Invalid);
        for byte in 0..40 {
            let mut bad = c.clone();
            bad[byte] ^= 0x08;
            assert_eq!(decode_cycle(&bad, 7, 8), Cycle::Invalid, "byte {byte}");
        }
        assert_eq!(decode_cycle(&[0u8; 512], 7, 8), Cycle::Zero);
        assert_eq!(decode_cycle(&c[..100], 7, 8), Cycle::Zero);
    }

    #[test]
    fn a_version_1_header_has_no_log_identity() {
        let mut h = vec![0u8; 512];
        h[0..8].copy_from_slice(SEGMENT_MAGIC);
        h[8..12].copy_from_slice(&1u32.to_le_bytes());
        h[16..24].copy_from_slice(&77u64.to_le_bytes());
        let sum = xxh3_64(&h[0..24]);
        h[24..32].copy_from_slice(&sum.to_le_bytes());
        assert_eq!(
            decode_header(&h),
            Header::Of {
                database_id: 77,
                log_id: None
            }
        );
    }
}
