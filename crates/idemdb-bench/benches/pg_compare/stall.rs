//! The stall of a partition drop under load, for both stores: `partitions` time partitions of
//! `per_partition` finished records each are made due by a `ManualClock`, then `CALLERS`
//! threads run reserve + complete of fresh keys (every reserve timed) three times: alone,
//! while one `compact_now()` drops every due partition, and alone again.
//!
//! PostgreSQL: each partition gets `api_per_partition` records through the API and the rest
//! as copies of one of them (new keys) by one `INSERT … SELECT`; the fill is not measured.
//! The embedded engine is filled through the API only. Before the drop the due partitions
//! and their rows are counted (`pg_inherits`, `stats()`); after it, none may be left, and on
//! PostgreSQL the dropped tables must be gone from `pg_class`, not merely detached.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idemdb::{ManualClock, Retention, Scope};
use tokio::runtime::Handle;

use crate::callers::{LoadRun, run_load};
use crate::dist::Dist;
use crate::shared::keys::{OPERATION, PRINCIPAL};
use crate::subject::{Compacted, Kind, Opened, Subject, parallel};

/// Caller threads of the load (as in `benches/retention`'s stall cell).
pub const CALLERS: usize = 64;
const HOUR_MS: u64 = 3_600_000;
/// Width and TTL: the clock is manual, so one hour costs no waiting.
const WIDTH: Duration = Duration::from_secs(3600);
const TTL: Duration = Duration::from_secs(3600);
/// Threads of the fill.
const FILL_THREADS: usize = 64;

pub struct StallSizes {
    pub partitions: u64,
    pub per_partition: u64,
    /// PostgreSQL: records per partition written through the API (the rest are copies).
    pub api_per_partition: u64,
    /// Each measured load phase lasts at least this.
    pub load: Duration,
    /// Unmeasured load before phase 1 (connections opened, the load's partition made).
    pub warm: Duration,
}

pub const FULL: StallSizes = StallSizes {
    partitions: 48,
    per_partition: 3_000,
    api_per_partition: 64,
    load: Duration::from_secs(5),
    warm: Duration::from_secs(1),
};

/// Criterion's test mode: every step once, quickly.
pub const TINY: StallSizes = StallSizes {
    partitions: 4,
    per_partition: 100,
    api_per_partition: 16,
    load: Duration::from_millis(400),
    warm: Duration::from_millis(100),
};

/// One store's measurement.
pub struct StallResult {
    pub fill_s: f64,
    pub records: u64,
    /// Reserve latencies (ns): alone before, beside the drop, alone after.
    pub phases: [Dist; 3],
    pub lifecycles_per_s: [f64; 3],
    /// Reserves of phase 2 whose interval overlaps the `compact_now` call.
    pub overlapping: Dist,
    pub compacted: Compacted,
}

/// A time aligned to the hour, so that windows are whole hours.
fn aligned_start() -> u64 {
    1_700_000_000_000u64.div_ceil(HOUR_MS) * HOUR_MS
}

pub fn stall(kind: Kind, rt: &Handle, root: &std::path::Path, sizes: &StallSizes) -> StallResult {
    let start = aligned_start();
    let clock = ManualClock::new(start);
    let retention = Retention::default().ttl(TTL).partition_width(WIDTH);
    let opened = Opened::open(kind, rt, root, CALLERS + 2, retention, Some(clock));
    let subject = &opened.subject;
    let scope = Scope::new(OPERATION, PRINCIPAL);
    let parts = sizes.partitions;
    let per = sizes.per_partition;
    let records = parts * per;

    // The fill: window w at start + w h, so its records expire in [start + (w+1) h, + 1 h).
    println!(
        "stall/{}: filling {parts} partitions × {per} records…",
        kind.id()
    );
    let began = Instant::now();
    let api = match kind {
        Kind::Postgres => sizes.api_per_partition.min(per),
        Kind::Embedded => per,
        Kind::Table => unreachable!("the stall runs the two stores"),
    };
    for w in 0..parts {
        let at = start + w * HOUR_MS + 1_000;
        opened.set_time(at);
        let ids = w * per..w * per + api;
        parallel(FILL_THREADS, ids, &|id| {
            subject.lifecycle(rt, &scope, id);
        });
        if let Subject::Pg(store) = subject
            && per > api
        {
            copy_rows(rt, store, at + TTL.as_millis() as u64, per - api);
        }
    }
    let fill_s = began.elapsed().as_secs_f64();
    println!("  {fill_s:.1} s");

    // Every filled partition is due: its end (start + (w+2) h at most) is past.
    let now = start + (parts + 2) * HOUR_MS;
    opened.set_time(now);
    let before = due(subject, rt, now);
    assert_eq!(before.partitions, parts, "due partitions before the drop");
    assert_eq!(before.records, records, "records in them");

    let op = |id: u64| subject.lifecycle(rt, &scope, id);
    println!("stall/{}: warm-up {:?}…", kind.id(), sizes.warm);
    run_load(CALLERS, sizes.warm, &op, None);
    println!("stall/{}: load alone {:?}…", kind.id(), sizes.load);
    let alone = run_load(CALLERS, sizes.load, &op, None);
    // The embedded engine's totals now include the load's one partition (its clock does not
    // move): compared below as differences.
    let stats_before = embedded_stats(subject);
    if let Subject::Pg(_) = subject {
        assert_eq!(
            due(subject, rt, now).partitions,
            parts,
            "nothing dropped without compaction"
        );
    }

    println!(
        "stall/{}: load beside compact_now() of {parts} due partitions…",
        kind.id()
    );
    let compacted: Mutex<Option<Compacted>> = Mutex::new(None);
    let compact = || {
        *compacted.lock().expect("compacted") = Some(subject.compact(rt));
    };
    let beside = run_load(CALLERS, sizes.load, &op, Some((sizes.load / 8, &compact)));
    let compacted = compacted
        .into_inner()
        .expect("compacted")
        .expect("compact_now ran");
    println!(
        "  compact_now: {:.1} ms, {} partitions dropped",
        compacted.took.as_secs_f64() * 1e3,
        compacted.partitions_dropped
    );
    assert_eq!(compacted.partitions_dropped, parts, "partitions dropped");
    if let Some(expired) = compacted.records_expired {
        assert_eq!(expired, records, "records expired");
    }
    match subject {
        Subject::Pg(store) => {
            assert_eq!(
                due(subject, rt, now).partitions,
                0,
                "due partitions left after the drop (pg_inherits)"
            );
            let left = existing_tables(rt, store, &before.names);
            assert_eq!(left, 0, "dropped partitions still in pg_class");
        }
        Subject::Table(_) => unreachable!("the stall runs the two stores"),
        Subject::Embedded(db) => {
            let (partitions, dropped) = stats_before.expect("embedded");
            let st = db.stats();
            assert_eq!(
                st.partitions_dropped - dropped,
                parts,
                "stats().partitions_dropped"
            );
            assert_eq!(
                st.partitions,
                partitions - parts,
                "stats().partitions after the drop"
            );
        }
    }

    println!("stall/{}: load alone again {:?}…", kind.id(), sizes.load);
    let after = run_load(CALLERS, sizes.load, &op, None);

    let (a, b) = beside.side.expect("the side ran");
    let overlapping = beside
        .reserves
        .iter()
        .filter(|(s, took)| *s < b && s + took > a)
        .map(|(_, took)| *took)
        .collect();
    let rate = |r: &LoadRun| r.reserves.len() as f64 / r.wall.as_secs_f64();
    let result = StallResult {
        fill_s,
        records,
        lifecycles_per_s: [rate(&alone), rate(&beside), rate(&after)],
        phases: [alone, beside, after].map(|r| Dist::new(r.reserves.iter().map(|x| x.1).collect())),
        overlapping: Dist::new(overlapping),
        compacted,
    };
    drop(opened);
    result
}

