//! The summary: the execute cells and the backlogs, as markdown.

use std::fmt::Write as _;

use crate::shared::report::{fmt_val, table_row, write_machine};
use crate::subject::Spent;

/// One caller count's plain and staging stores.
pub struct Cell {
    pub callers: usize,
    /// Executes/s over criterion's timed loops; `None` where a filter skipped them.
    pub plain: Option<f64>,
    pub staged: Option<f64>,
    /// Alternated rounds, and the executes each store ran in one.
    pub rounds: usize,
    pub per_round: u64,
    /// Median, lowest and highest staged ÷ plain of the rounds.
    pub ratio: f64,
    pub ratio_lo: f64,
    pub ratio_hi: f64,
    /// The median backlog a staged round left at its end (drained before the next round).
    pub left: u64,
    /// Median staged ÷ plain of the rounds for the store staging with no dispatcher.
    pub undispatched: f64,
    /// Over the rounds, for the plain store, the one staging with no dispatcher and the one
    /// staging beside its dispatcher.
    pub spent: [Spent; 3],
    /// Messages staged in the cell, published (counted by the publisher), and timed by the
    /// latency histogram.
    pub staged_executes: u64,
    pub published: u64,
    pub timed: u64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub mean_us: f64,
    pub round_errors: u64,
}

/// A backlog staged while nothing delivered, then drained.
pub struct Delivery {
    pub instances: usize,
    pub messages: u64,
    pub staged_per_s: f64,
    /// Growth of the outbox table (indexes included) per message staged.
    pub bytes_per_message: f64,
    /// From the first dispatcher's start to an empty backlog.
    pub delivered_per_s: f64,
    /// Messages each instance's publisher was handed.
    pub per_instance: Vec<u64>,
    pub round_errors: u64,
    pub fenced: u64,
}

/// Fresh messages delivered beside parked or held ones.
pub struct Beside {
    pub parked: u64,
    pub held: u64,
    pub fresh: u64,
    pub delivered_per_s: f64,
}

/// A histogram's bucket bound; none recorded (a cell filtered out) is "–".
fn bound(us: u64) -> String {
    if us == u64::MAX {
        "–".into()
    } else {
        us.to_string()
    }
}

