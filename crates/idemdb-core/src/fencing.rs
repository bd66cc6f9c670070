//! The fencing token: strictly increasing across the database and its restarts.

use std::fmt;
use std::num::NonZeroU64;

/// A fencing token: issued with every reservation and takeover, strictly increasing across the
/// whole database and across restarts. Every state change by an owner presents it; a record
/// whose token is higher refuses the change.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FencingToken(NonZeroU64);

impl FencingToken {
    /// A token from its number; `None` for 0, which is never issued.
    pub const fn new(value: u64) -> Option<Self> {
        match NonZeroU64::new(value) {
            Some(v) => Some(FencingToken(v)),
            None => None,
        }
    }

    /// The token as a number, e.g. to pass downstream.
    pub const fn get(self) -> u64 {
        self.0.get()
    }
}

impl fmt::Debug for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FencingToken({})", self.0)
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}
