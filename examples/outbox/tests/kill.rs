//! The outbox end to end through crashes: a receiver process, and a sender process started
//! again and again on one database file, each run ending in a crash at one of the failure
//! windows (aborted between commit and publish, aborted between the receiver's 2xx and the
//! delivery mark, or SIGKILLed from outside at a random moment; in some of the last, the
//! receiver is SIGKILLed too and comes back on the same port after the run), while the test
//! places purchases (new ones, retries of acknowledged keys, retries of unanswered ones, and
//! invalid ones the sender rejects after staging their message). A last, clean run drains the
//! outbox. Then every committed purchase's effect is at the receiver exactly once, every
//! acknowledged purchase is committed, and no effect exists for a purchase that never
//! committed.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_outbox");

/// Crashed sender runs before the clean one; each failure window gets a third of them.
const RUNS: usize = 30;

/// The most requests one sender run gets before the test stops feeding it.
const REQUESTS_PER_RUN: usize = 12;

/// The whole test's bound, never reached unless something hangs (on 2 shared cores the test
/// takes about 1 s in release, 2 s in debug).
const BUDGET: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// OUTBOX_CRASH=before_publish: abort between the commit and the publish.
    BeforePublish,
    /// OUTBOX_CRASH=after_publish: abort between the receiver's 2xx and the delivery mark.
    AfterPublish,
    /// SIGKILL from the test at a random moment.
    Killed,
}

/// What the service's stdout reader thread reports.
enum Event {
    Line(String),
    Closed,
}

/// A service process, killed on drop (a failing test leaves no process behind).
struct Service {
    child: Arc<Mutex<Child>>,
    events: mpsc::Receiver<Event>,
}

