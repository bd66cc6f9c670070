//! A real, throwaway PostgreSQL server for tests, examples and benches. No mocks: [`TestServer::start`] runs `initdb` and
//! `postgres` from the machine's PostgreSQL installation into a temporary directory, on a free
//! port of 127.0.0.1, with fsync on.
//!
//! Most callers want [`TestServer::shared`]: one server for the whole test process, or the
//! server named by the environment variable `IDEMDB_TEST_PG` (a connection URL to its
//! maintenance database, as `.ci/run` exports it), and an empty database of their own from
//! [`TestServer::fresh_database`].
//!
//! The server stops when the test process ends, even when the process is killed: it runs
//! under a small watchdog shell, in a process group of its own, that polls the test process
//! and then shuts the server down (fast shutdown) and removes the temporary directory.
//! Dropping a [`TestServer`] started by [`TestServer::start`] stops it at once.
//!
//! When the test process runs as root, `initdb` and `postgres` (which refuse root) run as the
//! OS user `postgres`, through `runuser` (or `su`).

use std::fmt::Write as _;
use std::io::Read as _;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The environment variable naming an existing server (a connection URL to its maintenance
/// database) that [`TestServer::shared`] uses instead of starting one.
pub const ENV_URL: &str = "IDEMDB_TEST_PG";

/// How long `initdb` may take.
const INITDB_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a server may take to accept connections after `initdb`.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long connecting, and creating a database, may take.
const CREATE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long [`Drop`] waits for a stopped server's watchdog to finish.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(60);
/// The OS user that runs the server when the test process is root.
const SERVER_OS_USER: &str = "postgres";
/// The database user created by `initdb`, a superuser with trust authentication.
const DB_USER: &str = "postgres";

/// Unique names within this process: temporary directories and databases.
static COUNTER: AtomicU64 = AtomicU64::new(0);

/// A PostgreSQL server for tests: either a throwaway cluster this process started (stopped
/// and deleted on drop, or by its watchdog when the process ends), or an existing server named
/// by `IDEMDB_TEST_PG`.
#[derive(Debug)]
pub struct TestServer {
    url: String,
    owned: Option<Owned>,
}

/// A throwaway cluster this process started.
#[derive(Debug)]
struct Owned {
    /// The temporary directory: `data/` (the cluster), the socket, `postgres.log`.
    dir: PathBuf,
    /// The watchdog (the shell that runs `initdb` and the postmaster), or the `runuser`/`su`
    /// wrapping it.
    watchdog: Option<Child>,
}

impl TestServer {
    /// The server shared by the whole test process: the one named by `IDEMDB_TEST_PG` if that
    /// variable is set (to a connection URL to its maintenance database), else one throwaway
    /// cluster started on first use by [`start`](Self::start) and reused after.
    ///
    /// A failure to start is remembered: every later call returns the same error.
    pub fn shared() -> Result<&'static TestServer, String> {
        static SHARED: OnceLock<Result<TestServer, String>> = OnceLock::new();
        SHARED
            .get_or_init(|| match std::env::var(ENV_URL) {
                Ok(url) if !url.trim().is_empty() => Ok(TestServer {
                    url: url.trim().to_owned(),
                    owned: None,
                }),
                _ => TestServer::start(),
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Starts a new throwaway cluster: `initdb` into a fresh temporary directory, then
    /// `postgres` on a free port of 127.0.0.1 (`max_connections=300`, fsync on), and waits
    /// (up to 30 s after `initdb`) until it accepts connections.
    ///
    /// The binaries come from `PATH` (where `initdb` is found, `postgres` is taken from the
    /// same directory, symbolic links resolved), else from the highest version under
    /// `/usr/lib/postgresql/*/bin`.
    pub fn start() -> Result<TestServer, String> {
        Self::start_with(None)
    }

    /// [`start`](Self::start) with TLS on (`ssl=on`): the server presents the certificate
    /// chain `cert_pem` with the private key `key_pem` (both PEM), and still accepts plain
    /// connections.
    pub fn start_with_tls(cert_pem: &str, key_pem: &str) -> Result<TestServer, String> {
        Self::start_with(Some((cert_pem, key_pem)))
    }

    fn start_with(tls: Option<(&str, &str)>) -> Result<TestServer, String> {
        let bin = find_bin_dir()?;
        let as_postgres = is_root();
        // The port is free when picked; if something takes it before the postmaster binds it,
        // the postmaster exits and a new cluster on a new port is tried.
        let mut attempt = 0;
        loop {
            attempt += 1;
            match Self::start_once(&bin, as_postgres, tls) {
                Ok(server) => return Ok(server),
                Err(Startup::Exited(_)) if attempt < 3 => {}
                Err(Startup::Exited(e) | Startup::Failed(e)) => return Err(e),
            }
        }
    }

    /// One attempt of [`start`](Self::start).
    fn start_once(
        bin: &Path,
        as_postgres: bool,
        tls: Option<(&str, &str)>,
    ) -> Result<TestServer, Startup> {
        let dir = unique_temp_dir().map_err(Startup::Failed)?;
        // From here on, `server`'s drop stops the server and removes the directory, whatever
        // fails.
        let mut server = TestServer {
            url: String::new(),
            owned: Some(Owned {
                dir: dir.clone(),
                watchdog: None,
            }),
        };
        let mut settings = Vec::new();
        if let Some((cert, key)) = tls {
            settings = tls_settings(&dir, cert, key).map_err(Startup::Failed)?;
        }
        if as_postgres {
            run_checked(
                Command::new("chown")
                    .arg("-R")
                    .arg(format!("{SERVER_OS_USER}:"))
                    .arg(&dir),
                "chown of the temporary directory to the postgres user",
            )
            .map_err(Startup::Failed)?;
        }
        let initdb = shell_line(&[
            path_str(&bin.join("initdb")).map_err(Startup::Failed)?,
            "-D",
            path_str(&dir.join("data")).map_err(Startup::Failed)?,
            "-U",
            DB_USER,
            "--auth=trust",
            "--no-sync",
            "--no-locale",
            "-E",
            "UTF8",
        ]);
        let port = free_port().map_err(Startup::Failed)?;
        let script = watchdog_script(&initdb, &bin.join("postgres"), &dir, port, &settings)
            .map_err(Startup::Failed)?;
        let mut command = command_as(as_postgres, &script);
        // In the temporary directory: the postgres user may not enter the test's own.
        command
            .current_dir(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // Out of the test's process group: a Ctrl-C there does not kill the watchdog before it
        // has stopped the server and removed the directory.
        #[cfg(unix)]
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let watchdog = command
            .spawn()
            .map_err(|e| Startup::Failed(format!("spawning the postgres watchdog: {e}")))?;
        if let Some(owned) = server.owned.as_mut() {
            owned.watchdog = Some(watchdog);
        }
        server.wait_ready(port)?;
        server.url = format!("postgres://{DB_USER}@127.0.0.1:{port}/postgres");
        Ok(server)
    }

    /// Restarts a cluster started here as `pg_ctl restart -m immediate` does: SIGQUIT to the
    /// postmaster (every backend is killed, nothing is flushed: crash recovery from the WAL
    /// at the next start), then the same server is started again; returns once it accepts
    /// connections (up to 30 s). Connections open to it are lost.
    pub fn restart_immediate(&self) -> Result<(), String> {
        let Some(owned) = self.owned.as_ref() else {
            return Err("a server named by IDEMDB_TEST_PG is not ours to restart".into());
        };
        let old = owned.postmaster_pid().ok_or("the server is not running")?;
        std::fs::File::create(owned.dir.join("restart"))
            .map_err(|e| format!("marking the restart: {e}"))?;
        run_checked(
            Command::new("sh")
                .arg("-c")
                .arg(format!("kill -QUIT {old}")),
            "SIGQUIT to the postmaster",
        )?;
        let port: u16 = self
            .url
            .rsplit(':')
            .next()
            .and_then(|rest| rest.split('/').next())
            .and_then(|p| p.parse().ok())
            .ok_or("no port in the server's URL")?;
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        while Instant::now() < deadline {
            let restarted = !owned.dir.join("restart").exists()
                && owned.postmaster_pid().is_some_and(|pid| pid != old)
                && owned.postmaster_ready();
            if restarted && TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(format!(
            "the server did not come back within {} s; its log:\n{}",
            STARTUP_TIMEOUT.as_secs(),
            owned.tail("postgres.log")
        ))
    }

    /// The connection URL of the server's maintenance database `postgres`, as
    /// `postgres://postgres@127.0.0.1:PORT/postgres` for a cluster started here (or the value
    /// of `IDEMDB_TEST_PG`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Creates a new, empty database with a name unique to this process and call
    /// (`idemdb_t_<pid>_<counter>_<nanos>`) and returns its connection URL.
    ///
    /// The work runs on a thread of its own with its own tokio runtime, so this may be called
    /// from inside a tokio runtime as well as from plain code. Blocks until the database
    /// exists.
    pub fn fresh_database(&self) -> Result<String, String> {
        let name = format!(
            "idemdb_t_{}_{}_{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed),
            nanos()
        );
        execute_on(&self.url, format!("CREATE DATABASE \"{name}\""))?;
        Ok(with_database(&self.url, &name))
    }

    /// Waits until `initdb` is done (up to [`INITDB_TIMEOUT`]), then until the postmaster
    /// reports itself ready in `postmaster.pid` and accepts TCP connections on `port` (up to
    /// [`STARTUP_TIMEOUT`]); fails early if `initdb` failed or the postmaster exited.
    fn wait_ready(&mut self, port: u16) -> Result<(), Startup> {
        let Some(owned) = self.owned.as_mut() else {
            return Ok(());
        };
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let mut initdb_done = false;
        let mut deadline = Instant::now() + INITDB_TIMEOUT;
        loop {
            if owned.dir.join("initdb.failed").exists() {
                return Err(Startup::Failed(format!(
                    "initdb failed:\n{}",
                    owned.tail("initdb.log")
                )));
            }
            if owned.dir.join("postgres.exited").exists() {
                return Err(Startup::Exited(format!(
                    "postgres exited during startup; its log:\n{}",
                    owned.tail("postgres.log")
                )));
            }
            if let Some(watchdog) = owned.watchdog.as_mut()
                && let Ok(Some(status)) = watchdog.try_wait()
            {
                owned.watchdog = None;
                return Err(Startup::Failed(format!(
                    "the postgres watchdog exited during startup ({status})"
                )));
            }
            if !initdb_done && owned.dir.join("postgres.log").exists() {
                initdb_done = true;
                deadline = Instant::now() + STARTUP_TIMEOUT;
            }
            if initdb_done
                && owned.postmaster_ready()
                && TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
            {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(Startup::Failed(if initdb_done {
                    format!(
                        "postgres did not accept connections on port {port} within {} s; its \
                         log:\n{}",
                        STARTUP_TIMEOUT.as_secs(),
                        owned.tail("postgres.log")
                    )
                } else {
                    format!(
                        "initdb did not finish within {} s:\n{}",
                        INITDB_TIMEOUT.as_secs(),
                        owned.tail("initdb.log")
                    )
                }));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Runs the statement `sql` on the database at `url`, on a thread of its own with its own
/// tokio runtime (so that it may be called from inside a runtime as well as from plain code).
/// Blocks until it is done.
fn execute_on(url: &str, sql: String) -> Result<(), String> {
    let url = url.to_owned();
    std::thread::Builder::new()
        .name("idemdb-pg-statement".into())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| format!("building a tokio runtime: {e}"))?;
            runtime.block_on(async move {
                let (client, connection) = tokio::time::timeout(
                    CREATE_TIMEOUT,
                    tokio_postgres::connect(&url, tokio_postgres::NoTls),
                )
                .await
                .map_err(|_| format!("connecting to {url}: timed out"))?
                .map_err(|e| format!("connecting to {url}: {e}"))?;
                let connection = tokio::spawn(connection);
                let done = tokio::time::timeout(CREATE_TIMEOUT, client.batch_execute(&sql))
                    .await
                    .map_err(|_| format!("{sql}: timed out"))
                    .and_then(|r| r.map_err(|e| format!("{sql}: {e}")));
                drop(client);
                // The connection ends once the client is gone.
                let _ = connection.await;
                done
            })
        })
        .map_err(|e| format!("spawning a thread: {e}"))?
        .join()
        .map_err(|_| "the thread running a statement panicked".to_owned())?
}

/// The store's time on one database, frozen and moved by hand: what
/// [`ManualClock`](idemdb::ManualClock) is to the embedded engine. `PgStore` reads every time
/// from the server (semantics.md §12), and the server's time is
/// `idemdb_meta.frozen_now_ms` when set: this sets it, for every instance on the database at
/// once, from their next statement on. Clones share the time. The schema must be migrated.
#[derive(Debug, Clone)]
pub struct ServerClock {
    url: String,
    now: std::sync::Arc<AtomicU64>,
}

impl ServerClock {
    /// Freezes the store's time of the database at `url` at `at_ms`.
    pub fn freeze(url: &str, at_ms: u64) -> Result<ServerClock, String> {
        let clock = ServerClock {
            url: url.to_owned(),
            now: std::sync::Arc::new(AtomicU64::new(at_ms)),
        };
        clock.set(at_ms)?;
        Ok(clock)
    }

    /// Sets the time to `ms`, forwards or backwards.
    pub fn set(&self, ms: u64) -> Result<(), String> {
        let ms_sql = i64::try_from(ms).map_err(|_| format!("{ms} ms is past bigint"))?;
        execute_on(
            &self.url,
            format!("UPDATE idemdb_meta SET frozen_now_ms = {ms_sql} WHERE id = 1"),
        )?;
        self.now.store(ms, Ordering::SeqCst);
        Ok(())
    }

    /// Moves the time forward by `by`.
    pub fn advance(&self, by: Duration) -> Result<(), String> {
        let by = u64::try_from(by.as_millis()).unwrap_or(u64::MAX);
        self.set(self.now_ms().saturating_add(by))
    }

    /// The time it was last set to, ms since the epoch.
    pub fn now_ms(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }

    /// Gives the database back the server's own clock.
    pub fn thaw(&self) -> Result<(), String> {
        execute_on(
            &self.url,
            "UPDATE idemdb_meta SET frozen_now_ms = NULL WHERE id = 1".to_owned(),
        )
    }
}

/// Why an attempt to start a cluster failed.
enum Startup {
    /// The postmaster exited during startup: perhaps its port was taken meanwhile; worth
    /// another attempt.
    Exited(String),
    /// Anything else.
    Failed(String),
}

impl Drop for TestServer {
    /// A cluster started here is shut down (fast shutdown) and its directory removed before
    /// the drop returns. A server named by `IDEMDB_TEST_PG` is left alone.
    fn drop(&mut self) {
        if let Some(owned) = self.owned.as_mut() {
            owned.stop();
            let _ = std::fs::remove_dir_all(&owned.dir);
        }
    }
}

impl Owned {
    /// Stops the server and waits for the watchdog, which removes the directory after the
    /// server exited: the file `stop` tells the watchdog to end (it polls every 0.5 s), and
    /// SIGINT tells the postmaster at once (fast shutdown).
    fn stop(&mut self) {
        let Some(mut watchdog) = self.watchdog.take() else {
            return;
        };
        if let Ok(Some(_)) = watchdog.try_wait() {
            return;
        }
        let _ = std::fs::File::create(self.dir.join("stop"));
        if let Some(pid) = self.postmaster_pid() {
            let _ = Command::new("sh")
                .arg("-c")
                .arg(format!("kill -INT {pid}"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        let deadline = Instant::now() + SHUTDOWN_TIMEOUT;
        loop {
            match watchdog.try_wait() {
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Ok(None) => {
                    let _ = watchdog.kill();
                    let _ = watchdog.wait();
                    return;
                }
                _ => return,
            }
        }
    }

    /// The postmaster's pid from `data/postmaster.pid`, if it is running.
    fn postmaster_pid(&self) -> Option<u32> {
        let pidfile = std::fs::read_to_string(self.dir.join("data/postmaster.pid")).ok()?;
        pidfile.lines().next()?.trim().parse().ok()
    }

    /// Whether `data/postmaster.pid` says the server is ready for connections (its eighth
    /// line, as `pg_ctl` reads it).
    fn postmaster_ready(&self) -> bool {
        std::fs::read_to_string(self.dir.join("data/postmaster.pid"))
            .is_ok_and(|pidfile| pidfile.lines().nth(7).is_some_and(|s| s.trim() == "ready"))
    }

    /// The end of the log `name` in the directory, for error messages.
    fn tail(&self, name: &str) -> String {
        let mut text = String::new();
        if let Ok(mut file) = std::fs::File::open(self.dir.join(name)) {
            let _ = file.read_to_string(&mut text);
        }
        let start = text.len().saturating_sub(4000);
        let start = (start..text.len())
            .find(|&i| text.is_char_boundary(i))
            .unwrap_or(text.len());
        text[start..].to_owned()
    }
}

/// The directory holding `initdb` and `postgres`: where `initdb` is on `PATH`
/// (symbolic links resolved), else the highest version under `/usr/lib/postgresql/*/bin`.
fn find_bin_dir() -> Result<PathBuf, String> {
    let has_all = |dir: &Path| ["initdb", "postgres"].iter().all(|b| dir.join(b).is_file());
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let initdb = dir.join("initdb");
            if initdb.is_file()
                && let Some(bin) = std::fs::canonicalize(&initdb)
                    .ok()
                    .and_then(|p| p.parent().map(Path::to_path_buf))
                && has_all(&bin)
            {
                return Ok(bin);
            }
        }
    }
    let mut versions: Vec<(Vec<u64>, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|entry| {
                    let name = entry.file_name();
                    let version = name
                        .to_str()?
                        .split('.')
                        .map(|part| part.parse::<u64>().ok())
                        .collect::<Option<Vec<u64>>>()?;
                    let bin = entry.path().join("bin");
                    has_all(&bin).then_some((version, bin))
                })
                .collect()
        })
        .unwrap_or_default();
    versions.sort();
    versions.pop().map(|(_, bin)| bin).ok_or_else(|| {
        "no PostgreSQL server binaries: initdb is not on PATH and there is no \
         /usr/lib/postgresql/*/bin (install the `postgresql` package, or set IDEMDB_TEST_PG \
         to a server's URL)"
            .to_owned()
    })
}

/// Whether this process runs as root (effective uid 0), from `/proc/self/status`, else from
/// `id -u`.
fn is_root() -> bool {
    if let Ok(status) = std::fs::read_to_string("/proc/self/status")
        && let Some(line) = status.lines().find(|l| l.starts_with("Uid:"))
    {
        // Real, effective, saved, filesystem.
        return line.split_whitespace().nth(2) == Some("0");
    }
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "0")
}

/// A command running the shell line `line`: through `sh` directly, or, when `as_postgres`,
/// as the OS user `postgres` through `runuser` (or `su` where there is no `runuser`).
fn command_as(as_postgres: bool, line: &str) -> Command {
    if !as_postgres {
        let mut command = Command::new("sh");
        command.arg("-c").arg(line);
        return command;
    }
    if which("runuser").is_some() {
        let mut command = Command::new("runuser");
        command.args(["-u", SERVER_OS_USER, "--", "sh", "-c", line]);
        command
    } else {
        let mut command = Command::new("su");
        command.args([SERVER_OS_USER, "-s", "/bin/sh", "-c", line]);
        command
    }
}

/// The watchdog: runs `initdb` (the shell line `initdb`), then the postmaster in the
/// background, and polls every 0.5 s that the test process and the postmaster are alive and
/// no file `stop` was made; then shuts the postmaster down (fast shutdown), waits for it, and,
/// once the test process is gone or `stop` made, removes the directory.
///
/// Markers for [`TestServer::wait_ready`]: `initdb.failed`, `postgres.log` (initdb is done),
/// `postgres.exited`. After a failure the directory stays while the test process lives, so it
/// can read the logs; dropping the server removes it.
///
/// SIGINT is sent until the postmaster is gone: a postmaster still starting up has no handler
/// yet, and a background job of a non-interactive shell ignores SIGINT by default. After 60 s
/// it gets SIGQUIT (immediate shutdown) instead.
///
/// The test process is looked for in `/proc`, by pid and start time (a reused pid, or a thread
/// of another process with that id, is not it): the watchdog may run as another user, for whom
/// `kill -0` cannot tell "gone" from "not mine". Without `/proc`, `kill -0` it is.
fn watchdog_script(
    initdb: &str,
    postgres: &Path,
    dir: &Path,
    port: u16,
    settings: &[String],
) -> Result<String, String> {
    let port = port.to_string();
    let data = dir.join("data");
    let mut words = vec![
        path_str(postgres)?,
        "-D",
        path_str(&data)?,
        "-p",
        &port,
        "-c",
        "listen_addresses=127.0.0.1",
        "-k",
        path_str(dir)?,
        "-c",
        "max_connections=300",
        "-c",
        "shared_buffers=128MB",
    ];
    for setting in settings {
        words.extend(["-c", setting.as_str()]);
    }
    let server = shell_line(&words);
    let mut script = String::new();
    let _ = write!(
        script,
        "T={pid}; S={start}; D={dir}
trap ': >\"$D/stop\"' HUP TERM
alive() {{
  if [ -n \"$S\" ]; then
    s=$(cat \"/proc/$T/stat\" 2>/dev/null) || return 1
    set -- ${{s##*\") \"}}
    [ \"${{20}}\" = \"$S\" ]
  else
    kill -0 \"$T\" 2>/dev/null
  fi
}}
if {initdb} >\"$D/initdb.log\" 2>&1 </dev/null; then
  while :; do
    {server} >>\"$D/postgres.log\" 2>&1 </dev/null &
    pg=$!
    while [ ! -e \"$D/stop\" ] && alive && kill -0 \"$pg\" 2>/dev/null; do sleep 0.1; done
    [ -e \"$D/restart\" ] && [ ! -e \"$D/stop\" ] && alive || break
    wait \"$pg\"
    rm -f \"$D/restart\"
  done
  n=0
  while kill -0 \"$pg\" 2>/dev/null; do
    [ $n -lt 600 ] && kill -INT \"$pg\" 2>/dev/null || kill -QUIT \"$pg\" 2>/dev/null
    n=$((n + 1)); sleep 0.1
  done
  wait \"$pg\"
  : >\"$D/postgres.exited\"
else
  : >\"$D/initdb.failed\"
fi
while [ ! -e \"$D/stop\" ] && alive; do sleep 0.5; done
rm -rf \"$D\"
",
        pid = std::process::id(),
        start = own_start_time().unwrap_or_default(),
        dir = shell_quote(path_str(dir)?),
    );
    Ok(script)
}

/// Writes the server's certificate and key into `dir` (the key readable by its owner only,
/// as the server demands) and returns the settings that turn TLS on with them.
fn tls_settings(dir: &Path, cert_pem: &str, key_pem: &str) -> Result<Vec<String>, String> {
    use std::os::unix::fs::PermissionsExt as _;
    let cert = dir.join("server.crt");
    let key = dir.join("server.key");
    std::fs::write(&cert, cert_pem).map_err(|e| format!("writing {}: {e}", cert.display()))?;
    std::fs::write(&key, key_pem).map_err(|e| format!("writing {}: {e}", key.display()))?;
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| format!("chmod {}: {e}", key.display()))?;
    Ok(vec![
        "ssl=on".to_owned(),
        format!("ssl_cert_file={}", path_str(&cert)?),
        format!("ssl_key_file={}", path_str(&key)?),
    ])
}

/// This process's start time (field 22 of `/proc/self/stat`, after the command name in
/// parentheses), if there is a `/proc`.
fn own_start_time() -> Option<String> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let after_name = &stat[stat.rfind(')')? + 1..];
    let start = after_name.split_whitespace().nth(19)?;
    start
        .bytes()
        .all(|b| b.is_ascii_digit())
        .then(|| start.to_owned())
}

/// Runs `command` to completion, its output captured; an error names `what` and carries the
/// output.
fn run_checked(command: &mut Command, what: &str) -> Result<(), String> {
    let out = command
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{what}: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    Err(format!(
        "{what} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    ))
}

/// A free port of 127.0.0.1, from binding port 0 and letting it go.
fn free_port() -> Result<u16, String> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .map_err(|e| format!("binding 127.0.0.1:0 for a free port: {e}"))?;
    listener
        .local_addr()
        .map(|addr| addr.port())
        .map_err(|e| format!("reading the free port: {e}"))
}

/// A new, empty directory under the system's temporary directory, named by pid, counter and
/// time. The name stays short: it holds the server's Unix socket, whose path is limited.
fn unique_temp_dir() -> Result<PathBuf, String> {
    let base = std::env::temp_dir();
    for _ in 0..100 {
        let dir = base.join(format!(
            "idemdb-pg-{}-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed),
            nanos() % 1_000_000_000
        ));
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(format!("creating {}: {e}", dir.display())),
        }
    }
    Err(format!("no free directory name under {}", base.display()))
}

/// Nanoseconds since the Unix epoch (0 if the clock is before it).
fn nanos() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

/// `url` with its database replaced by `database`: the path of a `postgres://` URL (its query
/// kept), or an appended `dbname=` for a key=value connection string (the last one wins).
fn with_database(url: &str, database: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return format!("{url} dbname={database}");
    };
    let rest = &url[scheme_end + 3..];
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let base = &url[..scheme_end + 3 + authority_end];
    let after = &rest[authority_end..];
    let query = after.find('?').map_or("", |i| &after[i..]);
    format!("{base}/{database}{query}")
}

/// Where `name` is on `PATH`.
fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// `path` as UTF-8, which the shell lines need.
fn path_str(path: &Path) -> Result<&str, String> {
    path.to_str()
        .ok_or_else(|| format!("path is not UTF-8: {}", path.display()))
}

/// One shell command line of the words, each quoted.
fn shell_line(words: &[&str]) -> String {
    words
        .iter()
        .map(|w| shell_quote(w))
        .collect::<Vec<_>>()
        .join(" ")
}

/// `word` in single quotes for `sh`.
fn shell_quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_replaced_in_urls() {
        assert_eq!(
            with_database("postgres://postgres@127.0.0.1:5432/postgres", "x"),
            "postgres://postgres@127.0.0.1:5432/x"
        );
        assert_eq!(
            with_database("postgres://u:p@h:1/postgres?sslmode=disable", "x"),
            "postgres://u:p@h:1/x?sslmode=disable"
        );
        assert_eq!(with_database("postgres://h:1", "x"), "postgres://h:1/x");
        assert_eq!(
            with_database("postgresql://h?connect_timeout=5", "x"),
            "postgresql://h/x?connect_timeout=5"
        );
        assert_eq!(
            with_database("host=127.0.0.1 user=postgres", "x"),
            "host=127.0.0.1 user=postgres dbname=x"
        );
    }

    #[test]
    fn shell_quoting() {
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
    }
}
