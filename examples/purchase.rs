//! A purchase flow on idemdb: concurrent duplicates race, one executes, the rest replay; a
//! different payload under the same key is refused; a crashed owner's lease expires, a retry
//! takes over, and the stale owner's late completion is fenced.
//!
//! Run: `cargo run --release --example purchase`

use idemdb::Refusal;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idemdb::redb::TableDefinition;
use idemdb::{Error, IdemDb, Key, ManualClock, ReserveOutcome, Scope};

/// The service's own table, written in the same commit as the dedupe record.
const ORDERS: TableDefinition<&str, &str> = TableDefinition::new("orders");

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let clock = ManualClock::new(1_767_225_600_000);
    let db = Arc::new(
        IdemDb::builder()
            .clock(clock.clone())
            // The order rows ride in the write-ahead log with their records.
            .table(ORDERS)
            .open(dir.path().join("shop.idemdb"))?,
    );
    let scope = Scope::new("POST /purchases", "user-42");
    let lease = Duration::from_secs(30);
    let charges = Arc::new(AtomicUsize::new(0));

    // 1. Sixteen concurrent retries of one intent: exactly one charges the card.
    let key = Key::new("intent-9f1c");
    let request = br#"{"sku":"book-1","cents":1999}"#;
    let threads: Vec<_> = (0..16)
        .map(|_| {
            let (db, scope, key, charges) = (
                Arc::clone(&db),
                scope.clone(),
                key.clone(),
                Arc::clone(&charges),
            );
            std::thread::spawn(move || -> Result<String, Error> {
                match db.reserve(&scope, &key, request, lease)? {
                    ReserveOutcome::Acquired(reservation) => {
                        charges.fetch_add(1, Ordering::SeqCst);
                        let token = reservation.token();
                        // The key and the fencing token go downstream to the payment provider.
                        db.complete_with(
                            &reservation,
                            b"201 Created\r\n\r\n{\"order\":\"o-1\"}".to_vec(),
                            move |tx| -> Result<(), Error> {
                                let mut orders = tx.open_table(ORDERS)?;
                                orders.insert("o-1", format!("book-1, token {token}").as_str())?;
                                Ok(())
                            },
                        )?;
                        Ok("executed".into())
                    }
                    ReserveOutcome::InProgress { retry_after } => {
                        Ok(format!("409, retry after {retry_after:?}"))
                    }
                    ReserveOutcome::Completed(bytes) => {
                        Ok(format!("replayed {} bytes", bytes.len()))
                    }
                    other => Ok(format!("{other:?}")),
                }
            })
        })
        .collect();
    for t in threads {
        let answer = t.join().map_err(|_| "a thread panicked")??;
        println!("duplicate: {answer}");
    }
    println!("card charged {} time(s)", charges.load(Ordering::SeqCst));
    assert_eq!(charges.load(Ordering::SeqCst), 1);

    // 2. A late retry replays the first response byte for byte; the order row is there.
    if let ReserveOutcome::Completed(bytes) = db.reserve(&scope, &key, request, lease)? {
        println!("late retry replays: {:?}", String::from_utf8_lossy(&bytes));
    }
    let read = db.begin_read()?;
    let orders = read.open_table(ORDERS)?;
    if let Some(order) = orders.get("o-1")? {
        println!("order committed with the record: {}", order.value());
    }

    // 3. The same key with a different payload is a client bug: refused, never replayed.
    let tampered = br#"{"sku":"book-1","cents":1}"#;
    println!(
        "same key, other payload: {:?}",
        db.reserve(&scope, &key, tampered, lease)?
    );

    // 4. An owner crashes mid-work; after its lease a retry takes over and the stale owner is
    //    fenced.
    let key = Key::from_parts(["user-42", "content-7", "2026-12"]);
    let ReserveOutcome::Acquired(stale) = db.reserve(&scope, &key, b"renew", lease)? else {
        return Err("fresh key was not acquired".into());
    };
    println!("owner A holds token {}", stale.token());
    clock.advance(lease + Duration::from_secs(1));
    let ReserveOutcome::Acquired(fresh) = db.reserve(&scope, &key, b"renew", lease)? else {
        return Err("expired lease was not taken over".into());
    };
    println!(
        "owner B took over: token {}, attempt {}, takeover {}",
        fresh.token(),
        fresh.attempt(),
        fresh.is_takeover()
    );
    match db.complete(&stale, b"late".to_vec()) {
        Err(e @ Error::Refused(Refusal::Fenced { .. })) => {
            println!("owner A's late completion: {e}")
        }
        other => return Err(format!("stale owner was not fenced: {other:?}").into()),
    }
    db.complete(&fresh, b"renewed".to_vec())?;
    if let ReserveOutcome::Completed(bytes) = db.reserve(&scope, &key, b"renew", lease)? {
        println!("a retry now replays: {:?}", String::from_utf8_lossy(&bytes));
    }
    Ok(())
}
