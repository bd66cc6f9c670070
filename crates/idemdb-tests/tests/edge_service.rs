//! The example edge service end to end: the provider and the purchase service as processes,
//! duplicates and retries, a SIGKILL of the service mid-run; charges made, purchases
//! acknowledged and orders stored must all equal the number of intents.

mod common;

use std::process::{Command, Stdio};

#[test]
fn charges_made_equal_purchases_acknowledged_across_a_kill() {
    let bin = common::example_binary("edge_service");
    // The run gives up after its --deadline and then fails.
    let out = Command::new(bin)
        .args(["load", "--intents", "60", "--deadline", "30"])
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    print!("{stdout}");
    assert!(out.status.success(), "the load run failed: {}", out.status);
    assert!(stdout.contains("killed the service (SIGKILL)"), "{stdout}");
    assert!(
        stdout.contains("charges made: 60, purchases acknowledged: 60, orders stored: 60"),
        "{stdout}"
    );
}