/// The due partitions of a store at `now` and the records in them. The embedded engine
/// tells only totals (`stats()`): call it there before the load has written anything.
struct Due {
    partitions: u64,
    records: u64,
    /// PostgreSQL: the partitions' table names.
    names: Vec<String>,
}

fn due(subject: &Subject, rt: &Handle, now: u64) -> Due {
    match subject {
        Subject::Embedded(db) => {
            let st = db.stats();
            Due {
                partitions: st.partitions,
                records: st.stored_records,
                names: Vec::new(),
            }
        }
        Subject::Pg(store) => rt.block_on(async {
            let client = store.pool().get().await.expect("pool");
            let rows = client
                .query(
                    "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c \
                     ON c.oid = i.inhrelid WHERE i.inhparent = 'idemdb_records'::regclass",
                    &[],
                )
                .await
                .expect("pg_inherits");
            let mut names = Vec::new();
            let mut records = 0;
            for row in rows {
                let name: String = row.get(0);
                let end = name
                    .strip_prefix("idemdb_records_")
                    .and_then(|r| r.split_once('_'))
                    .and_then(|(_, end)| end.parse::<u64>().ok());
                if end.is_some_and(|end| end <= now) {
                    let n: i64 = client
                        .query_one(&format!("SELECT count(*) FROM {name}"), &[])
                        .await
                        .expect("count")
                        .get(0);
                    records += n as u64;
                    names.push(name);
                }
            }
            Due {
                partitions: names.len() as u64,
                records,
                names,
            }
        }),
        Subject::Table(_) => unreachable!("the stall runs the two stores"),
    }
}

/// The embedded engine's partitions and partitions dropped so far.
fn embedded_stats(subject: &Subject) -> Option<(u64, u64)> {
    match subject {
        Subject::Embedded(db) => {
            let st = db.stats();
            Some((st.partitions, st.partitions_dropped))
        }
        Subject::Pg(_) | Subject::Table(_) => None,
    }
}

/// Adds `n` copies, under new keys, of one record of the partition holding `expires_at`.
fn copy_rows(rt: &Handle, store: &Arc<idemdb_postgres::PgStore>, expires_at: u64, n: u64) {
    rt.block_on(async {
        let client = store.pool().get().await.expect("pool");
        let copied = client
            .execute(
                "INSERT INTO idemdb_records (operation, principal, key, state, fingerprint, \
                 token, lease_expires_at, created_at, updated_at, expires_at, attempts, \
                 response) \
                 SELECT r.operation, r.principal, r.key || int8send(g), r.state, \
                 r.fingerprint, nextval('idemdb_tokens'), r.lease_expires_at, r.created_at, \
                 r.updated_at, r.expires_at, r.attempts, r.response \
                 FROM (SELECT * FROM idemdb_records WHERE expires_at = $1 LIMIT 1) r, \
                 generate_series(1::bigint, $2::bigint) g",
                &[&(expires_at as i64), &(n as i64)],
            )
            .await
            .expect("copy rows");
        assert_eq!(copied, n, "rows copied into the partition of {expires_at}");
    });
}

/// How many of `names` still exist as tables.
fn existing_tables(rt: &Handle, store: &Arc<idemdb_postgres::PgStore>, names: &[String]) -> i64 {
    rt.block_on(async {
        let client = store.pool().get().await.expect("pool");
        client
            .query_one(
                "SELECT count(*) FROM pg_class WHERE relname = ANY($1)",
                &[&names],
            )
            .await
            .expect("pg_class")
            .get(0)
    })
}
