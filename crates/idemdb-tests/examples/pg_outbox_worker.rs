//! A worker for the PostgreSQL outbox kill -9 test (tests/pg_outbox_kill.rs): four tasks run
//! `execute`s that each stage one message (ordering key: the task), and print `ACK <key>` once
//! the commit is acknowledged; a `PgDispatcher` in the same process publishes by appending
//! `SENT <id> <key>` to the file given as the third argument. It runs until it is killed, so
//! kills land before, inside and after commits, claims, publishes and delivery marks.
//!
//! `cargo run --release -p idemdb-tests --example pg_outbox_worker -- <url> run-1 /tmp/sent`

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idemdb_postgres::{
    DispatchOptions, Key, Message, OutboxMessage, Outcome, PgDispatcher, PgError, PgStore, PgTx,
    PublishError, Scope,
};

fn say(line: String) {
    // One write per line: a pipe write below PIPE_BUF is atomic, so lines never interleave.
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(format!("{line}\n").as_bytes());
    let _ = out.flush();
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (url, run, sent) = match (args.next(), args.next(), args.next()) {
        (Some(u), Some(r), Some(s)) => (u, r, s),
        _ => return Err("usage: pg_outbox_worker <url> <run> <sent-file>".into()),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(work(url, run, sent))
}

async fn work(url: String, run: String, sent: String) -> Result<(), Box<dyn std::error::Error>> {
    let db = Arc::new(PgStore::builder(&url)?.pool_size(8).connect().await?);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&sent)?;
    let file = Arc::new(Mutex::new(file));
    let publisher = move |m: OutboxMessage| {
        let key = String::from_utf8_lossy(&m.payload).into_owned();
        // One append per message: a kill cannot split it.
        let written = file
            .lock()
            .map_err(|_| PublishError::Transient("the file lock is poisoned".into()))
            .and_then(|mut f| {
                f.write_all(format!("SENT {} {key}\n", m.id).as_bytes())
                    .map_err(|e| PublishError::Transient(e.to_string()))
            });
        std::future::ready(written)
    };
    // A short lease: a killed worker's claims lapse quickly for the next one.
    let options = DispatchOptions::default()
        .backoff(Duration::from_millis(1), Duration::from_millis(10))
        .claim_lease(Duration::from_secs(2));
    let _dispatcher = PgDispatcher::start(&db, publisher, options);
    say("READY".into());
    let tasks: Vec<_> = (0..4)
        .map(|t| {
            let (db, run) = (Arc::clone(&db), run.clone());
            tokio::spawn(async move {
                let scope = Scope::new("outbox", "worker");
                for i in 0u64.. {
                    let key = format!("{run}-t{t}-{i}");
                    let okey = format!("{run}-t{t}");
                    let payload = key.clone();
                    let _ = db
                        .execute(&scope, &Key::new(&key), b"p", |tx: &mut PgTx<'_>| {
                            let m = Message::new("orders", payload.clone().into_bytes())
                                .ordering_key(okey.clone().into_bytes());
                            Box::pin(async move {
                                tx.stage(m).await?;
                                Ok::<_, PgError>(Outcome::Completed(b"ok".to_vec()))
                            })
                        })
                        .await
                        .map_err(|e| format!("{key}: {e}"))?;
                    say(format!("ACK {key}"));
                }
                Ok::<(), String>(())
            })
        })
        .collect();
    for t in tasks {
        t.await??;
    }
    Ok(())
}
