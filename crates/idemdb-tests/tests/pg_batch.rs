//! PgStore's batches (design.md §14.4): the calls that arrive while one runs are answered by
//! one transaction, each with the answer it would get alone. Each test makes its batch on
//! purpose: the test's own connection holds every stripe's lock, so a call that runs alone
//! with a fresh key waits for it; what is called meanwhile queues, and runs as one batch once
//! the lock is let go.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::LEASE;
use common::stores::{admin, fresh_database_url, runtime};
use idemdb_postgres::tokio_postgres::Client;
use idemdb_postgres::{
    Key, PgError, PgStore, RecordState, Refusal, Reservation, ReserveOutcome, Retention, Scope,
    Store,
};
use idemdb_testkit::postgres::ServerClock;
use tokio::task::JoinHandle;

const T0: u64 = 1_700_000_000_000;

fn scope() -> Scope {
    Scope::new("POST /orders", "u1")
}

async fn store(url: &str, max_batch: usize) -> Arc<PgStore> {
    let builder = PgStore::builder(url)
        .unwrap()
        .max_batch(max_batch)
        .retention(Retention::default().compact_interval(None));
    builder.migrate().await.unwrap();
    Arc::new(builder.connect().await.unwrap())
}

/// A fresh database, its server clock frozen at `T0`, and a batching store on it.
async fn setup() -> (String, ServerClock, Arc<PgStore>) {
    let url = fresh_database_url();
    let db = store(&url, 64).await;
    let clock = ServerClock::freeze(&url, T0).unwrap();
    (url, clock, db)
}

fn acquired(outcome: ReserveOutcome) -> Reservation {
    match outcome {
        ReserveOutcome::Acquired(r) => r,
        other => panic!("expected Acquired, got {other:?}"),
    }
}

/// The test's connection holding every stripe's lock.
/// A transaction of the test's holding locks, and the database's URL.
struct Gate(Client, String);

impl Gate {
    async fn close(url: &str) -> Gate {
        let client = admin(url).await;
        client
            .batch_execute("BEGIN; SELECT stripe FROM idemdb_stripes FOR UPDATE")
            .await
            .unwrap();
        Gate(client, url.to_string())
    }

    /// Waits until `n` other backends wait for a lock (the lone calls, or a batch). Asked on
    /// a connection of its own: inside the gate's transaction, `pg_stat_activity` would show
    /// the snapshot its first read took.
    async fn waited_on_by(&self, n: i64) {
        waited_on_by(&self.1, n).await;
    }

    async fn open(self) {
        self.0.batch_execute("COMMIT").await.unwrap();
    }
}

/// Waits until `n` backends of the database at `url` wait for a lock.
async fn waited_on_by(url: &str, n: i64) {
    common::stores::wait_for_lock_waiters(&admin(url).await, n).await;
}

/// Calls a store runs alone at once before it queues (design.md §14.4): the tests occupy
/// them all with calls that wait, so that what they call next is batched.
const LONE_CALLS: usize = 4;

/// The calls running alone while a batch forms.
struct Lone<T>(Vec<JoinHandle<T>>);

impl Lone<ReserveOutcome> {
    async fn acquired(self) {
        for call in self.0 {
            acquired(call.await.unwrap());
        }
    }
}

impl Lone<Result<(), PgError>> {
    async fn done(self) {
        for call in self.0 {
            call.await.unwrap().unwrap();
        }
    }
}

/// Reservations of fresh keys that run alone and wait at the gate: the calls made while they
/// wait queue for one batch.
async fn lone_call_at(gate: &Gate, db: &Arc<PgStore>) -> Lone<ReserveOutcome> {
    static LONE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let calls: Vec<JoinHandle<ReserveOutcome>> = (0..LONE_CALLS)
        .map(|_| {
            let n = LONE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            spawn_reserve(db, &format!("lone-{n}"), b"req")
        })
        .collect();
    gate.waited_on_by(LONE_CALLS as i64).await;
    Lone(calls)
}

