//! Two instances of a service on one PostgreSQL database: two `PgStore`s, each with its own
//! pool and listener, as two processes would have. Fencing, waiting and tokens across them.

mod common;

use idemdb_postgres::Refusal;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::stores::{fresh_database_url, runtime};
use common::{LEASE, T0, acquired};
use idemdb_postgres::{ExecuteError, Key, PgError, PgStore, ReserveOutcome, Scope, Store};
use idemdb_testkit::postgres::ServerClock;

/// An instance on `url`: the schema migrated (by whichever instance comes first).
async fn instance(url: &str, poll: Duration) -> Arc<PgStore> {
    let builder = PgStore::builder(url).unwrap().wait_poll_interval(poll);
    builder.migrate().await.unwrap();
    Arc::new(builder.connect().await.unwrap())
}

fn scope() -> Scope {
    Scope::new("POST /purchases", "user-42")
}

#[test]
fn a_stale_owner_on_a_is_fenced_after_b_took_over_its_expired_lease() {
    runtime().block_on(async {
        let url = fresh_database_url();
        let a = instance(&url, Duration::from_secs(1)).await;
        let b = instance(&url, Duration::from_secs(1)).await;
        // The store's time is the server's, moved by hand here for every instance at once.
        let clock = ServerClock::freeze(&url, T0).unwrap();
        let key = Key::new("intent-1");

        let on_a = acquired(a.reserve(&scope(), &key, b"req", LEASE).await.unwrap());
        // B sees A's live lease.
        assert_eq!(
            b.reserve(&scope(), &key, b"req", LEASE).await.unwrap(),
            ReserveOutcome::InProgress { retry_after: LEASE }
        );
        // A stalls past its lease; B takes over with a higher token.
        clock.advance(LEASE).unwrap();
        let on_b = acquired(b.reserve(&scope(), &key, b"req", LEASE).await.unwrap());
        assert!(on_b.is_takeover());
        assert_eq!(on_b.attempt(), 2);
        assert!(on_b.token() > on_a.token());

        // Every late call of A's is refused by the database's guard, naming both tokens.
        let fenced = |e: &PgError| {
            matches!(e, PgError::Refused(Refusal::Fenced { presented, current })
                if *presented == on_a.token() && *current == on_b.token())
        };
        let late = a.complete(&on_a, b"A's late answer".to_vec()).await;
        assert!(late.as_ref().is_err_and(fenced), "{late:?}");
        assert!(
            a.fail(&on_a, b"x".to_vec())
                .await
                .is_err_and(|e| fenced(&e))
        );
        assert!(a.release(&on_a).await.is_err_and(|e| fenced(&e)));
        let mut stale = on_a.clone();
        assert!(a.extend(&mut stale, LEASE).await.is_err_and(|e| fenced(&e)));
        // complete_with refuses before its closure runs.
        let ran = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let with = a
            .complete_with(
                &on_a,
                b"A".to_vec(),
                |_tx: &mut idemdb_postgres::PgTx<'_>| {
                    let ran = Arc::clone(&ran);
                    Box::pin(async move {
                        ran.store(true, std::sync::atomic::Ordering::SeqCst);
                        Ok::<_, PgError>(())
                    })
                },
            )
            .await;
        assert!(
            matches!(with, Err(ExecuteError::Db(ref e)) if fenced(e)),
            "{with:?}"
        );
        assert!(!ran.load(std::sync::atomic::Ordering::SeqCst));

        // B finishes; both instances replay B's answer, byte for byte.
        b.complete(&on_b, b"B's answer".to_vec()).await.unwrap();
        for store in [&a, &b] {
            assert_eq!(
                store.reserve(&scope(), &key, b"req", LEASE).await.unwrap(),
                ReserveOutcome::Completed(b"B's answer".to_vec())
            );
        }
    });
}

#[test]
fn a_takeover_in_real_time_fences_the_owner_that_outlived_its_lease() {
    runtime().block_on(async {
        let url = fresh_database_url();
        let a = instance(&url, Duration::from_secs(1)).await;
        let b = instance(&url, Duration::from_secs(1)).await;
        let key = Key::new("intent-rt");
        let lease = Duration::from_millis(300);
        let on_a = acquired(a.reserve(&scope(), &key, b"req", lease).await.unwrap());
        tokio::time::sleep(Duration::from_millis(400)).await;
        let on_b = acquired(b.reserve(&scope(), &key, b"req", lease).await.unwrap());
        assert!(on_b.is_takeover() && on_b.token() > on_a.token());
        assert!(matches!(
            a.complete(&on_a, b"late".to_vec()).await,
            Err(PgError::Refused(Refusal::Fenced { .. }))
        ));
        b.complete(&on_b, b"ok".to_vec()).await.unwrap();
    });
}

