//! The example edge service over PostgreSQL, end to end: two service processes on one fresh
//! database (`idemdb_postgres::PgStore`), each purchase's duplicates and retries sent to both in turn,
//! instance A SIGKILLed mid-run while it is charging and not restarted. Charges made at the
//! provider, purchases acknowledged and orders stored in PostgreSQL must all equal the number
//! of intents, each order with a charge of its own, and instance B must have taken over A's
//! reservations once their lease ran out.

mod common;

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The driver gives up after its `--deadline` (30 s) and fails; this is the bound on the whole
/// process, start-up included.
const TIMEOUT: Duration = Duration::from_secs(120);

#[test]
fn two_instances_on_one_database_charge_once_across_a_kill() {
    let url = common::stores::fresh_database_url();
    let bin = common::example_binary("edge_service");
    let mut child = Command::new(bin)
        .args(["load", "--postgres", &url, "--instances", "2"])
        .args(["--intents", "60", "--deadline", "30"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut out = String::new();
        let _ = stdout.read_to_string(&mut out);
        out
    });
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if started.elapsed() > TIMEOUT {
            // Its services and provider exit when its end of their stdin closes.
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stdout = reader.join().unwrap();
    print!("{stdout}");
    let status = status.unwrap_or_else(|| panic!("the load run took over {TIMEOUT:?}"));
    assert!(status.success(), "the load run failed: {status}");
    assert!(stdout.contains("killed instance A (SIGKILL)"), "{stdout}");
    assert!(
        stdout.contains("charges made: 60, purchases acknowledged: 60, orders stored: 60"),
        "{stdout}"
    );
    assert!(
        stdout.contains("distinct charges among the orders: 60"),
        "{stdout}"
    );
    let takeovers: u64 = stdout
        .lines()
        .find_map(|line| line.strip_prefix("takeovers: "))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no takeovers line: {stdout}"));
    assert!(
        takeovers >= 1,
        "instance B took over none of the killed instance's reservations: {stdout}"
    );
}
