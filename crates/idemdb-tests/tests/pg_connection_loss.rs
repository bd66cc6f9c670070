//! A connection lost where the commit may have happened answers `OutcomeUnknown`; lost
//! before the commit was sent, it is a plain error and nothing is committed. A reservation
//! is one statement that commits by itself (design.md §14), so for it every loss after the
//! statement left the client is `OutcomeUnknown`; `execute`'s transaction has a before and
//! an after. The loss is
//! real: a TCP proxy between the store and the server cuts the connection at the chosen
//! message, and the test then reads what the server actually committed.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::time::Duration;

use common::stores::{fresh_database_url, runtime};
use common::{LEASE, acquired};
use idemdb_postgres::{
    ExecuteError, ExecuteOutcome, Key, Outcome, PgError, PgStore, PgTx, RecordState, Retention,
    Scope, Store,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Where the proxy cuts the next connection that sends a matching message.
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Cut {
    Off = 0,
    /// Forward `COMMIT` to the server, then cut the client off before any answer.
    AfterCommit = 1,
    /// Cut both sides instead of forwarding `COMMIT`.
    BeforeCommit = 2,
    /// Forward the next Bind (an autocommit statement), then cut the client off.
    AfterBind = 3,
    /// Cut both sides instead of forwarding `execute`'s `INSERT` (inside its transaction,
    /// before the commit is sent).
    BeforeInsert = 4,
    /// Cut both sides instead of forwarding the next Bind.
    BeforeBind = 5,
}

struct Proxy {
    port: u16,
    cut: Arc<AtomicU8>,
    tripped: Arc<AtomicBool>,
    /// Notified once the cut connection's server side is done with what it was sent.
    settled: Arc<tokio::sync::Notify>,
}

/// The simple-protocol message tokio-postgres sends to commit.
const COMMIT: &[u8] = b"Q\0\0\0\x0bCOMMIT\0";
/// A Sync message, and the ReadyForQuery that answers each (status byte follows).
const SYNC: &[u8] = b"S\0\0\0\x04";
const READY: &[u8] = b"Z\0\0\0\x05";
/// `execute`'s insert, as its Parse message carries it.
const INSERT: &[u8] = b"INSERT INTO idemdb_records";

impl Proxy {
    async fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let cut = Arc::new(AtomicU8::new(Cut::Off as u8));
        let tripped = Arc::new(AtomicBool::new(false));
        let settled = Arc::new(tokio::sync::Notify::new());
        let (c, t, d) = (Arc::clone(&cut), Arc::clone(&tripped), Arc::clone(&settled));
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let server = TcpStream::connect(("127.0.0.1", upstream)).await.unwrap();
                let trap = (Arc::clone(&c), Arc::clone(&t), Arc::clone(&d));
                tokio::spawn(pipe(client, server, trap));
            }
        });
        Proxy {
            port,
            cut,
            tripped,
            settled,
        }
    }

    /// Waits until the server has finished what the cut connection sent it: only then does
    /// a read show what committed (the caller was answered at the cut, before that).
    async fn settled(&self) {
        assert!(
            self.tripped.load(Ordering::SeqCst),
            "the cut never happened"
        );
        tokio::time::timeout(Duration::from_secs(20), self.settled.notified())
            .await
            .expect("the server never finished the cut request");
    }

    fn arm(&self, cut: Cut) {
        self.tripped.store(false, Ordering::SeqCst);
        self.cut.store(cut as u8, Ordering::SeqCst);
    }
}

/// The trap: where to cut, whether it was cut, and who waits for the server to be done.
type Trap = (Arc<AtomicU8>, Arc<AtomicBool>, Arc<tokio::sync::Notify>);

