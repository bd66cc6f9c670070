//! The typed view of the embedded engine ([`Typed`], from idemdb-core).

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::db::IdemDb;
use idemdb_core::Typed;

impl IdemDb {
    /// A typed view of this database: responses as any `serde` type, stored as JSON. Its sync
    /// methods run on this thread, its `_async` ones on any executor; see [`Typed`].
    ///
    /// ```
    /// use idemdb::{IdemDb, Key, Scope, TypedOutcome};
    /// use serde::{Deserialize, Serialize};
    /// use std::time::Duration;
    ///
    /// #[derive(Serialize, Deserialize, Debug, PartialEq)]
    /// struct Receipt { order: u64 }
    /// #[derive(Serialize, Deserialize, Debug, PartialEq)]
    /// struct Declined { reason: String }
    ///
    /// # let dir = tempfile::tempdir()?;
    /// let db = IdemDb::open(dir.path().join("db"))?;
    /// let purchases = db.typed::<Receipt, Declined>();
    /// let (scope, key) = (Scope::new("purchase", "u1"), Key::new("k"));
    /// let lease = Duration::from_secs(10);
    /// if let TypedOutcome::Acquired(r) = purchases.reserve(&scope, &key, b"req", lease)? {
    ///     purchases.complete(&r, &Receipt { order: 7 })?;
    /// }
    /// assert_eq!(
    ///     purchases.reserve(&scope, &key, b"req", lease)?,
    ///     TypedOutcome::Completed(Receipt { order: 7 })
    /// );
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn typed<T, F>(&self) -> Typed<'_, T, F, IdemDb>
    where
        T: Serialize + DeserializeOwned,
        F: Serialize + DeserializeOwned,
    {
        Typed::over(self)
    }
}
