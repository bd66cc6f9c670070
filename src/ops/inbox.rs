//! Inbox dedupe for message consumers: the consumer's name is the scope, the producer's
//! message id the key. A first delivery runs the handler and commits its writes together with
//! the dedupe record; a redelivery is a `Duplicate` and does not run it; a handler error
//! commits nothing, so the redelivery runs it again.

use crate::db::IdemDb;
use crate::error::{Error, ExecuteError};
use crate::reentry::refuse_reentry;
use crate::tx::Tx;
use idemdb_core::inbox::Consumed;
use idemdb_core::outcome::Outcome;

use idemdb_core::inbox::{INBOX_PAYLOAD, consumed, names};

fn body<F, E>(handler: F) -> impl FnOnce(&mut Tx<'_>) -> Result<Outcome, E> + Send + 'static
where
    F: FnOnce(&mut Tx<'_>) -> Result<(), E> + Send + 'static,
{
    move |tx| handler(tx).map(|()| Outcome::Completed(Vec::new()))
}

impl IdemDb {
    /// Consumes one delivery of message `message_id` as `consumer`: runs `handler` once per
    /// message id, its writes committing with the dedupe record.
    ///
    /// ```
    /// use idemdb::{Consumed, IdemDb};
    /// use idemdb::redb::{ReadableTable, TableDefinition};
    /// const BALANCES: TableDefinition<&str, i64> = TableDefinition::new("balances");
    /// # let dir = tempfile::tempdir()?;
    /// # let db = IdemDb::open(dir.path().join("db"))?;
    /// let deposit = |db: &IdemDb| {
    ///     db.consume("ledger", "msg-81f3", |tx| {
    ///         let mut t = tx.open_table(BALANCES)?;
    ///         let before = t.get("acct-1")?.map(|v| v.value()).unwrap_or(0);
    ///         t.insert("acct-1", before + 50)?;
    ///         Ok::<_, idemdb::Error>(())
    ///     })
    /// };
    /// assert_eq!(deposit(&db)?, Consumed::Processed);
    /// assert_eq!(deposit(&db)?, Consumed::Duplicate); // the broker redelivered it
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn consume<F, E>(
        &self,
        consumer: &str,
        message_id: impl AsRef<[u8]>,
        handler: F,
    ) -> Result<Consumed, ExecuteError<E>>
    where
        F: FnOnce(&mut Tx<'_>) -> Result<(), E> + Send + 'static,
        E: Send + 'static,
    {
        let (scope, key) = names(consumer, message_id.as_ref());
        let outcome = self.execute(&scope, &key, INBOX_PAYLOAD, body(handler))?;
        Ok(consumed(consumer, outcome)?)
    }

    /// Consumes a poll of many messages in one commit batch: each message runs in a
    /// transaction of its own (a handler error or panic undoes its message only), all queued
    /// before any is waited for so that they share the commit. Answers are in the order
    /// given; a message id that appears twice is `Processed` then `Duplicate`.
    ///
    /// ```
    /// use idemdb::{Consumed, IdemDb};
    /// # let dir = tempfile::tempdir()?;
    /// # let db = IdemDb::open(dir.path().join("db"))?;
    /// let poll = ["m1", "m2", "m1"].map(|id| (id, |_tx: &mut idemdb::Tx<'_>| Ok::<_, idemdb::Error>(())));
    /// let answers: Vec<_> = db.consume_batch("orders", poll)?.into_iter().collect::<Result<_, _>>()?;
    /// assert_eq!(answers, [Consumed::Processed, Consumed::Processed, Consumed::Duplicate]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[allow(clippy::type_complexity)]
    pub fn consume_batch<I, M, F, E>(
        &self,
        consumer: &str,
        messages: I,
    ) -> Result<Vec<Result<Consumed, ExecuteError<E>>>, Error>
    where
        I: IntoIterator<Item = (M, F)>,
        M: AsRef<[u8]>,
        F: FnOnce(&mut Tx<'_>) -> Result<(), E> + Send + 'static,
        E: Send + 'static,
    {
        refuse_reentry()?;
        let calls = messages
            .into_iter()
            .map(|(id, handler)| {
                let (scope, key) = names(consumer, id.as_ref());
                self.prepare_execute(&scope, &key, INBOX_PAYLOAD.into(), body(handler))
            })
            .collect();
        // Queued together before any is waited for, so that they share the commit.
        Ok(self
            .call_many(calls)
            .into_iter()
            .map(|out| consumed(consumer, out?).map_err(|e| ExecuteError::Db(e.into())))
            .collect())
    }

    /// [`consume`](Self::consume), awaiting the commit. The handler runs on the committing
    /// thread, not in the task.
    pub async fn consume_async<F, E>(
        &self,
        consumer: &str,
        message_id: impl AsRef<[u8]>,
        handler: F,
    ) -> Result<Consumed, ExecuteError<E>>
    where
        F: FnOnce(&mut Tx<'_>) -> Result<(), E> + Send + 'static,
        E: Send + 'static,
    {
        let (scope, key) = names(consumer, message_id.as_ref());
        let outcome = self
            .execute_async(&scope, &key, INBOX_PAYLOAD, body(handler))
            .await?;
        Ok(consumed(consumer, outcome)?)
    }
}
