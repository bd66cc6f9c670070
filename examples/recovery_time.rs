//! Measures open() after an unclean exit (SIGKILL) of a process that wrote N records, with and
//! without redb's quick-repair, and with and without page verification on open.
//!
//! `cargo run --release --example recovery_time -- [N]` (default N = 1,000,000)

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Instant;

use idemdb::{Error, ExecuteOutcome, IdemDb, Key, Outcome, Scope};

const THREADS: u64 = 64;

fn fill(path: &str, n: u64, quick_repair: bool) -> Result<(), Box<dyn std::error::Error>> {
    let db = Arc::new(IdemDb::builder().quick_repair(quick_repair).open(path)?);
    let started = Instant::now();
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let db = Arc::clone(&db);
            std::thread::spawn(move || -> Result<(), Error> {
                let scope = Scope::new("fill", "p");
                for i in (t..n).step_by(THREADS as usize) {
                    let key = Key::new(format!("key-{i:08}"));
                    let outcome = db.execute(&scope, &key, b"payload", |_tx| {
                        Ok::<_, Error>(Outcome::Completed(b"201 {\"order\":1}".to_vec()))
                    })?;
                    if !matches!(outcome, ExecuteOutcome::Executed(_)) {
                        return Err(Error::Corrupted("a fresh key was not executed".into()));
                    }
                }
                Ok(())
            })
        })
        .collect();
    for t in threads {
        t.join().map_err(|_| "fill thread panicked")??;
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "FILLED {:.1}", started.elapsed().as_secs_f64())?;
    out.flush()?;
    // Wait to be killed: the exit is unclean.
    std::thread::park();
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("fill") {
        return fill(&args[1], args[2].parse()?, args[3] == "true");
    }
    let n: u64 = args
        .first()
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(1_000_000);
    let dir = tempfile::tempdir()?;
    println!("records: {n}");
    println!(
        "| quick_repair | fill (s) | file (MB) | open, verify on (ms) | open, verify off (ms) |"
    );
    println!("|---|---|---|---|---|");
    for quick_repair in [false, true] {
        let path = dir.path().join(format!("fill-{quick_repair}.idemdb"));
        let mut child = Command::new(std::env::current_exe()?)
            .args([
                "fill",
                path.to_str().ok_or("path")?,
                &n.to_string(),
                &quick_repair.to_string(),
            ])
            .stdout(Stdio::piped())
            .spawn()?;
        let mut line = String::new();
        BufReader::new(child.stdout.take().ok_or("stdout")?).read_line(&mut line)?;
        child.kill()?;
        child.wait()?;
        let fill_s = line
            .trim()
            .strip_prefix("FILLED ")
            .ok_or("fill failed")?
            .to_string();
        let size = std::fs::metadata(&path)?.len() as f64 / 1e6;
        let mut times = Vec::new();
        for verify in [true, false] {
            // Each open repairs the file, so each measurement opens its own unclean copy.
            let copy = dir
                .path()
                .join(format!("copy-{quick_repair}-{verify}.idemdb"));
            std::fs::copy(&path, &copy)?;
            let started = Instant::now();
            let db = IdemDb::builder().verify_on_open(verify).open(&copy)?;
            times.push(started.elapsed().as_secs_f64() * 1e3);
            let probe = db.get(&Scope::new("fill", "p"), &Key::new("key-00000000"))?;
            assert!(
                probe.is_some(),
                "a record written before the kill is missing"
            );
            drop(db);
            std::fs::remove_file(&copy)?;
        }
        println!(
            "| {quick_repair} | {fill_s} | {size:.0} | {:.0} | {:.0} |",
            times[0], times[1]
        );
        std::fs::remove_file(&path)?;
    }
    Ok(())
}