async fn pipe(client: TcpStream, server: TcpStream, (cut, tripped, settled): Trap) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    // Set once the client must hear nothing more; `done` once the server, unheard, has
    // finished what it was sent (ReadyForQuery, idle: committed or rolled back).
    let deaf = Arc::new(AtomicBool::new(false));
    let done = Arc::new(tokio::sync::Notify::new());
    // Syncs and simple queries sent unheard: the server is done when it has answered each
    // with ReadyForQuery (a Close and its Sync may ride ahead of the request itself).
    let syncs = Arc::new(AtomicUsize::new(0));
    let (deaf_down, done_down, syncs_down) =
        (Arc::clone(&deaf), Arc::clone(&done), Arc::clone(&syncs));
    let down = tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        let mut unheard = Vec::new();
        loop {
            let n = match server_read.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if deaf_down.load(Ordering::SeqCst) {
                let _ = client_write.shutdown().await;
                unheard.extend_from_slice(&buf[..n]);
                let ready = unheard.windows(READY.len()).filter(|w| *w == READY).count();
                if ready >= syncs_down.load(Ordering::SeqCst) {
                    done_down.notify_one();
                    return;
                }
            } else if client_write.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        let _ = client_write.shutdown().await;
        done_down.notify_one();
    });
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match client_read.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let chunk = &buf[..n];
        let mode = cut.load(Ordering::SeqCst);
        let has_commit = chunk.windows(COMMIT.len()).any(|w| w == COMMIT);
        let starts_bind = has_message(chunk, b'B');
        let has_insert = chunk.windows(INSERT.len()).any(|w| w == INSERT);
        let trap = ((mode == Cut::AfterCommit as u8 || mode == Cut::BeforeCommit as u8)
            && has_commit)
            || ((mode == Cut::AfterBind as u8 || mode == Cut::BeforeBind as u8) && starts_bind)
            || (mode == Cut::BeforeInsert as u8 && has_insert);
        let forward = mode == Cut::AfterCommit as u8 || mode == Cut::AfterBind as u8;
        if trap
            && cut
                .compare_exchange(mode, Cut::Off as u8, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        {
            tripped.store(true, Ordering::SeqCst);
            deaf.store(true, Ordering::SeqCst);
            if forward {
                // The server gets the whole request (what follows the trapped chunk too,
                // e.g. a Sync split off) and finishes it, answering into the void.
                syncs.fetch_add(readies(chunk), Ordering::SeqCst);
                let _ = server_write.write_all(chunk).await;
                let finished = done.notified();
                tokio::pin!(finished);
                let mut client_open = true;
                while client_open {
                    tokio::select! {
                        _ = &mut finished => break,
                        read = client_read.read(&mut buf) => match read {
                            Ok(n) if n > 0 => {
                                syncs.fetch_add(readies(&buf[..n]), Ordering::SeqCst);
                                let _ = server_write.write_all(&buf[..n]).await;
                            }
                            // The client saw the cut and hung up: the server goes on.
                            _ => client_open = false,
                        },
                    }
                }
                if !client_open {
                    let _ = tokio::time::timeout(Duration::from_secs(10), finished).await;
                }
            }
            down.abort();
            settled.notify_one();
            return;
        }
        if server_write.write_all(chunk).await.is_err() {
            break;
        }
    }
    down.abort();
}

/// Whether `chunk` (whole frontend messages: type byte, u32 BE length) holds a message of
/// `kind`. A dropped statement's Close may ride ahead of the next Bind.
fn has_message(chunk: &[u8], kind: u8) -> bool {
    let mut at = 0;
    while let (Some(&t), Some(len)) = (chunk.get(at), chunk.get(at + 1..at + 5)) {
        if t == kind {
            return true;
        }
        let len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
        at += 1 + len;
    }
    false
}

/// The ReadyForQuery answers `chunk` asks for: one per Sync, and one per simple Query (a
/// batch's `BEGIN` and `COMMIT` are simple queries).
fn readies(chunk: &[u8]) -> usize {
    let mut queries = 0;
    let mut at = 0;
    while let (Some(&t), Some(len)) = (chunk.get(at), chunk.get(at + 1..at + 5)) {
        if t == b'Q' {
            queries += 1;
        }
        let len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
        at += 1 + len;
    }
    count(chunk, SYNC) + queries
}

fn count(data: &[u8], pattern: &[u8]) -> usize {
    data.windows(pattern.len())
        .filter(|w| *w == pattern)
        .count()
}

