//! The fsync floor: what one durable commit costs at least on this machine's disk.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// 4 KiB pwrite into a preallocated file + fdatasync: the least one durable commit costs.
pub struct FsyncFloor {
    file: File,
    block: [u8; 4096],
    next: u64,
    blocks: u64,
}

/// Blocks of the file `open` makes (4 MiB): the writes cycle through them. Every floor uses
/// this size: on this VM a sync into a file of 64 blocks was 10–30% faster (83–87 µs against
/// 90–119 µs at the median, alternated), so a smaller file would flatter the floor.
pub const FLOOR_BLOCKS: u64 = 1024;

impl FsyncFloor {
    /// The floor on `dir/floor.bin`.
    pub fn open(dir: &Path) -> FsyncFloor {
        FsyncFloor::open_named(dir, "floor.bin", FLOOR_BLOCKS)
    }

    /// The floor on `dir/name`, preallocated to `blocks` blocks of 4 KiB (at least one).
    pub fn open_named(dir: &Path, name: &str, blocks: u64) -> FsyncFloor {
        let blocks = blocks.max(1);
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.join(name))
            .expect("create floor file");
        let zeros = vec![0u8; (blocks * 4096) as usize];
        file.write_all_at(&zeros, 0).expect("preallocate");
        file.sync_all().expect("sync");
        FsyncFloor {
            file,
            block: [0xa5; 4096],
            next: 0,
            blocks,
        }
    }

    /// One durable write: the next block, then `fdatasync`.
    pub fn op(&mut self) {
        let offset = (self.next % self.blocks) * 4096;
        self.block[..8].copy_from_slice(&self.next.to_le_bytes());
        self.next += 1;
        self.file.write_all_at(&self.block, offset).expect("pwrite");
        self.file.sync_data().expect("fdatasync");
    }

    /// Reads block `n` (modulo the file's blocks); returns the bytes read.
    pub fn read(&self, n: u64) -> usize {
        let mut buf = [0u8; 4096];
        self.file
            .read_exact_at(&mut buf, (n % self.blocks) * 4096)
            .expect("pread");
        buf.len()
    }
}
