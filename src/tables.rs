//! Caller tables registered on the [`Builder`](crate::Builder): what a closure writes to
//! them is logged as post-images and replayed typed at open, so a batch running caller code
//! needs no durable redb commit of its own (docs/design.md §5.6).

use std::collections::HashMap;
use std::sync::Arc;

use redb::{Key, TableDefinition, TableHandle, Value, WriteTransaction};

use crate::error::Error;

/// Re-applies one logged write: `Some(value)` inserts, `None` removes.
type Replay = dyn Fn(&WriteTransaction, &[u8], Option<&[u8]>) -> Result<(), Error> + Send + Sync;

struct Registered {
    key_type: String,
    value_type: String,
    replay: Arc<Replay>,
}

/// The registered tables, by name.
#[derive(Default, Clone)]
pub(crate) struct TableRegistry {
    tables: HashMap<String, Arc<Registered>>,
}

impl std::fmt::Debug for TableRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.tables.keys()).finish()
    }
}

impl TableRegistry {
    pub(crate) fn register<K: Key + 'static, V: Value + 'static>(
        &mut self,
        definition: TableDefinition<'static, K, V>,
    ) {
        let name = definition.name().to_string();
        // Captures the name only: a definition is neither Send nor Sync for every K and V.
        let replay = move |txn: &WriteTransaction, key: &[u8], value: Option<&[u8]>| {
            let mut table = txn.open_table(TableDefinition::<K, V>::new(&name))?;
            match value {
                Some(v) => {
                    table.insert(K::from_bytes(key), V::from_bytes(v))?;
                }
                None => {
                    table.remove(K::from_bytes(key))?;
                }
            }
            Ok(())
        };
        self.tables.insert(
            definition.name().to_string(),
            Arc::new(Registered {
                key_type: K::type_name().name().to_string(),
                value_type: V::type_name().name().to_string(),
                replay: Arc::new(replay),
            }),
        );
    }

    /// Whether writes to `name` with these types can be logged: registered with the same
    /// types (a table opened with other types is written, and committed, the slow way).
    pub(crate) fn logs<K: Key, V: Value>(&self, name: &str) -> bool {
        self.tables.get(name).is_some_and(|r| {
            r.key_type == K::type_name().name() && r.value_type == V::type_name().name()
        })
    }

    /// Re-applies a logged write to the caller table `name` at recovery.
    pub(crate) fn replay(
        &self,
        txn: &WriteTransaction,
        name: &str,
        key: &[u8],
        value: Option<&[u8]>,
    ) -> Result<(), Error> {
        let registered = self.tables.get(name).ok_or_else(|| {
            Error::Corrupted(format!(
                "the log holds writes to the table {name:?}, which is not registered: open \
                 with `Builder::table` for it, as the run that wrote the log did"
            ))
        })?;
        (registered.replay)(txn, key, value)
    }
}

#[cfg(test)]
mod tests {
    use redb::ReadableDatabase;
    use redb::backends::InMemoryBackend;

    use super::*;

    const ORDERS: TableDefinition<&str, u64> = TableDefinition::new("orders");
    const ORDERS_AS_BYTES: TableDefinition<&str, &[u8]> = TableDefinition::new("orders");

    #[test]
    fn a_table_is_logged_only_with_the_types_it_was_registered_with() {
        let mut registry = TableRegistry::default();
        registry.register(ORDERS);
        assert!(registry.logs::<&str, u64>("orders"));
        assert!(!registry.logs::<&str, &[u8]>("orders"));
        assert!(!registry.logs::<&str, u64>("other"));
    }

    #[test]
    fn replay_applies_typed_writes_and_refuses_an_unregistered_table() {
        let mut registry = TableRegistry::default();
        registry.register(ORDERS);
        let db = redb::Builder::new()
            .create_with_backend(InMemoryBackend::new())
            .unwrap();
        let txn = db.begin_write().unwrap();
        let key = b"k1".to_vec();
        let value = 1999u64.to_le_bytes().to_vec();
        registry.replay(&txn, "orders", &key, Some(&value)).unwrap();
        registry.replay(&txn, "orders", b"gone", None).unwrap();
        let refused = registry.replay(&txn, "unknown", &key, None);
        assert!(matches!(refused, Err(Error::Corrupted(_))));
        txn.commit().unwrap();
        let read = db.begin_read().unwrap();
        let table = read.open_table(ORDERS).unwrap();
        assert_eq!(table.get("k1").unwrap().unwrap().value(), 1999);
        // Registered under the other types, the replay fails to open the table: never a
        // silent write of bytes under the wrong type.
        let mut other = TableRegistry::default();
        other.register(ORDERS_AS_BYTES);
        let txn = db.begin_write().unwrap();
        assert!(other.replay(&txn, "orders", &key, Some(b"x")).is_err());
    }
}
