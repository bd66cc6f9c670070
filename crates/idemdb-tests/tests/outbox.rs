//! The transactional outbox of the embedded engine: messages staged in the record's commit
//! (and only then), delivered at least once after it is durable with stable ids, in commit
//! order per ordering key under 64 callers, retried with backoff, parked without blocking
//! other keys, kept across reopen, and the operator's tools. design.md §15's failure table
//! names these tests.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::fresh;
use idemdb::{
    Clock, DispatchOptions, Dispatcher, Error, ExecuteError, IdemDb, InputError, Key, Limits,
    Message, MessageId, OutboxMessage, Outcome, PublishError, Refusal, ReserveOutcome, Scope,
};

type Sent = Arc<Mutex<Vec<OutboxMessage>>>;

/// A publisher that records every message it is handed and answers `Ok`.
fn recording() -> (
    Sent,
    impl FnMut(&OutboxMessage) -> Result<(), PublishError> + Send,
) {
    let sent: Sent = Arc::default();
    let log = Arc::clone(&sent);
    (sent, move |m: &OutboxMessage| {
        log.lock().unwrap().push(m.clone());
        Ok(())
    })
}

fn fast() -> DispatchOptions {
    DispatchOptions::default()
        .backoff(Duration::from_millis(5), Duration::from_millis(20))
        .idle_check(Duration::from_millis(50))
}

/// Waits until `done` holds, at most 20 s.
fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A fresh database on a clock that moves only when told to.
fn on_manual_clock() -> (tempfile::TempDir, idemdb::ManualClock, Arc<IdemDb>) {
    let dir = tempfile::tempdir().unwrap();
    let clock = idemdb::ManualClock::new(10_000_000_000);
    let db = IdemDb::builder()
        .clock(clock.clone())
        .open(dir.path().join("db"))
        .unwrap();
    (dir, clock, Arc::new(db))
}

fn scope() -> Scope {
    Scope::new("order", "u1")
}

/// `execute` of `key` staging one message per payload, with ordering key `okey`.
fn place(db: &IdemDb, key: &str, okey: Option<&str>, payloads: &[&str]) -> Vec<MessageId> {
    let messages: Vec<Message> = payloads
        .iter()
        .map(|p| {
            let m =
                Message::new("orders", p.as_bytes().to_vec()).header("k", key.as_bytes().to_vec());
            match okey {
                Some(k) => m.ordering_key(k.as_bytes().to_vec()),
                None => m,
            }
        })
        .collect();
    let ids = Arc::new(Mutex::new(Vec::new()));
    let out = Arc::clone(&ids);
    let _ = db
        .execute(&scope(), &Key::new(key), b"req", move |tx| {
            for m in messages {
                out.lock().unwrap().push(tx.stage(m)?);
            }
            Ok::<_, Error>(Outcome::Completed(b"201".to_vec()))
        })
        .unwrap();
    ids.lock().unwrap().clone()
}

#[test]
fn a_staged_message_is_delivered_once_with_the_id_derived_from_its_record() {
    let (_dir, db) = fresh();
    let db = Arc::new(db);
    let ids = place(&db, "k1", None, &["created", "billed"]);
    assert_eq!(ids.len(), 2);
    assert_ne!(ids[0], ids[1]);
    // A duplicate runs nothing, so stages nothing.
    assert_eq!(place(&db, "k1", None, &["again"]), Vec::<MessageId>::new());
    let stats = db.outbox_stats().unwrap();
    assert_eq!((stats.backlog, stats.parked), (2, 0));
    assert!(stats.oldest_undelivered_age.is_some());
    let (sent, publisher) = recording();
    let dispatcher = Dispatcher::start(Arc::clone(&db), publisher, fast()).unwrap();
    until("two deliveries", || {
        db.outbox_stats().unwrap().delivered == 2
    });
    dispatcher.stop().unwrap();
    let sent = sent.lock().unwrap();
    assert_eq!(sent.len(), 2, "each message once");
    assert_eq!(sent[0].payload, b"created");
    assert_eq!(sent[1].payload, b"billed");
    assert_eq!((sent[0].id, sent[1].id), (ids[0], ids[1]));
    assert_eq!(sent[0].headers, vec![("k".to_string(), b"k1".to_vec())]);
    let stats = db.outbox_stats().unwrap();
    assert_eq!((stats.backlog, stats.oldest_undelivered_age), (0, None));
    assert!(db.outbox_pending(10).unwrap().is_empty());
}

