//! Payload fingerprints: 128-bit xxh3 keyed with a per-database random secret.

use std::fmt;

use xxhash_rust::xxh3::xxh3_128_with_secret;

/// Length of the per-database fingerprint secret, in bytes (xxh3's default secret size).
pub const SECRET_LEN: usize = 192;

/// A 128-bit fingerprint of a request's canonical bytes.
///
/// Two requests with the same key are "the same request" exactly when their fingerprints are
/// equal. Compute one with a store's `fingerprint`, which keys xxh3 with the
/// database's secret ([`Fingerprinter`]), or bring your own 128-bit digest (for example of a canonical JSON
/// subset) with [`Fingerprint::from_u128`].
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint(u128);

impl Fingerprint {
    /// Wraps a precomputed 128-bit digest.
    pub const fn from_u128(value: u128) -> Self {
        Fingerprint(value)
    }

    /// The digest as a number.
    pub const fn as_u128(self) -> u128 {
        self.0
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({:032x})", self.0)
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// What a caller hands over to identify the request: its bytes, or a fingerprint of them.
#[derive(Debug, Clone, Copy)]
pub enum Payload<'a> {
    /// The request's canonical bytes; fingerprinted with the database's secret.
    Bytes(&'a [u8]),
    /// A fingerprint computed beforehand.
    Fingerprint(Fingerprint),
}

impl<'a> From<&'a [u8]> for Payload<'a> {
    fn from(bytes: &'a [u8]) -> Self {
        Payload::Bytes(bytes)
    }
}

impl<'a, const N: usize> From<&'a [u8; N]> for Payload<'a> {
    fn from(bytes: &'a [u8; N]) -> Self {
        Payload::Bytes(bytes)
    }
}

impl<'a> From<&'a str> for Payload<'a> {
    fn from(text: &'a str) -> Self {
        Payload::Bytes(text.as_bytes())
    }
}

impl<'a> From<&'a String> for Payload<'a> {
    fn from(text: &'a String) -> Self {
        Payload::Bytes(text.as_bytes())
    }
}

impl<'a> From<&'a Vec<u8>> for Payload<'a> {
    fn from(bytes: &'a Vec<u8>) -> Self {
        Payload::Bytes(bytes)
    }
}

impl From<Fingerprint> for Payload<'_> {
    fn from(fp: Fingerprint) -> Self {
        Payload::Fingerprint(fp)
    }
}

/// Computes fingerprints with one database's secret. Each store keeps one secret per database
/// (drawn once by [`Fingerprinter::random_secret`], stored beside the records), so that a
/// fingerprint cannot be forged or matched across databases.
#[derive(Clone)]
pub struct Fingerprinter {
    secret: Box<[u8; SECRET_LEN]>,
}

impl Fingerprinter {
    /// A fingerprinter keyed by `secret`.
    pub fn new(secret: [u8; SECRET_LEN]) -> Self {
        Fingerprinter {
            secret: Box::new(secret),
        }
    }

    /// A fresh random secret from the operating system; `Err` with the operating system's
    /// words when it has no entropy to give.
    pub fn random_secret() -> Result<[u8; SECRET_LEN], String> {
        let mut secret = [0u8; SECRET_LEN];
        getrandom::fill(&mut secret).map_err(|e| e.to_string())?;
        Ok(secret)
    }

    /// The fingerprint of `bytes`.
    pub fn fingerprint(&self, bytes: &[u8]) -> Fingerprint {
        Fingerprint(xxh3_128_with_secret(bytes, &self.secret[..]))
    }

    /// The fingerprint of a payload: computed from its bytes, or the one given.
    pub fn resolve(&self, payload: Payload<'_>) -> Fingerprint {
        match payload {
            Payload::Bytes(bytes) => self.fingerprint(bytes),
            Payload::Fingerprint(fp) => fp,
        }
    }
}

/// The identity of the database whose fingerprint secret is `secret`: what a [`Reservation`]
/// carries so that another database refuses it. Derived, so that it moves with the secret
/// (a byte copy of a database keeps its identity).
///
/// [`Reservation`]: crate::Reservation
pub fn database_id(secret: &[u8; SECRET_LEN]) -> u64 {
    xxhash_rust::xxh3::xxh3_64_with_seed(secret, 0x6964_656d_6462_0002)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(seed: u8) -> [u8; SECRET_LEN] {
        std::array::from_fn(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
    }

    #[test]
    fn secret_keys_the_hash() {
        let a = Fingerprinter::new(secret(1));
        let b = Fingerprinter::new(secret(2));
        assert_eq!(a.fingerprint(b"x"), a.fingerprint(b"x"));
        assert_ne!(a.fingerprint(b"x"), b.fingerprint(b"x"));
        assert_ne!(a.fingerprint(b"x"), a.fingerprint(b"y"));
    }

    #[test]
    fn precomputed_passes_through() {
        let f = Fingerprinter::new([0u8; SECRET_LEN]);
        let fp = Fingerprint::from_u128(7);
        assert_eq!(f.resolve(Payload::from(fp)), fp);
        assert_eq!(f.resolve(Payload::from(b"abc")), f.fingerprint(b"abc"));
    }
}
