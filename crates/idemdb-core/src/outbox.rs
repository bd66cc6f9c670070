//! The transactional outbox, shared by the stores: what a closure stages in its record's
//! commit ([`Message`]), the stable id every delivery carries ([`MessageId`]), what a
//! publisher is handed ([`OutboxMessage`]) and what it answers ([`PublishError`]).
//! docs/semantics.md §13 gives the delivery guarantee.

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use crate::error::InputError;
use crate::limits::Limits;
use crate::scope::RecordKey;

/// A message to send once the commit that stages it is durable: a destination the
/// dispatcher routes on, an optional ordering key, headers and a payload.
///
/// Messages with the same ordering key are delivered in commit order; a message without one
/// is ordered against nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    destination: String,
    ordering_key: Option<Vec<u8>>,
    headers: Vec<(String, Vec<u8>)>,
    payload: Vec<u8>,
}

impl Message {
    /// A message to `destination` (must not be empty) carrying `payload`.
    pub fn new(destination: impl Into<String>, payload: impl Into<Vec<u8>>) -> Self {
        Message {
            destination: destination.into(),
            ordering_key: None,
            headers: Vec::new(),
            payload: payload.into(),
        }
    }

    /// Delivers this message after every earlier-committed message with the same key.
    pub fn ordering_key(mut self, key: impl Into<Vec<u8>>) -> Self {
        self.ordering_key = Some(key.into());
        self
    }

    /// Sets or clears the ordering key.
    pub fn with_ordering_key(mut self, key: Option<Vec<u8>>) -> Self {
        self.ordering_key = key;
        self
    }

    /// Adds a header (kept in the order added).
    pub fn header(mut self, name: impl Into<String>, value: impl Into<Vec<u8>>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Where the dispatcher sends it.
    pub fn destination(&self) -> &str {
        &self.destination
    }

    /// Its ordering key, if any.
    pub fn key(&self) -> Option<&[u8]> {
        self.ordering_key.as_deref()
    }

    /// Its headers, in the order added.
    pub fn headers(&self) -> &[(String, Vec<u8>)] {
        &self.headers
    }

    /// Its payload.
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }

    /// The bytes [`Limits::max_message_len`] bounds: payload, ordering key, header names
    /// and values.
    pub fn len(&self) -> usize {
        let headers: usize = self.headers.iter().map(|(n, v)| n.len() + v.len()).sum();
        self.payload.len() + self.ordering_key.as_ref().map_or(0, Vec::len) + headers
    }

    /// Whether the message carries no bytes at all (its destination aside).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Refuses what no store may stage: an empty or over-long destination, a message over
    /// `limits.max_message_len`, or one that would be message number `index` (from 0) of a
    /// commit allowed `limits.max_messages_per_commit`.
    pub fn check(&self, index: usize, limits: &Limits) -> Result<(), InputError> {
        if self.destination.is_empty() {
            return Err(InputError::Empty {
                what: "message destination",
            });
        }
        if self.destination.len() > Limits::MAX_PART_LEN {
            return Err(InputError::TooLong {
                what: "message destination",
                len: self.destination.len(),
                max: Limits::MAX_PART_LEN,
            });
        }
        if self.headers.len() > Limits::MAX_PART_LEN {
            return Err(InputError::TooMany {
                what: "message headers",
                count: self.headers.len(),
                max: Limits::MAX_PART_LEN,
            });
        }
        if let Some((name, _)) = self
            .headers
            .iter()
            .find(|(n, _)| n.len() > Limits::MAX_PART_LEN)
        {
            return Err(InputError::TooLong {
                what: "message header name",
                len: name.len(),
                max: Limits::MAX_PART_LEN,
            });
        }
        if self.len() > limits.max_message_len {
            return Err(InputError::TooLong {
                what: "message",
                len: self.len(),
                max: limits.max_message_len,
            });
        }
        if index >= limits.max_messages_per_commit {
            return Err(InputError::TooMany {
                what: "messages staged in one commit",
                count: index.saturating_add(1),
                max: limits.max_messages_per_commit,
            });
        }
        Ok(())
    }
}

/// A staged message's id: derived from its record's key and its place among the messages
/// that record's commit staged, so a retried intent that stages again (after a takeover, or
/// a rolled-back attempt) produces the same ids. Send it with the message: it is the
/// receiver's inbox key.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MessageId([u8; 16]);

impl MessageId {
    /// The id of message number `index` (from 0) staged with the record `record`.
    pub fn derive(record: &RecordKey, index: u32) -> Self {
        let mut input = Vec::with_capacity(record.as_bytes().len() + 16);
        input.extend_from_slice(b"idemdb-outbox/1\0");
        input.extend_from_slice(&index.to_be_bytes());
        input.extend_from_slice(record.as_bytes());
        MessageId(xxhash_rust::xxh3::xxh3_128(&input).to_be_bytes())
    }

    /// The id as stored.
    pub fn from_bytes(bytes: [u8; 16]) -> Self {
        MessageId(bytes)
    }

    /// The id's 16 bytes.
    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// Parses the 32 lowercase or uppercase hex digits [`Display`](fmt::Display) writes.
    pub fn parse(text: &str) -> Option<Self> {
        if text.len() != 32 {
            return None;
        }
        let mut out = [0u8; 16];
        for (i, byte) in out.iter_mut().enumerate() {
            *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(MessageId(out))
    }
}

impl fmt::Display for MessageId {
    /// 32 lowercase hex digits.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl fmt::Debug for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MessageId({self})")
    }
}

