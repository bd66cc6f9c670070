//! A worker for the kill -9 test (tests/kill_process.rs): four threads perform durable
//! reservations, completions with business writes, failures, releases and one-shot executes
//! on the database file given as the first argument, and print every acknowledged outcome to
//! stdout, one whole line per write, as soon as they get it. It runs until it is killed.
//!
//! `cargo run --release -p idemdb-tests --example crash_worker -- /tmp/db.idemdb run-1`
//!
//! `IDEMDB_WORKER_CHECKPOINT_MS` sets the database's checkpoint interval (default 1 s), so a
//! test can have checkpoints taken while it runs. `IDEMDB_WORKER_OPS` stops each thread after
//! that many operations (it then waits to be killed), so that a test whose rows need the
//! checkpoint to stay put never fills the log (growing it takes a checkpoint) however fast
//! the machine is. `IDEMDB_WORKER_TTL_MS` gives the records that TTL, partitions a quarter of
//! it wide and a compactor every tenth of it, so that partitions expire and drop while the
//! workload runs; the worker then also prints `DROPS n` whenever the count of partitions it
//! dropped grows. `IDEMDB_WORKER_WIDTH_MS` sets that partition width instead (a width under
//! 1/32 of the TTL: closed partitions are widened, docs/design.md §8.8).

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use idemdb::redb::TableDefinition;
use idemdb::{Error, ExecuteOutcome, IdemDb, Key, Outcome, ReserveOutcome, Retention, Scope};

/// Business rows written in the same commit as their records.
const ORDERS: TableDefinition<&str, &[u8]> = TableDefinition::new("orders");
const LEASE: Duration = Duration::from_secs(3600);

/// The response stored for `key`: different per key, long enough to span sectors.
pub fn response(key: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(700);
    while out.len() < 600 {
        out.extend_from_slice(key.as_bytes());
        out.push(b'|');
    }
    out
}

fn say(line: String) {
    // One write per line: a pipe write below PIPE_BUF is atomic, so lines never interleave.
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(format!("{line}\n").as_bytes());
    let _ = out.flush();
}

fn worker(db: &IdemDb, run: &str, thread: usize, ops: u64) -> Result<(), Error> {
    let scope = Scope::new("kill", "worker");
    for i in 0..ops {
        let key = format!("{run}-t{thread}-{i}");
        let k = Key::new(&key);
        match i % 4 {
            0 => {
                let ReserveOutcome::Acquired(r) = db.reserve(&scope, &k, b"p", LEASE)? else {
                    return Err(Error::Corrupted(format!("{key}: fresh key not acquired")));
                };
                say(format!("ACQ {key} {}", r.token()));
                let (row, bytes) = (key.clone(), response(&key));
                db.complete_with(&r, response(&key), move |tx| -> Result<(), Error> {
                    tx.open_table(ORDERS)?
                        .insert(row.as_str(), bytes.as_slice())?;
                    Ok(())
                })?;
                say(format!("DONE {key}"));
            }
            1 => {
                let (row, bytes) = (key.clone(), response(&key));
                let outcome =
                    db.execute(&scope, &k, b"p", move |tx| -> Result<Outcome, Error> {
                        tx.open_table(ORDERS)?
                            .insert(row.as_str(), bytes.as_slice())?;
                        Ok(Outcome::Completed(bytes.clone()))
                    })?;
                if !matches!(outcome, ExecuteOutcome::Executed(_)) {
                    return Err(Error::Corrupted(format!("{key}: fresh key not executed")));
                }
                say(format!("EXEC {key}"));
            }
            2 => {
                let ReserveOutcome::Acquired(r) = db.reserve(&scope, &k, b"p", LEASE)? else {
                    return Err(Error::Corrupted(format!("{key}: fresh key not acquired")));
                };
                say(format!("ACQ {key} {}", r.token()));
                db.fail(&r, response(&key))?;
                say(format!("FAIL {key}"));
            }
            _ => {
                let ReserveOutcome::Acquired(r) = db.reserve(&scope, &k, b"p", LEASE)? else {
                    return Err(Error::Corrupted(format!("{key}: fresh key not acquired")));
                };
                say(format!("ACQ {key} {}", r.token()));
                db.release(&r)?;
                say(format!("REL {key}"));
            }
        }
    }
    Ok(())
}

/// Records live `ttl_ms`; partitions are `width_ms` wide (default: a quarter of the TTL);
/// the compactor looks every tenth of the TTL. Must match tests/common/worker.rs.
fn expiring(ttl_ms: u64, width_ms: Option<u64>) -> Retention {
    Retention::default()
        .ttl(Duration::from_millis(ttl_ms))
        .partition_width(Duration::from_millis(width_ms.unwrap_or(ttl_ms / 4).max(1)))
        .compact_interval(Some(Duration::from_millis((ttl_ms / 10).max(1))))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args.next().ok_or("usage: crash_worker DB_PATH RUN_ID")?;
    let run = args.next().ok_or("usage: crash_worker DB_PATH RUN_ID")?;
    // Registered: the order rows are logged with their records, so a kill lands on the log path.
    let mut builder = IdemDb::builder().table(ORDERS);
    if let Ok(ms) = std::env::var("IDEMDB_WORKER_CHECKPOINT_MS") {
        builder = builder.checkpoint_interval(Duration::from_millis(ms.parse()?));
    }
    let ops = match std::env::var("IDEMDB_WORKER_OPS") {
        Ok(n) => n.parse()?,
        Err(_) => u64::MAX,
    };
    let expiring = match std::env::var("IDEMDB_WORKER_TTL_MS") {
        Ok(ms) => {
            let ttl: u64 = ms.parse()?;
            let width = match std::env::var("IDEMDB_WORKER_WIDTH_MS") {
                Ok(ms) => Some(ms.parse()?),
                Err(_) => None,
            };
            builder = builder.retention(expiring(ttl, width));
            true
        }
        Err(_) => false,
    };
    let db = Arc::new(builder.open(path)?);
    say("READY".into());
    if expiring {
        let db = Arc::clone(&db);
        std::thread::spawn(move || {
            let mut said = 0;
            loop {
                let dropped = db.stats().partitions_dropped;
                if dropped > said {
                    say(format!("DROPS {dropped}"));
                    said = dropped;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        });
    }
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let (db, run) = (Arc::clone(&db), run.clone());
            std::thread::spawn(move || worker(&db, &run, t, ops))
        })
        .collect();
    for t in threads {
        t.join().map_err(|_| "a worker thread panicked")??;
    }
    // Done early (IDEMDB_WORKER_OPS): the database stays open until the kill.
    loop {
        std::thread::park();
    }
}
