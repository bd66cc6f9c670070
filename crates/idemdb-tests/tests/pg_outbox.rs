//! The transactional outbox over PostgreSQL: messages staged in the record's transaction (and
//! only then), three instances dispatching one outbox with nothing lost and commit order per
//! key under 64 callers, a poison message parked without blocking other keys, a lapsed claim
//! taken over and its late marks fenced, retries with backoff, records' partitions dropped
//! around undelivered messages, cut connections, and the operator's tools. design.md §15's
//! failure table names these tests.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::stores::{admin, fresh_database_url, runtime};
use idemdb_postgres::{
    DispatchOptions, ExecuteError, InputError, Key, Limits, Message, MessageId, OutboxMessage,
    Outcome, PgDispatcher, PgError, PgStore, PgTx, PublishError, Refusal, Retention, Scope,
};
use idemdb_testkit::postgres::ServerClock;

type Sent = Arc<Mutex<Vec<(usize, OutboxMessage)>>>;

async fn store(url: &str) -> PgStore {
    store_with(url, Retention::default()).await
}

async fn store_with(url: &str, retention: Retention) -> PgStore {
    let builder = PgStore::builder(url)
        .unwrap()
        .pool_size(16)
        .retention(retention.compact_interval(None));
    builder.migrate().await.unwrap();
    builder.connect().await.unwrap()
}

fn fast() -> DispatchOptions {
    DispatchOptions::default()
        .backoff(Duration::from_millis(5), Duration::from_millis(20))
        .idle_check(Duration::from_millis(100))
}

/// A publisher for instance `who` that records what it is handed and answers `Ok`.
fn recording(
    sent: &Sent,
    who: usize,
) -> impl FnMut(OutboxMessage) -> std::future::Ready<Result<(), PublishError>> + Send + 'static {
    let log = Arc::clone(sent);
    move |m: OutboxMessage| {
        log.lock().unwrap().push((who, m));
        std::future::ready(Ok(()))
    }
}

/// A publisher that fails a message with what `fails` says, else records it and answers `Ok`.
fn failing(
    sent: &Sent,
    mut fails: impl FnMut(&OutboxMessage) -> Option<PublishError> + Send + 'static,
) -> impl FnMut(OutboxMessage) -> std::future::Ready<Result<(), PublishError>> + Send + 'static {
    let log = Arc::clone(sent);
    move |m: OutboxMessage| {
        let failed = fails(&m);
        if failed.is_none() {
            log.lock().unwrap().push((0, m));
        }
        std::future::ready(failed.map_or(Ok(()), Err))
    }
}

async fn until(what: &str, mut done: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn scope() -> Scope {
    Scope::new("order", "u1")
}

fn message(payload: &str, okey: Option<&str>) -> Message {
    let m = Message::new("orders", payload.as_bytes().to_vec()).header("h", b"v".to_vec());
    match okey {
        Some(k) => m.ordering_key(k.as_bytes().to_vec()),
        None => m,
    }
}

/// `execute` of `key` staging `messages`; the ids staged.
async fn place(db: &PgStore, key: &str, messages: Vec<Message>) -> Vec<MessageId> {
    let ids = Arc::new(Mutex::new(Vec::new()));
    let out = Arc::clone(&ids);
    let _ = db
        .execute(
            &scope(),
            &Key::new(key),
            b"req",
            move |tx: &mut PgTx<'_>| {
                let (messages, out) = (messages.clone(), Arc::clone(&out));
                Box::pin(async move {
                    out.lock().unwrap().clear();
                    for m in messages {
                        let id = tx.stage(m).await?;
                        out.lock().unwrap().push(id);
                    }
                    Ok::<_, PgError>(Outcome::Completed(b"201".to_vec()))
                })
            },
        )
        .await
        .unwrap();
    ids.lock().unwrap().clone()
}

fn record(key: &str) -> idemdb_postgres::RecordKey {
    idemdb_postgres::RecordKey::encode(&scope(), &Key::new(key), &Limits::default()).unwrap()
}

