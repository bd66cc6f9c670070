//! The reservation: proof of ownership that carries a fencing token.

use std::fmt;

pub use crate::fencing::FencingToken;
use crate::scope::RecordKey;

/// Proof of ownership of an IN_PROGRESS record, returned by a successful reservation.
///
/// Pass it to [`complete`](crate::IdemDb::complete), [`fail`](crate::IdemDb::fail),
/// [`release`](crate::IdemDb::release), [`extend`](crate::IdemDb::extend) or
/// [`complete_with`](crate::IdemDb::complete_with). Once another caller has taken the record over
/// after the lease expired, these are refused with [`Error::Fenced`](crate::Error::Fenced).
/// A reservation belongs to the database that issued it, across reopens of that file (a
/// byte copy of the file keeps the identity): presented to another database it is refused
/// with [`Error::ForeignReservation`](crate::Error::ForeignReservation), and nothing changes.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Reservation {
    /// The database that issued it: owner calls on another database are refused.
    pub(crate) database_id: u64,
    pub(crate) record_key: RecordKey,
    pub(crate) token: FencingToken,
    pub(crate) lease_expires_at: u64,
    pub(crate) attempt: u32,
    pub(crate) takeover: bool,
    pub(crate) beyond_horizon: bool,
}

impl Reservation {
    /// The fencing token; pass it downstream with the key so the outside system can fence too.
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// When the lease runs out, ms since the epoch; after it, a duplicate may take over.
    pub fn lease_expires_at(&self) -> u64 {
        self.lease_expires_at
    }

    /// How many times this record has been acquired, this time included (1 on the first).
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// Whether this reservation took over an expired lease of an earlier owner, whose work may
    /// have partly run: the operation must be safe to resume or must be reconciled.
    pub fn is_takeover(&self) -> bool {
        self.takeover
    }

    /// Whether the key had a record that expired, or was dropped and is still recognised: the
    /// request is a duplicate older than the retention (a late redrive), acquired as new
    /// under [`BeyondHorizonPolicy::Flag`](crate::BeyondHorizonPolicy::Flag). Worth logging
    /// or reconciling; the earlier response is gone.
    pub fn is_beyond_horizon(&self) -> bool {
        self.beyond_horizon
    }
}

impl fmt::Debug for Reservation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reservation")
            .field("record", &self.record_key)
            .field("token", &self.token)
            .field("lease_expires_at", &self.lease_expires_at)
            .field("attempt", &self.attempt)
            .field("takeover", &self.takeover)
            .field("beyond_horizon", &self.beyond_horizon)
            .finish()
    }
}
