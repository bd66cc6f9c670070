//! Measures open() after an unclean exit (SIGKILL) of a process that stored N records (N
//! lifecycles, reserve + complete, with the default checkpoints) and then wrote a full log
//! (64 MiB of frames after the last checkpoint): the redb repair, the log's replay, and the
//! key index's rebuild, with and without page verification. Also prints the files' sizes
//! after the N lifecycles and the checkpoints they took.
//!
//! `cargo run --release --example recovery_time -- [N] [LOG_MIB]` (default 1,000,000 and 64)

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idemdb::{Error, ExecuteOutcome, IdemDb, Key, Outcome, ReserveOutcome, Scope};

const THREADS: u64 = 64;

/// Runs keys `from..to` of `prefix` on 64 threads, as lifecycles (reserve + complete) or
/// executes, until `until` says stop.
fn run_keys(
    db: &Arc<IdemDb>,
    prefix: &'static str,
    range: std::ops::Range<u64>,
    lifecycles: bool,
    until: impl Fn(&IdemDb) -> bool + Send + Sync + Copy + 'static,
) -> Result<u64, Box<dyn std::error::Error>> {
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let db = Arc::clone(db);
            let range = range.clone();
            std::thread::spawn(move || -> Result<u64, Error> {
                let scope = Scope::new("fill", "p");
                let mut done = 0;
                for i in (range.start + t..range.end).step_by(THREADS as usize) {
                    if i % 256 == t && until(&db) {
                        break;
                    }
                    let key = Key::new(format!("{prefix}-{i:08}"));
                    let response = b"201 {\"order\":1}".to_vec();
                    if lifecycles {
                        match db.reserve(&scope, &key, b"payload", Duration::from_secs(30))? {
                            ReserveOutcome::Acquired(r) => db.complete(&r, response)?,
                            _ => {
                                return Err(Error::Corrupted(
                                    "a fresh key was not acquired".into(),
                                ));
                            }
                        }
                    } else {
                        let outcome = db.execute(&scope, &key, b"payload", |_tx| {
                            Ok::<_, Error>(Outcome::Completed(response))
                        })?;
                        if !matches!(outcome, ExecuteOutcome::Executed(_)) {
                            return Err(Error::Corrupted("a fresh key was not executed".into()));
                        }
                    }
                    done += 1;
                }
                Ok(done)
            })
        })
        .collect();
    let mut total = 0;
    for t in threads {
        total += t.join().map_err(|_| "fill thread panicked")??;
    }
    Ok(total)
}

/// The child: stores `n` records (checkpointed), then writes until `log_bytes` of frames
/// follow the last checkpoint, reports, and waits to be killed.
fn fill(path: &str, n: u64, log_bytes: u64) -> Result<(), Box<dyn std::error::Error>> {
    let started = Instant::now();
    {
        let db = Arc::new(IdemDb::open(path)?);
        run_keys(&db, "key", 0..n, true, |_| false)?;
        let fill_s = started.elapsed().as_secs_f64();
        let stats = db.stats();
        let ckpt = &stats.checkpoint_latency_us;
        eprintln!(
            "{n} lifecycles in {fill_s:.1} s ({:.0}/s), default checkpoints: database file \
             {:.0} MB, log file {:.1} MiB; {} checkpoints, {} by size or age, their latency \
             p50 ≤ {:.1} ms, p99 ≤ {:.1} ms, max ≤ {:.1} ms",
            n as f64 / fill_s,
            stats.bytes_on_disk as f64 / 1e6,
            stats.log_bytes_on_disk as f64 / (1 << 20) as f64,
            stats.checkpoints,
            ckpt.count,
            ckpt.quantile_upper_bound(0.5) as f64 / 1e3,
            ckpt.quantile_upper_bound(0.99) as f64 / 1e3,
            ckpt.quantile_upper_bound(1.0) as f64 / 1e3,
        );
    }
    let fill_s = started.elapsed().as_secs_f64();
    let db = Arc::new(
        IdemDb::builder()
            .checkpoint_bytes(u64::MAX)
            .checkpoint_interval(Duration::from_secs(24 * 3600))
            .open(path)?,
    );
    let logged = run_keys(&db, "after", 0..u64::MAX / 2, false, move |db| {
        db.stats().log_bytes_since_checkpoint >= log_bytes
    })?;
    let stats = db.stats();
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "FILLED {fill_s:.1} {logged} {} {}",
        stats.log_bytes_since_checkpoint, stats.log_bytes_on_disk
    )?;
    out.flush()?;
    // Wait to be killed: the exit is unclean.
    std::thread::park();
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("fill") {
        return fill(&args[1], args[2].parse()?, args[3].parse()?);
    }
    let n: u64 = args
        .first()
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(1_000_000);
    let log_mib: u64 = args.get(1).map(|s| s.parse()).transpose()?.unwrap_or(64);
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("fill.idemdb");
    let mut child = Command::new(std::env::current_exe()?)
        .args([
            "fill",
            path.to_str().ok_or("path")?,
            &n.to_string(),
            &(log_mib << 20).to_string(),
        ])
        .stdout(Stdio::piped())
        .spawn()?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().ok_or("stdout")?).read_line(&mut line)?;
    child.kill()?;
    child.wait()?;
    let fields: Vec<&str> = line
        .trim()
        .strip_prefix("FILLED ")
        .ok_or("fill failed")?
        .split(' ')
        .collect();
    let [fill_s, logged, frames, log_file] = fields[..] else {
        return Err("bad child report".into());
    };
    let mb = |p: &std::path::Path| std::fs::metadata(p).map(|m| m.len() as f64 / 1e6);
    let log_path = dir.path().join("fill.idemdb-wal");
    println!(
        "records: {n} stored in {fill_s} s (and closed), then {logged} executes logged after the last \
         checkpoint: {:.1} MiB of frames, log file {:.1} MiB, database file {:.0} MB",
        frames.parse::<f64>()? / (1 << 20) as f64,
        log_file.parse::<f64>()? / (1 << 20) as f64,
        mb(&path)?
    );
    println!("| open | time (ms) | frames replayed |");
    println!("|---|--:|--:|");
    for verify in [true, false] {
        // Each open repairs and replays, so each measurement opens its own unclean copy.
        let copy = dir.path().join(format!("copy-{verify}.idemdb"));
        let copy_log = dir.path().join(format!("copy-{verify}.idemdb-wal"));
        std::fs::copy(&path, &copy)?;
        std::fs::copy(&log_path, &copy_log)?;
        let started = Instant::now();
        let db = IdemDb::builder().verify_on_open(verify).open(&copy)?;
        let took = started.elapsed().as_secs_f64() * 1e3;
        let scope = Scope::new("fill", "p");
        for key in ["key-00000000", "after-00000000"] {
            assert!(
                db.get(&scope, &Key::new(key))?.is_some(),
                "{key}, written before the kill, is missing"
            );
        }
        println!(
            "| verify {} | {took:.0} | {} |",
            if verify { "on" } else { "off" },
            db.stats().replayed_frames
        );
    }
    Ok(())
}
