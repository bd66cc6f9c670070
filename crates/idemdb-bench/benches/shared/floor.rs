//! The fsync floor: what one durable commit costs at least on this machine's disk.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// 4 KiB pwrite into a preallocated file + fdatasync: the least one durable commit costs.
pub struct FsyncFloor {
    file: File,
    block: [u8; 4096],
    next: u64,
}

const FLOOR_BLOCKS: u64 = 1024;

impl FsyncFloor {
    pub fn open(dir: &Path) -> FsyncFloor {
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.join("floor.bin"))
            .expect("create floor file");
        let zeros = vec![0u8; (FLOOR_BLOCKS * 4096) as usize];
        file.write_all_at(&zeros, 0).expect("preallocate");
        file.sync_all().expect("sync");
        FsyncFloor {
            file,
            block: [0xa5; 4096],
            next: 0,
        }
    }

    pub fn op(&mut self) {
        let offset = (self.next % FLOOR_BLOCKS) * 4096;
        self.block[..8].copy_from_slice(&self.next.to_le_bytes());
        self.next += 1;
        self.file.write_all_at(&self.block, offset).expect("pwrite");
        self.file.sync_data().expect("fdatasync");
    }
}
