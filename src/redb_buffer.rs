//! Writing out what redb keeps in its write buffer after the open's commit.
//!
//! Why: a durable commit that freed pages is followed, inside redb, by a non-durable commit of
//! its own, whose pages stay in redb's write buffer until the next durable commit. While such
//! pages may be buffered and the page cache is full, every read that misses the cache first
//! tries the lock of each of the buffer's 131 stripes (redb 4.6, `PagedCachedFile::read`):
//! measured on a 10M-record file with the default 64 MiB cache, 6.2 µs per random point read
//! against 11.6 µs with the flag left set. After the open's commit that would last until the
//! first write's checkpoint, which a read-mostly service may not make for long. (While writes
//! go on, every batch's non-durable commit buffers pages anyway, until its checkpoint.)

use redb::Database;

use crate::error::Error;

/// Two empty durable commits: the first writes out the buffered pages (and frees those its
/// predecessor released, in a non-durable commit of redb's own), the second writes out that
/// commit's pages and frees nothing. Called at open, after the log's commit, when nothing
/// but a checkpoint's state is in redb.
pub(crate) fn write_out(db: &Database, quick_repair: bool) -> Result<(), Error> {
    for _ in 0..2 {
        let mut txn = db.begin_write()?;
        txn.set_quick_repair(quick_repair);
        txn.commit()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    use redb::backends::InMemoryBackend;
    use redb::{Builder, Durability, ReadableDatabase, StorageBackend, TableDefinition};

    use super::*;

    const ROWS: TableDefinition<u64, &[u8]> = TableDefinition::new("rows");

    /// An in-memory file that counts the writes it is given.
    #[derive(Debug)]
    struct Counting(InMemoryBackend, Arc<AtomicU64>);

    impl StorageBackend for Counting {
        fn len(&self) -> Result<u64, std::io::Error> {
            self.0.len()
        }
        fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), std::io::Error> {
            self.0.read(offset, out)
        }
        fn set_len(&self, len: u64) -> Result<(), std::io::Error> {
            self.0.set_len(len)
        }
        fn sync_data(&self) -> Result<(), std::io::Error> {
            self.0.sync_data()
        }
        fn write(&self, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
            self.1.fetch_add(1, Ordering::SeqCst);
            self.0.write(offset, data)
        }
    }

    /// A file of 4,000 rows of 300 bytes under a 64 KiB page cache, then a non-durable commit
    /// of one row (and `write_out` if `written_out`); returns the file writes that reading
    /// every row then caused.
    fn writes_during_reads(written_out: bool) -> u64 {
        let writes = Arc::new(AtomicU64::new(0));
        let db = Builder::new()
            .set_cache_size(64 << 10)
            .create_with_backend(Counting(InMemoryBackend::new(), Arc::clone(&writes)))
            .unwrap();
        for chunk in (0..4_000u64).collect::<Vec<_>>().chunks(500) {
            let txn = db.begin_write().unwrap();
            {
                let mut rows = txn.open_table(ROWS).unwrap();
                for &i in chunk {
                    rows.insert(i, &[i as u8; 300][..]).unwrap();
                }
            }
            txn.commit().unwrap();
        }
        let mut txn = db.begin_write().unwrap();
        txn.set_durability(Durability::None).unwrap();
        txn.open_table(ROWS)
            .unwrap()
            .insert(4_000, &[1u8; 300][..])
            .unwrap();
        txn.commit().unwrap();
        if written_out {
            write_out(&db, false).unwrap();
        }
        let before = writes.load(Ordering::SeqCst);
        let read = db.begin_read().unwrap();
        let rows = read.open_table(ROWS).unwrap();
        for i in 0..=4_000u64 {
            assert!(rows.get(i).unwrap().is_some(), "row {i}");
        }
        writes.load(Ordering::SeqCst) - before
    }

    #[test]
    fn reads_after_a_non_durable_commit_write_its_pages_unless_written_out() {
        // redb's behaviour this module exists for: reads that miss a full cache write out the
        // buffered pages of a non-durable commit (and, until a durable commit, try every
        // stripe of the buffer first). If redb stops doing so, this fails: the write-out may
        // then go.
        assert!(writes_during_reads(false) > 0);
        assert_eq!(writes_during_reads(true), 0);
    }
}
