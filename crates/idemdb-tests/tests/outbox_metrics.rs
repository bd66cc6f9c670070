//! Feature `metrics`: the outbox's counters, gauges and latency histogram through the
//! facade. The dispatcher runs on its own thread, so the recorder is this process's global
//! one (this binary holds only this test).

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use idemdb::{
    DispatchOptions, Dispatcher, Error, Key, Message, OutboxMessage, Outcome, PublishError, Scope,
};
use metrics_util::debugging::DebuggingRecorder;

#[test]
fn the_outbox_exports_its_counts_backlog_and_latency() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::set_global_recorder(recorder).unwrap();
    let (_dir, db) = common::fresh();
    let db = Arc::new(db);
    for (i, payload) in ["ok-1", "poison", "ok-2"].iter().enumerate() {
        let m = Message::new("orders", payload.as_bytes().to_vec());
        let _ = db
            .execute(
                &Scope::new("o", "p"),
                &Key::new(format!("k{i}")),
                b"r",
                move |tx| {
                    tx.stage(m)?;
                    Ok::<_, Error>(Outcome::Completed(b"ok".to_vec()))
                },
            )
            .unwrap();
    }
    let publisher = |m: &OutboxMessage| match m.payload.as_slice() {
        b"poison" => Err(PublishError::Permanent("refused".into())),
        _ => Ok(()),
    };
    let options = DispatchOptions::default().idle_check(Duration::from_millis(5));
    let dispatcher = Dispatcher::start(Arc::clone(&db), publisher, options).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while db.outbox_stats().unwrap().parked_since_open < 1
        || db.outbox_stats().unwrap().delivered < 2
    {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(2));
    }
    // One more round reads the backlog as it is now.
    std::thread::sleep(Duration::from_millis(50));
    dispatcher.stop().unwrap();
    let metrics = common::Metrics::of(&snapshotter);
    let (counter, gauge) = (|n: &str| metrics.counter(n), |n: &str| metrics.gauge(n));
    assert_eq!(counter("idemdb_outbox_delivered_total"), Some(2));
    assert_eq!(counter("idemdb_outbox_parked_total"), Some(1));
    assert_eq!(gauge("idemdb_outbox_backlog"), Some(0.0));
    assert_eq!(gauge("idemdb_outbox_parked"), Some(1.0));
    assert_eq!(
        gauge("idemdb_outbox_oldest_undelivered_age_seconds"),
        Some(0.0)
    );
    let timed = metrics.histogram_len("idemdb_outbox_publish_latency_seconds");
    assert_eq!(timed, Some(2));
}
