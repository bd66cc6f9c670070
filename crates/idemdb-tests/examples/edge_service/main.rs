//! The example edge service (issue 6): a purchase service on idemdb's two-step flow
//! (`reserve`, charge, `complete_with` writing the order in the record's commit), a fake
//! payment provider deduplicating by the key passed downstream (idemdb's HTTP layer), and a
//! load driver firing duplicates and retries while it SIGKILLs and restarts the service.
//!
//! `cargo run --release -p idemdb-tests --example edge_service` runs the whole demo; it starts the other two
//! subcommands as child processes of itself:
//!
//! ```text
//! edge_service [load] [--intents N] [--concurrency C] [--deadline SECONDS]
//!              [--postgres URL] [--instances N]
//! edge_service provider --port P --db PATH [--fail-every K] [--latency-ms MS]
//! edge_service service --port P --db PATH --provider URL
//! edge_service service --port P --postgres URL --provider URL [--pool-size N]
//! ```
//!
//! With `--postgres URL` or `--instances N` (N >= 2) the load driver runs N service processes
//! on one PostgreSQL database (`idemdb_postgres::PgStore`), sends each purchase's duplicates and
//! retries to them in turn, and SIGKILLs the first one mid-run; the others take over its
//! reservations once their lease runs out. Without a URL it starts a throwaway PostgreSQL
//! (`idemdb_testkit::postgres::TestServer`: `$IDEMDB_TEST_PG`, or `initdb` from the machine's
//! PostgreSQL installation).

mod load;
mod orders;
mod provider;
mod service;

use std::collections::HashMap;
use std::str::FromStr;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Set by `load` in its children's environment.
const CHILD_ENV: &str = "EDGE_SERVICE_CHILD";

/// A subcommand and its `--name value` flags.
pub struct Args {
    command: String,
    flags: HashMap<String, String>,
}

impl Args {
    fn parse(mut args: impl Iterator<Item = String>) -> Result<Args, BoxError> {
        let mut command = String::from("load");
        let mut flags = HashMap::new();
        let mut pending = args.next();
        if let Some(first) = pending.take_if(|a| !a.starts_with("--")) {
            command = first;
            pending = args.next();
        }
        while let Some(name) = pending {
            let Some(value) = args.next() else {
                return Err(format!("{name} needs a value").into());
            };
            if !name.starts_with("--") {
                return Err(format!("unexpected argument {name:?}").into());
            }
            flags.insert(name, value);
            pending = args.next();
        }
        Ok(Args { command, flags })
    }

    fn required(&self, name: &str) -> Result<&str, BoxError> {
        self.flags
            .get(name)
            .map(String::as_str)
            .ok_or_else(|| format!("{} needs {name}", self.command).into())
    }

    fn optional(&self, name: &str) -> Option<&str> {
        self.flags.get(name).map(String::as_str)
    }

    fn number<T: FromStr>(&self, name: &str, default: T) -> Result<T, BoxError> {
        match self.flags.get(name) {
            None => Ok(default),
            Some(v) => v
                .parse()
                .map_err(|_| format!("{name}: not a number: {v:?}").into()),
        }
    }
}

fn main() -> Result<(), BoxError> {
    let args = Args::parse(std::env::args().skip(1))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    match args.command.as_str() {
        "provider" => runtime.block_on(provider::run(&args)),
        "service" => runtime.block_on(service::run(&args)),
        "load" => {
            let equal = runtime.block_on(load::run(&args))?;
            drop(runtime);
            if !equal {
                std::process::exit(1);
            }
            Ok(())
        }
        other => Err(format!("unknown subcommand {other:?}: load, provider or service").into()),
    }
}

/// Serves `app` on 127.0.0.1:`port` (0: a free port) and prints `listening on ADDR` for the
/// parent to read.
async fn serve(port: u16, app: axum::Router) -> Result<(), BoxError> {
    if std::env::var_os(CHILD_ENV).is_some() {
        // Started by `load`: exit when it does, even if it was killed (stdin reaches EOF).
        std::thread::spawn(|| {
            let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
            std::process::exit(0);
        });
    }
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    println!("listening on {}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}

/// A header's value as text.
fn header<'h>(headers: &'h axum::http::HeaderMap, name: &str) -> Option<&'h str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}
