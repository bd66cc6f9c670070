//! The load driver: starts the provider and the service as child processes, fires every
//! intent several times (concurrent duplicates, then sequential retries), SIGKILLs the
//! service a third of the way in and restarts it on the same file, and compares charges made,
//! purchases acknowledged and orders stored.
//!
//! Over PostgreSQL (`--postgres URL` or `--instances N`): N service processes share one
//! database; each send of a purchase goes to the next instance in turn (concurrent duplicates
//! start on different instances). The provider takes 40 ms longer per charge, and the first
//! instance is SIGKILLed while it is charging, once a third of the requests were answered,
//! and not restarted: the others answer its purchases, taking over its reservations once
//! their lease runs out. The orders are then counted in PostgreSQL itself, with their
//! distinct charges.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idemdb_postgres::tokio_postgres;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::service::LEASE;
use crate::{Args, BoxError, CHILD_ENV};

/// A child process of this program, killed (SIGKILL) when dropped.
struct Server {
    child: std::process::Child,
    addr: SocketAddr,
    _stdout: BufReader<ChildStdout>,
    _stdin: Option<ChildStdin>,
}

impl Server {
    /// Starts `exe args` and waits for its `listening on ADDR` line.
    fn start<S: AsRef<str>>(exe: &Path, args: &[S]) -> Result<Server, BoxError> {
        let args: Vec<&str> = args.iter().map(AsRef::as_ref).collect();
        let mut child = Command::new(exe)
            .args(&args)
            .env(CHILD_ENV, "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let mut stdout = BufReader::new(child.stdout.take().ok_or("no stdout")?);
        let mut line = String::new();
        stdout.read_line(&mut line)?;
        let Some(addr) = line.trim().strip_prefix("listening on ") else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("{} did not start: {line:?}", args[0]).into());
        };
        let addr = addr.parse()?;
        Ok(Server {
            _stdin: child.stdin.take(),
            child,
            addr,
            _stdout: stdout,
        })
    }

    fn kill(&mut self) -> std::io::Result<()> {
        self.child.kill()?; // SIGKILL on unix
        self.child.wait().map(drop)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.kill();
    }
}

/// One purchase intent and how often the client sends it.
struct Intent {
    /// Its number: where its sends start in the turn of instances.
    index: usize,
    key: String,
    body: String,
    /// Sent this many times at once.
    duplicates: usize,
    /// Then this many times one after the other.
    retries: usize,
    /// Then once with the same key and this other body: must be refused (422).
    mismatch: Option<String>,
}

impl Intent {
    fn new(run: u64, i: usize) -> Intent {
        let body = |cents: usize| {
            serde_json::json!({"user": format!("user-{}", i % 17), "sku": format!("sku-{}", i % 5), "cents": cents})
                .to_string()
        };
        Intent {
            index: i,
            key: format!("{run:x}-intent-{i}"),
            body: body(100 + i),
            duplicates: 2 + i % 3,
            retries: 1 + i % 2,
            mismatch: i.is_multiple_of(10).then(|| body(1 + i)),
        }
    }

    fn planned(&self) -> u64 {
        (self.duplicates + self.retries + usize::from(self.mismatch.is_some())) as u64
    }
}

/// What the clients saw.
#[derive(Default)]
struct Tally {
    sent: AtomicU64,
    /// Sends that got an HTTP answer.
    answered: AtomicU64,
    created: AtomicU64,
    replayed: AtomicU64,
    in_progress: AtomicU64,
    unavailable: AtomicU64,
    connection_errors: AtomicU64,
    mismatches: AtomicU64,
}

struct Client {
    http: reqwest::Client,
    /// `POST /purchases` of each instance: a send goes to the next one in turn.
    urls: Vec<String>,
    tally: Tally,
    deadline: Instant,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

impl Client {
    /// Sends until a final answer (retrying on connection errors, 409 and 503), which must be
    /// a 201: its body. The first attempt goes to instance `start`, each next one to the next
    /// instance.
    async fn purchase(&self, key: &str, body: &str, start: usize) -> Result<Vec<u8>, String> {
        match self.send(key, body, start).await? {
            (201, bytes) => Ok(bytes),
            (status, bytes) => {
                let body = String::from_utf8_lossy(&bytes);
                Err(format!("{key}: unexpected {status}: {body}"))
            }
        }
    }

