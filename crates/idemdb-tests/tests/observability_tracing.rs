//! Feature `tracing`: spans name each operation's scope but never its payload or response.
//!
//! Alone in its test binary: tracing caches a callsite's interest process-wide, so a test
//! hitting the same callsites on another thread without this subscriber could hide them.

mod common;

use std::sync::{Arc, Mutex};

use common::{LEASE, acquired, setup};
use idemdb::{Key, Scope};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

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
