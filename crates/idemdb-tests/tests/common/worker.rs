//! A real process killed with SIGKILL: examples/crash_worker.rs runs a workload on a database
//! file and prints every acknowledged outcome; [`Acks`] keeps what it was told and checks a
//! reopened database against it (invariants I1–I3 of docs/design.md §12).

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use idemdb::redb::{ReadableTable, TableDefinition};
use idemdb::{IdemDb, Key, RecordState, ReserveOutcome, Retention, Scope};

/// The worker's business table, registered so that its rows ride in the log.
pub const ORDERS: TableDefinition<&str, &[u8]> = TableDefinition::new("orders");

/// Must match examples/crash_worker.rs.
pub fn response(key: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(700);
    while out.len() < 600 {
        out.extend_from_slice(key.as_bytes());
        out.push(b'|');
    }
    out
}

/// The worker's scope.
pub fn scope() -> Scope {
    Scope::new("kill", "worker")
}

/// The last acknowledged step of each key, with the token it was acquired under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acked {
    Acquired(u64),
    Done,
    Executed,
    Failed,
    Released,
}

/// Everything the killed workers were told, over every run on one file.
#[derive(Debug, Clone, Default)]
pub struct Acks {
    pub keys: BTreeMap<String, Acked>,
    pub max_token: u64,
    pub lines: usize,
    /// For each key, the wall-clock time (ms since the epoch) its run started: none of its
    /// records was written before.
    pub since: BTreeMap<String, u64>,
    /// Partitions the workers said they dropped, summed over the runs.
    pub drops: u64,
}

/// The crash worker, built once per test binary.
pub struct Worker {
    bin: PathBuf,
    /// `checkpoint_interval` of the worker's database, in ms (its default: 1 s).
    pub checkpoint_ms: Option<u64>,
    /// Operations per worker thread before it stops and waits for the kill (default: no
    /// limit).
    pub ops_per_thread: Option<u64>,
    /// The records' TTL, in ms: partitions expire and drop while the worker runs
    /// ([`expiring`]). Default: the store's (a day).
    pub ttl_ms: Option<u64>,
    /// Their partitions' width, in ms (default: a quarter of the TTL).
    pub width_ms: Option<u64>,
}

impl Worker {
    pub fn new() -> Worker {
        Worker {
            bin: super::example_binary("crash_worker"),
            checkpoint_ms: None,
            ops_per_thread: None,
            ttl_ms: None,
            width_ms: None,
        }
    }

    /// Starts the worker on `path`, lets it run `for_ms` after it is ready, SIGKILLs it and
    /// adds what it printed to `acks`.
    pub fn run_and_kill(&self, path: &Path, run: &str, for_ms: u64, acks: &mut Acks) {
        let mut command = Command::new(&self.bin);
        command
            .arg(path)
            .arg(run)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if let Some(ms) = self.checkpoint_ms {
            command.env("IDEMDB_WORKER_CHECKPOINT_MS", ms.to_string());
        }
        if let Some(n) = self.ops_per_thread {
            command.env("IDEMDB_WORKER_OPS", n.to_string());
        }
        if let Some(ms) = self.ttl_ms {
            command.env("IDEMDB_WORKER_TTL_MS", ms.to_string());
        }
        if let Some(ms) = self.width_ms {
            command.env("IDEMDB_WORKER_WIDTH_MS", ms.to_string());
        }
        let started = now_ms();
        let mut child = command.spawn().unwrap();
        let mut stdout = child.stdout.take().unwrap();
        // Wait for READY so the kill lands in the workload, not in process start-up.
        let mut first = [0u8; 6];
        stdout.read_exact(&mut first).unwrap();
        assert_eq!(&first, b"READY\n");
        std::thread::sleep(Duration::from_millis(for_ms));
        child.kill().unwrap(); // SIGKILL
        let mut out = String::new();
        stdout.read_to_string(&mut out).unwrap();
        child.wait().unwrap();
        acks.absorb(&out, started);
    }
}

impl Acks {
    /// Adds the lines a worker that started at `started` (ms since the epoch) printed (a last
    /// line cut by the kill is skipped).
    pub fn absorb(&mut self, out: &str, started: u64) {
        let mut drops = 0;
        for line in out.lines() {
            let parts: Vec<&str> = line.split(' ').collect();
            if let ["DROPS", n] = parts.as_slice() {
                drops = n.parse().unwrap_or(drops).max(drops);
                continue;
            }
            let step = match parts.as_slice() {
                ["ACQ", _, token] => {
                    let Ok(t) = token.parse::<u64>() else {
                        continue;
                    };
                    self.max_token = self.max_token.max(t);
                    Acked::Acquired(t)
                }
                ["DONE", _] => Acked::Done,
                ["EXEC", _] => Acked::Executed,
                ["FAIL", _] => Acked::Failed,
                ["REL", _] => Acked::Released,
                _ => continue,
            };
            self.keys.insert(parts[1].to_string(), step);
            self.since.entry(parts[1].to_string()).or_insert(started);
            self.lines += 1;
        }
        self.drops += drops;
    }

