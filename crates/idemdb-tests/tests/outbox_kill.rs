//! The outbox through real SIGKILLs: examples/outbox_worker.rs stages one message per
//! acknowledged `execute` while its dispatcher publishes them, and is killed at random
//! moments, 30 times on one file. Then a last dispatcher drains what is left. Every message of
//! an acknowledged commit is published at least once; none is published whose commit is not
//! in the database; each ordering key's messages are first published in commit order.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::outbox_kills::{Published, kill_runs, scope};
use idemdb::{DispatchOptions, Dispatcher, IdemDb, Key, OutboxMessage, RecordState};

const KILLS: usize = 30;

#[test]
fn sigkill_between_commit_publish_and_mark_loses_nothing_and_invents_nothing() {
    let bin = common::example_binary("outbox_worker");
    let dir = tempfile::tempdir().unwrap();
    let (path, sent_path) = (dir.path().join("db"), dir.path().join("sent"));
    let started = Instant::now();
    let acked = kill_runs(&bin, path.to_str().unwrap(), &sent_path, KILLS, (5, 80));
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
    let mut published = Published::read(&sent_path);
    for m in drained.lock().unwrap().iter() {
        published
            .0
            .push((m.id, String::from_utf8(m.payload.clone()).unwrap()));
    }
    let (sent, duplicates) = published.check(&acked, |key| {
        let record = db.get(&scope(), &Key::new(key)).unwrap();
        record.is_some_and(|r| r.state == RecordState::Completed)
    });
    eprintln!(
        "{KILLS} kills, {} acknowledged, {} published ({} duplicates), {:.1} s",
        acked.len(),
        sent,
        duplicates,
        started.elapsed().as_secs_f64()
    );
    assert!(
        acked.len() > KILLS,
        "the worker acknowledged almost nothing"
    );
}
