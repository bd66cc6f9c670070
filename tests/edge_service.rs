//! The example edge service end to end: the provider and the purchase service as processes,
//! duplicates and retries, a SIGKILL of the service mid-run; charges made, purchases
//! acknowledged and orders stored must all equal the number of intents.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Builds the example in this test's profile (a no-op when it is fresh) and finds it.
fn example_binary() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().unwrap().parent().unwrap();
    let mut build = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    build
        .args(["build", "--example", "edge_service", "--manifest-path"])
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"));
    if profile_dir.ends_with("release") {
        build.arg("--release");
    }
    assert!(
        build.status().unwrap().success(),
        "building the example failed"
    );
    let bin = profile_dir.join("examples").join("edge_service");
    assert!(bin.exists(), "no example at {}", bin.display());
    bin
}

#[test]
fn charges_made_equal_purchases_acknowledged_across_a_kill() {
    let bin = example_binary();
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