/// Lone calls that wait for a row lock instead of a stripe (so that the batch behind them may
/// meet stripes held by the test): the `complete`s of fresh records `held-*`, whose rows the
/// returned gate's transaction holds.
async fn lone_call_held_by_a_row_lock(
    url: &str,
    db: &Arc<PgStore>,
) -> (Gate, Lone<Result<(), PgError>>) {
    let mut held = Vec::new();
    for i in 0..LONE_CALLS {
        held.push(acquired(
            db.reserve(&scope(), &Key::new(format!("held-{i}")), b"req", LEASE)
                .await
                .unwrap(),
        ));
    }
    let row_gate = Gate(admin(url).await, url.to_string());
    row_gate
        .0
        .batch_execute(
            "BEGIN; SELECT 1 FROM idemdb_records \
             WHERE substring(key from 1 for 5) = 'held-'::bytea FOR UPDATE",
        )
        .await
        .unwrap();
    let calls = held
        .iter()
        .map(|r| spawn_complete(db, r, b"done"))
        .collect();
    row_gate.waited_on_by(LONE_CALLS as i64).await;
    (row_gate, Lone(calls))
}

fn spawn_reserve(
    db: &Arc<PgStore>,
    key: &str,
    payload: &'static [u8],
) -> JoinHandle<ReserveOutcome> {
    let (db, key) = (Arc::clone(db), Key::new(key));
    tokio::spawn(async move { db.reserve(&scope(), &key, payload, LEASE).await.unwrap() })
}

fn spawn_complete(
    db: &Arc<PgStore>,
    r: &Reservation,
    response: &'static [u8],
) -> JoinHandle<Result<(), PgError>> {
    let (db, r) = (Arc::clone(db), r.clone());
    tokio::spawn(async move { db.complete(&r, response.to_vec()).await })
}

/// Runs a test's body, failing it if it takes more than a minute: a call left unanswered
/// in the queue would otherwise hang the test.
fn within(body: impl std::future::Future<Output = ()>) {
    runtime().block_on(async {
        tokio::time::timeout(Duration::from_secs(60), body)
            .await
            .expect("a call was never answered");
    });
}

/// Lets the spawned calls reach the queue.
async fn queued() {
    tokio::time::sleep(Duration::from_millis(150)).await;
}

#[test]
fn concurrent_calls_share_one_batch_and_each_gets_its_own_answer() {
    within(async {
        let (url, _clock, db) = setup().await;
        let s = scope();
        // Before the batch: a completed key, a key in progress, a key completed with another
        // payload, and a reservation to complete in the batch.
        let done = acquired(
            db.reserve(&s, &Key::new("done"), b"req", LEASE)
                .await
                .unwrap(),
        );
        db.complete(&done, b"stored".to_vec()).await.unwrap();
        let busy = acquired(
            db.reserve(&s, &Key::new("busy"), b"req", LEASE)
                .await
                .unwrap(),
        );
        let mine = acquired(
            db.reserve(&s, &Key::new("mine"), b"req", LEASE)
                .await
                .unwrap(),
        );
        let before = db.stats();

        let gate = Gate::close(&url).await;
        let lone = lone_call_at(&gate, &db).await;
        let fresh: Vec<_> = (0..5)
            .map(|i| spawn_reserve(&db, &format!("f{i}"), b"req"))
            .collect();
        let replay = spawn_reserve(&db, "done", b"req");
        let mismatch = spawn_reserve(&db, "done", b"other");
        let in_progress = spawn_reserve(&db, "busy", b"req");
        let finish = spawn_complete(&db, &mine, b"finished in a batch");
        queued().await;
        gate.open().await;

        lone.acquired().await;
        let mut tokens: Vec<u64> = Vec::new();
        for f in fresh {
            tokens.push(acquired(f.await.unwrap()).token().get());
        }
        tokens.sort_unstable();
        tokens.dedup();
        assert_eq!(tokens.len(), 5, "every fresh key has a token of its own");
        assert!(tokens.iter().all(|t| *t > mine.token().get()));
        match replay.await.unwrap() {
            ReserveOutcome::Completed(response) => assert_eq!(response, b"stored"),
            other => panic!("expected the stored response, got {other:?}"),
        }
        // "done" twice in one batch: each read the stored record.
        assert!(
            matches!(mismatch.await.unwrap(), ReserveOutcome::Mismatch),
            "same key, other payload"
        );
        assert!(matches!(
            in_progress.await.unwrap(),
            ReserveOutcome::InProgress { .. }
        ));
        finish.await.unwrap().unwrap();
        let rec = db.get(&s, &Key::new("mine")).await.unwrap().unwrap();
        assert_eq!(rec.state, RecordState::Completed);
        assert_eq!(rec.response, b"finished in a batch");
        // The busy key is still its owner's.
        db.complete(&busy, b"late but owned".to_vec())
            .await
            .unwrap();

        let after = db.stats();
        assert_eq!(after.batches - before.batches, 1);
        assert_eq!(after.batched_calls - before.batched_calls, 9);
        // One commit for the batch's writes (five inserts and a finish); the lone calls' and
        // the owner's own commits besides.
        assert_eq!(after.commits - before.commits, LONE_CALLS as u64 + 1 + 1);
    });
}

