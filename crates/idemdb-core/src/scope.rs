//! Record identity: (operation, principal, key), and its encoding as a redb key.

use std::fmt;

use crate::error::InputError;
use crate::limits::Limits;

/// Where a key is valid: an operation (endpoint, consumer, saga step kind) and a principal (the
/// user, tenant or client the request acts for).
///
/// The same key bytes under another scope name another record.
///
/// ```
/// use idemdb_core::Scope;
/// let scope = Scope::new("POST /purchases", "user-42");
/// assert_eq!(scope.operation(), b"POST /purchases");
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Scope {
    operation: Box<[u8]>,
    principal: Box<[u8]>,
}

impl Scope {
    /// A scope. The operation must not be empty; the principal may be (an anonymous caller).
    /// Lengths are checked against the database's [`Limits`] when the scope is used.
    pub fn new(operation: impl AsRef<[u8]>, principal: impl AsRef<[u8]>) -> Self {
        Scope {
            operation: operation.as_ref().into(),
            principal: principal.as_ref().into(),
        }
    }

    /// The operation's bytes.
    pub fn operation(&self) -> &[u8] {
        &self.operation
    }

    /// The principal's bytes.
    pub fn principal(&self) -> &[u8] {
        &self.principal
    }
}

impl fmt::Debug for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scope")
            .field("operation", &String::from_utf8_lossy(&self.operation))
            .field("principal", &String::from_utf8_lossy(&self.principal))
            .finish()
    }
}

/// An idempotency key: the bytes that name one intent within a [`Scope`].
///
/// Use [`Key::new`] for a client-minted key (a UUID from an `Idempotency-Key` header, a message
/// id) and [`Key::from_parts`] for a natural key built from several fields.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key(Box<[u8]>);

impl Key {
    /// A key from its bytes, as given.
    pub fn new(bytes: impl AsRef<[u8]>) -> Self {
        Key(bytes.as_ref().into())
    }

    /// A natural key from several parts, encoded unambiguously: each part is prefixed with its
    /// length (4 bytes, big-endian), so `("ab", "c")` and `("a", "bc")` differ.
    ///
    /// ```
    /// use idemdb_core::Key;
    /// let charge = Key::from_parts(["user-7", "content-99", "2026-11"]);
    /// assert_ne!(Key::from_parts(["ab", "c"]), Key::from_parts(["a", "bc"]));
    /// assert_ne!(charge, Key::new("user-7content-992026-11"));
    /// ```
    ///
    /// A part longer than `u32::MAX` bytes cannot be represented; such a key is rejected when it
    /// is used, as it is far beyond any configurable key limit.
    pub fn from_parts<I, P>(parts: I) -> Self
    where
        I: IntoIterator<Item = P>,
        P: AsRef<[u8]>,
    {
        let mut out = Vec::new();
        for part in parts {
            let part = part.as_ref();
            let len = u32::try_from(part.len()).unwrap_or(u32::MAX);
            out.extend_from_slice(&len.to_be_bytes());
            out.extend_from_slice(part);
        }
        Key(out.into())
    }

    /// The key's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Key({})",
            String::from_utf8_lossy(&self.0).escape_debug()
        )
    }
}

impl From<&str> for Key {
    fn from(s: &str) -> Self {
        Key::new(s)
    }
}

impl From<String> for Key {
    fn from(s: String) -> Self {
        Key(s.into_bytes().into())
    }
}

impl From<&[u8]> for Key {
    fn from(b: &[u8]) -> Self {
        Key::new(b)
    }
}

impl From<Vec<u8>> for Key {
    fn from(b: Vec<u8>) -> Self {
        Key(b.into())
    }
}

/// The encoded identity of a record, in either store: the key of the embedded engine's
/// records tables, and what PostgreSQL rows are found by.
///
/// Layout: `u16 BE len(operation) | operation | u16 BE len(principal) | principal | key`. The
/// two length prefixes make the encoding injective; the key runs to the end. All records of one
/// operation share a prefix, so they can be scanned as a range.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RecordKey(Box<[u8]>);

