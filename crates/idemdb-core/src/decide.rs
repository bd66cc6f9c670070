//! Decisions, separate from the work: what a reservation or an owner's call does, given the
//! record found: the rows of docs/semantics.md, written once for every store (the embedded
//! engine's read path and writer, and PostgreSQL's transactions).

use std::time::Duration;

use crate::error::Refusal;
use crate::fingerprint::Fingerprint;
use crate::outcome::{ExecuteOutcome, ReserveOutcome};
use crate::record::Record;
use crate::state::RecordState;
use crate::token::FencingToken;

/// What a reservation does with the record it found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// No live record: create one.
    Acquire,
    /// An IN_PROGRESS record whose lease ran out: take it over with a new token.
    TakeOver(Record),
    /// Answer without writing.
    Replay(Replay),
}

/// The answer a duplicate gets, written once and converted into each public outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Replay {
    /// Another payload under this key.
    Mismatch,
    /// The stored success.
    Completed(Vec<u8>),
    /// The stored deterministic failure.
    Failed(Vec<u8>),
    /// A live lease, with what is left of it.
    InProgress {
        /// Time left on the owner's lease.
        retry_after: Duration,
    },
}

impl From<Replay> for ReserveOutcome {
    fn from(r: Replay) -> Self {
        match r {
            Replay::Mismatch => ReserveOutcome::Mismatch,
            Replay::Completed(b) => ReserveOutcome::Completed(b),
            Replay::Failed(b) => ReserveOutcome::Failed(b),
            Replay::InProgress { retry_after } => ReserveOutcome::InProgress { retry_after },
        }
    }
}

impl From<Replay> for ExecuteOutcome {
    fn from(r: Replay) -> Self {
        match r {
            Replay::Mismatch => ExecuteOutcome::Mismatch,
            Replay::Completed(b) => ExecuteOutcome::Completed(b),
            Replay::Failed(b) => ExecuteOutcome::Failed(b),
            Replay::InProgress { retry_after } => ExecuteOutcome::InProgress { retry_after },
        }
    }
}

/// Rows of the outcome table in docs/semantics.md, checked top to bottom.
pub fn decide(existing: Option<Record>, fp: Fingerprint, now_ms: u64) -> Decision {
    let Some(rec) = existing else {
        return Decision::Acquire;
    };
    if rec.fingerprint != fp {
        return Decision::Replay(Replay::Mismatch);
    }
    match rec.state {
        RecordState::Completed => Decision::Replay(Replay::Completed(rec.response)),
        RecordState::Failed => Decision::Replay(Replay::Failed(rec.response)),
        RecordState::InProgress if now_ms >= rec.lease_expires_at => Decision::TakeOver(rec),
        RecordState::InProgress => Decision::Replay(Replay::InProgress {
            retry_after: Duration::from_millis(rec.lease_expires_at - now_ms),
        }),
    }
}

/// Checks that `token` owns `existing` and that it is still IN_PROGRESS; the owned record.
///
/// A token that is not the record's current one is fenced when the record's is newer; a token
/// newer than the record's cannot belong to this record at all (it was released and the token
/// came from elsewhere), so the record is unknown to it.
pub fn check_owner(existing: Option<Record>, token: FencingToken) -> Result<Record, Refusal> {
    let Some(rec) = existing else {
        return Err(Refusal::UnknownRecord);
    };
    if rec.token > token {
        return Err(Refusal::Fenced {
            presented: token,
            current: rec.token,
        });
    }
    if rec.token < token {
        return Err(Refusal::UnknownRecord);
    }
    if rec.state != RecordState::InProgress {
        return Err(Refusal::NotInProgress { state: rec.state });
    }
    Ok(rec)
}

/// The IN_PROGRESS record of a new owner: a fresh record, or the takeover of `previous`
/// (whose creation time it keeps and whose attempts it counts on). Its `expires_at` is the
/// store's to set.
pub fn new_owner(
    previous: Option<&Record>,
    fingerprint: Fingerprint,
    token: FencingToken,
    lease_expires_at: u64,
    now_ms: u64,
) -> Record {
    let (created_at, attempts) = match previous {
        Some(prev) => (prev.created_at, prev.attempts.saturating_add(1)),
        None => (now_ms, 1),
    };
    Record {
        state: RecordState::InProgress,
        fingerprint,
        token,
        lease_expires_at,
        created_at,
        updated_at: now_ms,
        attempts,
        expires_at: u64::MAX,
        response: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(state: RecordState, fp: u128, token: u64, lease: u64) -> Record {
        Record {
            state,
            fingerprint: Fingerprint::from_u128(fp),
            token: FencingToken::new(token).unwrap(),
            lease_expires_at: lease,
            created_at: 0,
            updated_at: 0,
            attempts: 1,
            expires_at: u64::MAX,
            response: Vec::new(),
        }
    }

    #[test]
    fn outcome_table_rows() {
        let fp = Fingerprint::from_u128(1);
        let ip = rec(RecordState::InProgress, 1, 5, 100);
        let replay = |r| Decision::Replay(r);
        assert_eq!(decide(None, fp, 0), Decision::Acquire);
        assert_eq!(
            decide(Some(rec(RecordState::Completed, 2, 5, 0)), fp, 0),
            replay(Replay::Mismatch)
        );
        assert_eq!(
            decide(Some(rec(RecordState::InProgress, 2, 5, 0)), fp, 500),
            replay(Replay::Mismatch),
            "mismatch is checked before the lease"
        );
        let mut done = rec(RecordState::Completed, 1, 5, 0);
        done.response = b"ok".to_vec();
        assert_eq!(
            decide(Some(done), fp, 0),
            replay(Replay::Completed(b"ok".to_vec()))
        );
        assert_eq!(
            decide(Some(rec(RecordState::Failed, 1, 5, 0)), fp, 0),
            replay(Replay::Failed(Vec::new()))
        );
        assert_eq!(
            decide(Some(ip.clone()), fp, 40),
            replay(Replay::InProgress {
                retry_after: Duration::from_millis(60)
            })
        );
        assert_eq!(decide(Some(ip.clone()), fp, 100), Decision::TakeOver(ip));
    }

    #[test]
    fn owner_checks() {
        let t = |n| FencingToken::new(n).unwrap();
        let ip = rec(RecordState::InProgress, 1, 5, 100);
        assert_eq!(check_owner(Some(ip.clone()), t(5)).unwrap(), ip);
        assert!(matches!(
            check_owner(Some(ip.clone()), t(4)),
            Err(Refusal::Fenced { .. })
        ));
        assert!(matches!(
            check_owner(Some(ip.clone()), t(6)),
            Err(Refusal::UnknownRecord)
        ));
        assert!(matches!(
            check_owner(None, t(5)),
            Err(Refusal::UnknownRecord)
        ));
        assert!(matches!(
            check_owner(Some(rec(RecordState::Completed, 1, 5, 0)), t(5)),
            Err(Refusal::NotInProgress { .. })
        ));
    }
}
