//! Observability features: the `metrics` facade exports what `stats()` counts, and `tracing`
//! spans name each operation's scope but never its payload or response.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{acquired, setup};
use idemdb::{Key, ReserveOutcome, Scope};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

const LEASE: Duration = Duration::from_secs(30);

#[test]
fn metrics_follow_the_stats() {
    let (_dir, _clock, db) = setup();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let scope = Scope::new("op", "p");
    metrics::with_local_recorder(&recorder, || {
        let r = acquired(db.reserve(&scope, &Key::new("k"), b"x", LEASE).unwrap());
        db.complete(&r, b"ok".to_vec()).unwrap();
        for _ in 0..3 {
            let replay = db.reserve(&scope, &Key::new("k"), b"x", LEASE).unwrap();
            assert_eq!(replay, ReserveOutcome::Completed(b"ok".to_vec()));
        }
        assert_eq!(
            db.reserve(&scope, &Key::new("k"), b"y", LEASE).unwrap(),
            ReserveOutcome::Mismatch
        );
    });
    let values: Vec<(String, DebugValue)> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| (key.key().name().to_string(), value))
        .collect();
    let counter = |name: &str| {
        values.iter().find_map(|(n, v)| match v {
            DebugValue::Counter(c) if n == name => Some(*c),
            _ => None,
        })
    };
    let stats = db.stats();
    assert_eq!(counter("idemdb_acquired_total"), Some(stats.acquired));
    assert_eq!(counter("idemdb_finished_total"), Some(stats.finished));
    assert_eq!(counter("idemdb_replays_completed_total"), Some(3));
    assert_eq!(counter("idemdb_mismatches_total"), Some(1));
    assert_eq!(counter("idemdb_commits_total"), Some(stats.commits));
    let batches = values.iter().find_map(|(n, v)| match v {
        DebugValue::Histogram(h) if n == "idemdb_commit_batch_size" => Some(h.len() as u64),
        _ => None,
    });
    assert_eq!(batches, Some(stats.commits));
}

/// Records every span's name and fields.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<String>>>);

struct Fields(String);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!(" {}={:?}", field.name(), value));
    }
}

impl Subscriber for Capture {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, attrs: &Attributes<'_>) -> Id {
        let mut fields = Fields(String::new());
        attrs.record(&mut fields);
        let mut spans = self.0.lock().unwrap();
        spans.push(format!("{}{}", attrs.metadata().name(), fields.0));
        Id::from_u64(spans.len() as u64)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, _: &Event<'_>) {}
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

#[test]
fn spans_carry_the_scope_never_the_payload() {
    let (_dir, _clock, db) = setup();
    let capture = Capture::default();
    let scope = Scope::new("POST /charges", "user-7");
    tracing::subscriber::with_default(capture.clone(), || {
        let r = acquired(
            db.reserve(&scope, &Key::new("k"), b"card=4111", LEASE)
                .unwrap(),
        );
        db.complete(&r, b"secret-response".to_vec()).unwrap();
        let _ = db
            .reserve(&scope, &Key::new("k"), b"card=4111", LEASE)
            .unwrap();
    });
    let spans = capture.0.lock().unwrap().clone();
    let expected = [
        "idemdb.snapshot operation=POST /charges principal=user-7",
        "idemdb.write kind=\"reserve\" operation=POST /charges principal=user-7",
        "idemdb.write kind=\"finish\" operation=POST /charges principal=user-7",
        "idemdb.snapshot operation=POST /charges principal=user-7",
    ];
    assert_eq!(spans, expected);
    for span in &spans {
        assert!(!span.contains("4111") && !span.contains("secret"), "{span}");
    }
}