impl RecordKey {
    /// Validates the parts against `limits` and encodes them.
    pub fn encode(scope: &Scope, key: &Key, limits: &Limits) -> Result<Self, InputError> {
        let op = scope.operation();
        let principal = scope.principal();
        let key = key.as_bytes();
        check_len("operation", op.len(), 1, limits.max_operation_len)?;
        check_len("principal", principal.len(), 0, limits.max_principal_len)?;
        check_len("key", key.len(), 1, limits.max_key_len)?;
        let mut out = Vec::with_capacity(4 + op.len() + principal.len() + key.len());
        for part in [op, principal] {
            // check_len capped both at Limits::MAX_PART_LEN, which fits in a u16.
            let len = u16::try_from(part.len()).map_err(|_| InputError::TooLong {
                what: "scope part",
                len: part.len(),
                max: usize::from(u16::MAX),
            })?;
            out.extend_from_slice(&len.to_be_bytes());
            out.extend_from_slice(part);
        }
        out.extend_from_slice(key);
        Ok(RecordKey(out.into()))
    }

    /// A key as a store read it back (no check: it was encoded before it was stored).
    pub fn from_stored(bytes: &[u8]) -> Self {
        RecordKey(bytes.into())
    }

    /// The encoded bytes, as stored.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// Splits a stored key back into (operation, principal, key); `None` if malformed.
    pub fn split(bytes: &[u8]) -> Option<(&[u8], &[u8], &[u8])> {
        let (op, rest) = take_prefixed(bytes)?;
        let (principal, key) = take_prefixed(rest)?;
        Some((op, principal, key))
    }
}

impl fmt::Debug for RecordKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match RecordKey::split(&self.0) {
            Some((op, principal, key)) => write!(
                f,
                "RecordKey({} / {} / {})",
                String::from_utf8_lossy(op),
                String::from_utf8_lossy(principal),
                String::from_utf8_lossy(key)
            ),
            None => write!(f, "RecordKey(<malformed>)"),
        }
    }
}

fn take_prefixed(bytes: &[u8]) -> Option<(&[u8], &[u8])> {
    let len_bytes: [u8; 2] = bytes.get(..2)?.try_into().ok()?;
    let len = usize::from(u16::from_be_bytes(len_bytes));
    let body = bytes.get(2..2 + len)?;
    Some((body, &bytes[2 + len..]))
}

fn check_len(what: &'static str, len: usize, min: usize, max: usize) -> Result<(), InputError> {
    if len < min {
        return Err(InputError::Empty { what });
    }
    if len > max {
        return Err(InputError::TooLong { what, len, max });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoding_is_injective_across_parts() {
        let l = Limits::default();
        let a = RecordKey::encode(&Scope::new("ab", "c"), &Key::new("k"), &l).unwrap();
        let b = RecordKey::encode(&Scope::new("a", "bc"), &Key::new("k"), &l).unwrap();
        let c = RecordKey::encode(&Scope::new("a", "b"), &Key::new("ck"), &l).unwrap();
        assert_ne!(a, b);
        assert_ne!(b, c);
        assert_eq!(
            RecordKey::split(a.as_bytes()),
            Some((&b"ab"[..], &b"c"[..], &b"k"[..]))
        );
    }

    #[test]
    fn limits_are_enforced() {
        let l = Limits::default();
        let long = vec![b'x'; l.max_key_len + 1];
        assert!(matches!(
            RecordKey::encode(&Scope::new("op", "p"), &Key::new(&long), &l),
            Err(InputError::TooLong { what: "key", .. })
        ));
        assert!(matches!(
            RecordKey::encode(&Scope::new("", "p"), &Key::new("k"), &l),
            Err(InputError::Empty { what: "operation" })
        ));
        assert!(RecordKey::encode(&Scope::new("op", ""), &Key::new("k"), &l).is_ok());
    }

    #[test]
    fn split_rejects_truncated() {
        assert_eq!(RecordKey::split(&[0, 5, b'a']), None);
        assert_eq!(RecordKey::split(&[0]), None);
    }
}