pub fn markdown(
    cells: &[Cell],
    deliveries: &[Delivery],
    beside: &[Beside],
    machine: &[(String, String)],
) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "# pg_outbox bench (PgStore)\n");
    write_machine(&mut md, machine);
    let rounds = cells.first().map_or(0, |c| c.rounds);
    table_row(
        &mut md,
        &[
            "callers".to_string(),
            "execute/s, no message".into(),
            "execute/s, one staged".into(),
            format!("staged ÷ plain (median of {rounds} alternated rounds)"),
            "rounds' range".into(),
            "… with no dispatcher running (median)".into(),
            "backlog at a staged round's end (median)".into(),
            "commit→publish p50 µs (≤)".into(),
            "p99 µs (≤)".into(),
            "mean µs".into(),
            "messages timed / published / staged".into(),
        ],
    );
    table_row(
        &mut md,
        &[
            "--:", "--:", "--:", "--:", "--:", "--:", "--:", "--:", "--:", "--:", "--:",
        ],
    );
    for c in cells {
        table_row(
            &mut md,
            &[
                c.callers.to_string(),
                fmt_val(c.plain, 0),
                fmt_val(c.staged, 0),
                format!("{:.2}×", c.ratio),
                format!("{:.2}–{:.2}", c.ratio_lo, c.ratio_hi),
                format!("{:.2}×", c.undispatched),
                c.left.to_string(),
                bound(c.p50_us),
                bound(c.p99_us),
                fmt_val(Some(c.mean_us), 0),
                format!("{} / {} / {}", c.timed, c.published, c.staged_executes),
            ],
        );
    }
    let per_round: Vec<String> = cells
        .iter()
        .map(|c| format!("{} at {}", c.per_round, c.callers))
        .collect();
    let errors: u64 = cells.iter().map(|c| c.round_errors).sum();
    let _ = writeln!(
        md,
        "\nexecute/s: over criterion's timed loops (the plain store's cell first, then the \
         staging one's). A round: the same executes on each store, plain then staged ({} \
         executes per store at that many callers), and between them the same executes on a \
         third store staging one message each with no dispatcher running (its backlog left \
         undelivered): what `stage` itself costs; after each staged round its leftover \
         backlog is delivered (untimed) before the next plain round. The latency is every \
         message of the cell's (criterion's loops and the rounds), from the staging commit's \
         return to the publisher's `Ok`, in power-of-two buckets (upper bounds); a message the \
         dispatcher published before its caller's `execute` had noted the commit's return is \
         timed at 0. Dispatching rounds that failed on a database error: \
         {errors}.",
        per_round.join(", "),
    );
    let _ = writeln!(
        md,
        "\nWhere an execute's time went in the rounds, as its caller saw it (mean µs per \
         execute; with many callers the executes overlap):\n"
    );
    table_row(
        &mut md,
        &[
            "callers",
            "store",
            "execute µs",
            "`orders` insert µs",
            "`stage` µs",
            "the rest µs (look, record, commit, pool)",
        ],
    );
    table_row(&mut md, &["--:", "---", "--:", "--:", "--:", "--:"]);
    for c in cells {
        let names = [
            "plain",
            "staging, no dispatcher",
            "staging, dispatcher beside",
        ];
        for (name, s) in names.iter().zip(&c.spent) {
            table_row(
                &mut md,
                &[
                    c.callers.to_string(),
                    (*name).to_string(),
                    fmt_val(Some(s.execute_us), 0),
                    fmt_val(Some(s.insert_us), 0),
                    if *name == "plain" {
                        "–".to_string()
                    } else {
                        fmt_val(Some(s.stage_us), 0)
                    },
                    fmt_val(Some(s.execute_us - s.insert_us - s.stage_us), 0),
                ],
            );
        }
    }
    let _ = writeln!(md);
    table_row(
        &mut md,
        &[
            "dispatching instances",
            "backlog",
            "staged/s by 64 callers (no dispatcher)",
            "outbox growth on disk per message, bytes",
            "delivered/s (first start → empty backlog)",
            "published per instance",
            "round errors",
            "fenced",
        ],
    );
    table_row(
        &mut md,
        &["--:", "--:", "--:", "--:", "--:", "--:", "--:", "--:"],
    );
    for d in deliveries {
        let split: Vec<String> = d.per_instance.iter().map(u64::to_string).collect();
        table_row(
            &mut md,
            &[
                d.instances.to_string(),
                fmt_val(Some(d.messages as f64), 0),
                fmt_val(Some(d.staged_per_s), 0),
                fmt_val(Some(d.bytes_per_message), 0),
                fmt_val(Some(d.delivered_per_s), 0),
                split.join(" / "),
                d.round_errors.to_string(),
                d.fenced.to_string(),
            ],
        );
    }
    let _ = writeln!(
        md,
        "\nEach backlog: a fresh database, every message staged by an execute (its record, \
         `orders` row and message) with no dispatcher running; then that many `PgStore`s \
         (2 connections each) connected to it, their dispatchers (default options: batches of \
         64) started one after the other with an immediate publisher. The growth on disk is the \
         outbox table's files, indexes included, after staging less before: PostgreSQL \
         extends a heap many pages at a time while inserters wait, so it varies from run to \
         run and overstates the rows' own size."
    );
    let _ = writeln!(md);
    table_row(&mut md, &["parked", "held", "fresh", "delivered/s"]);
    table_row(&mut md, &["--:", "--:", "--:", "--:"]);
    for b in beside {
        table_row(
            &mut md,
            &[
                b.parked.to_string(),
                b.held.to_string(),
                b.fresh.to_string(),
                fmt_val(Some(b.delivered_per_s), 0),
            ],
        );
    }
    let _ = writeln!(
        md,
        "\nFresh messages (64 keys) delivered by one dispatcher beside parked messages (each its \
         own key) or held ones (pending behind one parked message of their key): a claim's \
         statement passes over them in number order every round."
    );
    md
}
