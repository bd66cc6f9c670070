//! The PostgreSQL outbox through real SIGKILLs: examples/pg_outbox_worker.rs stages one
//! message per acknowledged `execute` while its `PgDispatcher` claims, publishes and marks
//! them, and is killed at random moments, 20 times on one database. Then a last dispatcher
//! drains what is left (the killed workers' claims lapse first). Every message of an
//! acknowledged commit is published at least once; none is published whose commit is not in
//! the database; each ordering key's messages are first published in commit order.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::outbox_kills::{Published, kill_runs, scope};
use common::stores::{fresh_database_url, runtime};
use idemdb_postgres::{
    DispatchOptions, Key, OutboxMessage, PgDispatcher, PgStore, RecordState, Store,
};

const KILLS: usize = 20;

#[test]
fn sigkill_between_commit_claim_publish_and_mark_loses_nothing_and_invents_nothing() {
    let bin = common::example_binary("pg_outbox_worker");
    let url = fresh_database_url();
    let rt = runtime();
    rt.block_on(async {
        PgStore::builder(&url).unwrap().migrate().await.unwrap();
    });
    let dir = tempfile::tempdir().unwrap();
    let sent_path = dir.path().join("sent");
    let started = Instant::now();
    let acked = kill_runs(&bin, &url, &sent_path, KILLS, (20, 150));
    let (db, drained) = rt.block_on(async {
        // The last instance drains the backlog, once the killed workers' claims lapsed.
        let db = PgStore::builder(&url).unwrap().connect().await.unwrap();
        let drained: Arc<Mutex<Vec<OutboxMessage>>> = Arc::default();
        let log = Arc::clone(&drained);
        let dispatcher = PgDispatcher::start(
            &db,
            move |m: OutboxMessage| {
                log.lock().unwrap().push(m);
                std::future::ready(Ok(()))
            },
            DispatchOptions::default().idle_check(Duration::from_millis(50)),
        );
        let deadline = Instant::now() + Duration::from_secs(60);
        while db.outbox_stats().await.unwrap().backlog > 0 {
            assert!(Instant::now() < deadline, "the backlog never drained");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        dispatcher.stop().await;
        (db, drained)
    });
    let mut published = Published::read(&sent_path);
    for m in drained.lock().unwrap().iter() {
        published
            .0
            .push((m.id, String::from_utf8(m.payload.clone()).unwrap()));
    }
    let (sent, duplicates) = published.check(&acked, |key| {
        let record = rt.block_on(db.get(&scope(), &Key::new(key))).unwrap();
        record.is_some_and(|r| r.state == RecordState::Completed)
    });
    eprintln!(
        "{KILLS} kills, {} acknowledged, {} published ({} duplicates), {:.1} s",
        acked.len(),
        sent,
        duplicates,
        started.elapsed().as_secs_f64()
    );
    assert!(acked.len() > KILLS, "too few commits to mean anything");
}