#[test]
fn a_refused_row_fails_only_its_own_caller() {
    within(async {
        let (url, _clock, db) = setup().await;
        let s = scope();
        // The server refuses one key's insert, as it would a row it cannot store.
        admin(&url)
            .await
            .batch_execute(
                "CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$ \
                 BEGIN IF NEW.key = 'poison'::bytea \
                 OR (TG_OP = 'UPDATE' AND NEW.key = 'poison-finish'::bytea) THEN \
                 RAISE EXCEPTION 'poison refused by the server'; END IF; RETURN NEW; END $$; \
                 CREATE TRIGGER refuse_poison BEFORE INSERT OR UPDATE ON idemdb_records \
                 FOR EACH ROW EXECUTE FUNCTION refuse_poison();",
            )
            .await
            .unwrap();
        let mine = acquired(
            db.reserve(&s, &Key::new("mine"), b"req", LEASE)
                .await
                .unwrap(),
        );
        let gate = Gate::close(&url).await;
        let lone = lone_call_at(&gate, &db).await;
        let poison = {
            let db = Arc::clone(&db);
            tokio::spawn(async move {
                db.reserve(&scope(), &Key::new("poison"), b"req", LEASE)
                    .await
            })
        };
        let fresh: Vec<_> = (0..3)
            .map(|i| spawn_reserve(&db, &format!("f{i}"), b"req"))
            .collect();
        let finish = spawn_complete(&db, &mine, b"ok");
        queued().await;
        gate.open().await;

        lone.acquired().await;
        match poison.await.unwrap() {
            Err(e @ PgError::Database(_)) => {
                assert!(
                    e.to_string().contains("poison refused by the server"),
                    "{e}"
                );
            }
            other => panic!("expected the server's refusal, got {other:?}"),
        }
        for f in fresh {
            acquired(f.await.unwrap());
        }
        finish.await.unwrap().unwrap();
        assert_eq!(
            db.get(&s, &Key::new("mine")).await.unwrap().unwrap().state,
            RecordState::Completed
        );
        assert_eq!(db.get(&s, &Key::new("poison")).await.unwrap(), None);

        // A refused finish: the batch's reserves, read and inserted before it, are rolled back
        // with it, so none may be answered from those rows; each runs on its own path.
        let doomed = acquired(
            db.reserve(&s, &Key::new("poison-finish"), b"req", LEASE)
                .await
                .unwrap(),
        );
        let gate = Gate::close(&url).await;
        let lone = lone_call_at(&gate, &db).await;
        let fresh: Vec<_> = (0..3)
            .map(|i| spawn_reserve(&db, &format!("g{i}"), b"req"))
            .collect();
        let finish = spawn_complete(&db, &doomed, b"never");
        queued().await;
        gate.open().await;
        lone.acquired().await;
        for (i, f) in fresh.into_iter().enumerate() {
            let r = acquired(f.await.unwrap());
            let rec = db.get(&s, &Key::new(format!("g{i}"))).await.unwrap();
            assert_eq!(
                rec.map(|r| r.token),
                Some(r.token()),
                "g{i} answered but not stored"
            );
        }
        match finish.await.unwrap() {
            Err(e @ PgError::Database(_)) => assert!(e.to_string().contains("poison"), "{e}"),
            other => panic!("expected the server's refusal, got {other:?}"),
        }
    });
}

/// A reserve and its key's complete in one batch: the batch's reserves run before its
/// finishes, so the duplicate is told the key is in progress (never a made-up success), and
/// the owner's complete commits with it.
#[test]
fn a_reserve_and_a_complete_of_one_key_in_one_batch() {
    within(async {
        let (url, _clock, db) = setup().await;
        let s = scope();
        let owned = acquired(db.reserve(&s, &Key::new("k"), b"req", LEASE).await.unwrap());
        let before = db.stats();
        let gate = Gate::close(&url).await;
        let lone = lone_call_at(&gate, &db).await;
        let finish = spawn_complete(&db, &owned, b"the answer");
        let duplicate = spawn_reserve(&db, "k", b"req");
        queued().await;
        gate.open().await;
        lone.acquired().await;
        finish.await.unwrap().unwrap();
        assert!(
            matches!(duplicate.await.unwrap(), ReserveOutcome::InProgress { .. }),
            "the batch's reserves run before its finishes"
        );
        assert_eq!(db.stats().batches - before.batches, 1);
        match db.reserve(&s, &Key::new("k"), b"req", LEASE).await.unwrap() {
            ReserveOutcome::Completed(response) => assert_eq!(response, b"the answer"),
            other => panic!("expected the stored answer, got {other:?}"),
        }
    });
}

