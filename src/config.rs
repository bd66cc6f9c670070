//! Configurable limits and engine settings.

use crate::error::{Error, InputError};

/// Size limits on input, checked before anything is written.
///
/// Oversized or empty-where-not-allowed input is refused with
/// [`Error::InvalidInput`](crate::Error::InvalidInput) and nothing is written.
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
}

impl Limits {
    /// The hard cap on an operation or principal: their length is stored in 2 bytes.
    pub const MAX_PART_LEN: usize = u16::MAX as usize;
    /// The hard cap on a response: redb stores values of at most 3 GiB; we stop well short.
    pub const MAX_RESPONSE_LEN: usize = 1 << 30;

    pub(crate) fn validate(&self) -> Result<(), Error> {
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
        ];
        for what in ["max_operation_len", "max_key_len"] {
            let len = if what == "max_key_len" {
                self.max_key_len
            } else {
                self.max_operation_len
            };
            if len == 0 {
                return Err(Error::InvalidInput(InputError::Empty { what }));
            }
        }
        for (what, len, max) in caps {
            if len > max {
                return Err(Error::InvalidInput(InputError::TooLong { what, len, max }));
            }
        }
        Ok(())
    }

    pub(crate) fn check_response(&self, response: &[u8]) -> Result<(), Error> {
        if response.len() > self.max_response_len {
            return Err(Error::InvalidInput(InputError::TooLong {
                what: "response",
                len: response.len(),
                max: self.max_response_len,
            }));
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
        }
    }
}

/// Settings of the shared writer, set through [`Builder::max_batch`](crate::Builder::max_batch),
/// [`max_queue`](crate::Builder::max_queue) and
/// [`quick_repair`](crate::Builder::quick_repair).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WriterConfig {
    /// Most operations one commit batch may carry (default 256).
    pub(crate) max_batch: usize,
    /// Most operations waiting for a commit (default 4,096). Past it, callers wait for room
    /// (backpressure); no request is dropped.
    pub(crate) max_queue: usize,
    /// redb's quick-repair on every durable redb commit, i.e. every checkpoint (default off;
    /// see docs/design.md).
    pub(crate) quick_repair: bool,
    /// A checkpoint is taken once this many bytes of frames follow the last one.
    pub(crate) checkpoint_bytes: u64,
    /// ... or once frames are this old (checked by the committer thread).
    pub(crate) checkpoint_interval: std::time::Duration,
    /// Tokens each raise of the durable token ceiling reserves (design.md §7).
    pub(crate) token_block: u64,
    /// The log's size at creation and the unit it grows by (design.md §5.6).
    pub(crate) log_step: u64,
}

/// Tokens reserved on disk at a time (by default): the meta entry `next_token` (meta.rs) is a ceiling
/// above every token issued, raised by a block when issued tokens reach it (by a batch, which
/// then ends with a durable commit), when they come within half a block of it (by a
/// checkpoint), and at every open, so most batches do neither. After a reopen, tokens resume
/// at the ceiling; up to this many are skipped, never reused.
pub(crate) const TOKEN_BLOCK: u64 = 1 << 16;

/// The log file (wal/) preallocated at creation, and the step it grows by (by default): zero-filled,
/// so that an append's `fdatasync` has no block allocation or file size to write.
pub(crate) const GROW_STEP: u64 = 1 << 20;

impl Default for WriterConfig {
    fn default() -> Self {
        WriterConfig {
            max_batch: 256,
            max_queue: 4096,
            quick_repair: false,
            checkpoint_bytes: 16 << 20,
            checkpoint_interval: std::time::Duration::from_secs(1),
            token_block: TOKEN_BLOCK,
            log_step: GROW_STEP,
        }
    }
}
