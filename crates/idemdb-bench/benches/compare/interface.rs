//! What every engine implements, [`Engine`] and its callers' [`Session`]s, and what the
//! engines store alike: the baselines' scope-qualified key and record states, and `execute`'s
//! business table.

use idemdb::redb::TableDefinition;

use crate::shared::keys::{OPERATION, PRINCIPAL, key_bytes};

/// The caller's own business table, written by `execute`.
pub const ORDERS: TableDefinition<&[u8], u64> = TableDefinition::new("orders");

pub const STATE_IN_PROGRESS: u8 = 0;
pub const STATE_COMPLETED: u8 = 1;

/// The baselines' stored key: scope and key, as idemdb qualifies its own (similar length).
pub fn scoped_key(n: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(OPERATION.len() + PRINCIPAL.len() + 34);
    k.extend_from_slice(OPERATION.as_bytes());
    k.push(0);
    k.extend_from_slice(PRINCIPAL.as_bytes());
    k.push(0);
    k.extend_from_slice(&key_bytes(n));
    k
}

/// One caller's handle on an engine (a SQLite connection, or a shared handle).
pub trait Session: Send {
    /// Reserves a fresh key; it must be acquired.
    fn reserve(&mut self, id: u64);
    /// Reserves a fresh key and completes it: two durable writes.
    fn lifecycle(&mut self, id: u64);
    /// One-shot: reserve, one business insert and completion, in one durable transaction.
    fn execute(&mut self, id: u64);
    /// Reserves a completed key: returns the stored response's length.
    fn replay(&mut self, id: u64) -> usize;
}

/// An engine on one fresh file.
pub trait Engine: Send + Sync {
    /// A handle for one caller thread.
    fn session(&self) -> Box<dyn Session>;
    /// Stores `n` completed records, ids `0..n`, durably. Not measured; only needs speed.
    fn preload(&self, n: u64);
    /// The server processes doing this engine's work, whose CPU counts with the bench's (none
    /// for an embedded engine). Asked once its callers are connected.
    fn server_pids(&self) -> Vec<u32> {
        Vec::new()
    }
    /// The durable commits made so far, where the engine counts them (idemdb's log appends,
    /// `stats().commits`): a cell's writes ÷ its commits is the batch size.
    fn commits(&self) -> Option<u64> {
        None
    }
}
