//! The outbox through real SIGKILLs: examples/outbox_worker.rs stages one message per
//! acknowledged `execute` while its dispatcher publishes them, and is killed at random
//! moments, 30 times on one file. Then a last dispatcher drains what is left. Every message of
//! an acknowledged commit is published at least once; none is published whose commit is not
//! in the database; each ordering key's messages are first published in commit order.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, Read};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idemdb::{
    DispatchOptions, Dispatcher, IdemDb, Key, Limits, MessageId, OutboxMessage, RecordKey,
    RecordState, Scope,
};

const KILLS: usize = 30;

fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

fn id_of(key: &str) -> MessageId {
    let record = RecordKey::encode(
        &Scope::new("outbox", "worker"),
        &Key::new(key),
        &Limits::default(),
    )
    .unwrap();
    MessageId::derive(&record, 0)
}

#[test]
fn sigkill_between_commit_publish_and_mark_loses_nothing_and_invents_nothing() {
    let bin = common::example_binary("outbox_worker");
    let dir = tempfile::tempdir().unwrap();
    let (path, sent_path) = (dir.path().join("db"), dir.path().join("sent"));
    let mut acked: BTreeSet<String> = BTreeSet::new();
    let mut rng = 0x5851_f42d_4c95_7f2d ^ u64::from(std::process::id());
    let started = Instant::now();
    for run in 0..KILLS {
        let mut child = Command::new(&bin)
            .arg(&path)
            .arg(format!("r{run}"))
            .arg(&sent_path)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut stdout = child.stdout.take().unwrap();
        let mut first = [0u8; 6];
        stdout.read_exact(&mut first).unwrap();
        assert_eq!(&first, b"READY\n");
        std::thread::sleep(Duration::from_millis(5 + xorshift(&mut rng) % 80));
        child.kill().unwrap(); // SIGKILL
        let mut out = String::new();
        stdout.read_to_string(&mut out).unwrap();
        child.wait().unwrap();
        // A last line cut by the kill has no newline: skipped.
        for line in out.split_inclusive('\n').filter(|l| l.ends_with('\n')) {
            if let Some(key) = line.trim_end().strip_prefix("ACK ") {
                acked.insert(key.to_string());
            }
        }
    }
    // The last instance drains the backlog.
    let db = Arc::new(IdemDb::open(&path).unwrap());
    let drained: Arc<Mutex<Vec<OutboxMessage>>> = Arc::default();
    let log = Arc::clone(&drained);
    let dispatcher = Dispatcher::start(
        Arc::clone(&db),
        move |m: &OutboxMessage| {
            log.lock().unwrap().push(m.clone());
            Ok(())
        },
        DispatchOptions::default(),
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while db.outbox_stats().unwrap().backlog > 0 {
        assert!(Instant::now() < deadline, "the backlog never drained");
        std::thread::sleep(Duration::from_millis(5));
    }
    dispatcher.stop().unwrap();
    let mut published: Vec<(MessageId, String)> = Vec::new();
    let file = std::fs::File::open(&sent_path).unwrap();
    for line in std::io::BufReader::new(file).lines() {
        let line = line.unwrap();
        let mut parts = line.splitn(3, ' ');
        let (Some("SENT"), Some(id), Some(key)) = (parts.next(), parts.next(), parts.next()) else {
            panic!("a torn line in the sent file: {line:?}");
        };
        published.push((MessageId::parse(id).unwrap(), key.to_string()));
    }
    for m in drained.lock().unwrap().iter() {
        published.push((m.id, String::from_utf8(m.payload.clone()).unwrap()));
    }
    let scope = Scope::new("outbox", "worker");
    let mut first_of: BTreeMap<String, u64> = BTreeMap::new();
    let mut sent_keys: BTreeSet<String> = BTreeSet::new();
    let mut duplicates = 0;
    for (id, key) in &published {
        assert_eq!(*id, id_of(key), "{key}: the id derives from its record");
        // Never invented: the commit that staged it is in the database.
        let record = db.get(&scope, &Key::new(key)).unwrap();
        assert!(
            record.is_some_and(|r| r.state == RecordState::Completed),
            "{key} was published but its commit is not in the database"
        );
        if !sent_keys.insert(key.clone()) {
            duplicates += 1;
            continue;
        }
        // First publications of one ordering key (run, thread) in commit order.
        let (stream, i) = key.rsplit_once('-').unwrap();
        let i: u64 = i.parse().unwrap();
        if let Some(prev) = first_of.insert(stream.to_string(), i) {
            assert_eq!(i, prev + 1, "{stream}: {i} first published after {prev}");
        }
    }
    for key in &acked {
        assert!(
            sent_keys.contains(key),
            "{key} was acknowledged and never published"
        );
    }
    eprintln!(
        "{KILLS} kills, {} acknowledged, {} published ({} duplicates), {:.1} s",
        acked.len(),
        sent_keys.len(),
        duplicates,
        started.elapsed().as_secs_f64()
    );
    assert!(
        acked.len() > KILLS,
        "the worker acknowledged almost nothing"
    );
}