#[test]
fn a_message_is_staged_in_the_records_transaction_and_only_if_it_commits() {
    runtime().block_on(async {
        let url = fresh_database_url();
        let db = store(&url).await;

        // A closure that stages and then fails: rolled back, nothing staged.
        let failed = db
            .execute(&scope(), &Key::new("k1"), b"req", |tx: &mut PgTx<'_>| {
                Box::pin(async move {
                    tx.stage(message("m", Some("a"))).await.unwrap();
                    Err::<Outcome, _>("declined")
                })
            })
            .await;
        assert!(matches!(failed, Err(ExecuteError::Closure("declined"))));
        assert!(db.outbox_pending(10).await.unwrap().is_empty());

        // Its retry stages the same ids: derived from the record and the index.
        let ids = place(
            &db,
            "k1",
            vec![message("m0", Some("a")), message("m1", None)],
        )
        .await;
        assert_eq!(
            ids,
            [
                MessageId::derive(&record("k1"), 0),
                MessageId::derive(&record("k1"), 1)
            ]
        );
        let pending = db.outbox_pending(10).await.unwrap();
        assert_eq!(pending.iter().map(|m| m.id).collect::<Vec<_>>(), ids);
        assert_eq!(pending[0].payload, b"m0");
        assert_eq!(pending[0].ordering_key.as_deref(), Some(&b"a"[..]));
        assert_eq!(pending[0].headers, [("h".to_string(), b"v".to_vec())]);
        assert_eq!(pending[1].ordering_key, None);
        // A duplicate runs nothing and stages nothing.
        assert!(
            place(&db, "k1", vec![message("again", None)])
                .await
                .is_empty()
        );
        assert_eq!(db.outbox_pending(10).await.unwrap().len(), 2);

        // complete_with stages in the finishing transaction.
        use idemdb_postgres::Store;
        let r = match db
            .reserve(&scope(), &Key::new("k2"), b"req", Duration::from_secs(30))
            .await
            .unwrap()
        {
            idemdb_postgres::ReserveOutcome::Acquired(r) => r,
            other => panic!("{other:?}"),
        };
        db.complete_with(&r, b"201".to_vec(), |tx: &mut PgTx<'_>| {
            Box::pin(async move {
                tx.stage(message("from complete_with", None)).await?;
                Ok::<_, PgError>(())
            })
        })
        .await
        .unwrap();
        // And an inbox handler, in its message's commit.
        let consumed = db
            .consume("payments", b"msg-1", |tx: &mut PgTx<'_>| {
                Box::pin(async move {
                    tx.stage(message("from the inbox", None)).await?;
                    Ok::<_, PgError>(())
                })
            })
            .await
            .unwrap();
        assert_eq!(consumed, idemdb_postgres::Consumed::Processed);
        let payloads: Vec<Vec<u8>> = db
            .outbox_pending(10)
            .await
            .unwrap()
            .into_iter()
            .map(|m| m.payload)
            .collect();
        assert_eq!(
            payloads,
            [&b"m0"[..], b"m1", b"from complete_with", b"from the inbox"]
        );
    });
}

/// What a refusal must be.
type Expected = fn(&InputError) -> bool;

#[test]
fn bad_input_is_refused_with_nothing_staged() {
    runtime().block_on(async {
        let url = fresh_database_url();
        let db = store(&url).await;
        let limits = Limits::default();
        let too_long = vec![0u8; limits.max_message_len + 1];
        let cases: Vec<(Vec<Message>, Expected)> = vec![
            (vec![Message::new("", b"x".to_vec())], |e| {
                matches!(e, InputError::Empty { .. })
            }),
            (vec![Message::new("orders", too_long)], |e| {
                matches!(e, InputError::TooLong { .. })
            }),
            (
                (0..=limits.max_messages_per_commit)
                    .map(|i| Message::new("orders", vec![i as u8]))
                    .collect(),
                |e| matches!(e, InputError::TooMany { .. }),
            ),
        ];
        for (i, (messages, expected)) in cases.into_iter().enumerate() {
            let key = format!("bad-{i}");
            let result = db
                .execute(
                    &scope(),
                    &Key::new(&key),
                    b"req",
                    move |tx: &mut PgTx<'_>| {
                        let messages = messages.clone();
                        Box::pin(async move {
                            for m in messages {
                                tx.stage(m).await?;
                            }
                            Ok::<_, PgError>(Outcome::Completed(b"201".to_vec()))
                        })
                    },
                )
                .await;
            match result {
                Err(ExecuteError::Closure(PgError::Refused(Refusal::InvalidInput(e)))) => {
                    assert!(expected(&e), "case {i}: {e:?}")
                }
                other => panic!("case {i}: {other:?}"),
            }
        }
        // A `run` has no record to stage with.
        let ran = db
            .run(|tx: &mut PgTx<'_>| {
                Box::pin(async move {
                    tx.stage(message("x", None)).await?;
                    Ok::<_, PgError>(())
                })
            })
            .await;
        assert!(matches!(
            ran,
            Err(ExecuteError::Closure(PgError::Refused(
                Refusal::InvalidInput(InputError::StagedWithoutRecord)
            )))
        ));
        assert!(db.outbox_pending(100).await.unwrap().is_empty());
    });
}

