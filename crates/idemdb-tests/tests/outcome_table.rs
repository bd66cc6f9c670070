//! Every row of the reserve outcome table, with exact outcomes and exact bytes: each scenario
//! runs on the embedded engine and on PostgreSQL, with the same assertions.

mod common;

use common::stores::Under;
use common::{LEASE, T0, acquired};

use std::time::Duration;

use idemdb::{Fingerprint, Key, Payload, RecordState, ReserveOutcome, Scope, Store};

fn scope() -> Scope {
    Scope::new("POST /purchases", "user-42")
}

async fn fresh_key_is_acquired_with_a_leased_durable_record<S: Store>(under: Under<S>) {
    let (clock, db) = (&under.clock, &*under.db);
    let key = Key::new("intent-1");
    let r = acquired(db.reserve(&scope(), &key, b"payload", LEASE).await.unwrap());
    assert_eq!(r.token().get(), 1, "the first token of a new database is 1");
    assert_eq!(r.lease_expires_at(), T0 + 30_000);
    assert_eq!(r.attempt(), 1);
    assert!(!r.is_takeover());

    let rec = db
        .get(&scope(), &key)
        .await
        .unwrap()
        .expect("record exists");
    assert_eq!(rec.state, RecordState::InProgress);
    assert_eq!(rec.fingerprint, db.fingerprint(b"payload"));
    assert_eq!(rec.token, r.token());
    assert_eq!(rec.lease_expires_at, T0 + 30_000);
    assert_eq!(rec.created_at, T0);
    assert_eq!(rec.updated_at, T0);
    assert_eq!(rec.attempts, 1);
    assert!(rec.response.is_empty());

    // A second fresh key, later, gets the next token and its own lease.
    clock.advance(Duration::from_millis(5));
    let r2 = acquired(
        db.reserve(
            &scope(),
            &Key::new("intent-2"),
            b"payload",
            Duration::from_millis(1),
        )
        .await
        .unwrap(),
    );
    assert_eq!(r2.token().get(), 2);
    assert_eq!(r2.lease_expires_at(), T0 + 5 + 1);
    assert_eq!(r2.attempt(), 1);
    assert!(!r2.is_takeover());
}

async fn a_lease_is_never_shorter_than_asked<S: Store>(under: Under<S>) {
    let (clock, db) = (&under.clock, &*under.db);
    let _ = clock;
    // Whole milliseconds are kept; a partial millisecond rounds up, so a tiny lease is
    // neither zero nor refused.
    for (i, (lease, ms)) in [
        (Duration::from_millis(2), 2),
        (Duration::from_micros(2_999), 3),
        (Duration::from_micros(2_001), 3),
        (Duration::from_nanos(1), 1),
    ]
    .into_iter()
    .enumerate()
    {
        let r = acquired(
            db.reserve(&scope(), &Key::new(format!("k{i}")), b"p", lease)
                .await
                .unwrap(),
        );
        assert_eq!(r.lease_expires_at(), T0 + ms, "{lease:?}");
    }
}

async fn different_payload_on_in_progress_is_mismatch_and_changes_nothing<S: Store>(
    under: Under<S>,
) {
    let (clock, db) = (&under.clock, &*under.db);
    let key = Key::new("k");
    let _r = acquired(
        db.reserve(&scope(), &key, b"original", LEASE)
            .await
            .unwrap(),
    );
    let before = db.get(&scope(), &key).await.unwrap();

    assert_eq!(
        db.reserve(&scope(), &key, b"other", LEASE).await.unwrap(),
        ReserveOutcome::Mismatch
    );
    assert_eq!(db.get(&scope(), &key).await.unwrap(), before);

    // Mismatch is checked before the lease: even an expired lease is not taken over by
    // a different request.
    clock.advance(Duration::from_secs(31));
    assert_eq!(
        db.reserve(&scope(), &key, b"other", LEASE).await.unwrap(),
        ReserveOutcome::Mismatch
    );
    assert_eq!(db.get(&scope(), &key).await.unwrap(), before);
}

