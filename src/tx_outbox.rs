//! Staging outbox messages in a closure's transaction, and the dispatcher's own writes to the
//! outbox tables (delivered, retried later, parked, put back), all logged as a registered
//! table's writes are: durable with the batch's frame, replayed at open.

use idemdb_core::error::Refusal;
use idemdb_core::outbox::{Message, MessageId, OutboxMessage};
use redb::{ReadableTable, TableDefinition, TableHandle};
use std::sync::Arc;

use crate::engine_tables::{OUTBOX, OUTBOX_PARKED};
use crate::error::{Error, InputError};
use crate::outbox_row::OutboxRow;
use crate::tx::Tx;
use crate::tx_table::TxTable;

impl Tx<'_> {
    /// Stages `message` in this transaction: it is stored with the record and the caller's
    /// writes, or not at all if the closure returns `Err`; once the commit is durable, the
    /// dispatcher ([`Dispatcher`](crate::Dispatcher)) delivers it at least once.
    ///
    /// Returns its id, derived from the record and the message's place among this commit's
    /// messages: a retry of the same intent that stages the same messages in the same order
    /// stages the same ids, whoever runs it. Send it as the receiver's dedupe key.
    ///
    /// Refused with nothing staged ([`Error::Refused`] with an [`InputError`]): an empty
    /// destination, a message over [`Limits::max_message_len`](crate::Limits), more than
    /// [`Limits::max_messages_per_commit`](crate::Limits) messages, or a transaction without
    /// a record (`run`).
    ///
    /// ```
    /// # use idemdb::{IdemDb, Scope, Key, Outcome, Message};
    /// # let dir = tempfile::tempdir()?;
    /// # let db = IdemDb::open(dir.path().join("db"))?;
    /// db.execute(&Scope::new("order", "u1"), &Key::new("k1"), b"req", |tx| {
    ///     tx.stage(Message::new("order-created", b"{\"order\":\"k1\"}".to_vec())
    ///         .ordering_key(b"u1".to_vec()))?;
    ///     Ok::<_, idemdb::Error>(Outcome::Completed(b"201".to_vec()))
    /// })?;
    /// assert_eq!(db.outbox_stats()?.backlog, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn stage(&self, message: Message) -> Result<MessageId, Error> {
        let refused = |e: InputError| Error::Refused(Refusal::InvalidInput(e));
        let record = self
            .record
            .ok_or_else(|| refused(InputError::StagedWithoutRecord))?;
        let index = self.staged.get();
        message
            .check(
                usize::try_from(index).unwrap_or(usize::MAX),
                self.env.limits,
            )
            .map_err(refused)?;
        let id = MessageId::derive(record, index);
        let seq = self.env.outbox.allocate();
        let row = OutboxRow {
            message: OutboxMessage::staged(id, seq, message, self.env.now_ms),
            next_attempt_ms: 0,
        };
        self.outbox_table(OUTBOX)?
            .insert(seq, row.encode().as_slice())?;
        self.staged.set(index.saturating_add(1));
        Ok(id)
    }

    /// One of the outbox tables, its writes logged.
    fn outbox_table(
        &self,
        table: TableDefinition<'static, u64, &'static [u8]>,
    ) -> Result<TxTable<'_, u64, &'static [u8]>, Error> {
        Ok(TxTable::new(
            self.txn.open_table(table)?,
            Arc::from(table.name()),
            true,
            &self.log,
        ))
    }

    /// Removes delivered messages (a message already gone, parked meanwhile by an operator,
    /// is left where it is).
    pub(crate) fn outbox_delivered(&self, seqs: &[u64]) -> Result<(), Error> {
        let mut table = self.outbox_table(OUTBOX)?;
        for seq in seqs {
            table.remove(*seq)?;
        }
        Ok(())
    }

    /// Rewrites a pending message's delivery state (a failed attempt), if it is still
    /// pending.
    pub(crate) fn outbox_retry_later(&self, row: &OutboxRow) -> Result<(), Error> {
        let mut table = self.outbox_table(OUTBOX)?;
        if table.get(row.message.seq)?.is_some() {
            table.insert(row.message.seq, row.encode().as_slice())?;
        }
        Ok(())
    }

    /// Moves a message from the pending table to the parked one, with its last error; false
    /// if it was not pending.
    pub(crate) fn outbox_park(&self, row: &OutboxRow) -> Result<bool, Error> {
        let seq = row.message.seq;
        if self.outbox_table(OUTBOX)?.remove(seq)?.is_none() {
            return Ok(false);
        }
        self.outbox_table(OUTBOX_PARKED)?
            .insert(seq, row.encode().as_slice())?;
        Ok(true)
    }

    /// Moves a parked message back to the pending table, its attempts reset, under its own
    /// sequence number (so it keeps its place before later messages of its key); false if it
    /// was not parked.
    pub(crate) fn outbox_unpark(&self, seq: u64) -> Result<bool, Error> {
        let Some(bytes) = self
            .outbox_table(OUTBOX_PARKED)?
            .remove(seq)?
            .map(|v| v.value().to_vec())
        else {
            return Ok(false);
        };
        let mut row = OutboxRow::decode(seq, &bytes)?;
        row.message.attempts = 0;
        row.next_attempt_ms = 0;
        self.outbox_table(OUTBOX)?
            .insert(seq, row.encode().as_slice())?;
        Ok(true)
    }

    /// Removes parked messages; how many were.
    pub(crate) fn outbox_purge_parked(&self, seqs: &[u64]) -> Result<u64, Error> {
        let mut table = self.outbox_table(OUTBOX_PARKED)?;
        let mut purged = 0;
        for seq in seqs {
            if table.remove(*seq)?.is_some() {
                purged += 1;
            }
        }
        Ok(purged)
    }
}
