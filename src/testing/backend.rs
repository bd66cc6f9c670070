//! A fault-injecting [`StorageBackend`]: a disk with a volatile cache.
//!
//! It models a disk with a volatile write cache: the *durable image* is what survived the last
//! `sync_data`; writes and `set_len`s issued since are *pending*. A simulated power loss keeps,
//! drops or tears (at 512-byte sectors) each pending write. Syncs can be held (to line up a
//! group commit) or made to fail, and the backend can be killed so that the process that used
//! it can no longer write.

use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use redb::StorageBackend;

/// Sector size at which pending writes tear.
pub const SECTOR: usize = 512;

/// What a simulated power loss does with one pending write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// The write reached the disk.
    Keep,
    /// The write was lost.
    Drop,
    /// Only the sectors whose bit is set in the mask reached the disk (bit `i % 64` for
    /// sector `i`).
    Tear(u64),
}

/// Which I/O fails, counted from when the fault is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The write after `n` more successful writes fails, and every write after it.
    Write {
        /// Writes that still succeed.
        after: u64,
    },
    /// The sync after `n` more successful syncs fails, and every sync after it.
    Sync {
        /// Syncs that still succeed.
        after: u64,
    },
}

/// How a power loss treats the writes pending at that moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TearMode {
    /// None of them reached the disk.
    DropAll,
    /// All of them did (the cache was flushed just before the power went).
    KeepAll,
    /// Each is kept, dropped or torn at random, from this seed.
    Random(u64),
}

impl TearMode {
    /// The fate of each pending write, in issue order.
    pub fn fates(self) -> impl FnMut(usize) -> Fate {
        let mut rng = match self {
            TearMode::Random(seed) => seed | 1,
            _ => 1,
        };
        move |_| match self {
            TearMode::DropAll => Fate::Drop,
            TearMode::KeepAll => Fate::Keep,
            TearMode::Random(_) => {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                match rng % 3 {
                    0 => Fate::Keep,
                    1 => Fate::Drop,
                    _ => Fate::Tear(rng.rotate_left(23)),
                }
            }
        }
    }
}

#[derive(Debug, Clone)]
enum Pending {
    Write { offset: u64, data: Vec<u8> },
    SetLen(u64),
}

#[derive(Default)]
struct State {
    live: Vec<u8>,
    durable: Vec<u8>,
    pending: Vec<Pending>,
    writes: u64,
    syncs: u64,
    write_budget: Option<u64>,
    sync_budget: Option<u64>,
    hold_syncs: bool,
    held: usize,
    release_generation: u64,
    dead: bool,
    /// Syncs begun so far (including failed and crashed ones).
    syncs_begun: u64,
    crash_at: Option<(u64, TearMode)>,
    crash_image: Option<Vec<u8>>,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

/// An in-memory disk with a volatile cache, faults and power loss. Clones share one disk:
/// hand one to [`Builder::open_with_backend`](crate::Builder::open_with_backend) and keep one
/// to steer it.
#[derive(Clone, Default)]
pub struct FaultBackend {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for FaultBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.shared.state.lock();
        f.debug_struct("FaultBackend")
            .field("len", &s.live.len())
            .field("pending", &s.pending.len())
            .field("writes", &s.writes)
            .field("syncs", &s.syncs)
            .finish()
    }
}

fn io_error(what: &str) -> io::Error {
    io::Error::other(format!("injected fault: {what}"))
}

impl FaultBackend {
    /// An empty disk.
    pub fn new() -> Self {
        Self::default()
    }

    /// A disk whose durable content is `image` (e.g. a crash image of another backend).
    pub fn from_image(image: Vec<u8>) -> Self {
        let backend = Self::default();
        {
            let mut s = backend.shared.state.lock();
            s.live = image.clone();
            s.durable = image;
        }
        backend
    }

    /// Makes I/O fail as `fault` says; replaces an earlier fault.
    pub fn inject(&self, fault: Fault) {
        let mut s = self.shared.state.lock();
        match fault {
            Fault::Write { after } => s.write_budget = Some(after),
            Fault::Sync { after } => s.sync_budget = Some(after),
        }
    }

    /// Removes injected faults.
    pub fn clear_faults(&self) {
        let mut s = self.shared.state.lock();
        s.write_budget = None;
        s.sync_budget = None;
    }

    /// While on, every `sync_data` blocks before it takes effect.
    pub fn hold_syncs(&self, on: bool) {
        self.shared.state.lock().hold_syncs = on;
        self.shared.changed.notify_all();
    }

    /// Waits until `n` callers are blocked in a held sync; false on timeout.
    pub fn wait_for_held(&self, n: usize, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut s = self.shared.state.lock();
        while s.held < n {
            if self.shared.changed.wait_until(&mut s, deadline).timed_out() {
                return s.held >= n;
            }
        }
        true
    }

    /// Lets the syncs held now go through; later syncs are still held while holding is on.
    pub fn release_held(&self) {
        let mut s = self.shared.state.lock();
        s.release_generation += 1;
        self.shared.changed.notify_all();
    }

    /// Successful plus failed writes so far.
    pub fn writes(&self) -> u64 {
        self.shared.state.lock().writes
    }

    /// Completed syncs so far.
    pub fn syncs(&self) -> u64 {
        self.shared.state.lock().syncs
    }

    /// Writes and length changes issued since the last sync.
    pub fn pending(&self) -> usize {
        self.shared.state.lock().pending.len()
    }

