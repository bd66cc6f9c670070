//! The outbox's cost over PostgreSQL (`PgStore`), same run, as `benches/outbox` measures the
//! embedded engine's: lifecycles/s of `PgStore::execute` of a fresh key whose closure inserts
//! one business row (`orders`), without and with one staged message (`PgTx::stage`), at 1, 16
//! and 64 caller threads, a `PgDispatcher` with an immediate publisher delivering beside the
//! staging callers all along (its claims and marks share the server and the store's pool with
//! them); the commit-to-publish latency of those messages (the staging commit to the
//! publisher's `Ok`); and the delivery rate of a 20,000-message backlog by 1 dispatching
//! instance and by 3, and beside parked and held messages.
//!
//! PostgreSQL is the test server of `idemdb_testkit::postgres` (`$IDEMDB_TEST_PG`, else a
//! throwaway cluster for the process: fsync on, default `synchronous_commit`), a fresh
//! database per store. Callers are OS threads driving the async calls with `Handle::block_on`
//! on one multi-thread tokio runtime of 2 workers, where the stores' connections and the
//! dispatchers run.
//!
//! Criterion cells (sample size 10, warm-up 1 s, 3 s, flat sampling):
//! `pg_outbox_execute_{1,16,64}`, each with `plain` (a store with no message staged) and
//! `staged` (a store on a second database, its dispatcher running), one iteration = one
//! execute on each caller thread; each store's pool holds as many connections as there are
//! callers (at least 2). Then, outside criterion, staged ÷ plain as the median of 9 rounds
//! alternated between the two stores (this machine drifts between criterion's two runs), the
//! backlog drained after each staged round (what was left at its end is reported), and in
//! each round the same executes on a third store (a third database) that stages with no
//! dispatcher running, which splits the staged store's cost between the `stage` statement and
//! the delivery beside it; then the latency histogram of every message of the cell. Then the backlogs: 20,000 messages
//! (`IDEMDB_PG_OUTBOX_BACKLOG` overrides) staged by 64 callers with no dispatcher running,
//! then drained by 1 dispatcher, and a second backlog by 3 instances (3 `PgStore`s on its
//! database, a dispatcher each), from the first start to an empty backlog. Last, 5,000 fresh
//! messages delivered by one dispatcher beside nothing, beside 10,000 parked messages and
//! beside 10,000 held behind one parked message.
//!
//! Run: `cargo bench -p idemdb-bench --bench pg_outbox` (about 2 min on the 2-vCPU VM); the
//! summary is printed and written to `target/bench-results/pg_outbox_summary.md`. In
//! criterion's test mode (`cargo test --release -p idemdb-bench --bench pg_outbox`) every
//! cell runs once on tiny sizes and nothing is written.

mod callers;
mod report;
#[path = "../shared/mod.rs"]
mod shared;
mod subject;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, SamplingMode, Throughput};
use idemdb_postgres::{DispatchOptions, PgDispatcher, PgStore};
use tokio::runtime::Handle;

use callers::{Callers, Op};
use report::{Beside, Cell, Delivery};
use shared::report::target_dir;
use subject::Probe;

const CALLERS: [usize; 3] = [1, 16, 64];
/// Alternated rounds per cell for the ratio.
const ROUNDS: usize = 9;
/// About how long one store's part of a round runs (sized from the plain store's rate).
const ROUND: Duration = Duration::from_millis(400);
const BACKLOG: u64 = 20_000;
const BACKLOG_TEST: u64 = 256;
/// Callers staging a backlog.
const STAGING_CALLERS: usize = 64;
/// Dispatching instances draining a backlog, one backlog each.
const INSTANCES: [usize; 2] = [1, 3];
/// Parked messages (each its own key), and held ones (behind one parked message), beside
/// which `FRESH` messages are delivered.
const PARKED: u64 = 10_000;
const FRESH: u64 = 5_000;
/// How often the outbox is counted while waiting for it to empty.
const POLL: Duration = Duration::from_millis(2);

