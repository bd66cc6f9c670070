//! Expected outcomes of reservations: variants, not errors.

use std::time::Duration;

use crate::token::Reservation;

/// What a reservation found, checked in this order.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum ReserveOutcome {
    /// No live record existed (or its lease had expired): the caller owns the intent now and
    /// must run it, then complete, fail or release. The IN_PROGRESS record is durable.
    Acquired(Reservation),
    /// A record exists for this key with a different payload fingerprint: a client bug or
    /// tampering (HTTP 422). The stored result is never returned for a different request.
    Mismatch,
    /// The intent already completed: its first response, byte for byte.
    Completed(Vec<u8>),
    /// The intent already failed deterministically: the stored failure, byte for byte. It is
    /// never re-executed.
    Failed(Vec<u8>),
    /// Another caller holds a live lease (HTTP 409 with `Retry-After`): do not execute.
    InProgress {
        /// Time left on the owner's lease: when a retry may find the record finished or may
        /// take it over.
        retry_after: Duration,
    },
    /// The key's earlier record expired or was dropped and is still recognised (a redrive
    /// older than the retention), and the policy is
    /// [`BeyondHorizonPolicy::Refuse`](crate::BeyondHorizonPolicy::Refuse): nothing ran and
    /// nothing was written. Under the default policy the key is acquired instead, flagged by
    /// [`Reservation::is_beyond_horizon`].
    BeyondHorizon,
}

/// How an execution ended, as decided by the caller: both are stored and replayed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Success; the bytes are the response to replay (e.g. status + headers + body).
    Completed(Vec<u8>),
    /// A deterministic failure (a declined card); replayed to every duplicate, never re-run.
    Failed(Vec<u8>),
}

impl Outcome {
    /// The response bytes.
    pub fn response(&self) -> &[u8] {
        match self {
            Outcome::Completed(b) | Outcome::Failed(b) => b,
        }
    }
}

/// What a one-shot `execute` did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum ExecuteOutcome {
    /// The closure ran; its writes and the finished record committed together.
    Executed(Outcome),
    /// A record with another payload fingerprint exists (HTTP 422); nothing ran.
    Mismatch,
    /// A duplicate of a completed intent: the first response, byte for byte; nothing ran.
    Completed(Vec<u8>),
    /// A duplicate of a failed intent: the stored failure, byte for byte; nothing ran.
    Failed(Vec<u8>),
    /// A two-step owner holds a live lease on this key; nothing ran.
    InProgress {
        /// Time left on the owner's lease.
        retry_after: Duration,
    },
    /// A recognised key beyond the retention, refused by policy; see
    /// [`ReserveOutcome::BeyondHorizon`]. Nothing ran.
    BeyondHorizon,
}
