//! The applier thread runs at a lowered scheduling priority, 5 nice steps below the thread that
//! opened the database (design.md §5.7, "Its priority"): its CPU bursts must not delay a
//! caller whose `fdatasync` just returned. Linux only: a thread's nice value is its own
//! attribute there, read from /proc.

#![cfg(target_os = "linux")]

use std::time::{Duration, Instant};

use idemdb::IdemDb;

/// The nice value of this process's thread named `name`, once it exists.
fn nice_of_thread(name: &str) -> Option<i64> {
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let dir = task.ok()?.path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if comm.trim_end() != name {
            continue;
        }
        let stat = std::fs::read_to_string(dir.join("stat")).ok()?;
        // Fields after the command's closing parenthesis: state is field 3, nice field 19.
        let rest = &stat[stat.rfind(')')? + 2..];
        return rest.split(' ').nth(19 - 3)?.parse().ok();
    }
    None
}

/// The calling thread's nice value.
fn own_nice() -> i64 {
    let own = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
    let rest = &own[own.rfind(')').unwrap() + 2..];
    rest.split(' ').nth(19 - 3).unwrap().parse().unwrap()
}

#[test]
fn the_applier_thread_runs_at_a_lowered_priority_and_the_callers_at_theirs() {
    let before = own_nice();
    let dir = tempfile::tempdir().unwrap();
    let db = IdemDb::open(dir.path().join("db")).unwrap();
    let want = (before + 5).min(19);
    let deadline = Instant::now() + Duration::from_secs(10);
    let nice = loop {
        // The thread lowers its priority as its first step: it may be seen as it was briefly.
        match nice_of_thread("idemdb-applier") {
            Some(n) if n == want => break n,
            _ if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            other => panic!("the applier thread's nice value: {other:?}"),
        }
    };
    assert_eq!(nice, want);
    // Only that thread: the caller's (this test's) priority is untouched.
    assert_eq!(own_nice(), before);
    drop(db);
}