fn main() {
    let test_mode = shared::is_test_mode();
    let started = Instant::now();
    let mut c = shared::criterion(10, Duration::from_secs(3));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let handle = rt.handle();

    let cells: Vec<Cell> = CALLERS
        .iter()
        .map(|&n| cell(&mut c, handle, n, test_mode))
        .collect();
    c.final_summary();

    let messages = if test_mode {
        BACKLOG_TEST
    } else {
        std::env::var("IDEMDB_PG_OUTBOX_BACKLOG")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(BACKLOG)
    };
    let deliveries: Vec<Delivery> = INSTANCES
        .iter()
        .map(|&i| delivery(handle, messages, i))
        .collect();

    let (parked, fresh) = if test_mode { (64, 64) } else { (PARKED, FRESH) };
    let beside: Vec<Beside> = [(0, 0), (parked, 0), (0, parked)]
        .into_iter()
        .map(|(p, h)| beside_parked(handle, p, h, fresh))
        .collect();

    let mut machine = shared::report::machine();
    let (_, store) = subject::fresh(handle, 1);
    machine.extend(subject::pg_settings(handle, &store));
    drop(store);
    machine.push((
        "whole run".into(),
        format!("{:.0} s", started.elapsed().as_secs_f64()),
    ));
    let md = report::markdown(&cells, &deliveries, &beside, &machine);
    println!("\n{md}");
    if test_mode {
        println!("(test mode: every cell ran once on tiny sizes; nothing written)");
        return;
    }
    let dir = target_dir().join("bench-results");
    std::fs::create_dir_all(&dir).expect("create target/bench-results");
    let path = dir.join("pg_outbox_summary.md");
    std::fs::write(&path, &md).expect("write pg_outbox_summary.md");
    println!("written: {}", path.display());
}

/// Each caller's call: one execute of a fresh key on `store`, timed into `probe`.
fn op(rt: &Handle, store: &Arc<PgStore>, stage: bool, probe: &Arc<Probe>) -> Op {
    let (rt, store, probe) = (rt.clone(), Arc::clone(store), Arc::clone(probe));
    Arc::new(move |id| rt.block_on(subject::execute(&store, id, stage, &probe)))
}

/// Time and executes over a store's timed loops.
#[derive(Default)]
struct Timed {
    took: Duration,
    executes: u64,
}

impl Timed {
    fn add(&mut self, took: Duration, executes: u64) {
        self.took += took;
        self.executes += executes;
    }

    /// Executes per second; `None` for a cell criterion's filter skipped.
    fn rate(&self) -> Option<f64> {
        (self.executes > 0).then(|| self.executes as f64 / self.took.as_secs_f64())
    }
}