    /// What reads see now (as after a clean process exit with the OS cache intact).
    pub fn live_image(&self) -> Vec<u8> {
        self.shared.state.lock().live.clone()
    }

    /// What survived the last sync.
    pub fn durable_image(&self) -> Vec<u8> {
        self.shared.state.lock().durable.clone()
    }

    /// The disk after a power loss now: the durable image plus each pending write as `fate`
    /// decides (called once per pending write, in issue order).
    pub fn crash_image(&self, fate: impl FnMut(usize) -> Fate) -> Vec<u8> {
        image_after_loss(&self.shared.state.lock(), fate)
    }

    /// Arms a power loss that strikes inside the `n`-th sync from now (0 = the next one):
    /// the pending writes meet `mode`, the image is kept for [`crashed_image`](Self::crashed_image)
    /// and the disk dies.
    pub fn crash_at_sync(&self, n: u64, mode: TearMode) {
        let mut s = self.shared.state.lock();
        let at = s.syncs_begun + n;
        s.crash_at = Some((at, mode));
    }

    /// The image a power loss armed by [`crash_at_sync`](Self::crash_at_sync) left, once it
    /// struck.
    pub fn crashed_image(&self) -> Option<Vec<u8>> {
        self.shared.state.lock().crash_image.clone()
    }

    /// Syncs begun so far, including failed ones.
    pub fn syncs_begun(&self) -> u64 {
        self.shared.state.lock().syncs_begun
    }

    /// Kills the disk for the process using it: every later I/O fails, held syncs fail.
    /// Take the crash image before or after; the dead process can change nothing more.
    pub fn kill(&self) {
        let mut s = self.shared.state.lock();
        s.dead = true;
        s.hold_syncs = false;
        self.shared.changed.notify_all();
    }
}

fn image_after_loss(s: &State, mut fate: impl FnMut(usize) -> Fate) -> Vec<u8> {
    let mut image = s.durable.clone();
    for (i, p) in s.pending.iter().enumerate() {
        let f = fate(i);
        match (p, f) {
            (_, Fate::Drop) => {}
            (Pending::SetLen(len), _) => resize(&mut image, *len),
            (Pending::Write { offset, data }, Fate::Keep) => write_at(&mut image, *offset, data),
            (Pending::Write { offset, data }, Fate::Tear(mask)) => {
                for (sector, chunk) in data.chunks(SECTOR).enumerate() {
                    if mask & (1 << (sector % 64)) != 0 {
                        let at = offset + (sector * SECTOR) as u64;
                        write_at(&mut image, at, chunk);
                    }
                }
            }
        }
    }
    image
}

fn resize(image: &mut Vec<u8>, len: u64) {
    image.resize(usize::try_from(len).unwrap_or(usize::MAX), 0);
}

fn write_at(image: &mut Vec<u8>, offset: u64, data: &[u8]) {
    let start = usize::try_from(offset).unwrap_or(usize::MAX);
    let end = start.saturating_add(data.len());
    if image.len() < end {
        image.resize(end, 0);
    }
    image[start..end].copy_from_slice(data);
}

impl StorageBackend for FaultBackend {
    fn len(&self) -> Result<u64, io::Error> {
        let s = self.shared.state.lock();
        if s.dead {
            return Err(io_error("dead disk"));
        }
        Ok(s.live.len() as u64)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        let s = self.shared.state.lock();
        if s.dead {
            return Err(io_error("dead disk"));
        }
        let start = usize::try_from(offset).map_err(|_| io_error("offset"))?;
        let end = start.saturating_add(out.len());
        let src = s
            .live
            .get(start..end)
            .ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "read past end"))?;
        out.copy_from_slice(src);
        Ok(())
    }

    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        let mut s = self.shared.state.lock();
        if s.dead {
            return Err(io_error("dead disk"));
        }
        resize(&mut s.live, len);
        s.pending.push(Pending::SetLen(len));
        Ok(())
    }

    fn sync_data(&self) -> Result<(), io::Error> {
        let mut s = self.shared.state.lock();
        if s.dead {
            return Err(io_error("dead disk"));
        }
        s.syncs_begun += 1;
        if let Some((at, mode)) = s.crash_at
            && s.syncs_begun > at
        {
            s.crash_image = Some(image_after_loss(&s, mode.fates()));
            s.crash_at = None;
            s.dead = true;
            self.shared.changed.notify_all();
            return Err(io_error("power loss"));
        }
        if s.hold_syncs && !s.dead {
            s.held += 1;
            let generation = s.release_generation;
            self.shared.changed.notify_all();
            while s.hold_syncs && !s.dead && s.release_generation == generation {
                self.shared.changed.wait(&mut s);
            }
            s.held -= 1;
            self.shared.changed.notify_all();
        }
        if s.dead {
            return Err(io_error("dead disk"));
        }
        match s.sync_budget {
            Some(0) => return Err(io_error("sync")),
            Some(n) => s.sync_budget = Some(n - 1),
            None => {}
        }
        s.durable = s.live.clone();
        s.pending.clear();
        s.syncs += 1;
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        let mut s = self.shared.state.lock();
        if s.dead {
            return Err(io_error("dead disk"));
        }
        s.writes += 1;
        match s.write_budget {
            Some(0) => return Err(io_error("write")),
            Some(n) => s.write_budget = Some(n - 1),
            None => {}
        }
        write_at(&mut s.live, offset, data);
        s.pending.push(Pending::Write {
            offset,
            data: data.to_vec(),
        });
        Ok(())
    }
}
