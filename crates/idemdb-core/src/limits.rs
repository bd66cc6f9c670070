//! The input limits both stores check before anything is written.

use crate::error::InputError;

/// Size limits on input, checked before anything is written.
///
/// Oversized or empty-where-not-allowed input is refused with
/// an [`InputError`] (in either store's error, as `InvalidInput`) and nothing is written.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Limits {
    /// Longest operation name, in bytes (default 256; at most 65,535). Must not be empty.
    pub max_operation_len: usize,
    /// Longest principal, in bytes (default 256; at most 65,535). May be empty.
    pub max_principal_len: usize,
    /// Longest key, in bytes, after [`Key::from_parts`](crate::Key::from_parts) encoding
    /// (default 1,024). Must not be empty.
    pub max_key_len: usize,
    /// Largest stored response, in bytes (default 1 MiB). May be empty.
    pub max_response_len: usize,
    /// Largest outbox message, in bytes: payload, ordering key and headers (default 1 MiB;
    /// at most 1 GiB).
    pub max_message_len: usize,
    /// Most outbox messages one commit may stage (default 64). Must not be zero.
    pub max_messages_per_commit: usize,
}

impl Limits {
    /// The hard cap on an operation or principal: their length is stored in 2 bytes.
    pub const MAX_PART_LEN: usize = u16::MAX as usize;
    /// The hard cap on a response: redb stores values of at most 3 GiB; we stop well short.
    pub const MAX_RESPONSE_LEN: usize = 1 << 30;

    /// Whether these limits are within the hard caps, and the ones that must be are nonzero.
    pub fn validate(&self) -> Result<(), InputError> {
        let caps = [
            (
                "max_operation_len",
                self.max_operation_len,
                Self::MAX_PART_LEN,
            ),
            (
                "max_principal_len",
                self.max_principal_len,
                Self::MAX_PART_LEN,
            ),
            ("max_key_len", self.max_key_len, Self::MAX_RESPONSE_LEN),
            (
                "max_response_len",
                self.max_response_len,
                Self::MAX_RESPONSE_LEN,
            ),
            (
                "max_message_len",
                self.max_message_len,
                Self::MAX_RESPONSE_LEN,
            ),
        ];
        let nonzero = [
            ("max_operation_len", self.max_operation_len),
            ("max_key_len", self.max_key_len),
            ("max_messages_per_commit", self.max_messages_per_commit),
        ];
        for (what, len) in nonzero {
            if len == 0 {
                return Err(InputError::Empty { what });
            }
        }
        for (what, len, max) in caps {
            if len > max {
                return Err(InputError::TooLong { what, len, max });
            }
        }
        Ok(())
    }

    /// Refuses a response over [`max_response_len`](Self::max_response_len).
    pub fn check_response(&self, response: &[u8]) -> Result<(), InputError> {
        if response.len() > self.max_response_len {
            return Err(InputError::TooLong {
                what: "response",
                len: response.len(),
                max: self.max_response_len,
            });
        }
        Ok(())
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_operation_len: 256,
            max_principal_len: 256,
            max_key_len: 1024,
            max_response_len: 1 << 20,
            max_message_len: 1 << 20,
            max_messages_per_commit: 64,
        }
    }
}