/// Whether attempt `attempt` of message `m` fails: one in seven, fixed by the id.
fn flaky(m: &OutboxMessage) -> bool {
    (u32::from(m.id.as_bytes()[0]) + m.attempts * 3).is_multiple_of(7)
}

#[test]
fn three_instances_dispatch_one_outbox_under_64_callers_in_order_per_key_losing_nothing() {
    runtime().block_on(async {
        let url = fresh_database_url();
        let stores: Vec<Arc<PgStore>> = vec![
            Arc::new(store(&url).await),
            Arc::new(store(&url).await),
            Arc::new(store(&url).await),
        ];
        let sent: Sent = Arc::default();
        let mut dispatchers = Vec::new();
        for (who, db) in stores.iter().enumerate() {
            let log = Arc::clone(&sent);
            let publisher = move |m: OutboxMessage| {
                let fail = flaky(&m);
                if !fail {
                    log.lock().unwrap().push((who, m));
                }
                async move {
                    // A broker's round trip, so that instances overlap.
                    tokio::task::yield_now().await;
                    if fail {
                        Err(PublishError::Transient("broker busy".into()))
                    } else {
                        Ok(())
                    }
                }
            };
            dispatchers.push(PgDispatcher::start(db, publisher, fast().batch(16)));
        }

        // 64 callers, spread over the instances, each placing 24 intents on 4 ordering keys
        // (and some without a key).
        let mut callers = Vec::new();
        for c in 0..64usize {
            let db = Arc::clone(&stores[c % 3]);
            callers.push(tokio::spawn(async move {
                let mut staged = Vec::new();
                for i in 0..24usize {
                    let okey = format!("key-{}", (c + i) % 4);
                    let ms = vec![
                        message(&format!("{c}/{i}/0"), Some(&okey)),
                        message(&format!("{c}/{i}/1"), (i % 3 != 0).then_some(okey.as_str())),
                    ];
                    staged.extend(place(&db, &format!("c{c}-i{i}"), ms).await);
                }
                staged
            }));
        }
        let mut staged = HashSet::new();
        for c in callers {
            staged.extend(c.await.unwrap());
        }
        assert_eq!(staged.len(), 64 * 24 * 2);
        until("an empty backlog", async || {
            stores[0].outbox_stats().await.unwrap().backlog == 0
        })
        .await;
        for d in dispatchers {
            d.stop().await;
        }

        let sent = sent.lock().unwrap().clone();
        let published: HashSet<MessageId> = sent.iter().map(|(_, m)| m.id).collect();
        assert_eq!(
            published, staged,
            "every staged message published, none other"
        );
        // Per ordering key, first publications in numbering order, which is commit order
        // among a key's messages.
        let mut firsts: BTreeMap<Vec<u8>, Vec<u64>> = BTreeMap::new();
        let mut seen = HashSet::new();
        for (_, m) in &sent {
            if let Some(k) = &m.ordering_key
                && seen.insert(m.id)
            {
                firsts.entry(k.clone()).or_default().push(m.seq);
            }
        }
        for (k, seqs) in &firsts {
            assert!(
                seqs.is_sorted(),
                "{:?} out of order: {seqs:?}",
                String::from_utf8_lossy(k)
            );
        }
        let mut by_instance: HashMap<usize, usize> = HashMap::new();
        for (who, _) in &sent {
            *by_instance.entry(*who).or_default() += 1;
        }
        let stats: Vec<_> = [
            stores[0].outbox_stats().await.unwrap(),
            stores[1].outbox_stats().await.unwrap(),
            stores[2].outbox_stats().await.unwrap(),
        ]
        .into();
        let delivered: u64 = stats.iter().map(|s| s.delivered).sum();
        let retried: u64 = stats.iter().map(|s| s.retried).sum();
        println!(
            "published {} ({} distinct) by instance {by_instance:?}; delivered {delivered}, \
             retried {retried}",
            sent.len(),
            published.len()
        );
        assert_eq!(delivered as usize, staged.len());
        let counted: u64 = stores.iter().map(|s| s.stats().outbox.delivered).sum();
        assert_eq!(
            counted, delivered,
            "PgStats counts what outbox_stats counts"
        );
        assert!(retried > 0, "the flaky publisher failed no attempt");
        assert_eq!(
            by_instance.len(),
            3,
            "every instance dispatched: {by_instance:?}"
        );
    });
}

