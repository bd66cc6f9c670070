//! Inbox dedupe for message consumers, the part every store shares: the names of a message's
//! record and what a consumer is told. The handler's transaction is each store's own.

use std::time::Duration;

use crate::error::InputError;
use crate::outcome::ExecuteOutcome;
use crate::scope::{Key, Scope};

/// What an inbox's `consume` did with a message.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum Consumed {
    /// First delivery: the handler ran and its writes committed with the dedupe record.
    Processed,
    /// A redelivery of a message already processed: the handler did not run.
    Duplicate,
    /// Another owner holds the message id under this scope with a two-step reservation (not
    /// an inbox's doing): retry after this.
    InProgress {
        /// Time left on that owner's lease.
        retry_after: Duration,
    },
    /// The message is older than its retention and refused by
    /// [`BeyondHorizonPolicy::Refuse`](crate::BeyondHorizonPolicy::Refuse).
    BeyondHorizon,
}

/// Every inbox record carries this payload, so a message id never mismatches itself.
pub const INBOX_PAYLOAD: &[u8] = b"";

/// The scope and key of a consumer's message: the consumer's name is the scope, the
/// producer's message id the key.
pub fn names(consumer: &str, message_id: &[u8]) -> (Scope, Key) {
    (Scope::new(consumer, ""), Key::new(message_id))
}

/// What an inbox tells its caller of an `execute`'s outcome. A mismatch means another
/// writer uses the consumer's scope with payloads of its own: refused as misuse.
pub fn consumed(consumer: &str, outcome: ExecuteOutcome) -> Result<Consumed, InputError> {
    Ok(match outcome {
        ExecuteOutcome::Executed(_) => Consumed::Processed,
        ExecuteOutcome::Completed(_) | ExecuteOutcome::Failed(_) => Consumed::Duplicate,
        ExecuteOutcome::InProgress { retry_after } => Consumed::InProgress { retry_after },
        ExecuteOutcome::BeyondHorizon => Consumed::BeyondHorizon,
        ExecuteOutcome::Mismatch => {
            return Err(InputError::ConsumerScopeShared {
                consumer: consumer.to_string(),
            });
        }
    })
}
