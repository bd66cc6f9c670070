//! The `idemdb` binary (crate `idemdb-cli`) against databases made with the library: every command's
//! human and `--json` output, and a distinct error and exit code for a missing, foreign,
//! corrupt or locked file.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::{LEASE, acquired, first_partition};
use idemdb::redb::{self, ReadableDatabase, TableDefinition, TableHandle};
use idemdb::{Clock, IdemDb, Key, ManualClock, Retention, Scope};
use serde_json::Value;
use tempfile::TempDir;

fn idemdb(args: &[&str]) -> Output {
    Command::new(common::cli_binary())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn run(args: &[&str]) -> (i32, String, String) {
    let out = idemdb(args);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

fn json(stdout: &str) -> Value {
    serde_json::from_str(stdout).unwrap_or_else(|e| panic!("{e}: {stdout:?}"))
}

fn json_lines(stdout: &str) -> Vec<Value> {
    stdout.lines().map(json).collect()
}

/// Records, on the system clock: "POST /orders"/u1: a (completed), b (failed, binary
/// response), c (in progress); "refund"/u2: a natural key (completed).
fn populated() -> (TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shop.idemdb");
    let db = IdemDb::open(&path).unwrap();
    let orders = Scope::new("POST /orders", "u1");
    let r = acquired(db.reserve(&orders, &Key::new("a"), b"pa", LEASE).unwrap());
    db.complete(&r, b"201 {\"order\":1}".to_vec()).unwrap();
    let r = acquired(db.reserve(&orders, &Key::new("b"), b"pb", LEASE).unwrap());
    db.fail(&r, vec![0, 255, 1]).unwrap();
    acquired(db.reserve(&orders, &Key::new("c"), b"pc", LEASE).unwrap());
    let refund = Scope::new("refund", "u2");
    let natural = Key::from_parts([&b"u2"[..], &[0xff, 0x01]]);
    let r = acquired(db.reserve(&refund, &natural, b"pr", LEASE).unwrap());
    db.complete(&r, b"refunded".to_vec()).unwrap();
    (dir, path)
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

#[test]
fn stats_reports_the_gauges_and_the_retention() {
    let (_dir, path) = populated();
    let (code, out, err) = run(&[
        "stats",
        p(&path),
        "--json",
        "--ttl",
        "2h",
        "--operation-ttl",
        "POST /orders=90s",
    ]);
    assert_eq!(code, 0, "{err}");
    let v = json(&out);
    assert_eq!(v["stored_records"], 4);
    assert_eq!(v["in_flight_records"], 1);
    assert_eq!(v["partitions"], 1);
    assert_eq!(
        v["partitions_read_at_open"], 1,
        "its window is open: no summary"
    );
    assert_eq!(v["indexed_keys"], 3);
    assert!(v["bytes_on_disk"].as_u64().unwrap() > 0);
    let memory = &v["memory"];
    assert_eq!(memory["page_cache"], 64 << 20);
    assert_eq!(memory["replay_cache"], 0, "the CLI answers no replays");
    assert!(memory["key_index"].as_u64().unwrap() > 0, "{memory}");
    let parts = ["page_cache", "replay_cache", "key_index", "horizon"]
        .iter()
        .map(|k| memory[k].as_u64().unwrap())
        .sum::<u64>();
    assert_eq!(memory["total"], parts);
    assert_eq!(v["since_open"]["acquired"], 0);
    assert_eq!(v["retention"]["default_ttl_ms"], 7_200_000);
    assert_eq!(v["retention"]["horizon_factor"], 4);
    assert_eq!(v["retention"]["operation_ttls_ms"]["POST /orders"], 90_000);

    let (code, out, _) = run(&["stats", p(&path)]);
    assert_eq!(code, 0);
    assert!(
        out.contains("stored records      4 (in progress 1, finished 3"),
        "{out}"
    );
    assert!(out.contains("retention in force  ttl 1d"), "{out}");
    assert!(
        out.contains("(page cache 64.0 MiB (67108864 bytes), replay cache 0 bytes"),
        "{out}"
    );
}

#[test]
fn stats_under_a_memory_budget_too_small_is_refused_with_the_figures() {
    let (_dir, path) = populated();
    // The page cache alone (64 MiB) is over 1 MiB; the CLI keeps no replay cache.
    let (code, _, err) = run(&["stats", p(&path), "--memory-budget", "1M"]);
    assert_eq!(code, 8, "{err}");
    for part in [
        "over the memory budget of 1.0 MiB",
        "page cache 64.0 MiB",
        "replay cache 0.0 MiB",
        "for 3 finished records",
    ] {
        assert!(err.contains(part), "{part:?} not in: {err}");
    }
    let (code, out, err) = run(&["stats", p(&path), "--json", "--memory-budget", "65M"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(json(&out)["memory"]["replay_cache"], 0);
    let (code, _, err) = run(&["stats", p(&path), "--memory-budget", "65X"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("unknown unit \"X\""), "{err}");
}

#[test]
fn get_shows_one_record_as_text_or_hex() {
    let (_dir, path) = populated();
    let (code, out, err) = run(&["get", p(&path), "POST /orders", "u1", "a", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v = json(&out);
    assert_eq!(v["found"], true);
    let rec = &v["record"];
    assert_eq!(rec["state"], "completed");
    assert_eq!(rec["response"], "201 {\"order\":1}");
    assert_eq!(rec["response_encoding"], "utf8");
    assert_eq!(rec["attempts"], 1);
    assert_eq!(rec["fingerprint"].as_str().unwrap().len(), 32);

    let (code, out, _) = run(&["get", p(&path), "POST /orders", "u1", "b"]);
    assert_eq!(code, 0);
    assert!(out.contains("state        failed"), "{out}");
    assert!(
        out.contains("3 bytes, not UTF-8, shown as hex:\n00ff01"),
        "{out}"
    );
    let (_, out, _) = run(&["get", p(&path), "POST /orders", "u1", "b", "--json"]);
    assert_eq!(json(&out)["record"]["response"], "AP8B");
    assert_eq!(json(&out)["record"]["response_encoding"], "base64");

    let (code, out, _) = run(&["get", p(&path), "POST /orders", "u1", "a"]);
    assert_eq!(code, 0);
    assert!(out.contains("15 bytes, UTF-8:\n201 {\"order\":1}"), "{out}");

    // A natural key, given in hex.
    let natural = "00000002753200000002ff0";
    let (code, _, err) = run(&["get", p(&path), "refund", "u2", natural, "--key-hex"]);
    assert_eq!(code, 2, "odd digits: {err}");
    let natural = "00000002753200000002ff01";
    let (code, out, err) = run(&["get", p(&path), "refund", "u2", natural, "--key-hex"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("refunded"), "{out}");

    let (code, out, _) = run(&["get", p(&path), "POST /orders", "u1", "zzz", "--json"]);
    assert_eq!((code, json(&out)["found"].clone()), (1, Value::Bool(false)));
    let (code, out, _) = run(&["get", p(&path), "POST /orders", "u1", "zzz"]);
    assert_eq!(code, 1);
    assert!(
        out.contains("no live record for \"POST /orders\" / u1 / zzz"),
        "{out}"
    );
    let (code, _, err) = run(&["get", p(&path), "", "u1", "zzz"]);
    assert_eq!(code, 2);
    assert!(err.contains("operation must not be empty"), "{err}");
}

#[test]
fn scan_lists_records_one_per_line_with_filters() {
    let (_dir, path) = populated();
    let (code, out, err) = run(&["scan", p(&path), "--json"]);
    assert_eq!(code, 0, "{err}");
    let lines = json_lines(&out);
    assert_eq!(lines.len(), 4, "{out}");
    assert_eq!(lines[0]["state"], "in_progress");
    assert_eq!(lines[0]["stored_in"], "in_flight");
    assert!(lines.iter().all(|l| l.get("response").is_none()));
    // Partitions are read in key order: "refund" (6 bytes) sorts before "POST /orders" (12).
    assert_eq!(
        lines[1]["key_encoding"], "base64",
        "a natural key is binary"
    );
    assert_eq!(lines[1]["key"], "AAAAAnUyAAAAAv8B");
    assert!(err.is_empty(), "no summary in --json mode: {err}");

    let (_, out, _) = run(&["scan", p(&path), "--json", "--state", "completed"]);
    let keys: Vec<Value> = json_lines(&out).iter().map(|l| l["key"].clone()).collect();
    assert_eq!(keys.len(), 2);
    assert_eq!(keys[1], "a");
    let (_, out, _) = run(&["scan", p(&path), "--json", "--operation", "refund"]);
    assert_eq!(json_lines(&out).len(), 1);
    let (_, out, _) = run(&["scan", p(&path), "--json", "--limit", "2"]);
    assert_eq!(json_lines(&out).len(), 2);
    let (_, out, _) = run(&["scan", p(&path), "--limit", "0"]);
    assert!(out.is_empty());

    let (code, out, err) = run(&["scan", p(&path), "--state", "in_progress"]);
    assert_eq!(code, 0);
    assert_eq!(out.lines().count(), 1, "{out}");
    assert!(
        out.starts_with("in_progress \"POST /orders\" u1 c token="),
        "{out}"
    );
    assert!(err.contains("listed 1 records"), "{err}");
    let (_, _, err) = run(&["scan", p(&path), "--quiet"]);
    assert!(err.is_empty(), "{err}");
}

#[test]
fn export_writes_every_record_as_json_lines() {
    let (_dir, path) = populated();
    let fingerprints = {
        let db = IdemDb::open(&path).unwrap();
        [b"pc", b"pr", b"pa", b"pb"].map(|p| format!("{:032x}", db.fingerprint(p).as_u128()))
    };
    let (code, out, err) = run(&["export", p(&path)]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("exported 4 records"), "{err}");
    let lines = json_lines(&out);
    let got: Vec<(&str, &str, &str, &str)> = lines
        .iter()
        .map(|l| {
            (
                l["key"].as_str().unwrap(),
                l["state"].as_str().unwrap(),
                l["response"].as_str().unwrap(),
                l["response_encoding"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("c", "in_progress", "", "utf8"),
            ("AAAAAnUyAAAAAv8B", "completed", "refunded", "utf8"),
            ("a", "completed", "201 {\"order\":1}", "utf8"),
            ("b", "failed", "AP8B", "base64"),
        ]
    );
    let fps: Vec<&str> = lines
        .iter()
        .map(|l| l["fingerprint"].as_str().unwrap())
        .collect();
    assert_eq!(fps, fingerprints);
    for l in &lines {
        assert_eq!(l["operation_encoding"], "utf8");
        assert!(l["token"].as_u64().unwrap() >= 1);
        assert!(l["created_at"].as_u64() <= l["updated_at"].as_u64());
        assert!(l["expires_at"].as_u64() > l["updated_at"].as_u64());
        assert_eq!(l["expired"], false);
    }
}

#[test]
fn export_stops_quietly_when_the_reader_goes_away() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    {
        let db = IdemDb::open(&path).unwrap();
        let scope = Scope::new("bulk", "p");
        for i in 0..2_000u32 {
            let key = Key::new(format!("key-{i:06}"));
            let _ = db
                .execute(&scope, &key, b"x", |_tx| {
                    Ok::<_, idemdb::Error>(idemdb::Outcome::Completed(vec![b'r'; 100]))
                })
                .unwrap();
        }
    }
    let mut child = Command::new(common::cli_binary())
        .args(["export", p(&path)])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(json(first.trim())["key"] == "key-000000", "{first}");
    // The reader is dropped: the rest of the export meets a closed pipe.
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn compact_drops_expired_partitions() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    // Written ten days ago with a one-hour TTL: all expired by now.
    let ten_days_ago = idemdb::SystemClock.now_ms() - 10 * 86_400_000;
    {
        let clock = ManualClock::new(ten_days_ago);
        let db = IdemDb::builder()
            .clock(clock)
            .retention(
                Retention::default()
                    .ttl(Duration::from_secs(3600))
                    .compact_interval(None),
            )
            .open(&path)
            .unwrap();
        for k in ["a", "b"] {
            let r = acquired(
                db.reserve(&Scope::new("op", "p"), &Key::new(k), b"x", LEASE)
                    .unwrap(),
            );
            db.complete(&r, b"ok".to_vec()).unwrap();
        }
        acquired(
            db.reserve(&Scope::new("op", "p"), &Key::new("c"), b"x", LEASE)
                .unwrap(),
        );
    }
    let (_, out, _) = run(&["scan", p(&path), "--json"]);
    assert!(out.is_empty(), "all expired: {out}");
    let (_, out, _) = run(&["scan", p(&path), "--json", "--include-expired"]);
    let lines = json_lines(&out);
    assert_eq!(lines.len(), 3);
    assert!(lines.iter().all(|l| l["expired"] == true));

    let (code, out, err) = run(&["compact", p(&path), "--json", "--horizon-factor", "1000"]);
    assert_eq!(code, 0, "{err}");
    let v = json(&out);
    assert_eq!(v["partitions_dropped"], 1);
    assert_eq!(v["records_expired"], 2);
    assert_eq!(v["in_flight_expired"], 1);
    assert_eq!(
        (
            v["wide_partitions_built"].clone(),
            v["partitions_widened"].clone()
        ),
        (0.into(), 0.into())
    );
    let (_, out, _) = run(&["stats", p(&path), "--json"]);
    let v = json(&out);
    assert_eq!(
        (v["stored_records"].clone(), v["horizon_keys"].clone()),
        (0.into(), 3.into())
    );
    let (code, out, _) = run(&["compact", p(&path)]);
    assert_eq!(code, 0);
    assert!(
        out.starts_with("dropped 0 partitions (0 expired records), swept 0"),
        "{out}"
    );
}

#[test]
fn verify_passes_a_healthy_file() {
    let (_dir, path) = populated();
    let (code, out, err) = run(&["verify", p(&path), "--json"]);
    assert_eq!(code, 0, "{err}");
    let v = json(&out);
    assert_eq!(v["ok"], true);
    assert_eq!(v["problem_count"], 0);
    assert_eq!(
        (
            v["in_flight_records"].clone(),
            v["finished_records"].clone()
        ),
        (1.into(), 3.into())
    );
    let (code, out, _) = run(&["verify", p(&path)]);
    assert_eq!(code, 0);
    assert!(out.contains("OK: no problems found"), "{out}");
}

#[test]
fn verify_catches_a_damaged_record() {
    let (_dir, path) = populated();
    let part = first_partition(&path);
    {
        let db = redb::Database::open(&path).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut t = txn
                .open_table(TableDefinition::<&[u8], &[u8]>::new(&part))
                .unwrap();
            // Key "POST /orders"/"u1"/"zz", value: a record of an unknown version.
            let mut key = vec![0, 12];
            key.extend_from_slice(b"POST /orders");
            key.extend_from_slice(&[0, 2]);
            key.extend_from_slice(b"u1zz");
            t.insert(key.as_slice(), &[7u8, 2, 0][..]).unwrap();
        }
        txn.commit().unwrap();
    }
    let (code, out, err) = run(&["verify", p(&path), "--json"]);
    assert_eq!(code, 1, "{err}");
    let v = json(&out);
    assert_eq!(v["ok"], false);
    assert_eq!(v["problem_count"], 1);
    assert_eq!(v["problems"][0]["table"], part.as_str());
    assert!(
        v["problems"][0]["what"]
            .as_str()
            .unwrap()
            .contains("unknown record version 7"),
        "{v}"
    );
    let (code, out, _) = run(&["verify", p(&path)]);
    assert_eq!(code, 1);
    assert!(out.contains("FAILED: 1 problems found:"), "{out}");
    assert!(out.contains(&part), "{out}");

    // Scans and exports refuse the file as corrupt, naming the table.
    let (code, _, err) = run(&["export", p(&path)]);
    assert_eq!(code, 6, "{err}");
    assert!(
        err.contains("the database is corrupt") && err.contains(&part),
        "{err}"
    );
}

#[test]
fn a_missing_file_is_refused_and_not_created() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nope.idemdb");
    for cmd in ["stats", "scan", "compact", "verify", "export"] {
        let (code, out, err) = run(&[cmd, p(&path)]);
        assert_eq!(code, 3, "{cmd}: {err}");
        assert!(out.is_empty());
        assert!(err.contains("no such file"), "{err}");
    }
    let (code, _, err) = run(&["get", p(&path), "op", "p", "k", "--json"]);
    assert_eq!(code, 3);
    assert_eq!(json(err.trim())["error"], "missing");
    assert!(!path.exists());
}

#[test]
fn a_file_that_is_not_idemdb_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("notes.txt");
    std::fs::write(&text, "hello, not a database\n".repeat(500)).unwrap();
    let empty = dir.path().join("empty");
    std::fs::write(&empty, b"").unwrap();
    // A redb database of someone else's, and an empty one.
    let foreign = dir.path().join("foreign.redb");
    {
        let db = redb::Database::create(&foreign).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(TableDefinition::<&str, u64>::new("orders"))
            .unwrap()
            .insert("o1", 1)
            .unwrap();
        txn.commit().unwrap();
    }
    let blank = dir.path().join("blank.redb");
    drop(redb::Database::create(&blank).unwrap());
    for (path, why) in [
        (&text, "not a redb database file"),
        (&empty, "the file is empty"),
        (
            &foreign,
            "without idemdb's meta table (it holds \"orders\")",
        ),
        (&blank, "an empty redb database"),
    ] {
        let before = std::fs::read(path).unwrap();
        let (code, _, err) = run(&["stats", p(path)]);
        assert_eq!(code, 5, "{err}");
        assert!(
            err.contains("not an idemdb database") && err.contains(why),
            "{err}"
        );
        let (code, _, err) = run(&["verify", p(path), "--json"]);
        assert_eq!(code, 5);
        assert_eq!(json(err.trim())["error"], "not_idemdb");
        if path == &text || path == &empty {
            assert_eq!(std::fs::read(path).unwrap(), before, "left alone");
        }
    }
    // redb's integrity check commits, but nothing of idemdb's is written into either file.
    let tables = |path: &Path| -> Vec<String> {
        let db = redb::Database::open(path).unwrap();
        let txn = db.begin_read().unwrap();
        txn.list_tables()
            .unwrap()
            .map(|t| t.name().to_string())
            .collect()
    };
    assert_eq!(tables(&blank), Vec::<String>::new());
    assert_eq!(tables(&foreign), ["orders"]);
}

#[test]
fn a_corrupt_file_is_refused() {
    let (_dir, path) = populated();
    let mut bytes = std::fs::read(&path).unwrap();
    // Damage every page after the header region: whichever hold the committed trees fail
    // their checksums.
    let len = bytes.len();
    for offset in (8192..len).step_by(4096) {
        for b in &mut bytes[offset + 100..(offset + 200).min(len)] {
            *b ^= 0x5a;
        }
    }
    std::fs::write(&path, &bytes).unwrap();
    for cmd in ["stats", "verify", "export"] {
        let (code, out, err) = run(&[cmd, p(&path)]);
        assert_eq!(code, 6, "{cmd}: {err}");
        assert!(out.is_empty(), "{out}");
        assert!(err.contains("the database is corrupt"), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    let (code, _, err) = run(&["verify", p(&path), "--json"]);
    assert_eq!(code, 6);
    assert_eq!(json(err.trim())["error"], "corrupt");
}

/// Writes one entry into a table of the closed database at `path`, through redb alone.
fn write_raw<K: redb::Key + 'static, V: redb::Value + 'static>(
    path: &Path,
    table: TableDefinition<K, V>,
    key: K::SelfType<'_>,
    value: V::SelfType<'_>,
) {
    let db = redb::Database::open(path).unwrap();
    let txn = db.begin_write().unwrap();
    txn.open_table(table).unwrap().insert(key, value).unwrap();
    txn.commit().unwrap();
}

#[test]
fn damaged_meta_and_horizon_rows_are_refused_at_open() {
    const META: TableDefinition<&str, &[u8]> = TableDefinition::new("idemdb_meta");
    const HORIZON: TableDefinition<&[u8], &[u8]> = TableDefinition::new("idemdb_horizon");
    const RECOGNISED: TableDefinition<&[u8], &[u8]> = TableDefinition::new("idemdb_recognised");
    const UNINDEXED: TableDefinition<&[u8], ()> =
        TableDefinition::new("idemdb_recognised_unindexed");
    /// What is damaged, how, the exit code and the message expected.
    type Case = (&'static str, fn(&Path), i32, &'static str);
    let cases: [Case; 5] = [
        (
            "newer format",
            |path| write_raw(path, META, "format_version", &9u32.to_le_bytes()[..]),
            7,
            "unsupported file format: format version 9",
        ),
        (
            "wrong magic",
            |path| write_raw(path, META, "magic", &b"notours!"[..]),
            5,
            "not an idemdb database: wrong magic",
        ),
        (
            "bad token ceiling",
            |path| write_raw(path, META, "next_token", &[1u8, 2][..]),
            6,
            "the database is corrupt: meta entry \"next_token\" is 2 bytes",
        ),
        (
            "short horizon row key",
            |path| write_raw(path, HORIZON, &[1u8, 2, 3][..], &[][..]),
            6,
            "the database is corrupt: horizon row key of 3 bytes",
        ),
        (
            "a recognition row not yet entered by hash that is not whole hashes",
            |path| {
                let key = [&u64::MAX.to_be_bytes()[..], b"idemdb_inflight@1"].concat();
                write_raw(path, RECOGNISED, key.as_slice(), &[1u8, 2, 3][..]);
                write_raw(path, UNINDEXED, key.as_slice(), ());
            },
            6,
            "idemdb_recognised: set of 3 bytes is not whole 8-byte hashes",
        ),
    ];
    for (what, damage, code, message) in cases {
        let (_dir, path) = populated();
        damage(&path);
        let (got, out, err) = run(&["verify", p(&path)]);
        assert_eq!(got, code, "{what}: {err}");
        assert!(out.is_empty(), "{what}: {out}");
        assert!(err.contains(message), "{what}: {err}");
    }
}

#[test]
fn a_file_held_open_by_another_process_is_refused_as_locked() {
    let (_dir, path) = populated();
    let db = IdemDb::open(&path).unwrap();
    for cmd in ["stats", "scan", "verify", "compact", "export"] {
        let (code, out, err) = run(&[cmd, p(&path)]);
        assert_eq!(code, 4, "{cmd}: {err}");
        assert!(out.is_empty());
        assert!(err.contains("locked: another process has it open"), "{err}");
    }
    let (code, _, err) = run(&["stats", p(&path), "--json"]);
    assert_eq!(code, 4);
    assert_eq!(json(err.trim())["error"], "locked");
    drop(db);
    let (code, _, err) = run(&["stats", p(&path)]);
    assert_eq!(code, 0, "{err}");
}

#[test]
fn usage_errors_exit_2() {
    let (code, _, err) = run(&["scan", "x", "--state", "done"]);
    assert_eq!(code, 2);
    assert!(err.contains("in_progress, completed, failed"), "{err}");
    let (code, _, _) = run(&["stats"]);
    assert_eq!(code, 2);
    let (code, _, err) = run(&["stats", "x", "--ttl", "5 fortnights"]);
    assert_eq!(code, 2, "{err}");
}

/// `outbox list / park / retry / purge`: pending and parked messages listed, one parked and
/// put back by id, the parked purged only when confirmed (stdin is not a terminal here, so
/// without `--yes` it refuses and removes nothing).
#[test]
fn outbox_lists_parks_retries_and_purges_only_when_confirmed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("outbox.idemdb");
    {
        let db = IdemDb::open(&path).unwrap();
        for (key, payload) in [("k1", "first"), ("k2", "second")] {
            let m = idemdb::Message::new("orders", payload.as_bytes().to_vec())
                .ordering_key(b"customer-1".to_vec());
            let _ = db
                .execute(&Scope::new("op", "p"), &Key::new(key), b"req", move |tx| {
                    tx.stage(m)?;
                    Ok::<_, idemdb::Error>(idemdb::Outcome::Completed(b"ok".to_vec()))
                })
                .unwrap();
        }
    }
    outbox_tools_on(path.to_str().unwrap());
}

/// The same tools over PostgreSQL: a `postgres://` URL in place of the file. A database with
/// no schema is refused as not idemdb's, and the password never shows.
#[test]
fn outbox_over_postgres_lists_parks_retries_and_purges_only_when_confirmed() {
    use idemdb_postgres::{PgStore, PgTx};
    let url = common::stores::fresh_database_url();
    let rt = common::stores::runtime();
    rt.block_on(async {
        let builder = PgStore::builder(&url).unwrap();
        builder.migrate().await.unwrap();
        let store = builder.connect().await.unwrap();
        for (key, payload) in [("k1", "first"), ("k2", "second")] {
            let m = idemdb::Message::new("orders", payload.as_bytes().to_vec())
                .ordering_key(b"customer-1".to_vec());
            let _ = store
                .execute(
                    &Scope::new("op", "p"),
                    &Key::new(key),
                    b"req",
                    move |tx: &mut PgTx<'_>| {
                        let m = m.clone();
                        Box::pin(async move {
                            tx.stage(m).await?;
                            Ok::<_, idemdb_postgres::PgError>(idemdb::Outcome::Completed(
                                b"ok".to_vec(),
                            ))
                        })
                    },
                )
                .await
                .unwrap();
        }
    });
    outbox_tools_on(&url);

    let bare = common::stores::fresh_database_url();
    let (code, _, err) = run(&["outbox", "list", &bare]);
    assert_eq!(code, 5, "{err}");
    // The test cluster trusts its connections: the password is not checked, only hidden.
    let (user_end, at) = (bare.find("://").unwrap() + 3, bare.find('@').unwrap());
    let user = &bare[user_end..at];
    let with_password = format!("{}{user}:hunter2{}", &bare[..user_end], &bare[at..]);
    let (code, _, err) = run(&["outbox", "list", &with_password]);
    assert_eq!(code, 5, "{err}");
    assert!(
        err.contains(&format!("{user}:***@")) && !err.contains("hunter2"),
        "{err}"
    );
}

/// Two messages of one ordering key staged at `target` ("first", "second"): list them, park,
/// retry and park the first again, refuse an unconfirmed purge, then purge.
fn outbox_tools_on(p: &str) {
    let (code, out, err) = run(&["outbox", "list", p, "--json"]);
    assert_eq!(code, 0, "{err}");
    let listed = json_lines(&out);
    assert_eq!(listed.len(), 2);
    assert_eq!(listed[0]["status"], "pending");
    assert_eq!(listed[0]["payload"], "first");
    assert_eq!(listed[0]["ordering_key"], "customer-1");
    let id = listed[0]["id"].as_str().unwrap().to_string();
    let (code, out, _) = run(&["outbox", "list", p]);
    assert_eq!(code, 0);
    assert!(
        out.lines()
            .next()
            .unwrap()
            .starts_with(&format!("pending {id} #")),
        "{out}"
    );

    assert_eq!(
        run(&["outbox", "park", p, &id, "--reason", "bad schema"]).0,
        0
    );
    assert_eq!(run(&["outbox", "park", p, &id]).0, 1, "no longer pending");
    let parked = json_lines(&run(&["outbox", "list", p, "--parked", "--json"]).1);
    assert_eq!(parked.len(), 1);
    assert_eq!(parked[0]["last_error"], "parked by an operator: bad schema");
    assert_eq!(run(&["outbox", "retry", p, &id]).0, 0);
    assert_eq!(run(&["outbox", "retry", p, &id]).0, 1, "no longer parked");
    assert!(json_lines(&run(&["outbox", "list", p, "--parked", "--json"]).1).is_empty());

    assert_eq!(run(&["outbox", "park", p, &id]).0, 0);
    let (code, _, err) = run(&["outbox", "purge", p]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--yes"), "{err}");
    assert_eq!(
        json_lines(&run(&["outbox", "list", p, "--parked", "--json"]).1).len(),
        1
    );
    let (code, out, _) = run(&["outbox", "purge", p, "--yes", "--json"]);
    assert_eq!(code, 0);
    assert_eq!(json(&out)["purged"], 1);
    let rest = json_lines(&run(&["outbox", "list", p, "--json"]).1);
    assert_eq!(rest.len(), 1);
    assert_eq!(rest[0]["payload"], "second");
    assert_eq!(run(&["outbox", "retry", p, "not-an-id"]).0, 2);
}