#[test]
fn a_poison_message_is_parked_holding_back_only_its_key_until_an_operator_retries_it() {
    runtime().block_on(async {
        let url = fresh_database_url();
        let db = store(&url).await;
        let refuse = Arc::new(Mutex::new(true));
        let sent: Sent = Arc::default();
        let refusing = Arc::clone(&refuse);
        let publisher = failing(&sent, move |m| {
            (m.payload == b"poison" && *refusing.lock().unwrap())
                .then(|| PublishError::Permanent("schema violation".into()))
        });
        let dispatcher = PgDispatcher::start(&db, publisher, fast());
        place(&db, "p1", vec![message("poison", Some("a"))]).await;
        place(
            &db,
            "p2",
            vec![message("a2", Some("a")), message("b1", Some("b"))],
        )
        .await;
        until("the poison parked and b1 sent", async || {
            let s = db.outbox_stats().await.unwrap();
            s.parked == 1 && s.delivered == 1
        })
        .await;
        let parked = db.outbox_parked(10).await.unwrap();
        assert_eq!(parked.len(), 1);
        assert_eq!(parked[0].last_error.as_deref(), Some("schema violation"));
        assert_eq!(parked[0].attempts, 1);
        // a2 waits behind its key's parked message; b1 went.
        let pending = db.outbox_pending(10).await.unwrap();
        assert_eq!(pending.len(), 1);
        assert_eq!(pending[0].payload, b"a2");
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            db.outbox_pending(10).await.unwrap().len(),
            1,
            "a2 went past the poison"
        );

        // The operator fixes the consumer and retries it: the poison, then a2, in order.
        *refuse.lock().unwrap() = false;
        assert!(db.retry_parked(parked[0].id).await.unwrap());
        assert!(!db.retry_parked(parked[0].id).await.unwrap());
        until("the key drained", async || {
            db.outbox_stats().await.unwrap().backlog == 0
        })
        .await;
        let order: Vec<Vec<u8>> = sent
            .lock()
            .unwrap()
            .iter()
            .map(|(_, m)| m.payload.clone())
            .collect();
        assert_eq!(order, [&b"b1"[..], b"poison", b"a2"]);

        // An operator parks a pending message and purges it; the purge is for good.
        dispatcher.stop().await;
        let ids = place(&db, "p3", vec![message("stale", Some("c"))]).await;
        assert!(db.park_message(ids[0], "not wanted").await.unwrap());
        assert!(!db.park_message(ids[0], "twice").await.unwrap());
        let parked = db.outbox_parked(10).await.unwrap();
        assert_eq!(
            parked[0].last_error.as_deref(),
            Some("parked by an operator: not wanted")
        );
        assert_eq!(db.purge_parked().await.unwrap(), 1);
        let s = db.outbox_stats().await.unwrap();
        assert_eq!((s.backlog, s.parked), (0, 0));
    });
}

#[test]
fn transient_failures_back_off_and_park_at_the_attempt_cap() {
    runtime().block_on(async {
        let url = fresh_database_url();
        let db = store(&url).await;
        let tries: Arc<Mutex<Vec<Instant>>> = Arc::default();
        let log = Arc::clone(&tries);
        let publisher = move |_m: OutboxMessage| {
            log.lock().unwrap().push(Instant::now());
            std::future::ready(Err::<(), _>(PublishError::Transient("down".into())))
        };
        let options = DispatchOptions::default()
            .backoff(Duration::from_millis(40), Duration::from_millis(160))
            .max_attempts(4)
            .idle_check(Duration::from_millis(20));
        let dispatcher = PgDispatcher::start(&db, publisher, options);
        place(&db, "r1", vec![message("m", Some("a"))]).await;
        until("parked", async || {
            db.outbox_stats().await.unwrap().parked == 1
        })
        .await;
        dispatcher.stop().await;
        let tries = tries.lock().unwrap().clone();
        assert_eq!(tries.len(), 4);
        // Waits of 40, 80, 160 ms, each with up to half again added.
        for (i, base) in [40u64, 80, 160].into_iter().enumerate() {
            let waited = tries[i + 1] - tries[i];
            assert!(
                waited >= Duration::from_millis(base - 5),
                "wait {i}: {waited:?} under {base} ms"
            );
        }
        let s = db.outbox_stats().await.unwrap();
        assert_eq!((s.retried, s.parked_since_open, s.delivered), (3, 1, 0));
        let parked = db.outbox_parked(1).await.unwrap();
        assert_eq!(
            (parked[0].attempts, parked[0].last_error.as_deref()),
            (4, Some("down"))
        );
    });
}

