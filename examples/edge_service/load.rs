//! The load driver: starts the provider and the service as child processes, fires every
//! intent several times (concurrent duplicates, then sequential retries), SIGKILLs the
//! service a third of the way in and restarts it on the same file, and compares charges made,
//! purchases acknowledged and orders stored.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;
use tokio::task::JoinSet;

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
    created: AtomicU64,
    replayed: AtomicU64,
    in_progress: AtomicU64,
    unavailable: AtomicU64,
    connection_errors: AtomicU64,
    mismatches: AtomicU64,
}

struct Client {
    http: reqwest::Client,
    url: String,
    tally: Tally,
    deadline: Instant,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

impl Client {
    /// Sends until a final answer (retrying on connection errors, 409 and 503), which must be
    /// a 201: its body.
    async fn purchase(&self, key: &str, body: &str) -> Result<Vec<u8>, String> {
        match self.send(key, body).await? {
            (201, bytes) => Ok(bytes),
            (status, bytes) => {
                let body = String::from_utf8_lossy(&bytes);
                Err(format!("{key}: unexpected {status}: {body}"))
            }
        }
    }

    /// One attempt after another until an answer that is not 409, 503 or a connection error.
    async fn send(&self, key: &str, body: &str) -> Result<(u16, Vec<u8>), String> {
        loop {
            if Instant::now() > self.deadline {
                return Err(format!("{key}: no final answer before the deadline"));
            }
            bump(&self.tally.sent);
            let sent = self
                .http
                .post(&self.url)
                .header("idempotency-key", format!("\"{key}\""))
                .header("content-type", "application/json")
                .body(body.to_string())
                .send()
                .await;
            let resp = match sent {
                Ok(resp) => resp,
                Err(_) => {
                    bump(&self.tally.connection_errors);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
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
    }

    /// Every send of one intent: all must be acknowledged with the same bytes.
    async fn intent(self: Arc<Self>, intent: Intent) -> Result<(), String> {
        let intent = Arc::new(intent);
        let mut duplicates = JoinSet::new();
        for _ in 0..intent.duplicates {
            let (client, intent) = (Arc::clone(&self), Arc::clone(&intent));
            duplicates.spawn(async move { client.purchase(&intent.key, &intent.body).await });
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
        for _ in 0..intent.retries {
            check(self.purchase(&intent.key, &intent.body).await?)?;
        }
        if let Some(other) = &intent.mismatch {
            match self.send(&intent.key, other).await? {
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
    let provider_args = ["provider", "--port", "0", "--db", &provider_db];
    let provider = Server::start(
        &exe,
        &[&provider_args[..], &["--fail-every", "23"]].concat(),
    )?;
    let provider_url = format!("http://{}", provider.addr);
    let service_args = |port: &str| -> Vec<String> {
        let args = ["service", "--port", port, "--db", &service_db];
        let args = [&args[..], &["--provider", &provider_url]].concat();
        args.into_iter().map(String::from).collect()
    };
    let mut service = Server::start(&exe, &service_args("0"))?;
    let port = service.addr.port().to_string();

    let run_id = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_nanos() as u64;
    let plan: Vec<Intent> = (0..intents).map(|i| Intent::new(run_id, i)).collect();
    let planned: u64 = plan.iter().map(Intent::planned).sum();
    println!(
        "{intents} intents, {planned} requests planned, {concurrency} intents at a time; \
         provider on {}, service on {}",
        provider.addr, service.addr
    );
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(5))
        .build()?;
    let client = Arc::new(Client {
        http: http.clone(),
        url: format!("http://{}/purchases", service.addr),
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

    // A third of the way in: SIGKILL the service, restart it on the same file and port.
    while client.tally.sent.load(Ordering::Relaxed) < planned / 3 && !tasks.is_empty() {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let killed_after = client.tally.sent.load(Ordering::Relaxed);
    let down = Instant::now();
    service.kill()?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let args = service_args(&port);
    service = tokio::task::spawn_blocking(move || Server::start(&exe, &args)).await??;
    println!(
        "killed the service (SIGKILL) after {killed_after} requests, restarted it on the same \
         file in {:.2} s",
        down.elapsed().as_secs_f64()
    );

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
    let stats: serde_json::Value = serde_json::from_str(
        &http
            .get(format!("http://{}/stats", service.addr))
            .send()
            .await?
            .text()
            .await?,
    )?;
    println!(
        "restarted service: {} takeovers of the killed process's reservations, {} releases, \
         {} fenced",
        stats["takeovers"], stats["releases"], stats["fenced"]
    );
    for failure in failures.iter().take(5) {
        println!("failed: {failure}");
    }
    let charges = get_number(&http, format!("http://{}/count", provider.addr)).await?;
    let orders = get_number(&http, format!("http://{}/orders/count", service.addr)).await?;
    println!(
        "charges made: {charges}, purchases acknowledged: {acknowledged}, orders stored: {orders}"
    );
    let expected = intents as u64;
    let equal = failures.is_empty() && [charges, acknowledged, orders] == [expected; 3];
    if equal {
        println!("OK: each of the {intents} purchases was charged once and stored once");
    } else {
        println!("FAILED: expected {intents} of each");
    }
    Ok(equal)
}