impl Service {
    fn start(args: &[&str], crash: Option<(&str, u64)>) -> Service {
        let mut command = Command::new(BIN);
        command
            .args(args)
            .env_remove("OUTBOX_CRASH")
            .env_remove("OUTBOX_CRASH_AT")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if let Some((point, at)) = crash {
            command
                .env("OUTBOX_CRASH", point)
                .env("OUTBOX_CRASH_AT", at.to_string());
        }
        let mut child = command.spawn().expect("spawn the outbox binary");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, events) = mpsc::channel();
        // Stdout closes when the process dies: the exit signal, with no polling.
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(Event::Line(line)).is_err() {
                    return;
                }
            }
            let _ = tx.send(Event::Closed);
        });
        Service {
            child: Arc::new(Mutex::new(child)),
            events,
        }
    }

    /// The address from the `listening on http://<addr>` line; `None` if the process died
    /// first (a crash point reached by the backlog at start).
    fn address(&self, deadline: Instant) -> Option<SocketAddr> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.events.recv_timeout(left) {
                Ok(Event::Line(line)) => {
                    if let Some(addr) = line.strip_prefix("listening on http://") {
                        return Some(addr.parse().expect("a socket address"));
                    }
                }
                Ok(Event::Closed) | Err(RecvTimeoutError::Disconnected) => return None,
                Err(RecvTimeoutError::Timeout) => panic!("the service never said it listens"),
            }
        }
    }

    /// Waits for the process to end, up to `patience`; kills it after that. Its exit signal.
    fn end(&self, patience: Duration) -> Option<i32> {
        let deadline = Instant::now() + patience;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.events.recv_timeout(left) {
                Ok(Event::Line(_)) => continue,
                Ok(Event::Closed) | Err(RecvTimeoutError::Disconnected) => break,
                Err(RecvTimeoutError::Timeout) => {
                    self.kill();
                    break;
                }
            }
        }
        let mut child = self.child.lock().unwrap_or_else(PoisonError::into_inner);
        child.wait().expect("wait for the service").signal()
    }

    fn kill(&self) {
        let mut child = self.child.lock().unwrap_or_else(PoisonError::into_inner);
        let _ = child.kill(); // SIGKILL
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let mut child = self.child.lock().unwrap_or_else(PoisonError::into_inner);
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// One HTTP/1.1 request on a fresh connection; the status and the body. Any failure (the
/// process died before or while answering) is an error: the request's fate is unknown.
fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    key: Option<&str>,
    body: &[u8],
) -> std::io::Result<(u16, Vec<u8>)> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    stream.set_write_timeout(Some(Duration::from_secs(10)))?;
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    if let Some(key) = key {
        head.push_str(&format!("Idempotency-Key: {key}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    stream.write_all(body)?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let torn = || std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "a torn response");
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(torn)?;
    let status = std::str::from_utf8(raw.get(9..12).ok_or_else(torn)?)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(torn)?;
    Ok((status, raw[end + 4..].to_vec()))
}

fn get_json(addr: SocketAddr, path: &str) -> Value {
    let (status, body) = http(addr, "GET", path, None, b"").expect("GET");
    assert_eq!(
        status,
        200,
        "GET {path}: {}",
        String::from_utf8_lossy(&body)
    );
    serde_json::from_slice(&body).expect("a JSON body")
}

fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// A purchase as the client sends it, every time (a retry sends the same bytes).
#[derive(Debug, Clone)]
struct Purchase {
    order: String,
    key: String,
    body: Vec<u8>,
    valid: bool,
}

impl Purchase {
    fn new(n: usize) -> Purchase {
        // Every fifth is invalid: the sender stages its message, then rejects it, and the
        // rollback must take the message with it.
        let qty = if n % 5 == 4 { 0 } else { 1 + n % 3 };
        let order = format!("o-{n}");
        let body = format!(
            r#"{{"order_id":"{order}","customer":"c-{}","qty":{qty}}}"#,
            n % 4
        );
        Purchase {
            order,
            key: format!("k-{n}"),
            body: body.into_bytes(),
            valid: qty > 0,
        }
    }
}

/// The client's view of the purchases.
#[derive(Default)]
struct Client {
    made: usize,
    /// Answered 201: the stored response.
    acked: BTreeMap<String, (Purchase, Vec<u8>)>,
    /// Sent and never answered: committed or not.
    unanswered: BTreeMap<String, Purchase>,
    /// Invalid orders ever sent, answered (422) or not.
    invalid: BTreeSet<String>,
    /// Orders ever sent.
    sent: BTreeSet<String>,
    /// Retries of acknowledged keys that replayed the same bytes.
    replays: usize,
    /// Requests the sender died before answering.
    cut: usize,
}

impl Client {
    /// Sends `p`; false if the sender did not answer (it died).
    fn send(&mut self, addr: SocketAddr, p: Purchase) -> bool {
        self.sent.insert(p.order.clone());
        if !p.valid {
            self.invalid.insert(p.order.clone());
        }
        match http(addr, "POST", "/purchases", Some(&p.key), &p.body) {
            Err(_) => {
                self.cut += 1;
                if !self.acked.contains_key(&p.order) {
                    self.unanswered.insert(p.order.clone(), p);
                }
                false
            }
            Ok((201, stored)) => {
                assert!(p.valid, "{}: an invalid purchase was accepted", p.order);
                self.unanswered.remove(&p.order);
                if let Some((_, first)) = self.acked.get(&p.order) {
                    assert_eq!(*first, stored, "{}: a replay differs", p.order);
                    self.replays += 1;
                } else {
                    self.acked.insert(p.order.clone(), (p, stored));
                }
                true
            }
            Ok((422, _)) if !p.valid => {
                self.unanswered.remove(&p.order);
                true
            }
            Ok((status, body)) => panic!(
                "{}: unexpected {status}: {}",
                p.order,
                String::from_utf8_lossy(&body)
            ),
        }
    }

    /// The next request of a run: mostly new purchases, some retries.
    fn next(&mut self, rng: &mut u64) -> Purchase {
        let roll = xorshift(rng) % 8;
        if roll == 0 && !self.acked.is_empty() {
            let i = (xorshift(rng) as usize) % self.acked.len();
            if let Some((p, _)) = self.acked.values().nth(i) {
                return p.clone();
            }
        }
        // Some unanswered ones are retried during the runs, some only at the end.
        if roll == 1
            && let Some(p) = self.unanswered.values().next()
        {
            return p.clone();
        }
        self.made += 1;
        Purchase::new(self.made)
    }
}

/// A receiver on `db`, listening on `listen`; with its address.
fn receiver(db: &Path, listen: &str, deadline: Instant) -> (Service, SocketAddr) {
    let db = db.to_str().expect("a UTF-8 path");
    let service = Service::start(&["receiver", "--db", db, "--listen", listen], None);
    let addr = service.address(deadline).expect("the receiver listens");
    (service, addr)
}

/// The re-sent messages a receiver's inbox dropped since that receiver started.
fn duplicates(effects: &Value) -> u64 {
    effects["duplicates"].as_u64().expect("a count")
}

fn sender(db: &Path, receiver: SocketAddr, crash: Option<(&str, u64)>) -> Service {
    let db = db.to_str().expect("a UTF-8 path");
    let receiver = format!("http://{receiver}");
    Service::start(
        &[
            "sender",
            "--db",
            db,
            "--listen",
            "127.0.0.1:0",
            "--receiver",
            &receiver,
        ],
        crash,
    )
}

#[test]
fn crashes_at_every_window_lose_no_effect_and_double_none() {
    let started = Instant::now();
    let deadline = started + BUDGET;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (sender_db, receiver_db) = (
        dir.path().join("sender.idemdb"),
        dir.path().join("receiver.idemdb"),
    );
    let (mut receiver_service, receiver_addr) = receiver(&receiver_db, "127.0.0.1:0", deadline);
    // Re-sent messages the receiver's inbox dropped, summed over its lives (a life's count is
    // read just before it is killed: what it counted after that read is not in the sum).
    let mut resent = 0;
    let mut outages = 0;

    // OUTBOX_KILL_SEED=<hex> replays a printed seed's choices (the timing still varies).
    let seed = std::env::var("OUTBOX_KILL_SEED")
        .ok()
        .and_then(|s| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok())
        .unwrap_or_else(|| {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
            0x2545_f491_4f6c_dd1d ^ u64::from(std::process::id()) ^ u64::from(now)
        });
    let mut rng = seed | 1;
    let mut client = Client::default();
    let mut endings: BTreeMap<&str, usize> = BTreeMap::new();
    for run in 0..RUNS {
        assert!(Instant::now() < deadline, "over budget at run {run}");
        let ending = [Ending::BeforePublish, Ending::AfterPublish, Ending::Killed][run % 3];
        let crash = match ending {
            Ending::BeforePublish => Some(("before_publish", 1 + xorshift(&mut rng) % 3)),
            Ending::AfterPublish => Some(("after_publish", 1 + xorshift(&mut rng) % 3)),
            Ending::Killed => None,
        };
        let service = sender(&sender_db, receiver_addr, crash);
        // Crash points count only this process's own messages: none can fire before it listens.
        let addr = service.address(deadline).expect("the sender listens");
        // Every other killed run, the receiver dies too, at once: the sender's publishes fail
        // (retried later), and the receiver's own crash must keep each effect it answered for.
        let outage = ending == Ending::Killed && run % 6 == 5;
        if outage {
            resent += duplicates(&get_json(receiver_addr, "/effects"));
            receiver_service.kill();
            receiver_service.end(Duration::from_secs(10));
            outages += 1;
        }
        let killer = (ending == Ending::Killed).then(|| {
            let child = Arc::clone(&service.child);
            // Mostly while requests are in flight (about 1 ms each), sometimes after; later
            // during an outage, so that the sender tries to publish into it.
            let delay = if outage { 20 } else { 0 } + xorshift(&mut rng) % 20;
            let delay = Duration::from_millis(delay);
            std::thread::spawn(move || {
                std::thread::sleep(delay); // the random moment, not a synchronisation
                let mut child = child.lock().unwrap_or_else(PoisonError::into_inner);
                let _ = child.kill();
            })
        });
        for _ in 0..REQUESTS_PER_RUN {
            let p = client.next(&mut rng);
            if !client.send(addr, p) {
                break;
            }
        }
        if let Some(killer) = killer {
            killer.join().expect("the killer thread");
        }
        // A crash point fires once its publish comes (within milliseconds); a run that never
        // got there is killed after 5 s, and counted as killed.
        let signal = service.end(Duration::from_secs(5));
        let how = match (ending, signal) {
            (Ending::Killed, _) => "killed",
            (_, Some(6)) => crash.map_or("killed", |c| c.0),
            (_, other) => {
                assert_eq!(other, Some(9), "run {run}: ended by {other:?}");
                "killed"
            }
        };
        *endings.entry(how).or_default() += 1;
        if outage {
            // Back on the same port: the sender's next run finds it where it was.
            (receiver_service, _) = receiver(&receiver_db, &receiver_addr.to_string(), deadline);
        }
    }

    // The clean run: the client retries half of what was never answered (the rest it never
    // learns about: committed or not, the checks below hold for them too); the outbox drains.
    let service = sender(&sender_db, receiver_addr, None);
    let addr = service.address(deadline).expect("the clean sender listens");
    let unanswered: Vec<Purchase> = client.unanswered.values().cloned().collect();
    for p in unanswered.into_iter().step_by(2) {
        assert!(client.send(addr, p), "the clean sender did not answer");
    }
    let never_answered: BTreeSet<String> = client.unanswered.keys().cloned().collect();
    let committed = loop {
        let listed = get_json(addr, "/purchases");
        assert_eq!(listed["parked"], 0, "a message was parked: {listed}");
        if listed["backlog"] == 0 {
            let orders = listed["purchases"].as_array().expect("a list");
            break orders
                .iter()
                .map(|o| o.as_str().expect("an order id").to_string())
                .collect::<BTreeSet<_>>();
        }
        assert!(
            Instant::now() < deadline,
            "the outbox never drained: {listed}"
        );
        std::thread::sleep(Duration::from_millis(10)); // polling the backlog: no push signal
    };
    let effects = get_json(receiver_addr, "/effects");

    // Every acknowledged purchase committed; no invalid one did.
    for (order, (_, stored)) in &client.acked {
        assert!(
            committed.contains(order),
            "{order} was acknowledged and is not committed"
        );
        let stored: Value = serde_json::from_slice(stored).expect("a JSON answer");
        assert_eq!(stored["order_id"], order.as_str());
    }
    for order in &client.invalid {
        assert!(
            !committed.contains(order),
            "{order} is invalid and committed"
        );
    }
    // Every committed purchase's effect exactly once, and no other effect.
    let mut applied: BTreeMap<String, (u64, String)> = BTreeMap::new();
    for effect in effects["effects"].as_array().expect("a list") {
        let order = effect["order_id"]
            .as_str()
            .expect("an order id")
            .to_string();
        let count = effect["applied"].as_u64().expect("a count");
        let id = effect["message_id"]
            .as_str()
            .expect("a message id")
            .to_string();
        applied.insert(order, (count, id));
    }
    for (order, (count, _)) in &applied {
        assert!(
            committed.contains(order),
            "an effect for {order}, never committed"
        );
        assert_eq!(*count, 1, "{order}'s effect applied {count} times");
    }
    for order in &committed {
        assert!(
            applied.contains_key(order),
            "{order} committed, its effect lost"
        );
    }
    for (order, (_, stored)) in &client.acked {
        let stored: Value = serde_json::from_slice(stored).expect("a JSON answer");
        assert_eq!(
            stored["message_id"].as_str(),
            applied.get(order).map(|(_, id)| id.as_str()),
            "{order}: applied by another message than the one staged"
        );
    }
    // Each after_publish crash left a message the receiver had and the sender had not
    // marked: re-sent, and dropped by the inbox (the sum may miss a few, never all).
    resent += duplicates(&effects);
    assert!(
        resent > 0,
        "no message was re-sent: the crashes missed their window"
    );
    for window in ["before_publish", "after_publish", "killed"] {
        assert!(
            endings.get(window).is_some_and(|&n| n > 0),
            "no run ended {window}: {endings:?}"
        );
    }
    assert!(committed.len() > RUNS, "too few purchases to mean anything");

    println!(
        "seed {seed:#x}: {} purchases sent ({} invalid), {} acknowledged, {} committed \
         ({} requests cut by a crash; {} never answered, {} of them committed), {} replays \
         of acknowledged keys; sender \
         runs ended {endings:?}, {outages} with the receiver killed too; receiver: {} \
         effects, {} re-sent messages dropped by its inbox; {:.1} s",
        client.sent.len(),
        client.invalid.len(),
        client.acked.len(),
        committed.len(),
        client.cut,
        never_answered.len(),
        never_answered.intersection(&committed).count(),
        client.replays,
        applied.len(),
        resent,
        started.elapsed().as_secs_f64()
    );
    drop(service);
    drop(receiver_service);
}