/// A publisher for instance `who` that announces each message it is handed (its seq on the
/// receiver), waits for a release, then records it and answers `Ok`.
#[allow(clippy::type_complexity)]
fn stalling(
    who: usize,
) -> (
    Sent,
    Arc<tokio::sync::Notify>,
    tokio::sync::mpsc::UnboundedReceiver<u64>,
    impl FnMut(
        OutboxMessage,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<(), PublishError>> + Send>>
    + Send
    + 'static,
) {
    let (started, started_rx) = tokio::sync::mpsc::unbounded_channel();
    let release = Arc::new(tokio::sync::Notify::new());
    let sent: Sent = Arc::default();
    let (log, gate) = (Arc::clone(&sent), Arc::clone(&release));
    let publisher = move |m: OutboxMessage| {
        let (log, gate, started) = (Arc::clone(&log), Arc::clone(&gate), started.clone());
        Box::pin(async move {
            let _ = started.send(m.seq);
            gate.notified().await;
            log.lock().unwrap().push((who, m));
            Ok(())
        }) as std::pin::Pin<Box<dyn Future<Output = Result<(), PublishError>> + Send>>
    };
    (sent, release, started_rx, publisher)
}

#[test]
fn a_lapsed_claim_is_taken_over_and_the_first_claimants_late_marks_are_fenced() {
    runtime().block_on(async {
        let url = fresh_database_url();
        let a = store(&url).await;
        let b = store(&url).await;
        let clock = ServerClock::freeze(&url, 1_800_000_000_000).unwrap();
        place(
            &a,
            "f1",
            vec![message("m1", Some("k")), message("m2", Some("k"))],
        )
        .await;

        // A claims both and stalls in its publisher until released.
        let options = fast().claim_lease(Duration::from_secs(30));
        let (a_sent, a_release, mut a_started_rx, publisher_a) = stalling(0);
        let dispatcher_a = PgDispatcher::start(&a, publisher_a, options.clone());
        a_started_rx.recv().await.unwrap();

        // Its lease lapses by the server's clock: B takes both over, and stalls likewise.
        clock.advance(Duration::from_secs(31)).unwrap();
        let (b_sent, b_release, mut b_started_rx, publisher_b) = stalling(1);
        let dispatcher_b = PgDispatcher::start(&b, publisher_b, options);
        b_started_rx.recv().await.unwrap();

        // A's publishes complete: its marks are fenced, the rows stay B's.
        a_release.notify_one();
        a_started_rx.recv().await.unwrap();
        a_release.notify_one();
        until("A's marks", async || {
            let s = a.outbox_stats().await.unwrap();
            s.fenced == 2
        })
        .await;
        let s = a.outbox_stats().await.unwrap();
        assert_eq!((s.delivered, s.fenced, s.backlog), (0, 2, 2));

        // B's publishes complete and are marked delivered.
        b_release.notify_one();
        b_started_rx.recv().await.unwrap();
        b_release.notify_one();
        until("B's marks", async || {
            b.outbox_stats().await.unwrap().backlog == 0
        })
        .await;
        let s = b.outbox_stats().await.unwrap();
        assert_eq!((s.delivered, s.fenced), (2, 0));
        dispatcher_a.stop().await;
        dispatcher_b.stop().await;
        // Both sent both, each in order: at least once, never out of order.
        for sent in [&a_sent, &b_sent] {
            let seqs: Vec<u64> = sent.lock().unwrap().iter().map(|(_, m)| m.seq).collect();
            assert_eq!(seqs.len(), 2);
            assert!(seqs.is_sorted());
        }
    });
}

#[test]
fn dropping_records_partitions_never_drops_an_undelivered_or_parked_message() {
    runtime().block_on(async {
        let url = fresh_database_url();
        let ttl = Duration::from_secs(3600);
        let db = store_with(&url, Retention::default().ttl(ttl)).await;
        let clock = ServerClock::freeze(&url, 1_800_000_000_000).unwrap();
        let ids = place(
            &db,
            "old",
            vec![message("pending", Some("a")), message("parked", Some("b"))],
        )
        .await;
        assert!(db.park_message(ids[1], "held").await.unwrap());
        clock.advance(ttl * 30).unwrap();
        let compaction = db.compact_now().await.unwrap();
        assert!(compaction.partitions_dropped > 0, "{compaction:?}");
        assert_eq!(db.outbox_pending(10).await.unwrap()[0].id, ids[0]);
        assert_eq!(db.outbox_parked(10).await.unwrap()[0].id, ids[1]);
        // And it is still delivered.
        clock.thaw().unwrap();
        let sent: Sent = Arc::default();
        let dispatcher = PgDispatcher::start(&db, recording(&sent, 0), fast());
        until("delivered", async || {
            db.outbox_stats().await.unwrap().backlog == 0
        })
        .await;
        dispatcher.stop().await;
        assert_eq!(sent.lock().unwrap()[0].1.id, ids[0]);
        assert_eq!(db.outbox_stats().await.unwrap().parked, 1);
    });
}

#[test]
fn a_commit_wakes_its_instances_dispatcher_without_polling() {
    runtime().block_on(async {
        let url = fresh_database_url();
        let db = store(&url).await;
        let sent: Sent = Arc::default();
        let options = fast().idle_check(Duration::from_secs(60));
        let dispatcher = PgDispatcher::start(&db, recording(&sent, 0), options);
        tokio::time::sleep(Duration::from_millis(200)).await;
        let began = Instant::now();
        place(&db, "w1", vec![message("wake", None)]).await;
        let deadline = Instant::now() + Duration::from_secs(5);
        while sent.lock().unwrap().is_empty() {
            assert!(
                Instant::now() < deadline,
                "the commit did not wake the dispatcher"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        println!("staged to published: {:?}", began.elapsed());
        dispatcher.stop().await;
        let s = db.outbox_stats().await.unwrap();
        assert_eq!(s.publish_latency_us.count, 1);
    });
}

#[test]
fn a_dispatcher_outlives_its_connections_being_cut_and_loses_nothing() {
    runtime().block_on(async {
        let url = fresh_database_url();
        let db = Arc::new(store(&url).await);
        let sent: Sent = Arc::default();
        let dispatcher = PgDispatcher::start(&db, recording(&sent, 0), fast().batch(8));
        let operator = admin(&url).await;
        let mut staged = HashSet::new();
        for round in 0..10 {
            for i in 0..20 {
                // A caller whose connection was cut retries its intent (the same id).
                let key = format!("cut-{round}-{i}");
                loop {
                    let done = db
                        .execute(&scope(), &Key::new(&key), b"req", |tx: &mut PgTx<'_>| {
                            Box::pin(async move {
                                tx.stage(message("m", Some("k"))).await?;
                                Ok::<_, PgError>(Outcome::Completed(b"201".to_vec()))
                            })
                        })
                        .await;
                    if done.is_ok() {
                        break;
                    }
                }
                staged.insert(MessageId::derive(&record(&key), 0));
            }
            // Every connection of the store's pool and its listener, cut.
            operator
                .execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                     WHERE datname = current_database() AND pid <> pg_backend_pid()",
                    &[],
                )
                .await
                .unwrap();
        }
        until(
            "an empty backlog",
            async || matches!(db.outbox_stats().await, Ok(s) if s.backlog == 0),
        )
        .await;
        dispatcher.stop().await;
        let published: HashSet<MessageId> =
            sent.lock().unwrap().iter().map(|(_, m)| m.id).collect();
        assert_eq!(published, staged);
        let s = db.outbox_stats().await.unwrap();
        println!(
            "published {} for {} staged; {} rounds failed",
            sent.lock().unwrap().len(),
            staged.len(),
            s.round_errors
        );
    });
}

#[test]
fn transactions_staging_one_ordering_key_commit_one_after_another_in_number_order() {
    runtime().block_on(async {
        let url = fresh_database_url();
        let db = Arc::new(store(&url).await);
        let hold = Arc::new(tokio::sync::Notify::new());
        let (staged_tx, mut staged_rx) = tokio::sync::mpsc::unbounded_channel();
        // The first transaction stages on key k and waits before it commits.
        let first = {
            let (db, hold) = (Arc::clone(&db), Arc::clone(&hold));
            tokio::spawn(async move {
                db.execute(&scope(), &Key::new("t1"), b"req", |tx: &mut PgTx<'_>| {
                    let (hold, staged) = (Arc::clone(&hold), staged_tx.clone());
                    Box::pin(async move {
                        tx.stage(message("first", Some("k"))).await?;
                        let _ = staged.send(());
                        hold.notified().await;
                        Ok::<_, PgError>(Outcome::Completed(b"201".to_vec()))
                    })
                })
                .await
                .unwrap()
            })
        };
        staged_rx.recv().await.unwrap();
        // The second stages on k too: it waits for the first's commit, so that its number,
        // drawn later, is also its commit's place.
        let second = {
            let db = Arc::clone(&db);
            tokio::spawn(async move { place(&db, "t2", vec![message("second", Some("k"))]).await })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !second.is_finished(),
            "a transaction staging the same key committed before the earlier one"
        );
        hold.notify_one();
        let _ = first.await.unwrap();
        second.await.unwrap();
        let sent: Sent = Arc::default();
        let dispatcher = PgDispatcher::start(&db, recording(&sent, 0), fast());
        until("delivered", async || {
            db.outbox_stats().await.unwrap().backlog == 0
        })
        .await;
        dispatcher.stop().await;
        let order: Vec<Vec<u8>> = sent
            .lock()
            .unwrap()
            .iter()
            .map(|(_, m)| m.payload.clone())
            .collect();
        assert_eq!(order, [&b"first"[..], b"second"]);
    });
}