    /// One attempt after another until an answer that is not 409, 503 or a connection error.
    async fn send(&self, key: &str, body: &str, start: usize) -> Result<(u16, Vec<u8>), String> {
        let mut refused_in_a_row = 0;
        for attempt in start.. {
            if Instant::now() > self.deadline {
                return Err(format!("{key}: no final answer before the deadline"));
            }
            bump(&self.tally.sent);
            let sent = self
                .http
                .post(&self.urls[attempt % self.urls.len()])
                .header("idempotency-key", format!("\"{key}\""))
                .header("content-type", "application/json")
                .body(body.to_string())
                .send()
                .await;
            let resp = match sent {
                Ok(resp) => resp,
                Err(_) => {
                    bump(&self.tally.connection_errors);
                    // The next instance at once; a pause once every instance refused.
                    refused_in_a_row += 1;
                    if refused_in_a_row % self.urls.len() == 0 {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    continue;
                }
            };
            refused_in_a_row = 0;
            bump(&self.tally.answered);
            let status = resp.status().as_u16();
            let replayed = resp.headers().contains_key("idempotent-replayed");
            let retry_after = resp
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .map_or(Duration::from_secs(1), Duration::from_secs);
            let Ok(bytes) = resp.bytes().await else {
                bump(&self.tally.connection_errors);
                continue;
            };
            match status {
                409 => {
                    bump(&self.tally.in_progress);
                    // Poll faster than Retry-After: the owner usually finishes in milliseconds.
                    tokio::time::sleep(retry_after.min(Duration::from_millis(100))).await;
                }
                503 => {
                    bump(&self.tally.unavailable);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                201 if replayed => {
                    bump(&self.tally.replayed);
                    return Ok((status, bytes.to_vec()));
                }
                201 => {
                    bump(&self.tally.created);
                    return Ok((status, bytes.to_vec()));
                }
                _ => return Ok((status, bytes.to_vec())),
            }
        }
        unreachable!("the attempts are unbounded")
    }

    /// Every send of one intent: all must be acknowledged with the same bytes.
    async fn intent(self: Arc<Self>, intent: Intent) -> Result<(), String> {
        let intent = Arc::new(intent);
        let mut duplicates = JoinSet::new();
        for d in 0..intent.duplicates {
            let (client, intent) = (Arc::clone(&self), Arc::clone(&intent));
            duplicates.spawn(async move {
                client
                    .purchase(&intent.key, &intent.body, intent.index + d)
                    .await
            });
        }
        let mut first: Option<Vec<u8>> = None;
        let mut check = |bytes: Vec<u8>| match &first {
            Some(f) if *f != bytes => Err(format!("{}: two different answers", intent.key)),
            Some(_) => Ok(()),
            None => {
                first = Some(bytes);
                Ok(())
            }
        };
        while let Some(joined) = duplicates.join_next().await {
            check(joined.map_err(|e| e.to_string())??)?;
        }
        let mut next = intent.index + intent.duplicates;
        for _ in 0..intent.retries {
            check(self.purchase(&intent.key, &intent.body, next).await?)?;
            next += 1;
        }
        if let Some(other) = &intent.mismatch {
            match self.send(&intent.key, other, next).await? {
                (422, _) => bump(&self.tally.mismatches),
                (status, _) => return Err(format!("{}: reused key got {status}", intent.key)),
            }
        }
        Ok(())
    }
}

async fn get_number(http: &reqwest::Client, url: String) -> Result<u64, BoxError> {
    Ok(http.get(url).send().await?.text().await?.trim().parse()?)
}

async fn get_json(http: &reqwest::Client, url: String) -> Result<serde_json::Value, BoxError> {
    Ok(serde_json::from_str(
        &http.get(url).send().await?.text().await?,
    )?)
}

/// Where the service keeps its records.
enum Mode {
    /// One process on an embedded file: killed and restarted on the same file.
    Embedded { db: String },
    /// `instances` processes on one PostgreSQL database: the first is killed, the others
    /// carry on.
    Postgres { url: String, instances: usize },
}

/// An instance's name in the output: A, B, C...
fn name(i: usize) -> char {
    char::from(b'A' + (i % 26) as u8)
}

/// Runs the demo; whether charges made, purchases acknowledged and orders stored all equal
/// the number of intents.
pub async fn run(args: &Args) -> Result<bool, BoxError> {
    let intents: usize = args.number("--intents", 300)?;
    let concurrency: usize = args.number("--concurrency", 32)?;
    let deadline = Duration::from_secs(args.number("--deadline", 90)?);
    let exe = std::env::current_exe()?;
    let dir = tempfile::tempdir()?;
    let path = |name: &str| dir.path().join(name).to_string_lossy().into_owned();
    let (provider_db, service_db) = (path("provider.idemdb"), path("service.idemdb"));
    let postgres = args.optional("--postgres");
    let instances: usize = args.number("--instances", if postgres.is_some() { 2 } else { 1 })?;
    let mode = match (postgres, instances) {
        (None, 1) => Mode::Embedded { db: service_db },
        (_, 0 | 1) => return Err("over PostgreSQL, --instances must be 2 or more".into()),
        (Some(url), instances) => Mode::Postgres {
            url: url.to_string(),
            instances,
        },
        (None, instances) => {
            // A fresh database on a throwaway server (or on $IDEMDB_TEST_PG), which stops
            // when this process ends.
            let url = tokio::task::spawn_blocking(|| {
                idemdb_testkit::postgres::TestServer::shared()?.fresh_database()
            })
            .await??;
            println!("a fresh PostgreSQL database: {url}");
            Mode::Postgres { url, instances }
        }
    };
    let provider_args = ["provider", "--port", "0", "--db", &provider_db];
    // Over PostgreSQL, charges take 40 ms longer: A is killed while it is charging.
    let latency = match mode {
        Mode::Embedded { .. } => "0",
        Mode::Postgres { .. } => "40",
    };
    let provider = Server::start(
        &exe,
        &[
            &provider_args[..],
            &["--fail-every", "23", "--latency-ms", latency],
        ]
        .concat(),
    )?;
    let provider_url = format!("http://{}", provider.addr);
    let service_args = |port: &str| -> Vec<String> {
        let store = match &mode {
            Mode::Embedded { db } => ["--db", db.as_str()],
            Mode::Postgres { url, .. } => ["--postgres", url.as_str()],
        };
        let args = [
            &["service", "--port", port][..],
            &store,
            &["--provider", &provider_url],
        ];
        args.concat().into_iter().map(String::from).collect()
    };
    let services = match &mode {
        Mode::Embedded { .. } => vec![Server::start(&exe, &service_args("0"))?],
        // Started together: each migrates and creates the orders table if missing.
        Mode::Postgres { instances, .. } => {
            let mut starting = JoinSet::new();
            for i in 0..*instances {
                let (exe, args) = (exe.clone(), service_args("0"));
                starting.spawn_blocking(move || Server::start(&exe, &args).map(|s| (i, s)));
            }
            let mut started = Vec::new();
            while let Some(joined) = starting.join_next().await {
                started.push(joined??);
            }
            started.sort_by_key(|(i, _)| *i);
            started.into_iter().map(|(_, s)| s).collect()
        }
    };
    let listing = match &mode {
        Mode::Embedded { .. } => format!("service on {}", services[0].addr),
        Mode::Postgres { .. } => {
            let on = services.iter().enumerate();
            let on: Vec<String> = on
                .map(|(i, s)| format!("{} on {}", name(i), s.addr))
                .collect();
            format!("service instances {} over PostgreSQL", on.join(", "))
        }
    };

    let run_id = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_nanos() as u64;
    let plan: Vec<Intent> = (0..intents).map(|i| Intent::new(run_id, i)).collect();
    let planned: u64 = plan.iter().map(Intent::planned).sum();
    println!(
        "{intents} intents, {planned} requests planned, {concurrency} intents at a time; \
         provider on {}, {listing}",
        provider.addr
    );
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(5))
        .build()?;
    let client = Arc::new(Client {
        http: http.clone(),
        urls: services
            .iter()
            .map(|s| format!("http://{}/purchases", s.addr))
            .collect(),
        tally: Tally::default(),
        deadline: Instant::now() + deadline,
    });
    let started = Instant::now();
    let gate = Arc::new(Semaphore::new(concurrency));
    let mut tasks = JoinSet::new();
    for intent in plan {
        let (client, gate) = (Arc::clone(&client), Arc::clone(&gate));
        tasks.spawn(async move {
            let _permit = gate.acquire_owned().await.map_err(|e| e.to_string())?;
            client.intent(intent).await
        });
    }

    // A third of the way in: SIGKILL the (first) service. Over PostgreSQL, a third of the
    // requests answered: the first sends all go out at once, and A must have served some.
    let progress = match &mode {
        Mode::Embedded { .. } => &client.tally.sent,
        Mode::Postgres { .. } => &client.tally.answered,
    };
    while progress.load(Ordering::Relaxed) < planned / 3 && !tasks.is_empty() {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let killed_after = client.tally.sent.load(Ordering::Relaxed);
    let mut services = services;
    match &mode {
        Mode::Embedded { .. } => {
            // Restarted on the same file and port.
            let down = Instant::now();
            let port = services[0].addr.port().to_string();
            services[0].kill()?;
            tokio::time::sleep(Duration::from_millis(200)).await;
            let (exe, args) = (exe.clone(), service_args(&port));
            services[0] = tokio::task::spawn_blocking(move || Server::start(&exe, &args)).await??;
            println!(
                "killed the service (SIGKILL) after {killed_after} requests, restarted it on \
                 the same file in {:.2} s",
                down.elapsed().as_secs_f64()
            );
        }
        Mode::Postgres { .. } => {
            // While A is charging (its owners wait for the provider's answer, 40 ms or more),
            // so that it leaves reservations to take over; waited for up to 3 s.
            let stats = format!("http://{}/stats", services[0].addr);
            let until = Instant::now() + Duration::from_secs(3);
            let mut charging = 0;
            while Instant::now() < until && !tasks.is_empty() {
                let now = get_json(&http, stats.clone()).await?;
                charging = now["charging"].as_u64().unwrap_or(0);
                if charging > 0 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            services[0].kill()?;
            let killed_after = client.tally.sent.load(Ordering::Relaxed);
            println!(
                "killed instance A (SIGKILL) after {killed_after} requests, while it was \
                 charging {charging} purchases; not restarted: its sends now fail to connect \
                 and go on to the next instance, which takes over A's reservations once their \
                 {} s lease has run out",
                LEASE.as_secs()
            );
        }
    }

    let (mut acknowledged, mut failures) = (0u64, Vec::new());
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok(Ok(())) => acknowledged += 1,
            Ok(Err(e)) => failures.push(e),
            Err(e) => failures.push(e.to_string()),
        }
    }
    let t = &client.tally;
    let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
    println!(
        "{} requests in {:.1} s: 201 first answers {}, 201 replays {}, 409 in progress {}, \
         503 retry {}, connection errors {}, 422 key reused {}",
        n(&t.sent),
        started.elapsed().as_secs_f64(),
        n(&t.created),
        n(&t.replayed),
        n(&t.in_progress),
        n(&t.unavailable),
        n(&t.connection_errors),
        n(&t.mismatches)
    );
    let charges = get_number(&http, format!("http://{}/count", provider.addr)).await?;
    let (orders, distinct_charges) = match &mode {
        Mode::Embedded { .. } => {
            let stats = get_json(&http, format!("http://{}/stats", services[0].addr)).await?;
            println!(
                "restarted service: {} takeovers of the killed process's reservations, {} \
                 releases, {} fenced",
                stats["takeovers"], stats["releases"], stats["fenced"]
            );
            let url = format!("http://{}/orders/count", services[0].addr);
            (get_number(&http, url).await?, None)
        }
        Mode::Postgres { url, .. } => {
            let mut takeovers = 0;
            for (i, service) in services.iter().enumerate().skip(1) {
                let stats = get_json(&http, format!("http://{}/stats", service.addr)).await?;
                takeovers += stats["takeovers"].as_u64().unwrap_or(0);
                println!(
                    "instance {}: {} purchases run, {} takeovers of expired reservations, {} \
                     replays, {} answered 409 in progress, {} releases, {} fenced",
                    name(i),
                    stats["acquired"],
                    stats["takeovers"],
                    stats["replays"],
                    stats["in_progress"],
                    stats["releases"],
                    stats["fenced"]
                );
            }
            println!("takeovers: {takeovers}, kills: 1 (instance A)");
            let (orders, distinct) = count_orders(url, run_id).await?;
            (orders, Some(distinct))
        }
    };
    for failure in failures.iter().take(5) {
        println!("failed: {failure}");
    }
    println!(
        "charges made: {charges}, purchases acknowledged: {acknowledged}, orders stored: {orders}"
    );
    let expected = intents as u64;
    let mut equal = failures.is_empty() && [charges, acknowledged, orders] == [expected; 3];
    if let Some(distinct) = distinct_charges {
        println!("distinct charges among the orders: {distinct}");
        equal &= distinct == orders;
    }
    if equal {
        println!("OK: each of the {intents} purchases was charged once and stored once");
    } else {
        println!("FAILED: expected {intents} of each");
    }
    drop(services);
    drop(provider);
    Ok(equal)
}

/// This run's orders in PostgreSQL (by the run's key prefix: the database may hold earlier
/// runs'), and how many distinct provider charges they carry.
async fn count_orders(url: &str, run_id: u64) -> Result<(u64, u64), BoxError> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    let connection = tokio::spawn(connection);
    let row = client
        .query_one(
            "SELECT count(*), count(DISTINCT charge) FROM orders WHERE idem_key LIKE $1",
            &[&format!("{run_id:x}-intent-%")],
        )
        .await?;
    drop(client);
    let _ = connection.await;
    Ok((row.get::<_, i64>(0) as u64, row.get::<_, i64>(1) as u64))
}