async fn different_payload_on_completed_is_mismatch_never_the_stored_bytes<S: Store>(
    under: Under<S>,
) {
    let (clock, db) = (&under.clock, &*under.db);
    let _ = clock;
    let key = Key::new("k");
    let r = acquired(
        db.reserve(&scope(), &key, b"original", LEASE)
            .await
            .unwrap(),
    );
    db.complete(&r, b"secret response".to_vec()).await.unwrap();
    let before = db.get(&scope(), &key).await.unwrap();

    let outcome = db.reserve(&scope(), &key, b"other", LEASE).await.unwrap();
    assert_eq!(outcome, ReserveOutcome::Mismatch);
    assert_eq!(db.get(&scope(), &key).await.unwrap(), before);
    // The original request still replays.
    assert_eq!(
        db.reserve(&scope(), &key, b"original", LEASE)
            .await
            .unwrap(),
        ReserveOutcome::Completed(b"secret response".to_vec())
    );
}

async fn different_payload_on_failed_is_mismatch_never_the_stored_bytes<S: Store>(under: Under<S>) {
    let (clock, db) = (&under.clock, &*under.db);
    let _ = clock;
    let key = Key::new("k");
    let r = acquired(
        db.reserve(&scope(), &key, b"original", LEASE)
            .await
            .unwrap(),
    );
    db.fail(&r, b"card declined".to_vec()).await.unwrap();
    let before = db.get(&scope(), &key).await.unwrap();

    assert_eq!(
        db.reserve(&scope(), &key, b"other", LEASE).await.unwrap(),
        ReserveOutcome::Mismatch
    );
    assert_eq!(db.get(&scope(), &key).await.unwrap(), before);
    assert_eq!(
        db.reserve(&scope(), &key, b"original", LEASE)
            .await
            .unwrap(),
        ReserveOutcome::Failed(b"card declined".to_vec())
    );
}

async fn completed_replays_byte_identical_responses<S: Store>(under: Under<S>) {
    let (clock, db) = (&under.clock, &*under.db);
    let big: Vec<u8> = (0..200_000u32).map(|i| (i * 7 + 3) as u8).collect();
    let responses: Vec<Vec<u8>> = vec![
        vec![0x00, 0xff, 0x00, 0xfe, 0x80, 0x00],
        vec![0xc3, 0x28, 0xa0, 0xa1, 0xe2, 0x28, 0xa1], // invalid UTF-8
        vec![],
        vec![0x00],
        b"HTTP/1.1 201 Created\r\nX: y\r\n\r\n{\"order\":9}".to_vec(),
        big,
    ];
    for (i, response) in responses.iter().enumerate() {
        let key = Key::new(format!("k{i}"));
        let payload = format!("payload-{i}");
        let r = acquired(
            db.reserve(&scope(), &key, payload.as_str(), LEASE)
                .await
                .unwrap(),
        );
        db.complete(&r, response.clone()).await.unwrap();
        let rec = db.get(&scope(), &key).await.unwrap().unwrap();
        assert_eq!(rec.state, RecordState::Completed);
        assert_eq!(&rec.response, response);
        for _ in 0..2 {
            assert_eq!(
                db.reserve(&scope(), &key, payload.as_str(), LEASE)
                    .await
                    .unwrap(),
                ReserveOutcome::Completed(response.clone()),
                "response {i}"
            );
        }
    }
    // Replays last for the whole TTL (24 hours by default) after the record's last change.
    clock.advance(Duration::from_secs(24 * 3600 - 1));
    for (i, response) in responses.iter().enumerate() {
        let key = Key::new(format!("k{i}"));
        let payload = format!("payload-{i}");
        assert_eq!(
            db.reserve(&scope(), &key, payload.as_str(), LEASE)
                .await
                .unwrap(),
            ReserveOutcome::Completed(response.clone())
        );
    }
}

