//! The outbox's cost, same run: lifecycles/s of `execute` with one business insert, with and
//! without one staged message, at 1, 16 and 64 caller threads, a dispatcher with an
//! immediate publisher delivering beside the staging callers (its delivery commits share the
//! writer with them); the commit-to-publish latency of those messages (durability point to
//! the publisher's `Ok`); the delivery rate of a 20,000-message backlog
//! (`IDEMDB_OUTBOX_BACKLOG`); and that of 5,000 fresh messages beside 10,000 parked messages,
//! or beside 10,000 held behind one parked message (`IDEMDB_OUTBOX_PARKED`), against none.
//!
//! `cargo bench -p idemdb-bench --bench outbox` (about a minute); the summary is written to
//! target/bench-results/outbox_summary.md.

#[path = "../shared/mod.rs"]
mod shared;

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use criterion::{Criterion, SamplingMode};
use idemdb::redb::TableDefinition;
use idemdb::{
    DispatchOptions, Dispatcher, Error, ExecuteOutcome, IdemDb, Key, Message, OutboxMessage,
    Outcome, Scope,
};

use shared::keys::{PAYLOAD, RESPONSE, fresh_id, key_bytes};
use shared::report::{fmt_val, machine, table_row, target_dir, write_machine};

const ORDERS: TableDefinition<&[u8], u64> = TableDefinition::new("orders");
const CALLERS: [usize; 3] = [1, 16, 64];
/// Executes per iteration, shared by the callers.
const OPS: usize = 1_024;
const BACKLOG: usize = 20_000;
/// Alternated rounds of `OPS` executes per store for the ratio.
const ROUNDS: usize = 9;

fn open(dir: &std::path::Path) -> Arc<IdemDb> {
    Arc::new(
        IdemDb::builder()
            .table(ORDERS)
            .open(dir.join("db"))
            .expect("open"),
    )
}

/// One execute of a fresh key: the business insert, and one staged message if `stage`.
fn execute(db: &IdemDb, stage: bool) {
    let key = key_bytes(fresh_id());
    let done = db
        .execute(
            &Scope::new("bench", "outbox"),
            &Key::new(key),
            PAYLOAD,
            move |tx| {
                tx.open_table(ORDERS)?.insert(&key[..], 1999)?;
                if stage {
                    tx.stage(Message::new("orders", key.to_vec()).ordering_key(key[..4].to_vec()))?;
                }
                Ok::<_, Error>(Outcome::Completed(RESPONSE.to_vec()))
            },
        )
        .expect("execute");
    assert!(matches!(done, ExecuteOutcome::Executed(_)), "{done:?}");
}

/// `callers` threads running `ops` executes between them; the wall time.
fn run(db: &Arc<IdemDb>, callers: usize, ops: usize, stage: bool) -> Duration {
    let barrier = Arc::new(Barrier::new(callers + 1));
    let threads: Vec<_> = (0..callers)
        .map(|_| {
            let (db, barrier) = (Arc::clone(db), Arc::clone(&barrier));
            std::thread::spawn(move || {
                barrier.wait();
                for _ in 0..ops / callers {
                    execute(&db, stage);
                }
            })
        })
        .collect();
    barrier.wait();
    let start = Instant::now();
    for t in threads {
        t.join().expect("caller");
    }
    start.elapsed()
}

/// Executes per second; `None` for a cell criterion's filter skipped.
fn rate(n: usize, took: Duration) -> Option<f64> {
    (n > 0).then(|| n as f64 / took.as_secs_f64())
}

