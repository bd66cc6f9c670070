//! A pass-through [`StorageBackend`] that remembers the storage's length, so that `stats()`
//! can report the size of a database opened over any backend.

use std::io;
use std::ops::Bound;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use redb::{BackendError, StorageBackend};

#[derive(Debug)]
pub(crate) struct Measured<B> {
    inner: B,
    len: Arc<AtomicU64>,
}

impl<B: StorageBackend> Measured<B> {
    /// Wraps `inner`; `len` follows its length from now on.
    pub(crate) fn new(inner: B, len: Arc<AtomicU64>) -> Self {
        Measured { inner, len }
    }
}

impl<B: StorageBackend> StorageBackend for Measured<B> {
    fn len(&self) -> Result<u64, io::Error> {
        let len = self.inner.len()?;
        self.len.store(len, Ordering::Relaxed);
        Ok(len)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        self.inner.read(offset, out)
    }

    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        self.inner.set_len(len)?;
        self.len.store(len, Ordering::Relaxed);
        Ok(())
    }

    fn sync_data(&self) -> Result<(), io::Error> {
        self.inner.sync_data()
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        self.inner.write(offset, data)?;
        let end = offset.saturating_add(data.len() as u64);
        self.len.fetch_max(end, Ordering::Relaxed);
        Ok(())
    }

    fn close(&self) -> Result<(), io::Error> {
        self.inner.close()
    }

    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.try_lock_range(start, end)
    }

    fn try_lock_shared_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<bool, BackendError> {
        self.inner.try_lock_shared_range(start, end)
    }

    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.lock_range(start, end)
    }

    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.lock_shared_range(start, end)
    }

    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.unlock_range(start, end)
    }

    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.query_lock_range(start, end)
    }
}
