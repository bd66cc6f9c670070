//! The outbox seen from outside: its stats, the pending and parked messages, and the
//! operator's tools (retry or park one, purge the parked). Staging is `Tx::stage`
//! (tx_outbox.rs); delivery is the [`Dispatcher`](crate::Dispatcher) (dispatch.rs).

use std::sync::atomic::Ordering;
use std::time::Duration;

use redb::{ReadTransaction, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableError};

use crate::db::IdemDb;
use crate::engine_tables::{OUTBOX, OUTBOX_PARKED};
use crate::error::{Error, ExecuteError};
use crate::outbox_row::OutboxRow;
use crate::reentry::refuse_reentry;
use crate::tx::Tx;
use idemdb_core::dispatch::OutboxStats;
use idemdb_core::outbox::{MessageId, OutboxMessage};

impl IdemDb {
    /// The outbox's backlog, parked messages, oldest undelivered age and delivery counters.
    pub fn outbox_stats(&self) -> Result<OutboxStats, Error> {
        let read = self.durable_read()?;
        let now = self.engine.clock.now_ms();
        let (backlog, oldest) = match open(&read, OUTBOX)? {
            Some(t) => {
                let oldest = match t.first()? {
                    Some((seq, v)) => Some(OutboxRow::decode(seq.value(), v.value())?),
                    None => None,
                };
                (t.len()?, oldest)
            }
            None => (0, None),
        };
        let parked = match open(&read, OUTBOX_PARKED)? {
            Some(t) => t.len()?,
            None => 0,
        };
        let state = &self.engine.outbox;
        let mut stats = OutboxStats::default();
        stats.backlog = backlog;
        stats.parked = parked;
        stats.oldest_undelivered_age =
            oldest.map(|r| Duration::from_millis(now.saturating_sub(r.message.staged_at_ms)));
        stats.delivered = state.delivered.load(Ordering::Relaxed);
        stats.retried = state.retried.load(Ordering::Relaxed);
        stats.parked_since_open = state.parked.load(Ordering::Relaxed);
        stats.publish_latency_us = state.latency_us.lock().clone();
        Ok(stats)
    }

    /// Up to `limit` undelivered messages, oldest commit first (with their failed attempts
    /// and last error).
    pub fn outbox_pending(&self, limit: usize) -> Result<Vec<OutboxMessage>, Error> {
        self.outbox_list(OUTBOX, limit)
    }

    /// Up to `limit` parked messages, oldest commit first, each with the error that parked
    /// it.
    pub fn outbox_parked(&self, limit: usize) -> Result<Vec<OutboxMessage>, Error> {
        self.outbox_list(OUTBOX_PARKED, limit)
    }

    /// Puts the parked message `id` back in line, its attempts reset: it is delivered in its
    /// original place among its ordering key's messages. False if no parked message has
    /// that id.
    pub fn retry_parked(&self, id: MessageId) -> Result<bool, Error> {
        let Some(seq) = self.find(OUTBOX_PARKED, id)? else {
            return Ok(false);
        };
        let back = self.outbox_rehold(move |tx| tx.outbox_unpark(seq))?;
        self.engine.outbox.poke();
        Ok(back)
    }

    /// Parks the pending message `id` with `reason`: it is not sent until
    /// [`retry_parked`](Self::retry_parked), and holds back later messages of its ordering
    /// key. A publish already under way may still complete. False if no pending message has
    /// that id.
    pub fn park_message(&self, id: MessageId, reason: &str) -> Result<bool, Error> {
        let read = self.durable_read()?;
        let Some(mut row) = find_row(&read, OUTBOX, id)? else {
            return Ok(false);
        };
        drop(read);
        row.message.last_error = Some(format!("parked by an operator: {reason}"));
        let parked = self.outbox_rehold(move |tx| tx.outbox_park(&row))?;
        if parked {
            self.engine.outbox.count(0, 0, 1);
        }
        Ok(parked)
    }

    /// Removes every parked message for good (they are never sent); how many were removed.
    pub fn purge_parked(&self) -> Result<u64, Error> {
        let seqs: Vec<u64> = self
            .outbox_list(OUTBOX_PARKED, usize::MAX)?
            .into_iter()
            .map(|m| m.seq)
            .collect();
        if seqs.is_empty() {
            return Ok(0);
        }
        self.outbox_rehold(move |tx| tx.outbox_purge_parked(&seqs))
    }

    /// A read transaction that sees only durable commits: a closure's writes are visible at
    /// its non-durable commit, so this waits for the batch that made them durable.
    fn durable_read(&self) -> Result<ReadTransaction, Error> {
        refuse_reentry()?;
        let txn = self.engine.db.begin_read()?;
        if let Some(seq) = self.engine.durability.pending_any() {
            self.engine.durability.wait(seq)?;
        }
        Ok(txn)
    }

    /// The outbox's own writes, as a `run`.
    pub(crate) fn outbox_write<T: Send + 'static>(
        &self,
        body: impl FnOnce(&mut Tx<'_>) -> Result<T, Error> + Send + 'static,
    ) -> Result<T, Error> {
        self.run(body).map_err(|e| match e {
            ExecuteError::Db(e) | ExecuteError::Closure(e) => e,
        })
    }

    /// An operator's write that parks, unparks or purges: counted once visible (even
    /// when its answer is an error, which may come after the commit), so the dispatcher reads
    /// the held keys again (I27).
    fn outbox_rehold<T: Send + 'static>(
        &self,
        body: impl FnOnce(&mut Tx<'_>) -> Result<T, Error> + Send + 'static,
    ) -> Result<T, Error> {
        let result = self.outbox_write(body);
        self.engine.outbox.hold_changed();
        result
    }

    fn outbox_list(
        &self,
        table: redb::TableDefinition<'static, u64, &'static [u8]>,
        limit: usize,
    ) -> Result<Vec<OutboxMessage>, Error> {
        let read = self.durable_read()?;
        let Some(t) = open(&read, table)? else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for entry in t.iter()?.take(limit) {
            let (seq, v) = entry?;
            out.push(OutboxRow::decode(seq.value(), v.value())?.message);
        }
        Ok(out)
    }

    fn find(
        &self,
        table: redb::TableDefinition<'static, u64, &'static [u8]>,
        id: MessageId,
    ) -> Result<Option<u64>, Error> {
        let read = self.durable_read()?;
        Ok(find_row(&read, table, id)?.map(|r| r.message.seq))
    }
}

/// An outbox table in `read`; `None` before anything was staged.
pub(crate) fn open(
    read: &ReadTransaction,
    table: redb::TableDefinition<'static, u64, &'static [u8]>,
) -> Result<Option<redb::ReadOnlyTable<u64, &'static [u8]>>, Error> {
    match read.open_table(table) {
        Ok(t) => Ok(Some(t)),
        Err(TableError::TableDoesNotExist(_)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The row of message `id` (a scan: operator tools only).
fn find_row(
    read: &ReadTransaction,
    table: redb::TableDefinition<'static, u64, &'static [u8]>,
    id: MessageId,
) -> Result<Option<OutboxRow>, Error> {
    let Some(t) = open(read, table)? else {
        return Ok(None);
    };
    for entry in t.iter()? {
        let (seq, v) = entry?;
        let row = OutboxRow::decode(seq.value(), v.value())?;
        if row.message.id == id {
            return Ok(Some(row));
        }
    }
    Ok(None)
}
