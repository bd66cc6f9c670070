//! A worker for the outbox kill -9 test (tests/outbox_kill.rs): four threads run `execute`s
//! that each stage one message (ordering key: the thread), and print `ACK <key>` once the
//! commit is acknowledged; a dispatcher in the same process publishes by appending
//! `SENT <id> <key>` to the file given as the third argument. It runs until it is killed, so
//! kills land before, inside and after commits, publishes and delivery marks.
//!
//! `cargo run --release -p idemdb-tests --example outbox_worker -- /tmp/db run-1 /tmp/sent`

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use idemdb::{
    DispatchOptions, Dispatcher, Error, IdemDb, Key, Message, OutboxMessage, Outcome, Scope,
};

fn say(line: String) {
    // One write per line: a pipe write below PIPE_BUF is atomic, so lines never interleave.
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(format!("{line}\n").as_bytes());
    let _ = out.flush();
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (path, run, sent) = match (args.next(), args.next(), args.next()) {
        (Some(p), Some(r), Some(s)) => (p, r, s),
        _ => return Err("usage: outbox_worker <db> <run> <sent-file>".into()),
    };
    let db = Arc::new(IdemDb::open(&path)?);
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&sent)?;
    let publisher = move |m: &OutboxMessage| {
        let key = String::from_utf8_lossy(&m.payload);
        // One append per message: a kill cannot split it.
        file.write_all(format!("SENT {} {key}\n", m.id).as_bytes())
            .map_err(|e| idemdb::PublishError::Transient(e.to_string()))
    };
    let options =
        DispatchOptions::default().backoff(Duration::from_millis(1), Duration::from_millis(10));
    let _dispatcher = Dispatcher::start(Arc::clone(&db), publisher, options)?;
    say("READY".into());
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let (db, run) = (Arc::clone(&db), run.clone());
            std::thread::spawn(move || -> Result<(), Error> {
                let scope = Scope::new("outbox", "worker");
                for i in 0u64.. {
                    let key = format!("{run}-t{t}-{i}");
                    let staged = Message::new("orders", key.clone().into_bytes())
                        .ordering_key(format!("{run}-t{t}").into_bytes());
                    let _ = db
                        .execute(&scope, &Key::new(&key), b"p", move |tx| {
                            tx.stage(staged)?;
                            Ok::<_, Error>(Outcome::Completed(b"ok".to_vec()))
                        })
                        .map_err(|e| Error::Internal(format!("{key}: {e}")))?;
                    say(format!("ACK {key}"));
                }
                Ok(())
            })
        })
        .collect();
    for t in threads {
        t.join().map_err(|_| "a worker thread panicked")??;
    }
    Ok(())
}
