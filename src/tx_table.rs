//! A caller table opened through [`Tx`](crate::Tx): redb's table, with its writes recorded
//! for the log when the table is registered on the [`Builder`](crate::Builder).

use std::borrow::Borrow;
use std::cell::RefCell;
use std::ops::Deref;
use std::sync::Arc;

use redb::{AccessGuard, Key, StorageError, Table, Value};

use crate::wal::Effect;

/// What a closure's transaction wrote to caller tables, for the log.
#[derive(Default)]
pub(crate) struct BusinessLog {
    pub(crate) effects: Vec<Effect>,
    /// A write the log cannot replay (an unregistered table, a multimap table): the batch
    /// must commit durably instead.
    pub(crate) unlogged: bool,
}

/// One of the caller's tables in a closure's transaction: reads as a [`redb::Table`]
/// (through `Deref`, with [`redb::ReadableTable`] in scope), writes with
/// [`insert`](Self::insert) and [`remove`](Self::remove).
///
/// Writes to a table registered with [`Builder::table`](crate::Builder::table) are logged:
/// the batch is durable with one log append. Writes to any other table are committed with a
/// durable redb commit (slower, equally atomic).
pub struct TxTable<'t, K: Key + 'static, V: Value + 'static> {
    table: Table<'t, K, V>,
    name: Arc<str>,
    logged: bool,
    log: &'t RefCell<BusinessLog>,
}

impl<'t, K: Key + 'static, V: Value + 'static> TxTable<'t, K, V> {
    pub(crate) fn new(
        table: Table<'t, K, V>,
        name: Arc<str>,
        logged: bool,
        log: &'t RefCell<BusinessLog>,
    ) -> Self {
        TxTable {
            table,
            name,
            logged,
            log,
        }
    }

    /// Inserts `value` under `key`, returning the previous value, as
    /// [`redb::Table::insert`].
    pub fn insert<'k, 'v>(
        &mut self,
        key: impl Borrow<K::SelfType<'k>>,
        value: impl Borrow<V::SelfType<'v>>,
    ) -> Result<Option<AccessGuard<'_, V>>, StorageError> {
        self.record(K::as_bytes(key.borrow()).as_ref(), || {
            Some(Arc::from(V::as_bytes(value.borrow()).as_ref()))
        });
        self.table.insert(key, value)
    }

    /// Removes `key`, returning its value, as [`redb::Table::remove`].
    pub fn remove<'k>(
        &mut self,
        key: impl Borrow<K::SelfType<'k>>,
    ) -> Result<Option<AccessGuard<'_, V>>, StorageError> {
        self.record(K::as_bytes(key.borrow()).as_ref(), || None);
        self.table.remove(key)
    }

    /// Records the write before it is made: a failed write aborts the transaction, and its
    /// effects with it.
    fn record(&self, key: &[u8], value: impl FnOnce() -> Option<Arc<[u8]>>) {
        let mut log = self.log.borrow_mut();
        if !self.logged {
            log.unlogged = true;
            return;
        }
        let table = Arc::clone(&self.name);
        let key = Arc::from(key);
        log.effects.push(match value() {
            Some(value) => Effect::Put { table, key, value },
            None => Effect::Remove { table, key },
        });
    }
}

impl<'t, K: Key + 'static, V: Value + 'static> Deref for TxTable<'t, K, V> {
    type Target = Table<'t, K, V>;

    fn deref(&self) -> &Self::Target {
        &self.table
    }
}