async fn failed_replays_byte_identical_responses<S: Store>(under: Under<S>) {
    let (clock, db) = (&under.clock, &*under.db);
    let responses: Vec<Vec<u8>> = vec![
        vec![0xff, 0x00, 0xff],
        vec![0xc0, 0xaf], // invalid UTF-8
        vec![],
        b"402 declined".to_vec(),
    ];
    for (i, response) in responses.iter().enumerate() {
        let key = Key::new(format!("f{i}"));
        let r = acquired(db.reserve(&scope(), &key, b"req", LEASE).await.unwrap());
        db.fail(&r, response.clone()).await.unwrap();
        let rec = db.get(&scope(), &key).await.unwrap().unwrap();
        assert_eq!(rec.state, RecordState::Failed);
        assert_eq!(&rec.response, response);
        assert_eq!(
            db.reserve(&scope(), &key, b"req", LEASE).await.unwrap(),
            ReserveOutcome::Failed(response.clone())
        );
    }
    clock.advance(Duration::from_secs(3600));
    for (i, response) in responses.iter().enumerate() {
        assert_eq!(
            db.reserve(&scope(), &Key::new(format!("f{i}")), b"req", LEASE)
                .await
                .unwrap(),
            ReserveOutcome::Failed(response.clone()),
            "a failure is never re-executed, even long after"
        );
    }
}

async fn live_in_progress_reports_the_exact_remaining_lease<S: Store>(under: Under<S>) {
    let (clock, db) = (&under.clock, &*under.db);
    let key = Key::new("k");
    let _r = acquired(db.reserve(&scope(), &key, b"p", LEASE).await.unwrap());
    let before = db.get(&scope(), &key).await.unwrap();

    assert_eq!(
        db.reserve(&scope(), &key, b"p", LEASE).await.unwrap(),
        ReserveOutcome::InProgress {
            retry_after: Duration::from_millis(30_000)
        }
    );
    clock.advance(Duration::from_millis(12_345));
    assert_eq!(
        db.reserve(&scope(), &key, b"p", LEASE).await.unwrap(),
        ReserveOutcome::InProgress {
            retry_after: Duration::from_millis(17_655)
        }
    );
    clock.set(T0 + 30_000 - 1);
    assert_eq!(
        db.reserve(&scope(), &key, b"p", Duration::from_secs(99))
            .await
            .unwrap(),
        ReserveOutcome::InProgress {
            retry_after: Duration::from_millis(1)
        }
    );
    assert_eq!(
        db.get(&scope(), &key).await.unwrap(),
        before,
        "nothing changed"
    );
}

async fn expired_in_progress_is_taken_over_with_a_higher_token<S: Store>(under: Under<S>) {
    let (clock, db) = (&under.clock, &*under.db);
    let key = Key::new("k");
    let first = acquired(db.reserve(&scope(), &key, b"p", LEASE).await.unwrap());

    // Exactly at the lease's end it is expired.
    clock.set(T0 + 30_000);
    let second = acquired(
        db.reserve(&scope(), &key, b"p", Duration::from_secs(10))
            .await
            .unwrap(),
    );
    assert!(second.token() > first.token());
    assert!(second.is_takeover());
    assert_eq!(second.attempt(), 2);
    assert_eq!(second.lease_expires_at(), T0 + 30_000 + 10_000);

    let rec = db.get(&scope(), &key).await.unwrap().unwrap();
    assert_eq!(rec.state, RecordState::InProgress);
    assert_eq!(rec.token, second.token());
    assert_eq!(rec.attempts, 2);
    assert_eq!(rec.created_at, T0, "creation time is kept across takeovers");
    assert_eq!(rec.updated_at, T0 + 30_000);
    assert_eq!(rec.lease_expires_at, T0 + 40_000);
    assert_eq!(rec.fingerprint, db.fingerprint(b"p"));

    // The new lease is live.
    clock.advance(Duration::from_millis(2_500));
    assert_eq!(
        db.reserve(&scope(), &key, b"p", LEASE).await.unwrap(),
        ReserveOutcome::InProgress {
            retry_after: Duration::from_millis(7_500)
        }
    );

    // And a third takeover counts attempt 3.
    clock.advance(Duration::from_secs(60));
    let third = acquired(db.reserve(&scope(), &key, b"p", LEASE).await.unwrap());
    assert!(third.token() > second.token());
    assert!(third.is_takeover());
    assert_eq!(third.attempt(), 3);
    assert_eq!(third.lease_expires_at(), clock.now_ms() + 30_000);
}