#[test]
fn a_rolled_back_closure_stages_nothing_and_its_retry_stages_the_same_ids() {
    let (_dir, db) = fresh();
    let failed = db.execute(&scope(), &Key::new("k1"), b"req", |tx| {
        tx.stage(Message::new("orders", b"one".to_vec()))?;
        tx.stage(Message::new("orders", b"two".to_vec()))?;
        Err::<Outcome, Error>(Error::Closed)
    });
    assert!(matches!(failed, Err(ExecuteError::Closure(Error::Closed))));
    assert_eq!(
        db.outbox_stats().unwrap().backlog,
        0,
        "rolled back with the closure"
    );
    let ids = place(&db, "k1", None, &["one", "two"]);
    let record = idemdb::RecordKey::encode(&scope(), &Key::new("k1"), &Limits::default()).unwrap();
    assert_eq!(
        ids,
        vec![MessageId::derive(&record, 0), MessageId::derive(&record, 1)]
    );
    let pending = db.outbox_pending(10).unwrap();
    assert_eq!(pending.iter().map(|m| m.id).collect::<Vec<_>>(), ids);
    assert!(pending[0].seq < pending[1].seq);
}

#[test]
fn a_takeover_that_stages_again_stages_the_same_ids() {
    let (_dir, db) = fresh();
    let clock = idemdb::ManualClock::new(1_000_000);
    drop(db);
    let dir = tempfile::tempdir().unwrap();
    let db = IdemDb::builder()
        .clock(clock.clone())
        .open(dir.path().join("db"))
        .unwrap();
    let key = Key::new("k1");
    let lease = Duration::from_secs(5);
    let ReserveOutcome::Acquired(first) = db.reserve(&scope(), &key, b"req", lease).unwrap() else {
        panic!("first reserve")
    };
    clock.advance(Duration::from_secs(6));
    let ReserveOutcome::Acquired(second) = db.reserve(&scope(), &key, b"req", lease).unwrap()
    else {
        panic!("takeover")
    };
    let ids = Arc::new(Mutex::new(Vec::new()));
    let out = Arc::clone(&ids);
    db.complete_with(&second, b"201".to_vec(), move |tx| {
        out.lock()
            .unwrap()
            .push(tx.stage(Message::new("orders", b"x".to_vec()))?);
        Ok::<_, Error>(())
    })
    .unwrap();
    // The fenced first owner's commit, with its messages, is refused whole.
    let fenced = db.complete_with(&first, b"201".to_vec(), |tx| {
        tx.stage(Message::new("orders", b"stale".to_vec()))?;
        Ok::<_, Error>(())
    });
    assert!(matches!(
        fenced,
        Err(ExecuteError::Db(Error::Refused(Refusal::Fenced { .. })))
    ));
    let record = idemdb::RecordKey::encode(&scope(), &key, &Limits::default()).unwrap();
    assert_eq!(*ids.lock().unwrap(), vec![MessageId::derive(&record, 0)]);
    let pending = db.outbox_pending(10).unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].payload, b"x");
}