#[test]
fn a_takeover_in_a_batch_fences_the_old_owner() {
    within(async {
        let (url, clock, db) = setup().await;
        let s = scope();
        let old = acquired(
            db.reserve(&s, &Key::new("k"), b"req", Duration::from_secs(1))
                .await
                .unwrap(),
        );
        clock.advance(Duration::from_secs(2)).unwrap();
        let gate = Gate::close(&url).await;
        let lone = lone_call_at(&gate, &db).await;
        let successor = spawn_reserve(&db, "k", b"req");
        let fresh = spawn_reserve(&db, "f", b"req");
        queued().await;
        gate.open().await;
        lone.acquired().await;
        acquired(fresh.await.unwrap());
        let new = acquired(successor.await.unwrap());
        assert!(new.is_takeover());
        assert!(new.token() > old.token());
        match db.complete(&old, b"late".to_vec()).await {
            Err(PgError::Refused(Refusal::Fenced { .. })) => {}
            other => panic!("the old owner must be fenced, got {other:?}"),
        }
        db.complete(&new, b"mine".to_vec()).await.unwrap();
        let rec = db.get(&s, &Key::new("k")).await.unwrap().unwrap();
        assert_eq!(rec.response, b"mine");
    });
}

/// The previous build's reservation is this build's single call (`idemdb_reserve`, under the
/// same stripe locks); a store with batching off runs exactly it. Callers of both, racing on
/// one key, must elect one owner, round after round; and a batch of one store must exclude
/// the other store's calls.
#[test]
fn callers_of_a_batching_and_a_single_call_store_on_one_key_elect_one_owner() {
    within(async {
        let url = fresh_database_url();
        let batching = store(&url, 64).await;
        let single = store(&url, 0).await;
        for round in 0..20 {
            let key = format!("race-{round}");
            let callers: Vec<_> = (0..64)
                .map(|i| {
                    let db = if i % 2 == 0 { &batching } else { &single };
                    spawn_reserve(db, &key, b"req")
                })
                .collect();
            let mut owners = 0;
            for c in callers {
                match c.await.unwrap() {
                    ReserveOutcome::Acquired(_) => owners += 1,
                    ReserveOutcome::InProgress { .. } => {}
                    other => panic!("{other:?}"),
                }
            }
            assert_eq!(owners, 1, "round {round}: exactly one owner");
        }
        assert!(
            batching.stats().batches > 0,
            "the batching store never batched"
        );
    });
}

/// 64 callers of one batching store on one key: a batch holds one op per key, so two of them
/// never both find the key free in one statement.
#[test]
fn sixty_four_callers_of_one_store_on_one_key_elect_one_owner() {
    within(async {
        let (_url, _clock, db) = setup().await;
        for round in 0..20 {
            let key = format!("race-{round}");
            let callers: Vec<_> = (0..64).map(|_| spawn_reserve(&db, &key, b"req")).collect();
            let mut owners = 0;
            for c in callers {
                if let ReserveOutcome::Acquired(_) = c.await.unwrap() {
                    owners += 1;
                }
            }
            assert_eq!(owners, 1, "round {round}");
        }
    });
}

/// Replays in a batch take no lock: a batch of them is answered while another connection
/// holds every stripe. (The lone call that makes the batch waits for a row lock instead.)
#[test]
fn a_batch_of_replays_takes_no_stripe_lock() {
    within(async {
        let (url, _clock, db) = setup().await;
        let s = scope();
        for i in 0..5 {
            let r = acquired(
                db.reserve(&s, &Key::new(format!("d{i}")), b"req", LEASE)
                    .await
                    .unwrap(),
            );
            db.complete(&r, format!("stored {i}").into_bytes())
                .await
                .unwrap();
        }
        let (row_gate, lone) = lone_call_held_by_a_row_lock(&url, &db).await;
        let stripes = Gate::close(&url).await;
        let replays: Vec<_> = (0..5)
            .map(|i| spawn_reserve(&db, &format!("d{i}"), b"req"))
            .collect();
        queued().await;
        let before = db.stats();
        // Let the lone call go; the stripes stay held.
        row_gate.open().await;
        lone.done().await;
        for (i, r) in replays.into_iter().enumerate() {
            let answer = tokio::time::timeout(Duration::from_secs(10), r)
                .await
                .expect("a replay waited for a stripe lock")
                .unwrap();
            match answer {
                ReserveOutcome::Completed(response) => {
                    assert_eq!(response, format!("stored {i}").into_bytes());
                }
                other => panic!("expected the stored response, got {other:?}"),
            }
        }
        assert_eq!(
            db.stats().batches - before.batches,
            1,
            "the replays were one batch"
        );
        stripes.open().await;
    });
}

