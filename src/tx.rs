//! The handle through which a caller's closure writes its own tables in the same commit as the
//! dedupe record.

use idemdb_core::error::Refusal;
use std::cell::{Cell, RefCell};
use std::sync::Arc;

use redb::{
    Key, MultimapTable, MultimapTableDefinition, MultimapTableHandle, TableDefinition, TableHandle,
    Value, WriteTransaction,
};

use crate::config::Limits;
use crate::engine_tables::RESERVED_PREFIX;
use crate::error::{Error, InputError};
use crate::outbox_state::OutboxState;
use crate::tables::TableRegistry;
use crate::tx_table::{BusinessLog, TxTable};
use idemdb_core::scope::RecordKey;

/// The write transaction a closure of [`IdemDb::execute`](crate::IdemDb::execute) or
/// [`IdemDb::complete_with`](crate::IdemDb::complete_with) runs in.
///
/// Whatever the closure writes through it commits atomically with the record, or not at all if
/// the closure returns `Err`. It opens the caller's own tables; idemdb's tables (names starting
/// with `idemdb_`) are refused, and it can neither commit nor abort: the engine does.
///
/// Register the tables a closure writes with [`Builder::table`](crate::Builder::table): their
/// writes are then logged, and the closure's batch is durable with one log append. Writes to
/// unregistered tables (and multimap tables) are just as atomic, but their batch ends with a
/// durable redb commit, which costs several random page writes.
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
    pub(crate) txn: &'a WriteTransaction,
    pub(crate) env: TxEnv<'a>,
    /// The record this transaction commits with (`None` in a `run`): staged messages' ids
    /// derive from it.
    pub(crate) record: Option<&'a RecordKey>,
    beyond_horizon: bool,
    pub(crate) log: RefCell<BusinessLog>,
    /// Messages staged so far (tx_outbox.rs).
    pub(crate) staged: Cell<u32>,
}

/// What a closure's transaction uses of the engine.
#[derive(Clone, Copy)]
pub(crate) struct TxEnv<'a> {
    pub(crate) tables: &'a TableRegistry,
    pub(crate) limits: &'a Limits,
    pub(crate) outbox: &'a OutboxState,
    /// The batch's clock reading.
    pub(crate) now_ms: u64,
}

impl<'a> Tx<'a> {
    pub(crate) fn new(
        txn: &'a WriteTransaction,
        env: TxEnv<'a>,
        record: Option<&'a RecordKey>,
        beyond_horizon: bool,
    ) -> Self {
        Tx {
            txn,
            env,
            record,
            beyond_horizon,
            log: RefCell::default(),
            staged: Cell::new(0),
        }
    }

    /// What the closure wrote to caller tables, for the log.
    pub(crate) fn into_log(self) -> BusinessLog {
        self.log.into_inner()
    }

    /// Opens (creating if needed) one of the caller's tables.
    pub fn open_table<K: Key + 'static, V: Value + 'static>(
        &self,
        definition: TableDefinition<K, V>,
    ) -> Result<TxTable<'_, K, V>, Error> {
        let name = definition.name();
        check_name(name)?;
        let logged = self.env.tables.logs::<K, V>(name);
        Ok(TxTable::new(
            self.txn.open_table(definition)?,
            Arc::from(name),
            logged,
            &self.log,
        ))
    }

    /// Opens (creating if needed) one of the caller's multimap tables. Its writes are not
    /// logged: the batch ends with a durable redb commit.
    pub fn open_multimap_table<K: Key + 'static, V: Key + 'static>(
        &self,
        definition: MultimapTableDefinition<K, V>,
    ) -> Result<MultimapTable<'a, K, V>, Error> {
        check_name(definition.name())?;
        self.log.borrow_mut().unlogged = true;
        Ok(self.txn.open_multimap_table(definition)?)
    }

    /// The engine's clock reading for this operation, ms since the epoch.
    pub fn now_ms(&self) -> u64 {
        self.env.now_ms
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
        return Err(Error::Refused(Refusal::InvalidInput(
            InputError::ReservedTableName {
                name: name.to_string(),
            },
        )));
    }
    Ok(())
}