    /// I1, I2: every acknowledged outcome holds in `db` (or the step in flight after it
    /// happened), each completion with its business row, byte for byte.
    pub fn check_outcomes(&self, db: &IdemDb) {
        self.check_outcomes_expiring(db, None);
    }

    /// [`check_outcomes`](Self::check_outcomes) for records that live `ttl_ms`: a finished
    /// record whose run started a TTL or more ago may be gone (expired, its partition
    /// dropped, its business row left); one that is there must be what was acknowledged.
    /// An IN_PROGRESS record (its lease is an hour) and anything newer are checked whole.
    pub fn check_outcomes_expiring(&self, db: &IdemDb, ttl_ms: Option<u64>) {
        let rows: BTreeMap<String, Vec<u8>> = {
            let read = db.begin_read().unwrap();
            match read.open_table(ORDERS) {
                Ok(t) => t
                    .iter()
                    .unwrap()
                    .map(|e| {
                        let (k, v) = e.unwrap();
                        (k.value().to_string(), v.value().to_vec())
                    })
                    .collect(),
                Err(_) => BTreeMap::new(),
            }
        };
        for (key, step) in &self.keys {
            let rec = db.get(&scope(), &Key::new(key)).unwrap();
            let row = rows.get(key);
            let state = rec.as_ref().map(|r| r.state);
            // Read after the lookup, whose clock it is not behind: a record the lookup found
            // expired was written no earlier than its run started.
            let may_have_expired = ttl_ms.is_some_and(|ttl| now_ms() >= self.since[key] + ttl);
            if rec.is_none() && may_have_expired && *step != Acked::Released {
                // Expired, its partition perhaps dropped; a business row stays, whole.
                if let Some(bytes) = row {
                    assert_eq!(bytes, &response(key), "{key}: the row of an expired record");
                }
                continue;
            }
            // Every completion in the worker writes a row in its commit, and nothing else does.
            assert_eq!(
                row.is_some(),
                state == Some(RecordState::Completed),
                "{key}: record {state:?} with row {}",
                row.is_some()
            );
            if let (Some(r), Some(bytes)) = (&rec, row) {
                assert_eq!(bytes, &r.response, "{key}");
            }
            match step {
                Acked::Acquired(token) => match &rec {
                    Some(r) if r.state == RecordState::InProgress => {
                        assert_eq!(r.token.get(), *token, "{key}")
                    }
                    Some(r) => {
                        assert_eq!(r.token.get(), *token, "{key}");
                        assert_eq!(r.response, response(key), "{key}");
                    }
                    None => {} // the release in flight happened
                },
                Acked::Done | Acked::Executed => {
                    assert_eq!(state, Some(RecordState::Completed), "{key}");
                    assert_eq!(rec.as_ref().unwrap().response, response(key), "{key}");
                }
                Acked::Failed => {
                    assert_eq!(state, Some(RecordState::Failed), "{key}");
                    assert_eq!(rec.as_ref().unwrap().response, response(key), "{key}");
                }
                Acked::Released => {
                    assert_eq!(state, None, "{key}: released record came back")
                }
            }
        }
    }

    /// I3: a token issued now is above every token printed before. `probe` must be a key no
    /// run used.
    pub fn check_tokens(&self, db: &IdemDb, probe: &str) -> u64 {
        let ReserveOutcome::Acquired(r) = db
            .reserve(&scope(), &Key::new(probe), b"probe", Duration::from_secs(1))
            .unwrap()
        else {
            panic!("probe not acquired")
        };
        assert!(
            r.token().get() > self.max_token,
            "token {} issued after reopen is not above {} issued before",
            r.token(),
            self.max_token
        );
        r.token().get()
    }
}

/// Opens the worker's database at `path` (its table registered, so the log replays).
pub fn open_worker_db(path: &Path) -> Result<IdemDb, idemdb::Error> {
    IdemDb::builder().table(ORDERS).open(path)
}

/// The worker's retention under `IDEMDB_WORKER_TTL_MS` (examples/crash_worker.rs): records
/// live `ttl_ms`, partitions are `width_ms` wide (default: a quarter of the TTL), the
/// compactor looks every tenth of the TTL.
pub fn expiring(ttl_ms: u64, width_ms: Option<u64>) -> Retention {
    Retention::default()
        .ttl(Duration::from_millis(ttl_ms))
        .partition_width(Duration::from_millis(width_ms.unwrap_or(ttl_ms / 4).max(1)))
        .compact_interval(Some(Duration::from_millis((ttl_ms / 10).max(1))))
}

/// Opens the database of a worker whose records live `ttl_ms` in partitions `width_ms` wide,
/// with its retention and no compactor: the check reads what the killed worker left, and
/// changes nothing.
pub fn open_expiring_worker_db(
    path: &Path,
    ttl_ms: u64,
    width_ms: Option<u64>,
) -> Result<IdemDb, idemdb::Error> {
    IdemDb::builder()
        .table(ORDERS)
        .retention(expiring(ttl_ms, width_ms).compact_interval(None))
        .open(path)
}

/// Wall-clock milliseconds since the epoch, as the store's clock reads them.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
