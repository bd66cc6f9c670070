//! The database file alone bounds every fencing token ever issued (docs/design.md §7): its
//! durable `next_token` is above every token a caller was given, at every moment, so that no
//! loss of the log, detected or not, can make a token be issued twice.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::acquired;
use idemdb::redb::{ReadableDatabase, TableDefinition};
use idemdb::{IdemDb, Key, Scope};
use idemdb_testkit::FaultBackend;

const META: TableDefinition<&str, &[u8]> = TableDefinition::new("idemdb_meta");

/// The token ceiling the database file's durable image holds, read with redb alone.
fn durable_ceiling(backend: &FaultBackend) -> u64 {
    let raw = idemdb::redb::Builder::new()
        .create_with_backend(FaultBackend::from_image(backend.durable_image()))
        .unwrap();
    let read = raw.begin_read().unwrap();
    let meta = read.open_table(META).unwrap();
    let bytes = meta.get("next_token").unwrap().unwrap();
    u64::from_le_bytes(bytes.value().try_into().unwrap())
}

#[test]
fn the_database_file_alone_bounds_every_token_issued() {
    let backend = FaultBackend::new();
    // Blocks of 8 tokens: batches raise the ceiling all the time; no checkpoint by age.
    let db = Arc::new(
        IdemDb::builder()
            .token_block(8)
            .checkpoint_interval(Duration::from_secs(3600))
            .open_with_backend(backend.clone(), backend.log())
            .unwrap(),
    );
    let issued = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let (db, issued, backend) = (Arc::clone(&db), Arc::clone(&issued), backend.clone());
            std::thread::spawn(move || {
                for i in 0..150 {
                    let key = Key::new(format!("t{t}-{i}"));
                    let r = acquired(
                        db.reserve(&Scope::new("op", "p"), &key, b"p", common::LEASE)
                            .unwrap(),
                    );
                    issued.fetch_max(r.token().get(), Ordering::SeqCst);
                    if i % 3 == 0 {
                        db.complete(&r, b"ok".to_vec()).unwrap();
                    }
                    if i % 25 == 0 {
                        // Read after the answer: the token it returned is covered already.
                        let known = issued.load(Ordering::SeqCst);
                        let ceiling = durable_ceiling(&backend);
                        assert!(ceiling > known, "durable ceiling {ceiling}, token {known}");
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let known = issued.load(Ordering::SeqCst);
    assert!(known > 100, "{known}");
    assert!(durable_ceiling(&backend) > known);
    // And after a power loss, tokens resume above every token issued.
    let disk = common::power_loss_now(&backend, Arc::into_inner(db).unwrap());
    let db = IdemDb::builder()
        .open_with_backend(disk.clone(), disk.log())
        .unwrap();
    let r = acquired(
        db.reserve(
            &Scope::new("op", "p"),
            &Key::new("after"),
            b"p",
            common::LEASE,
        )
        .unwrap(),
    );
    assert!(r.token().get() > known);
}
