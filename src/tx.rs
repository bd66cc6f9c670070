//! The handle through which a caller's closure writes its own tables in the same commit as the
//! dedupe record.

use redb::{
    Key, MultimapTable, MultimapTableDefinition, MultimapTableHandle, Table, TableDefinition,
    TableHandle, Value, WriteTransaction,
};

use crate::error::{Error, InputError};
use crate::meta::RESERVED_PREFIX;

/// The write transaction a closure of [`IdemDb::execute`](crate::IdemDb::execute) or
/// [`IdemDb::complete_with`](crate::IdemDb::complete_with) runs in.
///
/// Whatever the closure writes through it commits atomically with the record, or not at all if
/// the closure returns `Err`. It opens the caller's own tables; idemdb's tables (names starting
/// with `idemdb_`) are refused, and it can neither commit nor abort: the engine does.
///
/// ```
/// # use idemdb::{IdemDb, Scope, Key, Outcome, ExecuteOutcome};
/// use idemdb::redb::TableDefinition;
/// const ORDERS: TableDefinition<&str, u64> = TableDefinition::new("orders");
/// # let dir = tempfile::tempdir()?;
/// # let db = IdemDb::open(dir.path().join("db"))?;
/// let done = db.execute(&Scope::new("order", "u1"), &Key::new("k1"), b"req", |tx| {
///     tx.open_table(ORDERS)?.insert("k1", 990)?;
///     Ok::<_, idemdb::Error>(Outcome::Completed(b"201".to_vec()))
/// })?;
/// assert!(matches!(done, ExecuteOutcome::Executed(_)));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Tx<'a> {
    txn: &'a WriteTransaction,
    now_ms: u64,
    beyond_horizon: bool,
}

impl<'a> Tx<'a> {
    pub(crate) fn new(txn: &'a WriteTransaction, now_ms: u64, beyond_horizon: bool) -> Self {
        Tx {
            txn,
            now_ms,
            beyond_horizon,
        }
    }

    /// Opens (creating if needed) one of the caller's tables.
    pub fn open_table<K: Key + 'static, V: Value + 'static>(
        &self,
        definition: TableDefinition<K, V>,
    ) -> Result<Table<'a, K, V>, Error> {
        check_name(definition.name())?;
        Ok(self.txn.open_table(definition)?)
    }

    /// Opens (creating if needed) one of the caller's multimap tables.
    pub fn open_multimap_table<K: Key + 'static, V: Key + 'static>(
        &self,
        definition: MultimapTableDefinition<K, V>,
    ) -> Result<MultimapTable<'a, K, V>, Error> {
        check_name(definition.name())?;
        Ok(self.txn.open_multimap_table(definition)?)
    }

    /// The engine's clock reading for this operation, ms since the epoch.
    pub fn now_ms(&self) -> u64 {
        self.now_ms
    }

    /// In [`execute`](crate::IdemDb::execute): the key's earlier record expired (or was
    /// dropped) and is still recognised, so this run is a duplicate older than the retention
    /// (see [`Retention`](crate::Retention)). The closure may decide what that means, e.g.
    /// fail instead of running twice. Always false in `complete_with` / `fail_with`.
    pub fn is_beyond_horizon(&self) -> bool {
        self.beyond_horizon
    }
}

fn check_name(name: &str) -> Result<(), Error> {
    if name.starts_with(RESERVED_PREFIX) {
        return Err(Error::InvalidInput(InputError::ReservedTableName {
            name: name.to_string(),
        }));
    }
    Ok(())
}