/// `callers` threads executing on a plain store and on a staging one (a dispatcher beside it),
/// in criterion and in alternated rounds; the latency of every message staged.
fn cell(c: &mut Criterion, rt: &Handle, callers: usize, test_mode: bool) -> Cell {
    let pool = callers.max(2);
    let (_, plain) = subject::fresh(rt, pool);
    let (_, staged) = subject::fresh(rt, pool);
    let sent = Arc::new(AtomicU64::new(0));
    let dispatcher = PgDispatcher::start(
        &staged,
        subject::immediate(Arc::clone(&sent)),
        DispatchOptions::default(),
    );
    // A third store that stages with no dispatcher, in the rounds only: it splits the cost
    // of staging (the statement, its row) from that of delivering beside it.
    let (_, undispatched) = subject::fresh(rt, pool);
    let probes: [Arc<Probe>; 3] = Default::default();
    let plain_callers = Callers::new(callers, op(rt, &plain, false, &probes[0]));
    let undispatched_callers = Callers::new(callers, op(rt, &undispatched, true, &probes[1]));
    let staged_callers = Callers::new(callers, op(rt, &staged, true, &probes[2]));

    let mut g = c.benchmark_group(format!("pg_outbox_execute_{callers}"));
    // PostgreSQL's commits take ms: equal iteration counts per sample keep each cell within
    // its few seconds.
    g.sampling_mode(SamplingMode::Flat);
    g.throughput(Throughput::Elements(callers as u64));
    let (mut plain_t, mut staged_t) = (Timed::default(), Timed::default());
    g.bench_function("plain", |b| {
        b.iter_custom(|iters| {
            let t = plain_callers.run(iters);
            plain_t.add(t, iters * callers as u64);
            t
        })
    });
    g.bench_function("staged", |b| {
        b.iter_custom(|iters| {
            let t = staged_callers.run(iters);
            staged_t.add(t, iters * callers as u64);
            t
        })
    });
    g.finish();
    // What criterion's staged loops left is delivered before the rounds: the first plain round
    // runs beside no delivery.
    assert!(
        subject::drain(rt, &staged, POLL),
        "the outbox did not drain"
    );

    // The ratio from rounds alternated between the stores: the median of each round's
    // staged ÷ plain. After each staged round the backlog it left is drained (untimed), so
    // that the next plain round runs beside no delivery; what it left is reported.
    let (rounds, per_thread) = if test_mode {
        (1, 1)
    } else {
        (ROUNDS, round_size(&plain_callers, &plain_t))
    };
    // The third store's connections are opened (its pool fills lazily) before the rounds, as
    // criterion's warm-up did the two others'. The probes cover the rounds only.
    undispatched_callers.run(2);
    probes.iter().for_each(|p| p.reset());
    let mut ratios = Vec::with_capacity(rounds);
    let mut undispatched_ratios = Vec::with_capacity(rounds);
    let mut left = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let p = plain_callers.run(per_thread);
        let u = undispatched_callers.run(per_thread);
        let s = staged_callers.run(per_thread);
        left.push(subject::stats(rt, &staged).backlog);
        assert!(
            subject::drain(rt, &staged, POLL),
            "the outbox did not drain"
        );
        ratios.push(p.as_secs_f64() / s.as_secs_f64());
        undispatched_ratios.push(p.as_secs_f64() / u.as_secs_f64());
    }
    ratios.sort_by(f64::total_cmp);
    undispatched_ratios.sort_by(f64::total_cmp);
    left.sort_unstable();
    drop((plain_callers, staged_callers, undispatched_callers));
    let spent = probes.each_ref().map(|p| p.spent());

    let staged_executes = staged_t.executes + (rounds * callers) as u64 * per_thread;
    let published = sent.load(Ordering::Relaxed);
    assert!(
        published >= staged_executes,
        "{published} messages published of {staged_executes} staged"
    );
    rt.block_on(dispatcher.stop());
    let stats = subject::stats(rt, &staged);
    assert_eq!(stats.backlog, 0, "undelivered messages");
    let latency = &stats.publish_latency_us;
    Cell {
        callers,
        plain: plain_t.rate(),
        staged: staged_t.rate(),
        rounds,
        per_round: (callers as u64) * per_thread,
        ratio: ratios[ratios.len() / 2],
        ratio_lo: ratios[0],
        ratio_hi: ratios[ratios.len() - 1],
        left: left[left.len() / 2],
        undispatched: undispatched_ratios[undispatched_ratios.len() / 2],
        spent,
        staged_executes,
        published,
        timed: latency.count,
        p50_us: latency.quantile_upper_bound(0.5),
        p99_us: latency.quantile_upper_bound(0.99),
        mean_us: latency.mean(),
        round_errors: stats.round_errors,
    }
}

/// Calls per thread for a round of about [`ROUND`] on the plain store, from its rate in
/// criterion's loops (or a short run of its own if criterion skipped them).
fn round_size(plain: &Callers, measured: &Timed) -> u64 {
    let threads = plain.threads() as u64;
    let rate = measured.rate().unwrap_or_else(|| {
        let t = plain.run(8);
        (8 * threads) as f64 / t.as_secs_f64()
    });
    let per_thread = (rate * ROUND.as_secs_f64() / threads as f64).ceil() as u64;
    per_thread.max(4)
}

