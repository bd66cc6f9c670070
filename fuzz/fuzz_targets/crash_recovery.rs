//! An arbitrary workload and crash schedule: run it, lose power inside one sync with the
//! pending writes dropped, kept or torn, reopen, and check invariants I1–I5 against what was
//! acknowledged.

#![no_main]

use arbitrary::Arbitrary;
use idemdb::ManualClock;
use idemdb::testing::{
    FaultBackend, KeyLog, Script, TearMode, check_recovered, open_workload, run_script,
};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Input {
    /// One script per key, by index into `Script::ALL`.
    scripts: Vec<u8>,
    /// The sync (counted after open) inside which the power goes.
    crash_sync: u8,
    /// 0: drop pending writes, 1: keep them, otherwise tear at random from `seed`.
    mode: u8,
    seed: u64,
    start_ms: u32,
}

fuzz_target!(|input: Input| {
    let scripts: Vec<Script> = input
        .scripts
        .iter()
        .take(24)
        .map(|b| Script::ALL[usize::from(*b) % Script::ALL.len()])
        .collect();
    let mode = match input.mode % 3 {
        0 => TearMode::DropAll,
        1 => TearMode::KeepAll,
        _ => TearMode::Random(input.seed),
    };
    let backend = FaultBackend::new();
    let clock = ManualClock::new(1_700_000_000_000 + u64::from(input.start_ms));
    let db = open_workload(backend.clone(), &clock).expect("open an empty backend");
    backend.crash_at_sync(u64::from(input.crash_sync), mode);
    let mut logs = Vec::new();
    for (i, script) in scripts.into_iter().enumerate() {
        let mut log = KeyLog::new(format!("k{i}-{script:?}"));
        let finished = run_script(&db, &clock, script, &mut log);
        logs.push(log);
        if !finished {
            break;
        }
    }
    drop(db);
    let disk = backend
        .crashed_disk()
        .unwrap_or_else(|| backend.durable_disk());
    if let Err(violation) = check_recovered(disk, clock, &logs) {
        panic!("invariant violated after crash ({mode:?}): {violation}");
    }
});
