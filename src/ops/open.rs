//! Opening and closing a database: [`IdemDb::open`], [`IdemDb::builder`] (the settings are
//! builder.rs's) and [`IdemDb::close`].

use crate::builder::Builder;
use crate::db::IdemDb;
use crate::error::Error;

impl IdemDb {
    /// Opens (or creates) the database at `path` with default settings.
    pub fn open(path: impl AsRef<std::path::Path>) -> Result<IdemDb, Error> {
        Builder::default().open(path)
    }

    /// Settings for opening a database.
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// Closes the database: answers every queued operation, then closes the file. The same
    /// as dropping it, spelled out.
    pub fn close(self) {
        drop(self);
    }
}