/// A backlog of `messages` staged by 64 callers with no dispatcher running, then drained by
/// `instances` stores on its database, each with a dispatcher.
fn delivery(rt: &Handle, messages: u64, instances: usize) -> Delivery {
    let (url, staging) = subject::fresh(rt, STAGING_CALLERS);
    let empty = subject::outbox_bytes(rt, &staging);
    let probe = Arc::new(Probe::default());
    let took = callers::share(STAGING_CALLERS, messages, &|id| {
        rt.block_on(subject::execute(&staging, id, true, &probe));
    });
    let bytes = subject::outbox_bytes(rt, &staging) - empty;
    assert_eq!(
        subject::stats(rt, &staging).backlog,
        messages,
        "the backlog"
    );
    drop(staging);

    // The instances connect before the clock starts; their dispatchers start one after the
    // other.
    let stores: Vec<Arc<PgStore>> = (0..instances)
        .map(|_| subject::connect(rt, &url, 2))
        .collect();
    let sent: Vec<Arc<AtomicU64>> = (0..instances)
        .map(|_| Arc::new(AtomicU64::new(0)))
        .collect();
    let started = Instant::now();
    let dispatchers: Vec<PgDispatcher> = stores
        .iter()
        .zip(&sent)
        .map(|(store, sent)| {
            PgDispatcher::start(
                store,
                subject::immediate(Arc::clone(sent)),
                DispatchOptions::default(),
            )
        })
        .collect();
    let deadline = started + Duration::from_secs(300);
    let published = || sent.iter().map(|n| n.load(Ordering::Relaxed)).sum::<u64>();
    while published() < messages {
        assert!(Instant::now() < deadline, "the backlog was not delivered");
        std::thread::sleep(Duration::from_millis(1));
    }
    // The last round's marks.
    assert!(
        subject::drain(rt, &stores[0], POLL),
        "the outbox did not drain"
    );
    let drain = started.elapsed();
    for d in dispatchers {
        rt.block_on(d.stop());
    }
    let stats: Vec<_> = stores.iter().map(|s| subject::stats(rt, s)).collect();
    Delivery {
        instances,
        messages,
        staged_per_s: messages as f64 / took.as_secs_f64(),
        bytes_per_message: bytes as f64 / messages as f64,
        delivered_per_s: messages as f64 / drain.as_secs_f64(),
        per_instance: sent.iter().map(|n| n.load(Ordering::Relaxed)).collect(),
        round_errors: stats.iter().map(|s| s.round_errors).sum(),
        fenced: stats.iter().map(|s| s.fenced).sum(),
    }
}

/// `parked` messages parked (each its own key) and `held` pending behind one parked message
/// of their key, staged by 64 callers and parked by a dispatcher whose publisher refuses them
/// for good; then the delivery rate of `fresh` messages of 64 other keys by one dispatcher.
fn beside_parked(rt: &Handle, parked: u64, held: u64, fresh: u64) -> Beside {
    let (_url, store) = subject::fresh(rt, STAGING_CALLERS);
    let next = AtomicU64::new(0);
    let id = || next.fetch_add(1, Ordering::Relaxed);
    callers::share(STAGING_CALLERS, parked, &|_| {
        let n = id();
        rt.block_on(subject::stage_one(
            &store,
            n,
            format!("parked-{n}").into_bytes(),
            b"poison",
        ));
    });
    if held > 0 {
        rt.block_on(subject::stage_one(
            &store,
            id(),
            b"held".to_vec(),
            b"poison",
        ));
        callers::share(STAGING_CALLERS, held, &|_| {
            rt.block_on(subject::stage_one(&store, id(), b"held".to_vec(), b"ok"));
        });
    }
    let poisoned = parked + u64::from(held > 0);
    if poisoned > 0 {
        let refusing = PgDispatcher::start(
            &store,
            |m: idemdb_postgres::OutboxMessage| {
                std::future::ready(if m.payload == b"poison" {
                    Err(idemdb_postgres::PublishError::Permanent("poison".into()))
                } else {
                    Ok(())
                })
            },
            DispatchOptions::default(),
        );
        let deadline = Instant::now() + Duration::from_secs(300);
        while subject::stats(rt, &store).parked < poisoned {
            assert!(Instant::now() < deadline, "the poison was not parked");
            std::thread::sleep(POLL);
        }
        rt.block_on(refusing.stop());
    }
    callers::share(STAGING_CALLERS, fresh, &|_| {
        let n = id();
        rt.block_on(subject::stage_one(
            &store,
            n,
            format!("fresh-{}", n % 64).into_bytes(),
            b"ok",
        ));
    });
    let sent = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let dispatcher = PgDispatcher::start(
        &store,
        subject::immediate(Arc::clone(&sent)),
        DispatchOptions::default(),
    );
    let deadline = started + Duration::from_secs(300);
    while sent.load(Ordering::Relaxed) < fresh {
        assert!(
            Instant::now() < deadline,
            "the fresh messages were not delivered"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let took = started.elapsed();
    rt.block_on(dispatcher.stop());
    Beside {
        parked,
        held,
        fresh,
        delivered_per_s: fresh as f64 / took.as_secs_f64(),
    }
}