fn port_of(url: &str) -> u16 {
    let config: idemdb_postgres::tokio_postgres::Config = url.parse().unwrap();
    config.get_ports()[0]
}

/// A store through the proxy (one pooled connection, so the cut strikes the operation's
/// own), and one straight to the server that reads what was committed.
async fn stores() -> (Proxy, PgStore, PgStore) {
    let (_, proxy, through, direct) = stores_at().await;
    (proxy, through, direct)
}

/// [`stores`], and the database's URL.
async fn stores_at() -> (String, Proxy, PgStore, PgStore) {
    let url = fresh_database_url();
    let proxy = Proxy::start(port_of(&url)).await;
    let proxied = url.replacen(
        &format!(":{}/", port_of(&url)),
        &format!(":{}/", proxy.port),
        1,
    );
    assert_ne!(proxied, url);
    let direct = PgStore::builder(&url).unwrap();
    direct.migrate().await.unwrap();
    let direct = direct.connect().await.unwrap();
    // No compactor: its statements would share the one connection and meet a trap armed
    // for the caller's.
    let through = PgStore::builder(&proxied)
        .unwrap()
        .pool_size(1)
        .retention(Retention::default().compact_interval(None))
        .connect()
        .await
        .unwrap();
    (url, proxy, through, direct)
}

fn scope() -> Scope {
    Scope::new("POST /purchases", "u1")
}

/// `execute` of `key` with a body that writes nothing of its own: the dedupe record's
/// transaction (BEGIN, the stripe, the read, the INSERT, COMMIT).
async fn execute(
    store: &PgStore,
    key: &Key,
) -> Result<ExecuteOutcome, ExecuteError<idemdb_postgres::tokio_postgres::Error, PgError>> {
    store
        .execute(&scope(), key, b"req", |_tx: &mut PgTx<'_>| {
            Box::pin(async move {
                Ok::<_, idemdb_postgres::tokio_postgres::Error>(Outcome::Completed(
                    b"done".to_vec(),
                ))
            })
        })
        .await
}

#[test]
fn a_connection_lost_after_commit_was_sent_is_outcome_unknown_and_did_commit() {
    runtime().block_on(async {
        let (proxy, through, direct) = stores().await;
        proxy.arm(Cut::AfterCommit);
        let key = Key::new("k1");
        let result = execute(&through, &key).await;
        proxy.settled().await;
        match result {
            Err(ExecuteError::Db(e @ PgError::OutcomeUnknown(_))) => {
                assert!(e.is_outcome_unknown());
                // Worded for this store: read the record; there is nothing to reopen.
                let text = e.to_string();
                assert!(text.contains("read the record"), "{text}");
                assert!(!text.contains("reopen"), "{text}");
            }
            other => panic!("expected OutcomeUnknown, got {other:?}"),
        }
        // It did commit: the record is there. The caller must read to learn it.
        let rec = direct
            .get(&scope(), &key)
            .await
            .unwrap()
            .expect("committed");
        assert_eq!(rec.state, RecordState::Completed);
        assert_eq!(rec.response, b"done");
        // The pool drops the broken connection; the next call works.
        let again = execute(&through, &Key::new("k2")).await;
        assert!(
            matches!(again, Ok(ExecuteOutcome::Executed(_))),
            "{again:?}"
        );
    });
}

#[test]
fn a_connection_lost_before_commit_is_an_error_and_nothing_is_committed() {
    runtime().block_on(async {
        let (proxy, through, direct) = stores().await;
        proxy.arm(Cut::BeforeInsert);
        let key = Key::new("k1");
        let result = execute(&through, &key).await;
        proxy.settled().await;
        match result {
            Err(ExecuteError::Db(e @ PgError::Database(_))) => assert!(!e.is_outcome_unknown()),
            other => panic!("expected a plain database error, got {other:?}"),
        }
        // The server rolled the transaction back when the connection went.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(direct.get(&scope(), &key).await.unwrap(), None);
    });
}

