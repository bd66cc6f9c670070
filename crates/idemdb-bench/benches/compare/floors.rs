//! The fsync floor as an engine: each caller thread does its own durable writes, one 4 KiB
//! `pwrite` + `fdatasync` each, in a file of its own (4 MiB, as `reserve_1`'s floor); nothing
//! is shared and nothing is batched. In a cell of N callers it is what N callers make when
//! every write of theirs waits for its own sync and the disk merges what it can of them
//! (`lifecycle_N`'s `fsync_floor` column): an engine above it shares syncs between callers,
//! one below it adds to them.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::interface::{Engine, Session};
use crate::shared::floor::{FLOOR_BLOCKS, FsyncFloor};

pub struct Floors {
    dir: PathBuf,
    sessions: AtomicU64,
}

impl Floors {
    pub fn new(dir: &Path) -> Floors {
        Floors {
            dir: dir.to_path_buf(),
            sessions: AtomicU64::new(0),
        }
    }
}

struct FloorSession(FsyncFloor);

impl Engine for Floors {
    fn session(&self) -> Box<dyn Session> {
        let n = self.sessions.fetch_add(1, Ordering::Relaxed);
        let name = format!("floor-{n}.bin");
        Box::new(FloorSession(FsyncFloor::open_named(
            &self.dir,
            &name,
            FLOOR_BLOCKS,
        )))
    }

    fn preload(&self, _n: u64) {
        // Nothing to store: a replay at the floor is a read of a block that is always there.
    }
}

impl Session for FloorSession {
    /// One durable write.
    fn reserve(&mut self, _id: u64) {
        self.0.op();
    }

    /// Two durable writes, as a reserve and its completion are.
    fn lifecycle(&mut self, _id: u64) {
        self.0.op();
        self.0.op();
    }

    /// One durable write: an execute is one durable transaction.
    fn execute(&mut self, _id: u64) {
        self.0.op();
    }

    /// A 4 KiB read of the file.
    fn replay(&mut self, id: u64) -> usize {
        self.0.read(id)
    }
}
