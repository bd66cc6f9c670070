//! What every stored record carries, and the keys: random-looking, reproducible from an id.

use std::sync::atomic::{AtomicU64, Ordering};

/// The request body every operation carries (64 bytes, fingerprinted by every engine).
pub const PAYLOAD: &[u8] = br#"{"sku":"book-1","cents":1999,"currency":"EUR","qty":1,"u":"42"}"#;
/// The response every completion stores and every replay returns (64 bytes).
pub const RESPONSE: &[u8] = br#"201 Created {"order":"o-000000000001","total":1999,"ok":true}"#;
pub const OPERATION: &str = "POST /purchases";
pub const PRINCIPAL: &str = "tenant-0001";

/// Ids of fresh keys: far above the preloaded or prefilled ones, unique in the process.
static NEXT_ID: AtomicU64 = AtomicU64::new(1 << 40);

/// A key id nobody has used yet.
pub fn fresh_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

/// The 32-byte idempotency key for id `n`: random-looking hex (like a client-minted UUID), so
/// inserts land all over the B-trees. splitmix64 is a bijection, so distinct ids give distinct
/// keys.
pub fn key_bytes(n: u64) -> [u8; 32] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let words = [splitmix64(n), splitmix64(n ^ 0x5851_f42d_4c95_7f2d)];
    let mut out = [0u8; 32];
    for (w, word) in words.iter().enumerate() {
        for i in 0..16 {
            out[w * 16 + i] = HEX[((word >> (60 - 4 * i)) & 0xf) as usize];
        }
    }
    out
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A small, fast xorshift generator for picking stored keys.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(splitmix64(seed) | 1)
    }

    /// The generator in state `state`, as is; it must not be 0 (xorshift would stay at 0).
    pub fn from_state(state: u64) -> Self {
        assert_ne!(state, 0, "xorshift state 0 never leaves 0");
        Rng(state)
    }

    /// Uniform-enough in `0..n` for picking among stored keys.
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}
