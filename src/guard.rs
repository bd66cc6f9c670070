//! Version guards on the caller's own tables: idempotency by construction, where the write
//! itself tolerates duplicates and reordering and no dedupe record is needed.

use std::borrow::Borrow;

use redb::{Key, ReadableTable, TableDefinition, Value};

use crate::error::Error;
use crate::tx::Tx;

/// The value of a versioned table: the entity's version, then its bytes. Read it back with
/// redb as usual: `table.get(id)?.map(|v| v.value())` gives `(version, bytes)`.
pub type Versioned = (u64, &'static [u8]);

/// What a guarded write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Guarded {
    /// Written; the entity is now at `version`.
    Applied {
        /// The version stored.
        version: u64,
    },
    /// Not written: the stored version made it a duplicate, a reordered old write or a lost
    /// race. `current` is the stored version (`None`: no entity).
    Rejected {
        /// The version stored now.
        current: Option<u64>,
    },
}

/// What an upsert did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Upserted {
    /// No row had the key.
    Inserted,
    /// A row had the key and was replaced.
    Updated,
    /// A row had the key and the same value: nothing changed.
    Unchanged,
}

impl Tx<'_> {
    /// Last writer wins by version: stores `(version, value)` under `id` only if `version` is
    /// greater than the stored one (or none is stored). A duplicate (equal version) and a
    /// reordered older event are both rejected, so applying a stream of absolute states in any
    /// order, any number of times, leaves the newest.
    ///
    /// ```
    /// use idemdb::{Guarded, IdemDb, Versioned};
    /// use idemdb::redb::{ReadableDatabase, ReadableTable, TableDefinition};
    /// const PRICES: TableDefinition<&str, Versioned> = TableDefinition::new("prices");
    /// # let dir = tempfile::tempdir()?;
    /// # let db = IdemDb::open(dir.path().join("db"))?;
    /// for (version, price) in [(2, "12.00"), (1, "10.00"), (2, "12.00")] {
    ///     db.run(move |tx| tx.apply_if_newer(PRICES, "sku-1", version, price.as_bytes()))?;
    /// }
    /// let read = db.begin_read()?;
    /// let prices = read.open_table(PRICES)?;
    /// let stored = prices.get("sku-1")?.unwrap();
    /// assert_eq!(stored.value(), (2, &b"12.00"[..]));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn apply_if_newer<'k, K: Key + 'static>(
        &self,
        table: TableDefinition<K, Versioned>,
        id: impl Borrow<K::SelfType<'k>>,
        version: u64,
        value: &[u8],
    ) -> Result<Guarded, Error> {
        self.write_versioned(table, id, value, |current| {
            current.is_none_or(|c| c < version).then_some(version)
        })
    }

    /// Compare-and-set for relative updates (a counter, a balance) that cannot be made
    /// absolute: stores `value` at version `expected + 1` only if the stored version is
    /// `expected` (0: no entity yet). A retry of an update that already applied finds the
    /// version moved on and is rejected.
    ///
    /// ```
    /// use idemdb::{Guarded, IdemDb, Versioned};
    /// use idemdb::redb::TableDefinition;
    /// const COUNTERS: TableDefinition<&str, Versioned> = TableDefinition::new("counters");
    /// # let dir = tempfile::tempdir()?;
    /// # let db = IdemDb::open(dir.path().join("db"))?;
    /// let bump = |expected: u64, value: u64| {
    ///     db.run(move |tx| tx.compare_and_set(COUNTERS, "visits", expected, &value.to_le_bytes()))
    /// };
    /// assert_eq!(bump(0, 1)?, Guarded::Applied { version: 1 });
    /// assert_eq!(bump(0, 1)?, Guarded::Rejected { current: Some(1) }); // a retry
    /// assert_eq!(bump(1, 2)?, Guarded::Applied { version: 2 });
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn compare_and_set<'k, K: Key + 'static>(
        &self,
        table: TableDefinition<K, Versioned>,
        id: impl Borrow<K::SelfType<'k>>,
        expected: u64,
        value: &[u8],
    ) -> Result<Guarded, Error> {
        self.write_versioned(table, id, value, |current| {
            // At u64::MAX the entity cannot advance: rejected.
            (current.unwrap_or(0) == expected)
                .then(|| expected.checked_add(1))
                .flatten()
        })
    }

    /// Stores `(version, value)` under `id` if `next`, given the stored version, names the
    /// version to write.
    fn write_versioned<'k, K: Key + 'static>(
        &self,
        table: TableDefinition<K, Versioned>,
        id: impl Borrow<K::SelfType<'k>>,
        value: &[u8],
        next: impl FnOnce(Option<u64>) -> Option<u64>,
    ) -> Result<Guarded, Error> {
        let mut table = self.open_table(table)?;
        let current = table.get(id.borrow())?.map(|v| v.value().0);
        let Some(version) = next(current) else {
            return Ok(Guarded::Rejected { current });
        };
        table.insert(id.borrow(), (version, value))?;
        Ok(Guarded::Applied { version })
    }

    /// Insert or update on a natural key (such as `(user_id, content_id)`): the unique key is
    /// the idempotency mechanism, so replaying the write any number of times leaves one row.
    ///
    /// ```
    /// use idemdb::{IdemDb, Upserted};
    /// use idemdb::redb::TableDefinition;
    /// const LIKES: TableDefinition<(&str, &str), u64> = TableDefinition::new("likes");
    /// # let dir = tempfile::tempdir()?;
    /// # let db = IdemDb::open(dir.path().join("db"))?;
    /// let like = |at: u64| db.run(move |tx| tx.upsert(LIKES, ("user-7", "post-9"), at));
    /// assert_eq!(like(100)?, Upserted::Inserted);
    /// assert_eq!(like(100)?, Upserted::Unchanged);
    /// assert_eq!(like(200)?, Upserted::Updated);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn upsert<'k, 'v, K: Key + 'static, V: Value + 'static>(
        &self,
        table: TableDefinition<K, V>,
        key: impl Borrow<K::SelfType<'k>>,
        value: impl Borrow<V::SelfType<'v>>,
    ) -> Result<Upserted, Error> {
        let mut table = self.open_table(table)?;
        let new = V::as_bytes(value.borrow()).as_ref().to_vec();
        let previous = table
            .insert(key.borrow(), value.borrow())?
            .map(|old| V::as_bytes(&old.value()).as_ref().to_vec());
        Ok(match previous {
            None => Upserted::Inserted,
            Some(old) if old == new => Upserted::Unchanged,
            Some(_) => Upserted::Updated,
        })
    }
}