#[test]
fn a_duplicate_waiting_on_b_is_woken_by_a_s_commit_not_by_polling() {
    runtime().block_on(async {
        let url = fresh_database_url();
        // A poll far longer than the test: only the notification can wake the waiter early.
        let poll = Duration::from_secs(60);
        let a = instance(&url, poll).await;
        let b = instance(&url, poll).await;
        let key = Key::new("intent-wait");
        let lease = Duration::from_secs(60);
        let owner = acquired(a.reserve(&scope(), &key, b"req", lease).await.unwrap());
        let waiter = {
            let b = Arc::clone(&b);
            let key = key.clone();
            tokio::spawn(async move {
                let began = Instant::now();
                let outcome = b
                    .reserve_or_wait(&scope(), &key, b"req", lease, Duration::from_secs(30))
                    .await
                    .unwrap();
                (outcome, began.elapsed())
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !waiter.is_finished(),
            "the duplicate must wait while A owns the key"
        );
        a.complete(&owner, b"first".to_vec()).await.unwrap();
        let (outcome, waited) = waiter.await.unwrap();
        assert_eq!(outcome, ReserveOutcome::Completed(b"first".to_vec()));
        assert!(
            waited < Duration::from_secs(10),
            "woken by NOTIFY, not by the 60 s poll: waited {waited:?}"
        );

        // A release wakes a waiter too, which then acquires the key itself.
        let key2 = Key::new("intent-release");
        let owner = acquired(a.reserve(&scope(), &key2, b"req", lease).await.unwrap());
        let waiter = {
            let b = Arc::clone(&b);
            let key2 = key2.clone();
            tokio::spawn(async move {
                b.reserve_or_wait(&scope(), &key2, b"req", lease, Duration::from_secs(30))
                    .await
                    .unwrap()
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        a.release(&owner).await.unwrap();
        let outcome = tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .expect("woken by the release")
            .unwrap();
        let taken = acquired(outcome);
        assert!(!taken.is_takeover() && taken.token() > owner.token());
    });
}

#[test]
fn a_waiting_duplicate_takes_over_when_the_owner_s_lease_runs_out() {
    runtime().block_on(async {
        let url = fresh_database_url();
        let a = instance(&url, Duration::from_secs(60)).await;
        let b = instance(&url, Duration::from_secs(60)).await;
        let key = Key::new("intent-lapse");
        let owner = acquired(
            a.reserve(&scope(), &key, b"req", Duration::from_millis(500))
                .await
                .unwrap(),
        );
        let began = Instant::now();
        let outcome = b
            .reserve_or_wait(&scope(), &key, b"req", LEASE, Duration::from_secs(20))
            .await
            .unwrap();
        let taken = acquired(outcome);
        assert!(taken.is_takeover() && taken.token() > owner.token());
        assert!(
            began.elapsed() < Duration::from_secs(10),
            "{:?}",
            began.elapsed()
        );
        // And a waiter whose timeout comes first is told InProgress.
        let quick = b
            .reserve_or_wait(&scope(), &key, b"req", LEASE, Duration::from_millis(200))
            .await
            .unwrap();
        assert!(
            matches!(quick, ReserveOutcome::InProgress { .. }),
            "{quick:?}"
        );
    });
}

#[test]
fn tokens_increase_across_instances_and_reservations_belong_to_their_database() {
    runtime().block_on(async {
        let url = fresh_database_url();
        let a = instance(&url, Duration::from_secs(1)).await;
        let b = instance(&url, Duration::from_secs(1)).await;
        let mut last = 0;
        for i in 0..20 {
            let store = if i % 2 == 0 { &a } else { &b };
            let r = acquired(
                store
                    .reserve(&scope(), &Key::new(format!("k{i}")), b"req", LEASE)
                    .await
                    .unwrap(),
            );
            assert!(r.token().get() > last, "token {} after {last}", r.token());
            last = r.token().get();
            // A reservation made on A is completed on B: one database.
            let other = if i % 2 == 0 { &b } else { &a };
            other.complete(&r, b"ok".to_vec()).await.unwrap();
        }
        // Both instances key fingerprints with the database's one secret.
        assert_eq!(a.fingerprint(b"req"), b.fingerprint(b"req"));

        // A reservation of another database is refused there, and nothing changes.
        let elsewhere = instance(&fresh_database_url(), Duration::from_secs(1)).await;
        assert_ne!(elsewhere.fingerprint(b"req"), a.fingerprint(b"req"));
        let r = acquired(
            a.reserve(&scope(), &Key::new("mine"), b"req", LEASE)
                .await
                .unwrap(),
        );
        assert!(matches!(
            elsewhere.complete(&r, b"x".to_vec()).await,
            Err(PgError::Refused(Refusal::ForeignReservation))
        ));
        assert_eq!(
            elsewhere.get(&scope(), &Key::new("mine")).await.unwrap(),
            None
        );
    });
}