#[test]
fn a_commit_sent_but_never_received_is_still_outcome_unknown() {
    runtime().block_on(async {
        let (proxy, through, direct) = stores().await;
        // The proxy swallows COMMIT: the client sent it and cannot know it never arrived.
        proxy.arm(Cut::BeforeCommit);
        let key = Key::new("k1");
        let result = execute(&through, &key).await;
        proxy.settled().await;
        assert!(
            matches!(result, Err(ExecuteError::Db(PgError::OutcomeUnknown(_)))),
            "{result:?}"
        );
        // "Unknown" meant it: this time nothing committed, and a retry executes.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(direct.get(&scope(), &key).await.unwrap(), None);
        let retry = execute(&through, &key).await;
        assert!(
            matches!(retry, Ok(ExecuteOutcome::Executed(_))),
            "{retry:?}"
        );
    });
}

/// A store through the proxy whose one connection has run a reservation already: its
/// statement is prepared and its partitions made, so the next reservation is one Bind.
async fn warmed() -> (Proxy, PgStore, PgStore) {
    let (proxy, through, direct) = stores().await;
    let warm = through
        .reserve(&scope(), &Key::new("warm"), b"req", LEASE)
        .await
        .unwrap();
    assert!(
        matches!(warm, idemdb::ReserveOutcome::Acquired(_)),
        "{warm:?}"
    );
    (proxy, through, direct)
}

/// A reservation of `k1` through a warmed store whose statement meets `cut`: it must answer
/// `OutcomeUnknown`. The stores and the key, once the server is done with what it was sent.
async fn reserve_cut(cut: Cut) -> (PgStore, PgStore, Key) {
    let (proxy, through, direct) = warmed().await;
    proxy.arm(cut);
    let key = Key::new("k1");
    let result = through.reserve(&scope(), &key, b"req", LEASE).await;
    proxy.settled().await;
    assert!(
        matches!(result, Err(PgError::OutcomeUnknown(_))),
        "{result:?}"
    );
    (through, direct, key)
}

#[test]
fn a_reservation_cut_after_its_statement_was_sent_is_outcome_unknown_and_did_commit() {
    runtime().block_on(async {
        let (_through, direct, key) = reserve_cut(Cut::AfterBind).await;
        // It did commit: the key is IN_PROGRESS under a lease nobody was told of.
        let rec = direct
            .get(&scope(), &key)
            .await
            .unwrap()
            .expect("committed");
        assert_eq!(rec.state, RecordState::InProgress);
        let again = direct.reserve(&scope(), &key, b"req", LEASE).await.unwrap();
        assert!(
            matches!(again, idemdb::ReserveOutcome::InProgress { .. }),
            "{again:?}"
        );
    });
}

#[test]
fn a_reservation_whose_statement_never_arrived_is_still_outcome_unknown() {
    runtime().block_on(async {
        // The proxy swallows the statement: the client sent it and cannot know.
        let (through, direct, key) = reserve_cut(Cut::BeforeBind).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(direct.get(&scope(), &key).await.unwrap(), None);
        let retry = through
            .reserve(&scope(), &key, b"req", LEASE)
            .await
            .unwrap();
        assert!(
            matches!(retry, idemdb::ReserveOutcome::Acquired(_)),
            "{retry:?}"
        );
    });
}

#[test]
fn an_autocommit_complete_cut_after_it_was_sent_is_outcome_unknown_and_did_commit() {
    runtime().block_on(async {
        let (proxy, through, direct) = stores().await;
        // Warm the pooled connection's statement cache: the next complete is one Bind.
        let warm = acquired(
            through
                .reserve(&scope(), &Key::new("w"), b"req", LEASE)
                .await
                .unwrap(),
        );
        through.complete(&warm, b"ok".to_vec()).await.unwrap();
        let r = acquired(
            through
                .reserve(&scope(), &Key::new("k"), b"req", LEASE)
                .await
                .unwrap(),
        );
        proxy.arm(Cut::AfterBind);
        let result = through.complete(&r, b"the answer".to_vec()).await;
        proxy.settled().await;
        assert!(
            matches!(result, Err(PgError::OutcomeUnknown(_))),
            "{result:?}"
        );
        let rec = direct.get(&scope(), &Key::new("k")).await.unwrap().unwrap();
        assert_eq!(rec.state, RecordState::Completed);
        assert_eq!(rec.response, b"the answer");
    });
}