async fn precomputed_fingerprint_behaves_as_the_bytes<S: Store>(under: Under<S>) {
    let (clock, db) = (&under.clock, &*under.db);
    let _ = clock;
    let key = Key::new("k");
    let fp = db.fingerprint(b"canonical request");
    assert_eq!(fp, db.fingerprint(b"canonical request"));
    assert_ne!(fp, db.fingerprint(b"canonical request!"));

    let r = acquired(db.reserve(&scope(), &key, fp, LEASE).await.unwrap());
    assert_eq!(
        db.get(&scope(), &key).await.unwrap().unwrap().fingerprint,
        fp
    );
    // The bytes are the same request as their fingerprint.
    assert_eq!(
        db.reserve(&scope(), &key, b"canonical request", LEASE)
            .await
            .unwrap(),
        ReserveOutcome::InProgress { retry_after: LEASE }
    );
    db.complete(&r, b"ok".to_vec()).await.unwrap();
    assert_eq!(
        db.reserve(&scope(), &key, Payload::Fingerprint(fp), LEASE)
            .await
            .unwrap(),
        ReserveOutcome::Completed(b"ok".to_vec())
    );
    assert_eq!(
        db.reserve(&scope(), &key, Payload::Bytes(b"canonical request"), LEASE)
            .await
            .unwrap(),
        ReserveOutcome::Completed(b"ok".to_vec())
    );
    assert_eq!(
        db.reserve(&scope(), &key, "canonical request", LEASE)
            .await
            .unwrap(),
        ReserveOutcome::Completed(b"ok".to_vec())
    );
    assert_eq!(
        db.reserve(&scope(), &key, &b"canonical request".to_vec(), LEASE)
            .await
            .unwrap(),
        ReserveOutcome::Completed(b"ok".to_vec())
    );
    assert_eq!(
        db.reserve(&scope(), &key, db.fingerprint(b"other"), LEASE)
            .await
            .unwrap(),
        ReserveOutcome::Mismatch
    );

    // The other direction: bytes first, fingerprint second.
    let key2 = Key::new("k2");
    let r2 = acquired(db.reserve(&scope(), &key2, b"body", LEASE).await.unwrap());
    db.fail(&r2, vec![9, 9]).await.unwrap();
    assert_eq!(
        db.reserve(&scope(), &key2, db.fingerprint(b"body"), LEASE)
            .await
            .unwrap(),
        ReserveOutcome::Failed(vec![9, 9])
    );
}

async fn caller_supplied_digest_is_stored_as_given<S: Store>(under: Under<S>) {
    let (clock, db) = (&under.clock, &*under.db);
    let _ = clock;
    let key = Key::new("k");
    let digest = Fingerprint::from_u128(0x0123_4567_89ab_cdef_0011_2233_4455_6677);
    let r = acquired(db.reserve(&scope(), &key, digest, LEASE).await.unwrap());
    let rec = db.get(&scope(), &key).await.unwrap().unwrap();
    assert_eq!(rec.fingerprint, digest);
    assert_eq!(
        rec.fingerprint.as_u128(),
        0x0123_4567_89ab_cdef_0011_2233_4455_6677
    );
    db.complete(&r, b"digest-ok".to_vec()).await.unwrap();
    assert_eq!(
        db.reserve(
            &scope(),
            &key,
            Fingerprint::from_u128(digest.as_u128()),
            LEASE
        )
        .await
        .unwrap(),
        ReserveOutcome::Completed(b"digest-ok".to_vec())
    );
    assert_eq!(
        db.reserve(
            &scope(),
            &key,
            Fingerprint::from_u128(digest.as_u128() ^ 1),
            LEASE
        )
        .await
        .unwrap(),
        ReserveOutcome::Mismatch
    );
}