#[test]
fn a_retry_scheduled_before_the_servers_clock_stepped_back_an_hour_runs_at_once() {
    runtime().block_on(async {
        let url = fresh_database_url();
        let db = store(&url).await;
        let t0 = 1_800_000_000_000;
        let clock = ServerClock::freeze(&url, t0).unwrap();
        let sent: Sent = Arc::default();
        let mut failed_once = false;
        let publisher = failing(&sent, move |_| {
            (!std::mem::replace(&mut failed_once, true))
                .then(|| PublishError::Transient("once".into()))
        });
        let dispatcher = PgDispatcher::start(&db, publisher, fast());
        place(&db, "s1", vec![message("m", Some("k"))]).await;
        until("the first attempt failed", async || {
            db.outbox_stats().await.unwrap().retried == 1
        })
        .await;
        // Scheduled 5–8 ms after t0 by the server's (frozen) clock, which now steps back an
        // hour and stays there: only a retry known to predate the step can be due.
        clock.set(t0 - 3_600_000).unwrap();
        until("the retry after the step", async || {
            db.outbox_stats().await.unwrap().delivered == 1
        })
        .await;
        dispatcher.stop().await;
        assert_eq!(sent.lock().unwrap().len(), 1);
    });
}

#[test]
fn a_publish_that_hangs_past_the_claims_lease_is_abandoned_and_tried_again() {
    runtime().block_on(async {
        let url = fresh_database_url();
        let db = store(&url).await;
        let sent: Sent = Arc::default();
        let log = Arc::clone(&sent);
        let mut first = true;
        let publisher = move |m: OutboxMessage| {
            let hang = std::mem::replace(&mut first, false);
            let log = Arc::clone(&log);
            async move {
                if hang {
                    std::future::pending::<()>().await;
                }
                log.lock().unwrap().push((0, m));
                Ok(())
            }
        };
        let options = fast().claim_lease(Duration::from_millis(300));
        let began = Instant::now();
        let dispatcher = PgDispatcher::start(&db, publisher, options);
        place(&db, "h1", vec![message("m", Some("k"))]).await;
        until("delivered", async || {
            db.outbox_stats().await.unwrap().delivered == 1
        })
        .await;
        assert!(began.elapsed() >= Duration::from_millis(300));
        dispatcher.stop().await;
        let s = db.outbox_stats().await.unwrap();
        assert_eq!((s.retried, s.backlog), (1, 0));
        assert_eq!(sent.lock().unwrap().len(), 1);
    });
}
