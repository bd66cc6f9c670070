//! Redis as a user runs it for dedupe: a real `redis-server` (the machine's binary), started by
//! the bench on a free port of 127.0.0.1 from a config file in the cell's directory under the
//! run's temp dir (the data on the same filesystem as the other engines' files):
//! `appendonly yes`, `appendfsync always` (Redis writes and fsyncs the AOF before it sends the
//! replies of the writes it holds, so every answer is durable), no RDB snapshots (`save ""`).
//! The server is killed when the last handle on it drops (also while a panic unwinds), and
//! with the bench process (`PR_SET_PDEATHSIG`).
//!
//! One lifecycle:
//! - reserve: `SET key P<token><fingerprint> NX PX 30000`: atomic, a 30 s lease.
//! - complete: `EVALSHA` of [`COMPLETE`], which replaces the record with
//!   `C<fingerprint><response>` and a 24 h TTL only while it still holds the caller's marker.
//!   A plain `SET … PX` is one round trip too, but lets an owner whose lease ran out overwrite
//!   the record of the caller that took the key over; the other baselines complete by token,
//!   and so does this one. The script runs in Redis's one thread, so check and write are atomic.
//! - replay: `GET`, with the state and the fingerprint checked.
//!
//! The client speaks RESP2 over a std `TcpStream` (TCP_NODELAY), one connection per caller
//! thread: the five commands need no library, and it adds nothing on top of the bytes sent.
//! The async cells send the same bytes over a tokio `TcpStream` per task ([`RedisTask`]).
//!
//! The binary is `$IDEMDB_BENCH_REDIS_SERVER`, else `redis-server` on PATH. If there is none, or
//! it does not start, the run leaves Redis out and prints why (see [`probe`]).

use std::fmt::Write as _;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use xxhash_rust::xxh3::xxh3_128;

use crate::interface::{Engine, Session, scoped_key};
use crate::shared::keys::{PAYLOAD, RESPONSE};

/// The environment variable naming the `redis-server` binary; a path that is not a file leaves
/// Redis out of the run (e.g. `IDEMDB_BENCH_REDIS_SERVER=none`).
pub const ENV_BINARY: &str = "IDEMDB_BENCH_REDIS_SERVER";

/// How long a server may take to answer PING.
const STARTUP: Duration = Duration::from_secs(10);
/// The reservation's lease, ms (the other engines': 30 s).
const LEASE_MS: &[u8] = b"30000";
/// How long a completed record is kept, ms (24 h).
const TTL_MS: &[u8] = b"86400000";
/// The owner's completion: `KEYS[1]` the record, `ARGV[1]` the caller's in-progress marker,
/// `ARGV[2]` the completed record, `ARGV[3]` its TTL in ms. Replies OK, or nil if the record
/// is no longer the caller's.
const COMPLETE: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
     return redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) end return false";

// ---------------------------------------------------------------------------------------------
// The server.

/// A `redis-server` this process started; killed on drop.
pub struct RedisServer {
    child: Child,
    port: u16,
}