/// A batch (design.md §14.4) of two reserves and a complete through the proxied store, its
/// pipelined transaction meeting `cut` at its `COMMIT`. The batch is made on purpose: the
/// test's own connection holds every stripe's lock while a lone reservation waits for it on
/// the store's one connection, and the three calls queue behind it. Every batched caller
/// must be answered `OutcomeUnknown`; returns the stores once the server is done.
async fn batch_cut(cut: Cut) -> (PgStore, PgStore, Vec<Key>) {
    let (url, proxy, through, direct) = stores_at().await;
    let through = Arc::new(through);
    let owned = acquired(
        through
            .reserve(&scope(), &Key::new("k"), b"req", LEASE)
            .await
            .unwrap(),
    );
    let gate = common::stores::admin(&url).await;
    gate.batch_execute("BEGIN; SELECT stripe FROM idemdb_stripes FOR UPDATE")
        .await
        .unwrap();
    // The store runs up to four calls alone before it queues (design.md §14.4): four lone
    // reservations, the first on the one connection waiting for the gate, the others for the
    // connection.
    let lone: Vec<_> = (0..4)
        .map(|i| {
            let through = Arc::clone(&through);
            tokio::spawn(async move {
                through
                    .reserve(&scope(), &Key::new(format!("lone-{i}")), b"req", LEASE)
                    .await
            })
        })
        .collect();
    // Asked outside the gate's transaction, whose `pg_stat_activity` would stay as first read.
    common::stores::wait_for_lock_waiters(&common::stores::admin(&url).await, 1).await;
    tokio::time::sleep(Duration::from_millis(150)).await;
    let keys = vec![Key::new("a"), Key::new("b")];
    let mut batched = Vec::new();
    for key in &keys {
        let (through, key) = (Arc::clone(&through), key.clone());
        batched.push(tokio::spawn(async move {
            through
                .reserve(&scope(), &key, b"req", LEASE)
                .await
                .map(drop)
        }));
    }
    {
        let through = Arc::clone(&through);
        batched.push(tokio::spawn(async move {
            through.complete(&owned, b"done".to_vec()).await
        }));
    }
    tokio::time::sleep(Duration::from_millis(150)).await;
    let before = through.stats();
    proxy.arm(cut);
    gate.batch_execute("COMMIT").await.unwrap();
    for call in lone {
        acquired(call.await.unwrap().unwrap());
    }
    for call in batched {
        let result = call.await.unwrap();
        assert!(
            matches!(result, Err(PgError::OutcomeUnknown(_))),
            "every caller of a cut batch: {result:?}"
        );
    }
    proxy.settled().await;
    assert_eq!(through.stats().batches, before.batches, "no batch answered");
    let through = Arc::try_unwrap(through).ok().unwrap();
    (through, direct, keys)
}

#[test]
fn a_batch_cut_after_its_commit_was_sent_is_outcome_unknown_to_every_caller_and_did_commit() {
    runtime().block_on(async {
        let (_through, direct, keys) = batch_cut(Cut::AfterCommit).await;
        for key in &keys {
            let rec = direct.get(&scope(), key).await.unwrap().expect("committed");
            assert_eq!(rec.state, RecordState::InProgress);
        }
        let rec = direct.get(&scope(), &Key::new("k")).await.unwrap().unwrap();
        assert_eq!(rec.state, RecordState::Completed);
        assert_eq!(rec.response, b"done");
    });
}

#[test]
fn a_batch_whose_commit_never_arrived_is_still_outcome_unknown_and_committed_nothing() {
    runtime().block_on(async {
        let (through, direct, keys) = batch_cut(Cut::BeforeCommit).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        for key in &keys {
            assert_eq!(direct.get(&scope(), key).await.unwrap(), None);
            // Each caller reads its record, finds nothing, and runs again.
            acquired(through.reserve(&scope(), key, b"req", LEASE).await.unwrap());
        }
        let rec = direct.get(&scope(), &Key::new("k")).await.unwrap().unwrap();
        assert_eq!(rec.state, RecordState::InProgress);
    });
}
