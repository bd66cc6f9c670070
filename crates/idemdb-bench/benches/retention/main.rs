//! Retention by time partitions (issue 5), measured against what a user would otherwise embed.
//!
//! 1. **Drop** (`drop`): 1,000,000 finished records in 48 hourly partitions (TTL 48 h, so
//!    that none is due when the fill ends). The clock is then moved to each partition's due
//!    time in turn and every `compact_now` (one partition each) is timed. File size before the
//!    fill, after it, after the drop and after refilling the same 1M keys. Baselines on the
//!    same records: naive redb (`naive`: one table, a scan for expired rows, then removal in
//!    durable transactions of 10,000 keys) and SQLite (`sqlite`: WAL, `synchronous=FULL`, an
//!    index on `expires_at`, `DELETE … WHERE rowid IN (SELECT rowid … WHERE expires_at <= ?
//!    LIMIT 10000)` until nothing is left). Open time of the 1M-record file (`open`), with
//!    `verify_on_open` on and off (three each), beside plain redb opening the same file.
//! 2. **Stall** (`stall`): 64 threads doing reserve + complete of fresh keys (long TTL) for a
//!    fixed time, every reserve timed, three times on the refilled store: alone, while another
//!    thread drops the 48 refilled partitions one after another, and alone again. The same for
//!    naive redb beside its chunked sweep (redb's single writer lock is the one mutex both
//!    share).
//! 3. **Absence** (`absence`): criterion on `get` of a key never stored (proves it absent) and
//!    on `reserve` of a completed key (a replay, answered without writing), with 200,000
//!    records in 1, 48 or 168 partitions; then the same calls again with the three stores
//!    measured in turn, 30 rounds, compared round by round (criterion measures one store after
//!    the other, seconds apart, and the VM drifts by more than the effect sought).
//!
//! Every write is durable (default durability everywhere). idemdb is filled through its
//! public API (64 threads of reserve + complete, so group commit batches them); the baselines
//! are filled with big transactions (their fill is not what is compared).
//!
//! Run: `cargo bench --bench retention` (about 4.5 minutes on the 2-vCPU VM). The summary is
//! printed at the end and written to `target/bench-results/retention.md` (nothing else there).
//! Under `cargo test --benches` (criterion's test mode) every path runs once on tiny sizes,
//! with sanity checks, and nothing is written.

mod absence;
mod baseline;
mod drop;
mod fill;
mod load;
mod naive;
mod open;
mod report;
mod settings;
#[path = "../shared/mod.rs"]
mod shared;
mod space;
mod sqlite;
mod stall;

use std::time::{Duration, Instant};

use report::Report;
use settings::{FULL, TINY};
use shared::report::target_dir;

fn main() {
    let test_mode = shared::is_test_mode();
    let sizes = if test_mode { &TINY } else { &FULL };
    let mut c = shared::criterion(30, Duration::from_secs(2));
    let root = shared::temp_root("idemdb-retention-");
    let started = Instant::now();
    let mut report = Report::default();

    let store = drop::drop_cell(root.path(), sizes, &mut report);
    stall::stall_cell(&store, sizes, &mut report);
    std::mem::drop(store);
    absence::absence_cell(&mut c, root.path(), sizes, test_mode, &mut report);

    c.final_summary();
    report.notes.push(format!(
        "whole run: {:.0} s",
        started.elapsed().as_secs_f64()
    ));
    let md = report.markdown(&report::machine());
    println!("\n{md}");
    if test_mode {
        println!("(test mode: tiny sizes, nothing written)");
        return;
    }
    let dir = target_dir().join("bench-results");
    std::fs::create_dir_all(&dir).expect("create target/bench-results");
    std::fs::write(dir.join("retention.md"), &md).expect("write retention.md");
    println!("written: {}", dir.join("retention.md").display());
}