#[test]
fn bad_messages_are_refused_with_nothing_staged() {
    let dir = tempfile::tempdir().unwrap();
    let mut limits = Limits::default();
    limits.max_message_len = 16;
    limits.max_messages_per_commit = 2;
    let db = IdemDb::builder()
        .limits(limits)
        .open(dir.path().join("db"))
        .unwrap();
    let refusals = Arc::new(Mutex::new(Vec::new()));
    let out = Arc::clone(&refusals);
    let _ = db
        .execute(&scope(), &Key::new("k1"), b"req", move |tx| {
            let mut seen = out.lock().unwrap();
            for m in [
                Message::new("", b"x".to_vec()),
                Message::new("orders", vec![0u8; 17]),
                Message::new("orders", b"ok-1".to_vec()),
                Message::new("orders", b"ok-2".to_vec()),
                Message::new("orders", b"third".to_vec()),
            ] {
                seen.push(tx.stage(m).err());
            }
            Ok::<_, Error>(Outcome::Completed(b"201".to_vec()))
        })
        .unwrap();
    let refusals = refusals.lock().unwrap();
    let input = |i: usize| match &refusals[i] {
        Some(Error::Refused(Refusal::InvalidInput(e))) => e.clone(),
        other => panic!("message {i}: {other:?}"),
    };
    assert!(matches!(input(0), InputError::Empty { .. }));
    assert!(matches!(
        input(1),
        InputError::TooLong {
            len: 17,
            max: 16,
            ..
        }
    ));
    assert!(refusals[2].is_none() && refusals[3].is_none());
    assert!(matches!(
        input(4),
        InputError::TooMany {
            count: 3,
            max: 2,
            ..
        }
    ));
    let pending = db.outbox_pending(10).unwrap();
    let payloads: Vec<_> = pending.iter().map(|m| m.payload.clone()).collect();
    assert_eq!(payloads, vec![b"ok-1".to_vec(), b"ok-2".to_vec()]);
    // A `run` has no record to derive an id from.
    let run = db.run(|tx| tx.stage(Message::new("orders", b"x".to_vec())));
    assert!(matches!(
        run,
        Err(ExecuteError::Closure(Error::Refused(
            Refusal::InvalidInput(InputError::StagedWithoutRecord)
        )))
    ));
    assert!(format!("{}", input(4)).contains("more than the limit of 2"));
}

#[test]
fn complete_with_and_an_inbox_handler_stage_in_their_commits() {
    let (_dir, db) = fresh();
    let ReserveOutcome::Acquired(r) = db
        .reserve(&scope(), &Key::new("k1"), b"req", Duration::from_secs(30))
        .unwrap()
    else {
        panic!("reserve")
    };
    db.complete_with(&r, b"201".to_vec(), |tx| {
        tx.stage(Message::new("orders", b"from-complete".to_vec()))?;
        Ok::<_, Error>(())
    })
    .unwrap();
    let _ = db
        .consume("billing", "m1", |tx| {
            tx.stage(Message::new("invoices", b"from-inbox".to_vec()))?;
            Ok::<_, Error>(())
        })
        .unwrap();
    // A redelivery runs no handler: nothing more is staged.
    let _ = db
        .consume("billing", "m1", |tx| {
            tx.stage(Message::new("invoices", b"again".to_vec()))?;
            Ok::<_, Error>(())
        })
        .unwrap();
    let pending = db.outbox_pending(10).unwrap();
    let payloads: Vec<_> = pending.iter().map(|m| m.payload.clone()).collect();
    assert_eq!(
        payloads,
        vec![b"from-complete".to_vec(), b"from-inbox".to_vec()]
    );
    assert_eq!(pending[1].destination, "invoices");
}