impl RedisServer {
    /// Starts a server with its config and data in `dir` and waits until it answers PING with
    /// the durability settings in force. A port taken before the server binds it is retried.
    pub fn start(dir: &Path) -> Result<RedisServer, String> {
        let bin = binary()?;
        let mut last = String::new();
        for _ in 0..3 {
            match RedisServer::start_once(&bin, dir) {
                Ok(server) => return Ok(server),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    fn start_once(bin: &Path, dir: &Path) -> Result<RedisServer, String> {
        let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("a free port: {e}"))?
            .port();
        let conf = dir.join("redis.conf");
        let log = dir.join("redis.log");
        let text = format!(
            "bind 127.0.0.1\nport {port}\ndaemonize no\ndir \"{}\"\nlogfile \"{}\"\n\
             appendonly yes\nappendfsync always\nsave \"\"\n",
            dir.display(),
            log.display()
        );
        std::fs::write(&conf, text).map_err(|e| format!("writing {}: {e}", conf.display()))?;
        let mut command = Command::new(bin);
        command
            .arg(&conf)
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        die_with_this_thread(&mut command);
        let child = command
            .spawn()
            .map_err(|e| format!("spawning {}: {e}", bin.display()))?;
        // From here on, dropping `server` kills it.
        let mut server = RedisServer { child, port };
        server.wait_ready(&log)?;
        server.check_durable()?;
        Ok(server)
    }

    fn wait_ready(&mut self, log: &Path) -> Result<(), String> {
        let deadline = Instant::now() + STARTUP;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                let log = std::fs::read_to_string(log).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(5).collect();
                return Err(format!(
                    "redis-server exited at startup ({status}): {}",
                    tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
                ));
            }
            if let Ok(mut conn) = Resp::connect(self.port)
                && matches!(conn.call(&[b"PING"]), Ok(Reply::Status(s)) if s == "PONG")
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "redis-server did not answer PING within {} s",
                    STARTUP.as_secs()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The settings the comparison rests on, as the server reports them.
    fn check_durable(&self) -> Result<(), String> {
        let mut conn = self.connect().map_err(|e| format!("connecting: {e}"))?;
        for (name, want) in [
            ("appendonly", "yes"),
            ("appendfsync", "always"),
            ("save", ""),
        ] {
            let got = match conn.call(&[b"CONFIG", b"GET", name.as_bytes()]) {
                Ok(Reply::Array(Some(v))) => match v.get(1) {
                    Some(Reply::Bulk(Some(b))) => String::from_utf8_lossy(b).into_owned(),
                    _ => String::new(),
                },
                other => return Err(format!("CONFIG GET {name}: {other:?}")),
            };
            if got != want {
                return Err(format!("{name} is {got:?}, not {want:?}"));
            }
        }
        Ok(())
    }

    pub fn connect(&self) -> io::Result<Resp> {
        Resp::connect(self.port)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `redis_version` from `INFO server`.
    fn version(&self) -> String {
        let info = self
            .connect()
            .and_then(|mut c| c.call(&[b"INFO", b"server"]));
        let Ok(Reply::Bulk(Some(info))) = info else {
            return "?".into();
        };
        String::from_utf8_lossy(&info)
            .lines()
            .find_map(|l| l.strip_prefix("redis_version:").map(str::to_owned))
            .unwrap_or_else(|| "?".into())
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The binary: `$IDEMDB_BENCH_REDIS_SERVER`, else `redis-server` on PATH.
fn binary() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os(ENV_BINARY).filter(|v| !v.is_empty()) {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!("{ENV_BINARY}={} is not a file", path.display()))
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join("redis-server"))
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| {
            "no redis-server on PATH (Debian: apt-get install redis-server; or set \
             IDEMDB_BENCH_REDIS_SERVER to the binary)"
                .into()
        })
}

/// The child gets SIGKILL when the thread that spawns it ends (the bench's main thread, which
/// lives as long as the process): a bench killed outright leaves no server behind.
fn die_with_this_thread(command: &mut Command) {
    let parent = std::process::id();
    // SAFETY: the closure runs between fork and exec; it only calls prctl and getppid, which
    // are async-signal-safe, and allocates nothing (errors are raw OS codes).
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The parent died before prctl took effect: nobody would kill this one.
            if libc::getppid() as u32 != parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

/// Starts and stops a server in `dir`: what the run will use, if it works. Returns the
/// summary's note on it, or why Redis is left out.
pub fn probe(dir: &Path) -> Result<String, String> {
    let server = RedisServer::start(dir)?;
    Ok(format!(
        "redis-server {} ({}), appendonly yes, appendfsync always, save \"\" (checked with \
         CONFIG GET), 127.0.0.1 over TCP, data in the run's temp dir",
        server.version(),
        binary()?.display()
    ))
}

// ---------------------------------------------------------------------------------------------
// RESP2.

/// A reply (an error reply is [`Resp::read`]'s `Err`).
#[derive(Debug)]
pub enum Reply {
    Status(String),
    /// No command here answers with one; read through `Debug` in panic messages.
    #[allow(dead_code)]
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Reply>>),
}

/// One connection: commands are buffered by [`push`](Resp::push) and written by
/// [`send`](Resp::send) (so that several can be pipelined), replies read one at a time.
pub struct Resp {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    out: Vec<u8>,
}

/// Appends one command to `out`: an array of bulk strings.
fn encode(out: &mut Vec<u8>, args: &[&[u8]]) {
    let mut head = String::new();
    let _ = write!(head, "*{}\r\n", args.len());
    out.extend_from_slice(head.as_bytes());
    for arg in args {
        head.clear();
        let _ = write!(head, "${}\r\n", arg.len());
        out.extend_from_slice(head.as_bytes());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_owned())
}

impl Resp {
    pub fn connect(port: u16) -> io::Result<Resp> {
        let stream = TcpStream::connect((Ipv4Addr::LOCALHOST, port))?;
        stream.set_nodelay(true)?;
        Ok(Resp {
            reader: BufReader::new(stream.try_clone()?),
            writer: stream,
            out: Vec::with_capacity(256),
        })
    }

    /// Buffers one command: an array of bulk strings.
    pub fn push(&mut self, args: &[&[u8]]) {
        encode(&mut self.out, args);
    }

    /// Writes the buffered commands in one `write`.
    pub fn send(&mut self) -> io::Result<()> {
        self.writer.write_all(&self.out)?;
        self.out.clear();
        Ok(())
    }

    /// One reply; an error reply is `Err`.
    pub fn read(&mut self) -> io::Result<Reply> {
        let mut line = Vec::with_capacity(64);
        self.reader.read_until(b'\n', &mut line)?;
        if line.len() < 3 || !line.ends_with(b"\r\n") {
            return Err(bad("connection closed, or a line without CRLF"));
        }
        let body = String::from_utf8_lossy(&line[1..line.len() - 2]).into_owned();
        let int = || body.parse::<i64>().map_err(|_| bad("not an integer"));
        Ok(match line[0] {
            b'+' => Reply::Status(body),
            b'-' => return Err(io::Error::other(format!("redis-server: {body}"))),
            b':' => Reply::Int(int()?),
            b'$' => match usize::try_from(int()?) {
                Err(_) => Reply::Bulk(None),
                Ok(n) => {
                    let mut bytes = vec![0; n + 2];
                    self.reader.read_exact(&mut bytes)?;
                    bytes.truncate(n);
                    Reply::Bulk(Some(bytes))
                }
            },
            b'*' => match usize::try_from(int()?) {
                Err(_) => Reply::Array(None),
                Ok(n) => Reply::Array(Some(
                    (0..n).map(|_| self.read()).collect::<io::Result<_>>()?,
                )),
            },
            _ => return Err(bad("unknown reply type")),
        })
    }

    /// One command, one reply.
    pub fn call(&mut self, args: &[&[u8]]) -> io::Result<Reply> {
        self.push(args);
        self.send()?;
        self.read()
    }
}

// ---------------------------------------------------------------------------------------------
// The engine.

/// Redis on a server of its own.
pub struct Redis {
    server: Arc<RedisServer>,
    /// Fencing tokens, kept in memory as the other baselines keep theirs.
    tokens: Arc<AtomicU64>,
    /// `SCRIPT LOAD` of [`COMPLETE`].
    complete: Arc<[u8]>,
}

impl Redis {
    /// Starts a server in `dir` (run on the main thread: see [`die_with_this_thread`]).
    pub fn open(dir: &Path) -> Redis {
        let server = RedisServer::start(dir).unwrap_or_else(|e| panic!("redis-server: {e}"));
        let mut conn = server.connect().expect("connect");
        let sha = match conn.call(&[b"SCRIPT", b"LOAD", COMPLETE.as_bytes()]) {
            Ok(Reply::Bulk(Some(sha))) => sha,
            other => panic!("SCRIPT LOAD: {other:?}"),
        };
        Redis {
            server: Arc::new(server),
            tokens: Arc::new(AtomicU64::new(1)),
            complete: sha.into(),
        }
    }
}

struct RedisSession {
    conn: Resp,
    tokens: Arc<AtomicU64>,
    complete: Arc<[u8]>,
    fp: [u8; 16],
    /// The server lives while a session does.
    _server: Arc<RedisServer>,
}

/// `state | fingerprint (16) | rest`: the in-progress marker (rest = the token) or the
/// completed record (rest = the response).
fn record(state: u8, fp: &[u8; 16], rest: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(17 + rest.len());
    v.push(state);
    v.extend_from_slice(fp);
    v.extend_from_slice(rest);
    v
}

impl Engine for Redis {
    fn session(&self) -> Box<dyn Session> {
        Box::new(RedisSession {
            conn: self.server.connect().expect("connect to redis-server"),
            tokens: Arc::clone(&self.tokens),
            complete: Arc::clone(&self.complete),
            fp: xxh3_128(PAYLOAD).to_le_bytes(),
            _server: Arc::clone(&self.server),
        })
    }

    fn preload(&self, n: u64) {
        let mut conn = self.server.connect().expect("connect");
        let value = record(b'C', &xxh3_128(PAYLOAD).to_le_bytes(), RESPONSE);
        let ids: Vec<u64> = (0..n).collect();
        // Pipelined: a batch's writes share the server's fsyncs.
        for batch in ids.chunks(1000) {
            for &id in batch {
                conn.push(&[b"SET", &scoped_key(id), &value, b"PX", TTL_MS]);
            }
            conn.send().expect("send");
            for _ in batch {
                match conn.read() {
                    Ok(Reply::Status(s)) if s == "OK" => {}
                    other => panic!("preload SET: {other:?}"),
                }
            }
        }
    }

    fn server_pids(&self) -> Vec<u32> {
        vec![self.server.pid()]
    }
}

impl RedisSession {
    fn call(&mut self, args: &[&[u8]]) -> Reply {
        self.conn.call(args).expect("redis-server")
    }

    /// `SET NX PX`; returns the marker it stored.
    fn acquire(&mut self, key: &[u8]) -> Vec<u8> {
        let token = self.tokens.fetch_add(1, Ordering::Relaxed);
        let marker = record(b'P', &self.fp, &token.to_le_bytes());
        match self.call(&[b"SET", key, &marker, b"NX", b"PX", LEASE_MS]) {
            Reply::Status(s) if s == "OK" => marker,
            other => panic!("fresh key not acquired: {other:?}"),
        }
    }
}

impl Session for RedisSession {
    fn reserve(&mut self, id: u64) {
        self.acquire(&scoped_key(id));
    }

    fn lifecycle(&mut self, id: u64) {
        let key = scoped_key(id);
        let marker = self.acquire(&key);
        let done = record(b'C', &self.fp, RESPONSE);
        let sha = Arc::clone(&self.complete);
        match self.call(&[b"EVALSHA", &sha, b"1", &key, &marker, &done, TTL_MS]) {
            Reply::Status(s) if s == "OK" => {}
            other => panic!("complete refused: {other:?}"),
        }
    }

    fn execute(&mut self, _id: u64) {
        unreachable!("execute cells leave Redis out: its business write would be in another store")
    }

    fn replay(&mut self, id: u64) -> usize {
        match self.call(&[b"GET", &scoped_key(id)]) {
            Reply::Bulk(Some(v)) if v[0] == b'C' && v[1..17] == self.fp => v.len() - 17,
            other => panic!("preloaded key not completed: {other:?}"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The async cells: one connection per task, on the tokio runtime that runs the tasks.

/// A connection driven by a tokio runtime, for a lifecycle's two commands, whose replies are
/// one line each.
struct AsyncResp {
    /// Writes pass through the buffer to the stream.
    stream: tokio::io::BufReader<tokio::net::TcpStream>,
    out: Vec<u8>,
    line: Vec<u8>,
}

impl AsyncResp {
    /// Connects from the current tokio runtime (its thread drives the connection).
    async fn connect(port: u16) -> io::Result<AsyncResp> {
        let stream = tokio::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port)).await?;
        stream.set_nodelay(true)?;
        Ok(AsyncResp {
            stream: tokio::io::BufReader::new(stream),
            out: Vec::with_capacity(256),
            line: Vec::with_capacity(64),
        })
    }

    /// Sends one command, bytes as [`Resp::push`] builds them, and reads its reply, which
    /// must be `+OK`: anything else panics with `what` and the reply.
    async fn call_ok(&mut self, what: &str, args: &[&[u8]]) {
        use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _};
        encode(&mut self.out, args);
        self.stream
            .write_all(&self.out)
            .await
            .expect("write to redis-server");
        self.out.clear();
        self.line.clear();
        self.stream
            .read_until(b'\n', &mut self.line)
            .await
            .expect("read from redis-server");
        if self.line != b"+OK\r\n" {
            panic!("{what}: {:?}", String::from_utf8_lossy(&self.line));
        }
    }
}

/// One task's session: the sync session's lifecycle, awaited on a tokio connection.
pub struct RedisTask {
    conn: AsyncResp,
    tokens: Arc<AtomicU64>,
    complete: Arc<[u8]>,
    fp: [u8; 16],
    /// The server lives while a session does.
    _server: Arc<RedisServer>,
}

impl Redis {
    /// One task's session; await it on the runtime that will run the task.
    pub async fn task_session(&self) -> RedisTask {
        RedisTask {
            conn: AsyncResp::connect(self.server.port)
                .await
                .expect("connect to redis-server"),
            tokens: Arc::clone(&self.tokens),
            complete: Arc::clone(&self.complete),
            fp: xxh3_128(PAYLOAD).to_le_bytes(),
            _server: Arc::clone(&self.server),
        }
    }
}

impl RedisTask {
    /// `SET NX PX`, then `EVALSHA` of [`COMPLETE`]: the same commands as
    /// [`RedisSession`]'s lifecycle.
    pub async fn lifecycle(&mut self, id: u64) {
        let key = scoped_key(id);
        let token = self.tokens.fetch_add(1, Ordering::Relaxed);
        let marker = record(b'P', &self.fp, &token.to_le_bytes());
        let reserve: [&[u8]; 6] = [b"SET", &key, &marker, b"NX", b"PX", LEASE_MS];
        self.conn.call_ok("fresh key not acquired", &reserve).await;
        let done = record(b'C', &self.fp, RESPONSE);
        let complete: [&[u8]; 7] = [
            b"EVALSHA",
            &self.complete,
            b"1",
            &key,
            &marker,
            &done,
            TTL_MS,
        ];
        self.conn.call_ok("complete refused", &complete).await;
    }
}