/// A staged message as the publisher (and an operator's listing) sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct OutboxMessage {
    /// Its stable id (the receiver's dedupe key).
    pub id: MessageId,
    /// Its place in commit order: later commits stage higher numbers.
    pub seq: u64,
    /// Where it goes.
    pub destination: String,
    /// Its ordering key.
    pub ordering_key: Option<Vec<u8>>,
    /// Its headers.
    pub headers: Vec<(String, Vec<u8>)>,
    /// Its payload.
    pub payload: Vec<u8>,
    /// The store's time of the commit that staged it, ms since the epoch.
    pub staged_at_ms: u64,
    /// Publish attempts that failed so far.
    pub attempts: u32,
    /// The last attempt's error, if one failed.
    pub last_error: Option<String>,
}

impl OutboxMessage {
    /// `message` as staged under `seq` at `staged_at_ms`, not yet attempted. For store
    /// implementations.
    pub fn staged(id: MessageId, seq: u64, message: Message, staged_at_ms: u64) -> Self {
        let Message {
            destination,
            ordering_key,
            headers,
            payload,
        } = message;
        OutboxMessage {
            id,
            seq,
            destination,
            ordering_key,
            headers,
            payload,
            staged_at_ms,
            attempts: 0,
            last_error: None,
        }
    }
}

/// A publisher's failure: a transient one is retried with backoff (up to the attempt cap,
/// then the message is parked); a permanent one parks the message at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PublishError {
    /// Worth retrying: a broker or endpoint down, a timeout.
    Transient(String),
    /// Never worth retrying: the message is refused for what it is (a poison message).
    Permanent(String),
}

impl PublishError {
    /// The publisher's own words, as stored with the message (`last_error`).
    pub fn into_reason(self) -> String {
        match self {
            PublishError::Transient(why) | PublishError::Permanent(why) => why,
        }
    }
}

impl fmt::Display for PublishError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PublishError::Transient(why) => write!(f, "transient publish failure: {why}"),
            PublishError::Permanent(why) => write!(f, "permanent publish failure: {why}"),
        }
    }
}

impl std::error::Error for PublishError {}

/// What sends a staged message to the world. Return `Ok` only once the destination has it:
/// the message is then marked delivered, and never sent again unless that mark is lost to a
/// crash (at least once, docs/semantics.md §13).
pub trait Publish: Send + 'static {
    /// Sends one message.
    fn publish(&mut self, message: &OutboxMessage) -> Result<(), PublishError>;
}

impl<F> Publish for F
where
    F: FnMut(&OutboxMessage) -> Result<(), PublishError> + Send + 'static,
{
    fn publish(&mut self, message: &OutboxMessage) -> Result<(), PublishError> {
        self(message)
    }
}

/// The future an [`AsyncPublish`] returns.
pub type PublishFuture = Pin<Box<dyn Future<Output = Result<(), PublishError>> + Send + 'static>>;

/// An async publisher (PostgreSQL's `PgDispatcher` runs it on the store's runtime): any
/// `FnMut(OutboxMessage) -> impl Future<Output = Result<(), PublishError>>`. Return `Ok`
/// only once the destination has the message, as for [`Publish`]. A future that panics counts
/// as a transient failure.
pub trait AsyncPublish: Send + 'static {
    /// Sends one message.
    fn publish(&mut self, message: OutboxMessage) -> PublishFuture;
}

impl<F, Fut> AsyncPublish for F
where
    F: FnMut(OutboxMessage) -> Fut + Send + 'static,
    Fut: Future<Output = Result<(), PublishError>> + Send + 'static,
{
    fn publish(&mut self, message: OutboxMessage) -> PublishFuture {
        Box::pin(self(message))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scope::{Key, Scope};

    fn record(key: &str) -> RecordKey {
        RecordKey::encode(&Scope::new("op", "p"), &Key::new(key), &Limits::default()).unwrap()
    }

    #[test]
    fn an_id_depends_on_the_record_and_the_index_only() {
        let a = MessageId::derive(&record("k1"), 0);
        assert_eq!(a, MessageId::derive(&record("k1"), 0));
        assert_ne!(a, MessageId::derive(&record("k1"), 1));
        assert_ne!(a, MessageId::derive(&record("k2"), 0));
        assert_eq!(MessageId::parse(&a.to_string()), Some(a));
        assert_eq!(MessageId::parse(&a.to_string().to_uppercase()), Some(a));
        assert_eq!(MessageId::parse("xyz"), None);
        assert_eq!(MessageId::parse(&"g".repeat(32)), None);
    }

    #[test]
    fn check_refuses_what_no_store_stages() {
        let limits = Limits {
            max_message_len: 8,
            max_messages_per_commit: 2,
            ..Limits::default()
        };
        let ok = Message::new("orders", b"1234".to_vec()).ordering_key(b"k".to_vec());
        assert_eq!(ok.check(1, &limits), Ok(()));
        assert!(matches!(
            Message::new("", b"x".to_vec()).check(0, &limits),
            Err(InputError::Empty { .. })
        ));
        let long = Message::new("orders", b"1234".to_vec()).header("h", b"1234".to_vec());
        assert!(matches!(
            long.check(0, &limits),
            Err(InputError::TooLong { len: 9, max: 8, .. })
        ));
        assert!(matches!(
            ok.check(2, &limits),
            Err(InputError::TooMany {
                count: 3,
                max: 2,
                ..
            })
        ));
    }
}