/// 64 callers each stage a run of messages on one of four ordering keys: every key's
/// messages reach the publisher in commit order (the order of their sequence numbers), each
/// caller's in the order it staged them, and none twice.
#[test]
fn messages_of_one_ordering_key_are_delivered_in_commit_order_under_64_callers() {
    const CALLERS: usize = 64;
    const EACH: usize = 20;
    let (_dir, db) = fresh();
    let db = Arc::new(db);
    let (sent, publisher) = recording();
    // A publisher that fails now and then: retries must not reorder a key.
    let mut n = 0u64;
    let mut inner = publisher;
    let flaky = move |m: &OutboxMessage| {
        n += 1;
        if n.is_multiple_of(7) {
            return Err(PublishError::Transient(
                "every seventh attempt fails".into(),
            ));
        }
        inner(m)
    };
    let dispatcher = Dispatcher::start(Arc::clone(&db), flaky, fast().max_attempts(1000)).unwrap();
    let threads: Vec<_> = (0..CALLERS)
        .map(|c| {
            let db = Arc::clone(&db);
            std::thread::spawn(move || {
                for i in 0..EACH {
                    let okey = format!("customer-{}", c % 4);
                    let payload = format!("{c}/{i}");
                    place(&db, &format!("c{c}-i{i}"), Some(&okey), &[&payload]);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let total = (CALLERS * EACH) as u64;
    until("every delivery", || {
        db.outbox_stats().unwrap().delivered == total
    });
    dispatcher.stop().unwrap();
    let sent = sent.lock().unwrap();
    assert_eq!(sent.len() as u64, total, "none twice");
    let mut last_seq: HashMap<Vec<u8>, u64> = HashMap::new();
    let mut last_of_caller: BTreeMap<String, usize> = BTreeMap::new();
    for m in sent.iter() {
        let key = m.ordering_key.clone().unwrap();
        let prev = last_seq.insert(key, m.seq).unwrap_or(0);
        assert!(m.seq > prev, "message {} after {} of its key", m.seq, prev);
        let text = String::from_utf8(m.payload.clone()).unwrap();
        let (caller, i) = text.split_once('/').unwrap();
        let i: usize = i.parse().unwrap();
        if let Some(p) = last_of_caller.insert(caller.to_string(), i) {
            assert!(i > p, "caller {caller}: {i} after {p}");
        }
    }
    assert!(
        db.outbox_stats().unwrap().retried > 0,
        "the flaky publisher failed some"
    );
}

/// A poison message (a permanent error) is parked at once with its error; later messages of
/// its ordering key wait behind it, every other key flows; an operator's retry puts it back
/// in its place, and the held messages follow it in order.
#[test]
fn a_poison_message_is_parked_without_blocking_the_others() {
    let (_dir, db) = fresh();
    let db = Arc::new(db);
    let poison_id = place(&db, "p", Some("a"), &["poison"])[0];
    place(&db, "a2", Some("a"), &["a-after"]);
    place(&db, "b1", Some("b"), &["b-1"]);
    place(&db, "n1", None, &["no-key"]);
    let sent: Sent = Arc::default();
    let log = Arc::clone(&sent);
    let cured = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let is_cured = Arc::clone(&cured);
    let publisher = move |m: &OutboxMessage| {
        if m.payload == b"poison" && !is_cured.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(PublishError::Permanent("schema rejected".into()));
        }
        log.lock().unwrap().push(m.clone());
        Ok(())
    };
    let dispatcher = Dispatcher::start(Arc::clone(&db), publisher, fast()).unwrap();
    until("two deliveries", || {
        db.outbox_stats().unwrap().delivered == 2
    });
    let payloads = |s: &Sent| -> Vec<Vec<u8>> {
        s.lock()
            .unwrap()
            .iter()
            .map(|m| m.payload.clone())
            .collect()
    };
    assert_eq!(payloads(&sent), vec![b"b-1".to_vec(), b"no-key".to_vec()]);
    let stats = db.outbox_stats().unwrap();
    assert_eq!(
        (stats.backlog, stats.parked, stats.parked_since_open),
        (1, 1, 1)
    );
    let parked = db.outbox_parked(10).unwrap();
    assert_eq!(parked[0].id, poison_id);
    assert_eq!(parked[0].last_error.as_deref(), Some("schema rejected"));
    // Held, not lost: a-after stays pending while its key's earlier message is parked.
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(db.outbox_pending(10).unwrap()[0].payload, b"a-after");
    cured.store(true, std::sync::atomic::Ordering::SeqCst);
    assert!(db.retry_parked(poison_id).unwrap());
    assert!(!db.retry_parked(poison_id).unwrap(), "no longer parked");
    until("all four", || db.outbox_stats().unwrap().delivered == 4);
    dispatcher.stop().unwrap();
    assert_eq!(
        payloads(&sent)[2..].to_vec(),
        vec![b"poison".to_vec(), b"a-after".to_vec()]
    );
}

#[test]
fn transient_failures_back_off_and_park_at_the_attempt_cap() {
    let (_dir, db) = fresh();
    let db = Arc::new(db);
    let id = place(&db, "k1", None, &["down"])[0];
    let attempts = Arc::new(Mutex::new(Vec::<Instant>::new()));
    let seen = Arc::clone(&attempts);
    let publisher = move |_: &OutboxMessage| {
        seen.lock().unwrap().push(Instant::now());
        Err(PublishError::Transient("503".into()))
    };
    let options = DispatchOptions::default()
        .max_attempts(4)
        .backoff(Duration::from_millis(40), Duration::from_millis(200))
        .idle_check(Duration::from_millis(500));
    let dispatcher = Dispatcher::start(Arc::clone(&db), publisher, options).unwrap();
    until("parked", || db.outbox_stats().unwrap().parked == 1);
    dispatcher.stop().unwrap();
    let attempts = attempts.lock().unwrap();
    assert_eq!(attempts.len(), 4);
    // Waits of at least 40, 80 and 160 ms (the jitter only adds).
    for (i, min_ms) in [40u64, 80, 160].iter().enumerate() {
        let waited = attempts[i + 1] - attempts[i];
        assert!(
            waited >= Duration::from_millis(*min_ms),
            "wait {i}: {waited:?}"
        );
    }
    let stats = db.outbox_stats().unwrap();
    assert_eq!(
        (stats.retried, stats.parked_since_open, stats.backlog),
        (3, 1, 0)
    );
    let parked = db.outbox_parked(10).unwrap();
    assert_eq!((parked[0].id, parked[0].attempts), (id, 4));
    assert_eq!(db.purge_parked().unwrap(), 1);
    assert_eq!(db.outbox_stats().unwrap().parked, 0);
}

#[test]
fn an_operators_park_and_purge_under_a_running_dispatcher_hold_and_release_the_key() {
    let (_dir, db) = fresh();
    let db = Arc::new(db);
    let first = place(&db, "k1", Some("k"), &["x1"])[0];
    let (sent, mut inner) = recording();
    let publisher = move |m: &OutboxMessage| {
        if m.payload == b"x1" {
            return Err(PublishError::Transient("503".into()));
        }
        inner(m)
    };
    // x1's retry waits a minute: its key is held, below the dispatcher's frontier.
    let options = fast().backoff(Duration::from_secs(60), Duration::from_secs(60));
    let dispatcher = Dispatcher::start(Arc::clone(&db), publisher, options).unwrap();
    until("x1's retry", || {
        db.outbox_pending(1).unwrap()[0].attempts == 1
    });
    place(&db, "k2", Some("k"), &["x2"]);
    place(&db, "k3", Some("other"), &["y"]);
    until("y", || sent.lock().unwrap().len() == 1);
    assert!(db.park_message(first, "stuck").unwrap());
    std::thread::sleep(Duration::from_millis(150)); // rounds after the park
    let payloads = |sent: &Sent| -> Vec<Vec<u8>> {
        sent.lock()
            .unwrap()
            .iter()
            .map(|m| m.payload.clone())
            .collect()
    };
    assert_eq!(
        payloads(&sent),
        [b"y".to_vec()],
        "x2 went past its parked key"
    );
    // Purged: the key is free, well before x1's retry would have come due.
    assert_eq!(db.purge_parked().unwrap(), 1);
    until("x2", || sent.lock().unwrap().len() == 2);
    assert_eq!(payloads(&sent), [b"y".to_vec(), b"x2".to_vec()]);
    dispatcher.stop().unwrap();
}

#[test]
fn undelivered_and_parked_messages_survive_reopen_and_compaction() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let clock = idemdb::ManualClock::new(1_000_000);
    let open = || {
        IdemDb::builder()
            .clock(clock.clone())
            .retention(idemdb::Retention::default().ttl(Duration::from_secs(60)))
            .open(&path)
            .unwrap()
    };
    let db = Arc::new(open());
    place(&db, "k1", Some("a"), &["one"]);
    place(&db, "k2", Some("b"), &["two"]);
    let parked_id = place(&db, "k3", Some("c"), &["three"])[0];
    assert!(db.park_message(parked_id, "bad payload").unwrap());
    let first_seq = db.outbox_pending(1).unwrap()[0].seq;
    drop(Arc::into_inner(db).unwrap());
    // Records expire and their partitions drop: the messages are not in them.
    clock.advance(Duration::from_secs(3600));
    let db = Arc::new(open());
    db.compact_now().unwrap();
    let stats = db.outbox_stats().unwrap();
    assert_eq!((stats.backlog, stats.parked), (2, 1));
    assert_eq!(
        stats.oldest_undelivered_age,
        Some(Duration::from_secs(3600))
    );
    assert_eq!(
        db.outbox_parked(10).unwrap()[0].last_error.as_deref(),
        Some("parked by an operator: bad payload")
    );
    // New messages take numbers above every stored one.
    place(&db, "k4", Some("a"), &["four"]);
    let pending = db.outbox_pending(10).unwrap();
    assert_eq!(pending[0].seq, first_seq);
    assert!(pending[2].seq > parked_id_seq(&db, parked_id));
    let (sent, publisher) = recording();
    let dispatcher = Dispatcher::start(Arc::clone(&db), publisher, fast()).unwrap();
    until("three deliveries", || {
        db.outbox_stats().unwrap().delivered == 3
    });
    dispatcher.stop().unwrap();
    let payloads: Vec<_> = sent
        .lock()
        .unwrap()
        .iter()
        .map(|m| m.payload.clone())
        .collect();
    assert_eq!(
        payloads,
        vec![b"one".to_vec(), b"two".to_vec(), b"four".to_vec()]
    );
}

fn parked_id_seq(db: &IdemDb, id: MessageId) -> u64 {
    db.outbox_parked(10)
        .unwrap()
        .iter()
        .find(|m| m.id == id)
        .unwrap()
        .seq
}

#[test]
fn one_dispatcher_per_database_and_a_panicking_publisher_is_a_transient_failure() {
    let (_dir, db) = fresh();
    let db = Arc::new(db);
    place(&db, "k1", None, &["boom"]);
    let mut calls = 0;
    let publisher = move |_: &OutboxMessage| {
        calls += 1;
        if calls == 1 {
            panic!("publisher bug");
        }
        Ok(())
    };
    let first = Dispatcher::start(Arc::clone(&db), publisher, fast()).unwrap();
    let second = Dispatcher::start(Arc::clone(&db), |_: &OutboxMessage| Ok(()), fast());
    assert!(matches!(second, Err(Error::DispatcherRunning)));
    until("delivered after the panic", || {
        db.outbox_stats().unwrap().delivered == 1
    });
    assert!(first.is_running());
    assert_eq!(db.outbox_stats().unwrap().retried, 1);
    drop(first);
    // Dropped, it stopped: another may start.
    let again = Dispatcher::start(Arc::clone(&db), |_: &OutboxMessage| Ok(()), fast()).unwrap();
    again.stop().unwrap();
}

/// The dispatcher is woken by the commit that staged, not by its fallback timer: with an
/// idle check of a minute, a message still goes out at once.
#[test]
fn a_staging_commit_wakes_the_dispatcher() {
    let (_dir, db) = fresh();
    let db = Arc::new(db);
    let (sent, publisher) = recording();
    let options = fast().idle_check(Duration::from_secs(60));
    let dispatcher = Dispatcher::start(Arc::clone(&db), publisher, options).unwrap();
    std::thread::sleep(Duration::from_millis(50)); // asleep by now
    for i in 0..20 {
        let started = Instant::now();
        place(&db, &format!("k{i}"), None, &["x"]);
        until("the delivery", || sent.lock().unwrap().len() == i + 1);
        assert!(started.elapsed() < Duration::from_secs(5));
    }
    // Timed at the publisher's `Ok`, counted as delivered after the mark's commit.
    until("the marks", || db.outbox_stats().unwrap().delivered == 20);
    let stats = db.outbox_stats().unwrap();
    assert_eq!(stats.publish_latency_us.count, 20);
    dispatcher.stop().unwrap();
}

/// Held between its non-durable commit (the closure's rows visible in redb) and its log
/// append, a staging commit's message is not published: the dispatcher, polling every 2 ms,
/// reads only durable commits.
#[test]
fn nothing_is_published_before_its_commit_is_durable() {
    let (_dir, db) = fresh();
    let db = Arc::new(db);
    let (sent, publisher) = recording();
    let dispatcher = Dispatcher::start(
        Arc::clone(&db),
        publisher,
        fast().idle_check(Duration::from_millis(2)),
    )
    .unwrap();
    let early: Arc<Mutex<Option<usize>>> = Arc::default();
    let (seen, during) = (Arc::clone(&sent), Arc::clone(&early));
    idemdb::testing::after_next_commit(&db, move || {
        std::thread::sleep(Duration::from_millis(200));
        *during.lock().unwrap() = Some(seen.lock().unwrap().len());
    });
    place(&db, "k1", None, &["x"]);
    assert_eq!(
        *early.lock().unwrap(),
        Some(0),
        "published before the durability point"
    );
    until("the delivery", || db.outbox_stats().unwrap().delivered == 1);
    dispatcher.stop().unwrap();
}

/// The clock steps back an hour after a transient failure: the retry, scheduled by the old
/// time, runs after its backoff, not after the step. Then the clock jumps a day ahead: the
/// oldest-age gauge follows it, and nothing is lost.
#[test]
fn a_retry_scheduled_before_the_clock_stepped_back_still_runs_after_its_backoff() {
    let (_dir, clock, db) = on_manual_clock();
    place(&db, "k1", None, &["retried"]);
    let (sent, mut inner) = recording();
    let mut failed_once = false;
    let step_back = clock.clone();
    let publisher = move |m: &OutboxMessage| {
        if !failed_once {
            failed_once = true;
            // The failure's backoff is scheduled by this time; then the clock steps back.
            let now = step_back.now_ms();
            std::thread::spawn({
                let c = step_back.clone();
                move || {
                    std::thread::sleep(Duration::from_millis(20));
                    c.set(now - 3_600_000);
                }
            });
            return Err(PublishError::Transient("503".into()));
        }
        inner(m)
    };
    let options = fast().backoff(Duration::from_millis(50), Duration::from_millis(100));
    let dispatcher = Dispatcher::start(Arc::clone(&db), publisher, options).unwrap();
    until("the retry", || sent.lock().unwrap().len() == 1);
    place(&db, "k2", None, &["later"]);
    clock.advance(Duration::from_secs(86_400));
    until("the second", || sent.lock().unwrap().len() == 2);
    dispatcher.stop().unwrap();
    assert_eq!(db.outbox_stats().unwrap().backlog, 0);
}

/// The dispatcher's rounds skip what they already know cannot be sent (ops/held.rs); a step
/// back of the clock smaller than the longest backoff must still make a retry scheduled before
/// it due at once, though an earlier retry is not due.
#[test]
fn a_small_step_back_makes_a_far_retry_due_though_a_nearer_one_is_not() {
    let (_dir, clock, db) = on_manual_clock();
    // "b" fails three times (its next wait is 4–6 s), then goes; "a" always fails.
    let attempts: Arc<Mutex<HashMap<Vec<u8>, u32>>> = Arc::default();
    let (sent, mut inner) = recording();
    let tries = Arc::clone(&attempts);
    let publisher = move |m: &OutboxMessage| {
        let n = {
            let mut tries = tries.lock().unwrap();
            let n = tries.entry(m.payload.clone()).or_default();
            *n += 1;
            *n
        };
        if m.payload == b"a" || n <= 3 {
            return Err(PublishError::Transient("503".into()));
        }
        inner(m)
    };
    let tried = |p: &[u8]| attempts.lock().unwrap().get(p).copied().unwrap_or(0);
    let options = fast()
        .backoff(Duration::from_secs(1), Duration::from_secs(4))
        .max_attempts(100);
    let dispatcher = Dispatcher::start(Arc::clone(&db), publisher, options).unwrap();
    place(&db, "kb", Some("b"), &["b"]);
    for n in 1..=3 {
        until("b's attempt", || tried(b"b") == n);
        if n < 3 {
            clock.advance(Duration::from_secs(3));
        }
    }
    // Once b's third failure is committed: a fails once (its next wait is 1–1.5 s).
    until("b's retry committed", || {
        db.outbox_pending(10).unwrap()[0].attempts == 3
    });
    place(&db, "ka", Some("a"), &["a"]);
    until("a's attempt", || tried(b"a") == 1);
    until("a's retry committed", || {
        db.outbox_pending(10)
            .unwrap()
            .iter()
            .all(|m| m.attempts > 0)
    });
    std::thread::sleep(Duration::from_millis(100)); // rounds that find neither due
    // Back 3 s: b's retry (4–6 s ahead) is now further ahead than any backoff (6 s), a's
    // (1–1.5 s ahead) is not.
    clock.set(clock.now_ms() - 3_000);
    until("b, due at once", || sent.lock().unwrap().len() == 1);
    assert_eq!(tried(b"a"), 1, "a's retry ran before it was due");
    dispatcher.stop().unwrap();
}

#[test]
fn a_disk_that_fails_under_the_delivery_commit_stops_the_dispatcher_and_loses_nothing() {
    use idemdb_testkit::{Fault, FaultBackend};
    let backend = FaultBackend::new();
    let db = Arc::new(common::on_backend(&backend));
    let ids: Vec<MessageId> = ["m0", "m1", "m2"]
        .iter()
        .enumerate()
        .flat_map(|(i, p)| place(&db, &format!("d{i}"), Some("k"), &[p]))
        .collect();
    // The disk fills (every write fails) while the first message is being published: the
    // commit that would mark it delivered cannot be made.
    let sent: Arc<Mutex<Vec<MessageId>>> = Arc::default();
    let (log, disk) = (Arc::clone(&sent), backend.clone());
    let publisher = move |m: &OutboxMessage| {
        disk.inject(Fault::Write { after: 0 });
        log.lock().unwrap().push(m.id);
        Ok(())
    };
    let dispatcher = Dispatcher::start(Arc::clone(&db), publisher, fast()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while dispatcher.is_running() {
        assert!(
            Instant::now() < deadline,
            "the dispatcher went on past a failed commit"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    let stopped = dispatcher.stop();
    assert!(
        stopped.is_err(),
        "the dispatcher's error was not returned: {stopped:?}"
    );
    let before = sent.lock().unwrap().clone();
    assert!(!before.is_empty());
    drop(db);

    // Reopened on a working disk: nothing was marked, every message is sent (again).
    backend.clear_faults();
    let db = Arc::new(common::on_backend(&backend.live_disk()));
    assert_eq!(db.outbox_stats().unwrap().backlog, 3);
    let (again, publisher) = recording();
    let dispatcher = Dispatcher::start(Arc::clone(&db), publisher, fast()).unwrap();
    until("the reopened outbox drained", || {
        db.outbox_stats().unwrap().backlog == 0
    });
    dispatcher.stop().unwrap();
    let again: Vec<MessageId> = again.lock().unwrap().iter().map(|m| m.id).collect();
    assert_eq!(again, ids, "all three, in order, after the reopen");
}
