//! Fuzzed workloads: besides one key's script at a time, steps that put several callers'
//! operations in one group commit (plain ops sharing one transaction, closures each in their
//! own, a failing closure among them), and clean reopens; checked against the same model of
//! what was acknowledged (workload.rs).

use idemdb::Consumed;
use idemdb::IdemDb;
use idemdb::Key;
use idemdb::ManualClock;
use idemdb::Refusal;
use idemdb::Reservation;
use idemdb::ReserveOutcome;
use idemdb::testing::{self, Finish};
use idemdb::{Error, ExecuteError};

use crate::backend::FaultBackend;
use crate::workload::{
    Checkpoints, Expect, INBOX, KeyLog, LONG_LEASE, ROWS, Script, log_payload, open_workload_as,
    response, run_script, scope,
};

/// One step of a workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// One fresh key's script, its calls one after another.
    Script(Script),
    /// `keys` fresh keys (1 to 16) reserved in one group commit, then finished in another:
    /// key `i` by the two bits `2i..2i+2` of `finish`: 0 complete, 1 fail, 2 release, 3 left in
    /// progress.
    Batch {
        /// How many keys.
        keys: u8,
        /// What each key's owner does next.
        finish: u32,
    },
    /// An inbox poll of `messages` (1 to 16) consumed in one group commit, each handler in a
    /// transaction of its own writing a business row; handler `i` fails (nothing of it
    /// commits) if bit `i` of `failing` is set.
    Poll {
        /// How many messages.
        messages: u8,
        /// Which handlers fail.
        failing: u16,
    },
    /// Close the database cleanly and open it again.
    Reopen,
}

/// Runs `steps` on `db` (opened by [`open_workload_as`] over `disk` with `checkpoints`,
/// as a [`Step::Reopen`] opens it again), one after another, until a call fails (the crash
/// struck, or a fault). Returns every key's log. A wrong answer before the crash is a bug
/// and panics.
pub fn run_steps(
    db: IdemDb,
    disk: &FaultBackend,
    clock: &ManualClock,
    checkpoints: Checkpoints,
    steps: &[Step],
) -> Vec<KeyLog> {
    let mut logs = Vec::new();
    let mut db = Some(db);
    for (n, step) in steps.iter().enumerate() {
        let Some(open) = db.as_ref() else { break };
        let finished = match *step {
            Step::Script(script) => {
                let mut log = KeyLog::new(format!("s{n}-{script:?}"));
                let finished = run_script(open, clock, script, &mut log);
                logs.push(log);
                finished
            }
            Step::Batch { keys, finish } => batch(open, n, keys, finish, &mut logs),
            Step::Poll { messages, failing } => poll(open, n, messages, failing, &mut logs),
            Step::Reopen => {
                drop(db.take());
                db = open_workload_as(disk.clone(), clock, checkpoints).ok();
                db.is_some()
            }
        };
        if !finished {
            break;
        }
    }
    logs
}

/// Reserves `keys` fresh keys in one commit, then finishes them in another.
fn batch(db: &IdemDb, step: usize, keys: u8, finish: u32, logs: &mut Vec<KeyLog>) -> bool {
    let first = logs.len();
    let names: Vec<String> = (0..keys.clamp(1, 16))
        .map(|i| format!("b{step}-{i}"))
        .collect();
    let keys: Vec<Key> = names
        .iter()
        .map(|name| {
            let mut log = KeyLog::new(name.clone());
            log.begin(Expect::InProgress(None));
            logs.push(log);
            Key::new(name)
        })
        .collect();
    let mut held: Vec<(usize, Reservation)> = Vec::new();
    let mut all = true;
    let answers = testing::reserve_many(db, &scope(), &keys, log_payload(), LONG_LEASE);
    for (i, out) in answers.into_iter().enumerate() {
        match out {
            Ok(ReserveOutcome::Acquired(r)) => {
                logs[first + i].answered_acquired(&r);
                held.push((first + i, r));
            }
            Ok(other) => panic!("a fresh key in a batch: {other:?}"),
            Err(_) => all = false,
        }
    }
    if !all {
        return false;
    }
    let mut calls = Vec::new();
    for (n, (at, r)) in held.iter().enumerate() {
        let log = &mut logs[*at];
        let done = response(&log.key, "batch");
        match (finish >> (2 * n)) & 3 {
            0 => {
                log.begin(Expect::Completed {
                    response: done.clone(),
                    row: false,
                });
                calls.push((r, Finish::Complete(done)));
            }
            1 => {
                log.begin(Expect::Failed {
                    response: done.clone(),
                    row: false,
                });
                calls.push((r, Finish::Fail(done)));
            }
            2 => {
                log.begin(Expect::Absent);
                calls.push((r, Finish::Release));
            }
            _ => {}
        }
    }
    let finishing: Vec<usize> = held
        .iter()
        .enumerate()
        .filter(|(n, _)| (finish >> (2 * n)) & 3 != 3)
        .map(|(_, (at, _))| *at)
        .collect();
    let mut all = true;
    for (at, out) in finishing.into_iter().zip(testing::finish_many(db, calls)) {
        match out {
            Ok(()) => logs[at].answered(),
            Err(
                e @ (Error::Refused(Refusal::Fenced { .. })
                | Error::Refused(Refusal::UnknownRecord)
                | Error::Refused(Refusal::NotInProgress { .. })),
            ) => {
                panic!("owner call refused before the crash: {e}")
            }
            Err(_) => all = false,
        }
    }
    all
}

/// Consumes `messages` fresh messages in one poll.
fn poll(db: &IdemDb, step: usize, messages: u8, failing: u16, logs: &mut Vec<KeyLog>) -> bool {
    let first = logs.len();
    let mut batch = Vec::new();
    for i in 0..messages.clamp(1, 16) {
        let id = format!("p{step}-{i}");
        let fails = failing & (1 << i) != 0;
        let mut log = KeyLog::new(id.clone());
        log.inbox = true;
        log.begin(if fails {
            Expect::Absent
        } else {
            Expect::Completed {
                response: Vec::new(),
                row: true,
            }
        });
        logs.push(log);
        let row = id.clone();
        batch.push((id, move |tx: &mut idemdb::Tx<'_>| -> Result<(), String> {
            tx.open_table(ROWS)
                .map_err(|e| e.to_string())?
                .insert(row.as_str(), &b""[..])
                .map_err(|e| e.to_string())?;
            if fails {
                return Err("transient".into());
            }
            Ok(())
        }));
    }
    let Ok(answers) = db.consume_batch(INBOX, batch) else {
        return false;
    };
    let mut all = true;
    for (i, answer) in answers.into_iter().enumerate() {
        match answer {
            Ok(Consumed::Processed) | Err(ExecuteError::Closure(_)) => logs[first + i].answered(),
            Ok(other) => panic!("a fresh message: {other:?}"),
            Err(ExecuteError::Db(_)) => all = false,
        }
    }
    all
}
