//! The reservation: proof of ownership that carries a fencing token.

use std::fmt;

pub use crate::fencing::FencingToken;
use crate::scope::RecordKey;

/// Proof of ownership of an IN_PROGRESS record, returned by a successful reservation.
///
/// Pass it to the store's `complete`, `fail`, `release`, `extend` or `complete_with`. Once
/// another caller has taken the record over after the lease expired, these are refused with
/// [`Refusal::Fenced`](crate::Refusal::Fenced). A reservation belongs to the database that
/// issued it, across reopens (a byte copy of an embedded file keeps the identity): presented to
/// another database it is refused with
/// [`Refusal::ForeignReservation`](crate::Refusal::ForeignReservation), and nothing changes.
///
/// Only a store issues one; the fields are read through methods. (A store's side of it, hidden
/// from these docs, is described in docs/stores.md.)
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Reservation {
    /// The database that issued it: owner calls on another database are refused.
    database_id: u64,
    record_key: RecordKey,
    token: FencingToken,
    lease_expires_at: u64,
    attempt: u32,
    takeover: bool,
    beyond_horizon: bool,
}

/// What a store knows when it grants ownership: the parts of a [`Reservation`]. For store
/// implementations only (docs/stores.md).
#[doc(hidden)]
#[derive(Debug, Clone)]
pub struct Grant {
    /// The issuing database's identity ([`database_id`](crate::fingerprint::database_id)).
    pub database_id: u64,
    /// The record owned.
    pub record_key: RecordKey,
    /// The token of this acquisition, above every token issued before.
    pub token: FencingToken,
    /// When the lease runs out, ms since the epoch.
    pub lease_expires_at: u64,
    /// The record's acquisitions, this one included.
    pub attempt: u32,
    /// Whether an expired lease of an earlier owner was taken over.
    pub takeover: bool,
    /// Whether the key was recognised beyond the retention.
    pub beyond_horizon: bool,
}

impl Reservation {
    /// The reservation a store hands to the caller it made the owner. For store
    /// implementations only, after the grant is durable: a reservation built by anyone else
    /// (from a token read with `get`, say) passes the store's fencing check as the owner's
    /// would, and finishing an intent with it breaks exactly-once (docs/stores.md).
    #[doc(hidden)]
    pub fn issue(grant: Grant) -> Reservation {
        let Grant {
            database_id,
            record_key,
            token,
            lease_expires_at,
            attempt,
            takeover,
            beyond_horizon,
        } = grant;
        Reservation {
            database_id,
            record_key,
            token,
            lease_expires_at,
            attempt,
            takeover,
            beyond_horizon,
        }
    }

    /// The database that issued it: owner calls on another database are refused.
    pub fn database_id(&self) -> u64 {
        self.database_id
    }

    /// The record it owns.
    pub fn record_key(&self) -> &RecordKey {
        &self.record_key
    }

    /// Records a renewed lease. For store implementations, after the renewal is durable; the
    /// store's own record decides ownership, never this copy (docs/stores.md).
    #[doc(hidden)]
    pub fn renewed(&mut self, lease_expires_at: u64) {
        self.lease_expires_at = lease_expires_at;
    }

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
