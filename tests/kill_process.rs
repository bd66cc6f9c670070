//! A real process killed with SIGKILL at random moments, over 50 times, on one file: after
//! each kill the file is reopened and every outcome the process printed is checked
//! (invariants I1–I5), then the workload continues on the same file.

mod common;

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use idemdb::redb::{ReadableTable, TableDefinition};
use idemdb::{IdemDb, Key, RecordState, ReserveOutcome, Scope};

const ORDERS: TableDefinition<&str, &[u8]> = TableDefinition::new("orders");
const KILLS: usize = 60;

/// Must match examples/crash_worker.rs.
fn response(key: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(700);
    while out.len() < 600 {
        out.extend_from_slice(key.as_bytes());
        out.push(b'|');
    }
    out
}

/// The last acknowledged step of each key, with the token it was acquired under.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Acked {
    Acquired(u64),
    Done,
    Executed,
    Failed,
    Released,
}

fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

fn check(path: &Path, acked: &BTreeMap<String, Acked>, max_token: u64, run: usize) {
    let mut raw = idemdb::redb::Database::open(path).unwrap();
    assert!(raw.check_integrity().unwrap(), "redb integrity check (I4)");
    drop(raw);
    // Opening replays the log: the rows written after the last checkpoint are there only
    // after it (the worker registers `orders`, so its rows ride in the log).
    let db = IdemDb::builder().table(ORDERS).open(path).unwrap();
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
    let scope = Scope::new("kill", "worker");
    for (key, step) in acked {
        let rec = db.get(&scope, &Key::new(key)).unwrap();
        let row = rows.get(key);
        let state = rec.as_ref().map(|r| r.state);
        // I2: every completion in the worker writes a row in its commit, and nothing else does.
        assert_eq!(
            row.is_some(),
            state == Some(RecordState::Completed),
            "{key}: record {state:?} with row {}",
            row.is_some()
        );
        if let (Some(r), Some(bytes)) = (&rec, row) {
            assert_eq!(bytes, &r.response, "{key}");
        }
        // I1/I5: the acknowledged step holds, or the step in flight after it happened.
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
                assert!(row.is_some(), "{key}: completed without its row");
            }
            Acked::Failed => {
                assert_eq!(state, Some(RecordState::Failed), "{key}");
                assert_eq!(rec.as_ref().unwrap().response, response(key), "{key}");
            }
            Acked::Released => assert_eq!(state, None, "{key}: released record came back"),
        }
    }
    // I3: a token issued now is above every token printed before the kill. One probe key per
    // run: a run that printed no new token must not meet the previous run's probe.
    let probe = Key::new(format!("probe-{run}"));
    let ReserveOutcome::Acquired(r) = db
        .reserve(&scope, &probe, b"probe", Duration::from_secs(1))
        .unwrap()
    else {
        panic!("probe not acquired")
    };
    assert!(r.token().get() > max_token, "token went backwards");
}

#[test]
fn sigkill_at_random_moments_loses_nothing_acknowledged() {
    let bin = common::example_binary("crash_worker");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("killed.idemdb");
    let mut acked: BTreeMap<String, Acked> = BTreeMap::new();
    let mut max_token = 0;
    let mut rng = 0x2545_f491_4f6c_dd1d ^ std::process::id() as u64;
    let (mut lines, started) = (0usize, Instant::now());
    for run in 0..KILLS {
        let mut child = Command::new(&bin)
            .arg(&path)
            .arg(format!("r{run}"))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut stdout = child.stdout.take().unwrap();
        // Wait for READY so the kill lands in the workload, not in process start-up.
        let mut first = [0u8; 6];
        stdout.read_exact(&mut first).unwrap();
        assert_eq!(&first, b"READY\n");
        std::thread::sleep(Duration::from_millis(5 + xorshift(&mut rng) % 60));
        child.kill().unwrap(); // SIGKILL
        let mut out = String::new();
        stdout.read_to_string(&mut out).unwrap();
        child.wait().unwrap();
        for line in out.lines() {
            let parts: Vec<&str> = line.split(' ').collect();
            let step = match parts.as_slice() {
                ["ACQ", _, token] => {
                    let t: u64 = token.parse().unwrap();
                    max_token = max_token.max(t);
                    Acked::Acquired(t)
                }
                ["DONE", _] => Acked::Done,
                ["EXEC", _] => Acked::Executed,
                ["FAIL", _] => Acked::Failed,
                ["REL", _] => Acked::Released,
                _ => continue, // a line cut by the kill
            };
            acked.insert(parts[1].to_string(), step);
            lines += 1;
        }
        check(&path, &acked, max_token, run);
    }
    eprintln!(
        "{KILLS} kills, {lines} acknowledged outcomes checked over {} keys, {:.1} s",
        acked.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(lines > KILLS, "the worker acknowledged almost nothing");
}
