//! A fault-injecting [`StorageBackend`]: a disk with a volatile cache, holding two files (the
//! database and its log).
//!
//! It models a disk with a volatile write cache: a file's *durable image* is what survived its
//! last `sync_data`; writes and `set_len`s issued since are *pending*. A simulated power loss
//! strikes both files at once and keeps, drops or tears (at 512-byte sectors) each pending
//! write. Faults, held syncs, crash points and counters are the disk's, shared by both files.
//! Syncs can be held (to line up a group commit) or made to fail, and the disk can be killed so
//! that the process that used it can no longer write.

use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use idemdb::redb::StorageBackend;
use parking_lot::{Condvar, Mutex};

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
    /// As `Sync`, counting and failing the syncs of one file only: the log's (`log: true`)
    /// or the database's.
    FileSync {
        /// The log, or the database file.
        log: bool,
        /// Syncs of that file that still succeed.
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
struct File {
    live: Vec<u8>,
    durable: Vec<u8>,
    pending: Vec<Pending>,
}

/// The files of one disk: the database, and its log.
const FILES: usize = 2;

#[derive(Default)]
struct State {
    files: [File; FILES],
    writes: u64,
    syncs: u64,
    write_budget: Option<u64>,
    sync_budget: Option<u64>,
    file_sync_budget: [Option<u64>; FILES],
    hold_syncs: bool,
    held: usize,
    release_generation: u64,
    dead: bool,
    /// Syncs begun so far (including failed and crashed ones).
    syncs_begun: u64,
    crash_at: Option<(u64, TearMode)>,
    crash_images: Option<[Vec<u8>; FILES]>,
    /// The file in whose sync the armed power loss struck.
    crashed_in: Option<usize>,
    /// Syncs begun per file.
    file_syncs: [u64; FILES],
    /// When on, the log's durable image after each of its syncs: (length, bytes up to the
    /// last non-zero one; the rest are zeros).
    log_history: Option<Vec<(usize, Vec<u8>)>>,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

/// One file of an in-memory disk with a volatile cache, faults and power loss. Clones share
/// the disk: hand one and its [`log`](Self::log) to
/// [`Builder::open_with_backend`](idemdb::Builder::open_with_backend) and keep one to steer it.
#[derive(Clone, Default)]
pub struct FaultBackend {
    shared: Arc<Shared>,
    file: usize,
}

impl std::fmt::Debug for FaultBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.shared.state.lock();
        f.debug_struct("FaultBackend")
            .field("file", &self.file)
            .field("len", &s.files[self.file].live.len())
            .field("pending", &s.files[self.file].pending.len())
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

    /// A disk whose database file's durable content is `image` (e.g. a crash image of
    /// another backend), with an empty log.
    pub fn from_image(image: Vec<u8>) -> Self {
        Self::from_images(image, Vec::new())
    }

    /// A disk whose durable content is `db` for the database and `log` for its log.
    pub fn from_images(db: Vec<u8>, log: Vec<u8>) -> Self {
        let backend = Self::default();
        {
            let mut s = backend.shared.state.lock();
            for (file, image) in s.files.iter_mut().zip([db, log]) {
                file.live = image.clone();
                file.durable = image;
            }
        }
        backend
    }

    /// A new disk holding what both files of this one hold after a power loss now: each
    /// pending write meets `fate` (the database's writes first, then the log's).
    pub fn crash_disk(&self, mut fate: impl FnMut(usize) -> Fate) -> FaultBackend {
        let [db, log] = images_after_loss(&self.shared.state.lock().files, &mut fate);
        FaultBackend::from_images(db, log)
    }

    /// A new disk holding what a power loss armed by [`crash_at_sync`](Self::crash_at_sync)
    /// left of both files, once it struck.
    pub fn crashed_disk(&self) -> Option<FaultBackend> {
        let s = self.shared.state.lock();
        let [db, log] = s.crash_images.clone()?;
        Some(FaultBackend::from_images(db, log))
    }

    /// A new disk holding what survived each file's last sync.
    pub fn durable_disk(&self) -> FaultBackend {
        let s = self.shared.state.lock();
        FaultBackend::from_images(s.files[0].durable.clone(), s.files[1].durable.clone())
    }

    /// A new disk holding what reads see now (a clean process exit with the OS cache intact).
    pub fn live_disk(&self) -> FaultBackend {
        let s = self.shared.state.lock();
        FaultBackend::from_images(s.files[0].live.clone(), s.files[1].live.clone())
    }

    /// The log file on the same disk (the same file whichever handle asks).
    pub fn log(&self) -> FaultBackend {
        FaultBackend {
            shared: Arc::clone(&self.shared),
            file: 1,
        }
    }

    /// Makes I/O fail as `fault` says; replaces an earlier fault.
    pub fn inject(&self, fault: Fault) {
        let mut s = self.shared.state.lock();
        match fault {
            Fault::Write { after } => s.write_budget = Some(after),
            Fault::Sync { after } => s.sync_budget = Some(after),
            Fault::FileSync { log, after } => s.file_sync_budget[usize::from(log)] = Some(after),
        }
    }

    /// Removes injected faults.
    pub fn clear_faults(&self) {
        let mut s = self.shared.state.lock();
        s.write_budget = None;
        s.sync_budget = None;
        s.file_sync_budget = [None; FILES];
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

    /// This file's writes and length changes issued since its last sync.
    pub fn pending(&self) -> usize {
        self.shared.state.lock().files[self.file].pending.len()
    }

    /// What reads of this file see now (as after a clean process exit with the OS cache
    /// intact).
    pub fn live_image(&self) -> Vec<u8> {
        self.shared.state.lock().files[self.file].live.clone()
    }

    /// What survived this file's last sync.
    pub fn durable_image(&self) -> Vec<u8> {
        self.shared.state.lock().files[self.file].durable.clone()
    }

    /// Arms a power loss that strikes inside the `n`-th sync from now (0 = the next one):
    /// the pending writes meet `mode`, the image is kept for [`crashed_image`](Self::crashed_image)
    /// and the disk dies.
    pub fn crash_at_sync(&self, n: u64, mode: TearMode) {
        let mut s = self.shared.state.lock();
        let at = s.syncs_begun + n;
        s.crash_at = Some((at, mode));
    }

    /// The image of this file a power loss armed by [`crash_at_sync`](Self::crash_at_sync)
    /// left, once it struck.
    pub fn crashed_image(&self) -> Option<Vec<u8>> {
        self.shared
            .state
            .lock()
            .crash_images
            .as_ref()
            .map(|images| images[self.file].clone())
    }

    /// Whether the armed power loss struck inside a sync of the log (`Some(true)`) or of the
    /// database file (`Some(false)`); `None` before it struck.
    pub fn crash_struck_log(&self) -> Option<bool> {
        self.shared.state.lock().crashed_in.map(|f| f == 1)
    }

    /// Syncs of this file begun so far, including failed ones.
    pub fn file_syncs_begun(&self) -> u64 {
        self.shared.state.lock().file_syncs[self.file]
    }

    /// Syncs begun so far on the disk (both files), including failed ones.
    pub fn syncs_begun(&self) -> u64 {
        self.shared.state.lock().syncs_begun
    }

    /// From now on, keeps the log's durable image after each of its syncs, for
    /// [`log_history`](Self::log_history): the earlier images of itself that a log can be
    /// rolled back to.
    pub fn keep_log_history(&self) {
        self.shared
            .state
            .lock()
            .log_history
            .get_or_insert_with(Vec::new);
    }

    /// The log's durable images after each of its syncs since
    /// [`keep_log_history`](Self::keep_log_history), oldest first.
    pub fn log_history(&self) -> Vec<Vec<u8>> {
        let s = self.shared.state.lock();
        s.log_history
            .iter()
            .flatten()
            .map(|(len, head)| {
                let mut image = head.clone();
                image.resize(*len, 0);
                image
            })
            .collect()
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

/// Both files after one power loss: the fates run over the database's pending writes, then
/// the log's.
fn images_after_loss(
    files: &[File; FILES],
    mut fate: impl FnMut(usize) -> Fate,
) -> [Vec<u8>; FILES] {
    let mut seen = 0;
    files.each_ref().map(|f| {
        let base = seen;
        seen += f.pending.len();
        image_after_loss(f, |i| fate(base + i))
    })
}

fn image_after_loss(s: &File, mut fate: impl FnMut(usize) -> Fate) -> Vec<u8> {
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

/// The length of `image` without its trailing zeros: compared a sector at a time (a byte at a
/// time, under a fuzzer's comparison tracing, cost a fifth of an execution).
fn used_len(image: &[u8]) -> usize {
    const ZEROS: [u8; 512] = [0; 512];
    let mut end = image.len();
    while end > 0 {
        let start = end.saturating_sub(512);
        let chunk = &image[start..end];
        if chunk != &ZEROS[..chunk.len()] {
            return start + chunk.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
        }
        end = start;
    }
    0
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
        Ok(s.files[self.file].live.len() as u64)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        let s = self.shared.state.lock();
        if s.dead {
            return Err(io_error("dead disk"));
        }
        let start = usize::try_from(offset).map_err(|_| io_error("offset"))?;
        let end = start.saturating_add(out.len());
        let src = s.files[self.file]
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
        let file = &mut s.files[self.file];
        resize(&mut file.live, len);
        file.pending.push(Pending::SetLen(len));
        Ok(())
    }

    fn sync_data(&self) -> Result<(), io::Error> {
        let mut s = self.shared.state.lock();
        if s.dead {
            return Err(io_error("dead disk"));
        }
        s.syncs_begun += 1;
        s.file_syncs[self.file] += 1;
        if let Some((at, mode)) = s.crash_at
            && s.syncs_begun > at
        {
            s.crash_images = Some(images_after_loss(&s.files, mode.fates()));
            s.crashed_in = Some(self.file);
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
        match s.file_sync_budget[self.file] {
            Some(0) => return Err(io_error("sync")),
            Some(n) => s.file_sync_budget[self.file] = Some(n - 1),
            None => {}
        }
        // Only this file's pending writes become durable (O(pending), not a copy of the file).
        let file = &mut s.files[self.file];
        for p in std::mem::take(&mut file.pending) {
            match p {
                Pending::SetLen(len) => resize(&mut file.durable, len),
                Pending::Write { offset, data } => write_at(&mut file.durable, offset, &data),
            }
        }
        if self.file == 1 && s.log_history.is_some() {
            let durable = &s.files[1].durable;
            let image = (durable.len(), durable[..used_len(durable)].to_vec());
            if let Some(history) = s.log_history.as_mut() {
                history.push(image);
            }
        }
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
        let file = &mut s.files[self.file];
        write_at(&mut file.live, offset, data);
        file.pending.push(Pending::Write {
            offset,
            data: data.to_vec(),
        });
        Ok(())
    }
}