async fn same_key_under_another_operation_or_principal_is_a_separate_record<S: Store>(
    under: Under<S>,
) {
    let (clock, db) = (&under.clock, &*under.db);
    let _ = clock;
    let key = Key::new("shared-key");
    let scopes = [
        Scope::new("op-a", "alice"),
        Scope::new("op-b", "alice"),
        Scope::new("op-a", "bob"),
        Scope::new("op-a", ""),
        Scope::new("op-ab", "c"),
        Scope::new("op-a", "bc"),
    ];
    let mut reservations = Vec::new();
    for (i, s) in scopes.iter().enumerate() {
        // Different payloads per scope: no Mismatch across scopes.
        let payload = format!("payload-{i}");
        let r = acquired(db.reserve(s, &key, payload.as_str(), LEASE).await.unwrap());
        assert_eq!(r.attempt(), 1);
        assert!(!r.is_takeover());
        reservations.push(r);
    }
    let tokens: Vec<u64> = reservations.iter().map(|r| r.token().get()).collect();
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "each scope got its own, increasing token: {tokens:?}"
    );

    db.complete(&reservations[0], b"for alice on op-a".to_vec())
        .await
        .unwrap();
    assert_eq!(
        db.reserve(&scopes[0], &key, "payload-0", LEASE)
            .await
            .unwrap(),
        ReserveOutcome::Completed(b"for alice on op-a".to_vec())
    );
    for (i, s) in scopes.iter().enumerate().skip(1) {
        let rec = db.get(s, &key).await.unwrap().unwrap();
        assert_eq!(rec.state, RecordState::InProgress, "scope {i}");
        assert_eq!(rec.token, reservations[i].token());
        assert_eq!(
            db.reserve(s, &key, format!("payload-{i}").as_str(), LEASE)
                .await
                .unwrap(),
            ReserveOutcome::InProgress { retry_after: LEASE }
        );
    }
    // An unknown scope has no record at all.
    assert_eq!(
        db.get(&Scope::new("op-c", "alice"), &key).await.unwrap(),
        None
    );
}

async fn natural_keys_from_parts<S: Store>(under: Under<S>) {
    let (clock, db) = (&under.clock, &*under.db);
    let _ = clock;
    let s = Scope::new("charge", "tenant-1");
    let natural = Key::from_parts(["user-7", "content-99", "2026-11"]);
    let r = acquired(db.reserve(&s, &natural, b"charge", LEASE).await.unwrap());
    db.complete(&r, b"charged".to_vec()).await.unwrap();
    // Rebuilt from the same parts: the same record.
    assert_eq!(
        db.reserve(
            &s,
            &Key::from_parts(["user-7", "content-99", "2026-11"]),
            b"charge",
            LEASE
        )
        .await
        .unwrap(),
        ReserveOutcome::Completed(b"charged".to_vec())
    );
    // The concatenation is a different key.
    let concat = acquired(
        db.reserve(&s, &Key::new("user-7content-992026-11"), b"charge", LEASE)
            .await
            .unwrap(),
    );
    assert_eq!(concat.attempt(), 1);
    // Part boundaries matter.
    let ab_c = acquired(
        db.reserve(&s, &Key::from_parts(["ab", "c"]), b"x", LEASE)
            .await
            .unwrap(),
    );
    let a_bc = acquired(
        db.reserve(&s, &Key::from_parts(["a", "bc"]), b"x", LEASE)
            .await
            .unwrap(),
    );
    assert_ne!(ab_c.token(), a_bc.token());
    assert_eq!(
        Key::from_parts(["ab"]).as_bytes(),
        &[0, 0, 0, 2, b'a', b'b']
    );
    // Binary parts are fine.
    let bin = Key::from_parts([&[0u8, 0xff][..], &[][..]]);
    let rb = acquired(db.reserve(&s, &bin, b"b", LEASE).await.unwrap());
    db.fail(&rb, vec![0xff]).await.unwrap();
    assert_eq!(
        db.reserve(
            &s,
            &Key::from_parts([&[0u8, 0xff][..], &[][..]]),
            b"b",
            LEASE
        )
        .await
        .unwrap(),
        ReserveOutcome::Failed(vec![0xff])
    );
}

on_both_stores!(
    fresh_key_is_acquired_with_a_leased_durable_record,
    a_lease_is_never_shorter_than_asked,
    different_payload_on_in_progress_is_mismatch_and_changes_nothing,
    different_payload_on_completed_is_mismatch_never_the_stored_bytes,
    different_payload_on_failed_is_mismatch_never_the_stored_bytes,
    completed_replays_byte_identical_responses,
    failed_replays_byte_identical_responses,
    live_in_progress_reports_the_exact_remaining_lease,
    expired_in_progress_is_taken_over_with_a_higher_token,
    precomputed_fingerprint_behaves_as_the_bytes,
    caller_supplied_digest_is_stored_as_given,
    same_key_under_another_operation_or_principal_is_a_separate_record,
    natural_keys_from_parts,
);