fn immediate(
    sent: Arc<AtomicU64>,
) -> impl FnMut(&OutboxMessage) -> Result<(), idemdb::PublishError> + Send {
    move |_| {
        sent.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

struct Cell {
    callers: usize,
    /// Median staged ÷ plain of the alternated rounds.
    ratio: f64,
    plain: Option<f64>,
    staged: Option<f64>,
    p50_us: u64,
    p99_us: u64,
    mean_us: f64,
}

fn main() {
    let test_mode = shared::is_test_mode();
    let root = shared::temp_root("idemdb-outbox-bench");
    let mut c: Criterion = shared::criterion(10, Duration::from_secs(3));
    let mut cells = Vec::new();
    for callers in CALLERS {
        let plain_dir = tempfile::tempdir_in(root.path()).expect("dir");
        let staged_dir = tempfile::tempdir_in(root.path()).expect("dir");
        let plain = open(plain_dir.path());
        let staged = open(staged_dir.path());
        let sent = Arc::new(AtomicU64::new(0));
        let dispatcher = Dispatcher::start(
            Arc::clone(&staged),
            immediate(Arc::clone(&sent)),
            DispatchOptions::default(),
        )
        .expect("dispatcher");
        let ops = if test_mode { callers.max(8) } else { OPS };
        let mut g = c.benchmark_group(format!("outbox_execute_{callers}"));
        g.sampling_mode(SamplingMode::Flat);
        g.throughput(criterion::Throughput::Elements(ops as u64));
        let (mut plain_t, mut plain_n) = (Duration::ZERO, 0usize);
        let (mut staged_t, mut staged_n) = (Duration::ZERO, 0usize);
        g.bench_function("plain", |b| {
            b.iter_custom(|iters| {
                let t: Duration = (0..iters).map(|_| run(&plain, callers, ops, false)).sum();
                (plain_t, plain_n) = (plain_t + t, plain_n + iters as usize * ops);
                t
            })
        });
        g.bench_function("staged", |b| {
            b.iter_custom(|iters| {
                let t: Duration = (0..iters).map(|_| run(&staged, callers, ops, true)).sum();
                (staged_t, staged_n) = (staged_t + t, staged_n + iters as usize * ops);
                t
            })
        });
        g.finish();
        // The ratio from rounds alternated between the two stores (this machine drifts
        // between criterion's two runs): the median of each round's staged ÷ plain.
        let rounds = if test_mode { 1 } else { ROUNDS };
        let mut ratios: Vec<f64> = (0..rounds)
            .map(|_| {
                let p = run(&plain, callers, ops, false);
                let s = run(&staged, callers, ops, true);
                p.as_secs_f64() / s.as_secs_f64()
            })
            .collect();
        ratios.sort_by(f64::total_cmp);
        let deadline = Instant::now() + Duration::from_secs(60);
        while staged.outbox_stats().expect("stats").backlog > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        dispatcher.stop().expect("dispatcher");
        let latency = staged.outbox_stats().expect("stats").publish_latency_us;
        cells.push(Cell {
            callers,
            ratio: ratios[ratios.len() / 2],
            plain: rate(plain_n, plain_t),
            staged: rate(staged_n, staged_t),
            p50_us: latency.quantile_upper_bound(0.5),
            p99_us: latency.quantile_upper_bound(0.99),
            mean_us: latency.mean(),
        });
    }
    // A backlog staged with no dispatcher (a publisher outage), the file reopened with it,
    // then drained.
    let dir = tempfile::tempdir_in(root.path()).expect("dir");
    let backlog = if test_mode {
        256
    } else {
        std::env::var("IDEMDB_OUTBOX_BACKLOG")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(BACKLOG)
    };
    let db = open(dir.path());
    let empty = file_bytes(dir.path());
    let staging = run(&db, 64, backlog, true);
    drop(Arc::into_inner(db).expect("the only handle"));
    let bytes = file_bytes(dir.path()).saturating_sub(empty);
    let reopen_started = Instant::now();
    let db = open(dir.path());
    let reopen = reopen_started.elapsed();
    let sent = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let dispatcher = Dispatcher::start(
        Arc::clone(&db),
        immediate(Arc::clone(&sent)),
        DispatchOptions::default(),
    )
    .expect("dispatcher");
    while db.outbox_stats().expect("stats").backlog > 0 {
        std::thread::sleep(Duration::from_millis(1));
    }
    let drain = started.elapsed();
    dispatcher.stop().expect("dispatcher");
    let at_size = Backlog {
        messages: backlog,
        staged_per_s: backlog as f64 / staging.as_secs_f64(),
        bytes_per_message: bytes as f64 / backlog as f64,
        reopen,
        delivered_per_s: backlog as f64 / drain.as_secs_f64(),
    };
    let parked = if test_mode {
        64
    } else {
        std::env::var("IDEMDB_OUTBOX_PARKED")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(PARKED)
    };
    let fresh = if test_mode { 64 } else { FRESH };
    let beside = [(0, 0), (parked, 0), (0, parked)].map(|(p, h)| {
        let dir = tempfile::tempdir_in(root.path()).expect("dir");
        Beside {
            parked: p,
            held: h,
            fresh,
            delivered_per_s: beside_parked(&open(dir.path()), p, h, fresh),
        }
    });
    report(&cells, &at_size, &beside);
}

/// Parked messages (distinct keys) and held ones (behind one parked key) beside which a fresh
/// backlog is drained.
const PARKED: usize = 10_000;
const FRESH: usize = 5_000;

/// One `execute` staging `payload` under ordering key `okey`.
fn stage_one(db: &IdemDb, okey: &[u8], payload: &'static [u8]) {
    let key = key_bytes(fresh_id());
    let okey = okey.to_vec();
    let _ = db
        .execute(
            &Scope::new("bench", "parked"),
            &Key::new(key),
            PAYLOAD,
            move |tx| {
                tx.stage(Message::new("orders", payload.to_vec()).ordering_key(okey))?;
                Ok::<_, Error>(Outcome::Completed(RESPONSE.to_vec()))
            },
        )
        .expect("execute");
}

/// `parked` messages parked (each its own key), `held` pending behind a parked message of
/// their key; then the delivery rate of `fresh` messages of other keys staged meanwhile.
fn beside_parked(db: &Arc<IdemDb>, parked: usize, held: usize, fresh: usize) -> f64 {
    for i in 0..parked {
        stage_one(db, format!("parked-{i}").as_bytes(), b"poison");
    }
    if held > 0 {
        stage_one(db, b"held", b"poison");
        for _ in 0..held {
            stage_one(db, b"held", b"ok");
        }
    }
    let sent = Arc::new(AtomicU64::new(0));
    let count = Arc::clone(&sent);
    let publisher = move |m: &OutboxMessage| {
        if m.payload == b"poison" {
            return Err(idemdb::PublishError::Permanent("poison".into()));
        }
        count.fetch_add(1, Ordering::Relaxed);
        Ok(())
    };
    let dispatcher =
        Dispatcher::start(Arc::clone(db), publisher, DispatchOptions::default()).expect("start");
    let poisoned = (parked + usize::from(held > 0)) as u64;
    while db.outbox_stats().expect("stats").parked < poisoned {
        std::thread::sleep(Duration::from_millis(1));
    }
    dispatcher.stop().expect("stop");
    for i in 0..fresh {
        stage_one(db, format!("fresh-{}", i % 64).as_bytes(), b"ok");
    }
    let sent = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let dispatcher = Dispatcher::start(
        Arc::clone(db),
        immediate(Arc::clone(&sent)),
        DispatchOptions::default(),
    )
    .expect("dispatcher");
    while sent.load(Ordering::Relaxed) < fresh as u64 {
        std::thread::sleep(Duration::from_millis(1));
    }
    let took = started.elapsed();
    dispatcher.stop().expect("stop");
    fresh as f64 / took.as_secs_f64()
}

/// Delivery of a fresh backlog beside parked and held messages.
struct Beside {
    parked: usize,
    held: usize,
    fresh: usize,
    delivered_per_s: f64,
}

/// The database file's and its log's bytes on disk under `dir`.
fn file_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// A backlog staged while nothing delivered, then drained.
struct Backlog {
    messages: usize,
    staged_per_s: f64,
    bytes_per_message: f64,
    reopen: Duration,
    delivered_per_s: f64,
}

/// A histogram's bucket bound; none recorded (a cell filtered out) is "–".
fn bound(us: u64) -> String {
    if us == u64::MAX {
        "–".into()
    } else {
        us.to_string()
    }
}

fn report(cells: &[Cell], backlog: &Backlog, beside: &[Beside]) {
    let mut md = String::new();
    let _ = writeln!(md, "# outbox bench\n");
    write_machine(&mut md, &machine());
    table_row(
        &mut md,
        &[
            "callers",
            "execute/s, no message",
            "execute/s, one staged",
            "staged ÷ plain (median of 9 alternated rounds)",
            "commit→publish p50 µs (≤)",
            "p99 µs (≤)",
            "mean µs",
        ],
    );
    table_row(&mut md, &["--:", "--:", "--:", "--:", "--:", "--:", "--:"]);
    for c in cells {
        table_row(
            &mut md,
            &[
                c.callers.to_string(),
                fmt_val(c.plain, 0),
                fmt_val(c.staged, 0),
                format!("{:.2}×", c.ratio),
                bound(c.p50_us),
                bound(c.p99_us),
                fmt_val(Some(c.mean_us), 0),
            ],
        );
    }
    let _ = writeln!(
        md,
        "\nA backlog of {} messages staged by 64 callers with no dispatcher: {} staged/s, \
         the file and its log grown by {:.0} bytes per staging `execute` (its record, `orders` row \
         and message), the reopen with it {:.0} ms, then \
         delivered to an immediate publisher at {} messages/s.",
        backlog.messages,
        fmt_val(Some(backlog.staged_per_s), 0),
        backlog.bytes_per_message,
        backlog.reopen.as_secs_f64() * 1e3,
        fmt_val(Some(backlog.delivered_per_s), 0),
    );
    let _ = writeln!(
        md,
        "\nA fresh backlog of {} messages (64 keys) delivered beside parked messages \
         (each its own key) and held ones (pending behind a parked message of their key):\n",
        beside.first().map_or(0, |b| b.fresh)
    );
    table_row(&mut md, &["parked", "held", "delivered/s"]);
    table_row(&mut md, &["--:", "--:", "--:"]);
    for b in beside {
        table_row(
            &mut md,
            &[
                b.parked.to_string(),
                b.held.to_string(),
                fmt_val(Some(b.delivered_per_s), 0),
            ],
        );
    }
    let path = target_dir().join("bench-results").join("outbox_summary.md");
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let _ = std::fs::write(&path, &md);
    println!("{md}");
}