/// Ten duplicates of a fresh key in one batch read the same snapshot, in which the key is
/// free: only the first may insert. The others are decided on their own path, after the batch
/// committed, and find the key in progress.
#[test]
fn duplicates_of_a_fresh_key_in_one_batch_elect_one_owner() {
    within(async {
        let (url, _clock, db) = setup().await;
        let before = db.stats();
        let gate = Gate::close(&url).await;
        let lone = lone_call_at(&gate, &db).await;
        let duplicates: Vec<_> = (0..10)
            .map(|_| spawn_reserve(&db, "same", b"req"))
            .collect();
        queued().await;
        gate.open().await;
        lone.acquired().await;
        let mut owners = 0;
        for d in duplicates {
            match d.await.unwrap() {
                ReserveOutcome::Acquired(_) => owners += 1,
                ReserveOutcome::InProgress { .. } => {}
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(owners, 1);
        assert_eq!(db.stats().batches - before.batches, 1);
    });
}

/// The previous build's reservation of a key, in flight (its stripe locked, its row inserted,
/// not yet committed: `idemdb_reserve` inside an open transaction of the test's), while a batch
/// of this build reserves the same key. The batch must wait for the stripe and then find the
/// key taken: a batch that inserted on its snapshot alone would make a second owner.
#[test]
fn a_batch_waits_for_an_older_builds_reservation_of_the_same_key() {
    within(async {
        let (url, _clock, db) = setup().await;
        let s = scope();
        // Partitions for the key's row, and the lone call's record.
        acquired(
            db.reserve(&s, &Key::new("warm"), b"req", LEASE)
                .await
                .unwrap(),
        );
        let (row_gate, lone) = lone_call_held_by_a_row_lock(&url, &db).await;
        let batched = spawn_reserve(&db, "k", b"req");
        let beside = spawn_reserve(&db, "beside", b"req");
        queued().await;
        let before = db.stats();
        // The older build: its whole reservation in one open transaction.
        let older = admin(&url).await;
        older
            .batch_execute(&format!(
                "BEGIN; SELECT stripe FROM idemdb_stripes FOR UPDATE; \
                 SELECT * FROM idemdb_reserve('POST /orders'::bytea, 'u1'::bytea, 'k'::bytea, \
                 '\\x00112233445566778899aabbccddeeff'::bytea, {}, 86400000, true, 0)",
                LEASE.as_millis()
            ))
            .await
            .unwrap();
        row_gate.open().await;
        lone.done().await;
        // The batch waits for the older build's stripe lock ...
        waited_on_by(&url, 1).await;
        older.batch_execute("COMMIT").await.unwrap();
        // ... and then finds the key taken (by a payload of the older build's test caller).
        match batched.await.unwrap() {
            ReserveOutcome::Mismatch => {}
            other => panic!("the key is the older build's caller's: got {other:?}"),
        }
        acquired(beside.await.unwrap());
        assert_eq!(db.stats().batches - before.batches, 1);
        let rec = db.get(&s, &Key::new("k")).await.unwrap().unwrap();
        assert_eq!(rec.state, RecordState::InProgress);
    });
}

/// The lock stripe of a key of `scope()`, as the store computes it (design.md §14: xxh3 of the
/// encoded record key, modulo the 1,024 stripes).
fn stripe_of(key: &str) -> i32 {
    let mut encoded = Vec::new();
    for part in [b"POST /orders".as_slice(), b"u1".as_slice()] {
        encoded.extend_from_slice(&u16::try_from(part.len()).unwrap().to_be_bytes());
        encoded.extend_from_slice(part);
    }
    encoded.extend_from_slice(key.as_bytes());
    i32::try_from(xxhash_rust::xxh3::xxh3_64(&encoded) % 1024).unwrap()
}

/// A key live when the batch's `LOCK` read it (so its stripe is not locked for it), released
/// before its `RESERVE` reads it, while an older build's reservation of it is in flight: the
/// batch must not insert it (its stripe is not held), and its caller, deciding on its own
/// path, waits for the older build and finds the key taken.
#[test]
fn a_key_released_between_the_batchs_lock_and_its_insert_is_not_inserted() {
    within(async {
        let (url, _clock, db) = setup().await;
        let s = scope();
        let owner = acquired(db.reserve(&s, &Key::new("k"), b"req", LEASE).await.unwrap());
        let fresh = (0..20)
            .map(|i| format!("f{i}"))
            .find(|f| stripe_of(f) != stripe_of("k"))
            .unwrap();
        let (row_gate, lone) = lone_call_held_by_a_row_lock(&url, &db).await;
        // Every stripe but the key's: the batch's LOCK waits for the fresh key's.
        let stripes = admin(&url).await;
        stripes
            .batch_execute(&format!(
                "BEGIN; SELECT stripe FROM idemdb_stripes WHERE stripe <> {} FOR UPDATE",
                stripe_of("k")
            ))
            .await
            .unwrap();
        let before = db.stats();
        let batched = spawn_reserve(&db, "k", b"req");
        let beside = spawn_reserve(&db, &fresh, b"req");
        queued().await;
        row_gate.open().await;
        lone.done().await;
        waited_on_by(&url, 1).await;
        // Between the batch's two statements: the owner releases, and an older build's
        // reservation takes the key's stripe and inserts, uncommitted.
        db.release(&owner).await.unwrap();
        let older = admin(&url).await;
        older
            .batch_execute(&format!(
                "BEGIN; SELECT * FROM idemdb_reserve('POST /orders'::bytea, 'u1'::bytea, \
                 'k'::bytea, '\\x00112233445566778899aabbccddeeff'::bytea, {}, 86400000, true, {})",
                LEASE.as_millis(),
                stripe_of("k")
            ))
            .await
            .unwrap();
        Gate(stripes, url.clone()).open().await;
        acquired(beside.await.unwrap());
        // The key's caller decides on its own path, and waits for the older build's stripe.
        waited_on_by(&url, 1).await;
        older.batch_execute("COMMIT").await.unwrap();
        match batched.await.unwrap() {
            ReserveOutcome::Mismatch => {}
            other => panic!("the key is the older build's caller's: got {other:?}"),
        }
        assert_eq!(db.stats().batches - before.batches, 1);
    });
}

/// Instances whose clocks are 10 minutes ahead and behind, their calls batched: every lease
/// and expiry a batch writes is the server's time plus the span, whatever the instance says
/// (the batch's statements read the store's time themselves, as single calls do).
#[test]
fn a_batch_of_a_skewed_instance_writes_the_server_s_times() {
    within(async {
        let (url, _clock, _db) = setup().await;
        for (name, skew) in [("ahead", 600_000), ("behind", -600_000)] {
            let db = Arc::new(
                PgStore::builder(&url)
                    .unwrap()
                    .clock(common::stores::Skewed(skew))
                    .retention(Retention::default().compact_interval(None))
                    .connect()
                    .await
                    .unwrap(),
            );
            let s = scope();
            let owned = acquired(
                db.reserve(&s, &Key::new(format!("{name}-owned")), b"req", LEASE)
                    .await
                    .unwrap(),
            );
            let before = db.stats();
            let gate = Gate::close(&url).await;
            let lone = lone_call_at(&gate, &db).await;
            let fresh = spawn_reserve(&db, &format!("{name}-fresh"), b"req");
            let finish = spawn_complete(&db, &owned, b"done");
            queued().await;
            gate.open().await;
            lone.acquired().await;
            let r = acquired(fresh.await.unwrap());
            finish.await.unwrap().unwrap();
            assert_eq!(db.stats().batches - before.batches, 1, "{name}");
            let lease = u64::try_from(LEASE.as_millis()).unwrap();
            assert_eq!(r.lease_expires_at(), T0 + lease, "{name}");
            let fresh = db
                .get(&s, &Key::new(format!("{name}-fresh")))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(fresh.lease_expires_at, T0 + lease, "{name}");
            let done = db
                .get(&s, &Key::new(format!("{name}-owned")))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(
                (done.state, done.updated_at),
                (RecordState::Completed, T0),
                "{name}"
            );
        }
    });
}
