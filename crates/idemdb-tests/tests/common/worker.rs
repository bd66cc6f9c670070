//! A real process killed with SIGKILL: examples/crash_worker.rs runs a workload on a database
//! file and prints every acknowledged outcome; [`Acks`] keeps what it was told and checks a
//! reopened database against it (invariants I1–I3 of docs/design.md §12).

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use idemdb::redb::{ReadableTable, TableDefinition};
use idemdb::{IdemDb, Key, RecordState, ReserveOutcome, Scope};

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
}

/// The crash worker, built once per test binary.
pub struct Worker {
    bin: PathBuf,
    /// `checkpoint_interval` of the worker's database, in ms (its default: 1 s).
    pub checkpoint_ms: Option<u64>,
    /// Operations per worker thread before it stops and waits for the kill (default: no
    /// limit).
    pub ops_per_thread: Option<u64>,
}

impl Worker {
    pub fn new() -> Worker {
        Worker {
            bin: super::example_binary("crash_worker"),
            checkpoint_ms: None,
            ops_per_thread: None,
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
        acks.absorb(&out);
    }
}

impl Acks {
    /// Adds the lines a worker printed (a last line cut by the kill is skipped).
    pub fn absorb(&mut self, out: &str) {
        for line in out.lines() {
            let parts: Vec<&str> = line.split(' ').collect();
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
            self.lines += 1;
        }
    }

    /// I1, I2: every acknowledged outcome holds in `db` (or the step in flight after it
    /// happened), each completion with its business row, byte for byte.
    pub fn check_outcomes(&self, db: &IdemDb) {
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
